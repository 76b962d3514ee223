import type { IncomingMessage, ServerResponse } from 'node:http';
import http from '../node-http.js';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { answerAfterHalfClose, asksToClose, checkExpectationsInPlan, factsOf, lingerAfterClosingAnswers, REFUSAL_CLOSES, serverOptions, type DataPath } from './boundary.js';
import { malformed, ProxyError } from './errors.js';
import type { Exchange } from './exchange.js';
import { forward, refuse } from './forward.js';
import { planIntercepted, reflectionProblem } from './plan.js';
import { newRecord, refusedPath } from './record.js';
import { refuseUpgrade, relayUpgrade } from './websocket.js';

/**
 * The Node exchange: intercepted connections fed to an internal HTTP server that never listens,
 * so Node's strict parser handles requests, keep-alive and upgrades; each request goes through
 * the plan step and then `forward` (undici) or `relayUpgrade`. It takes what the fast path does
 * not (`adopt`: with the bytes already read) and every connection when the fast path is off.
 */
export interface NodeExchange extends Exchange {
  /** Takes over a connection another exchange read `bytes` from (its parser reads them first). */
  adopt(socket: TLSSocket, bytes: Buffer): void;
  close(): void;
}

export function createNodeExchange(dp: DataPath): NodeExchange {
  const { core, limits, tunnels, boundary } = dp;
  const inner = http.createServer(serverOptions(limits));
  inner.timeout = limits.idleTimeoutMs;
  // The inner server never listens, and Node starts its head-timeout clock (slow-loris guard) on
  // 'listening': start it by hand, stopped again in close().
  inner.emit('listening');
  inner.on('connection', (s: Duplex) => boundary.follow(s));
  checkExpectationsInPlan(inner);
  answerAfterHalfClose(inner);
  lingerAfterClosingAnswers(inner, boundary);

  inner.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const started = performance.now();
    const t = tunnels.get(req.socket);
    if (!t) {
      res.destroy();
      return;
    }
    // Read after a closing answer: never acted on, and the connection is left to its linger
    // (destroyed now, it would reset a client that has not read that answer yet).
    if (boundary.isAnswered(req.socket)) return;
    const config = core.config(); // one snapshot for the whole request
    const rec = newRecord(req.method ?? '', { client: t.client, host: t.host, port: t.port, decision: 'intercept' }, '');
    t.inFlight++;
    res.once('close', () => {
      t.inFlight--;
      if (core.draining() && t.inFlight === 0) req.socket.end();
    });
    if (core.draining() || asksToClose(req)) res.shouldKeepAlive = false;
    const planned = dp.reportRefusal(planIntercepted(factsOf(req), t, config, limits));
    if (planned instanceof ProxyError) {
      rec.path = refusedPath(req.url ?? '');
      req.resume();
      // Answered and closing: a request pipelined behind this one is never acted on.
      boundary.answer(req.socket);
      refuse(core, res, rec, started, planned, REFUSAL_CLOSES);
      return;
    }
    rec.path = planned.path;
    void forward(core, req, res, { scheme: 'https', host: t.host, port: t.port, pathAndQuery: planned.pathAndQuery, logPath: planned.path, decision: 'intercept', rule: planned.rule, client: t.client }, rec, started);
  });

  inner.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    const t = tunnels.get(socket);
    boundary.stopFollowing(socket);
    if (!t || boundary.isAnswered(socket)) {
      boundary.closeAfterEarlierAnswers(socket);
      return;
    }
    const base = { client: t.client, host: t.host, port: t.port, decision: 'intercept' as const };
    const path = refusedPath(req.url ?? '');
    const reflects = reflectionProblem(factsOf(req));
    if (reflects) {
      refuseUpgrade(core, req, socket, base, path, reflects);
      return;
    }
    if (String(req.headers.upgrade).toLowerCase() !== 'websocket') {
      refuseUpgrade(core, req, socket, base, path, malformed('only WebSocket upgrades are supported'));
      return;
    }
    const planned = dp.reportRefusal(planIntercepted(factsOf(req), t, core.config(), limits));
    if (planned instanceof ProxyError) {
      refuseUpgrade(core, req, socket, base, path, planned);
      return;
    }
    dp.idleGuard(socket);
    relayUpgrade(core, req, socket, head, { scheme: 'https', ...base, pathAndQuery: planned.pathAndQuery, logPath: planned.path, rule: planned.rule });
  });

  inner.on('clientError', boundary.onClientError);
  // CONNECT inside an intercepted tunnel: a tunnel in a tunnel is never opened (Node would only drop the connection).
  inner.on('connect', (req: IncomingMessage, socket: Duplex) => {
    const t = tunnels.get(socket);
    boundary.stopFollowing(socket);
    if (!t || boundary.isAnswered(socket)) {
      boundary.closeAfterEarlierAnswers(socket);
      return;
    }
    refuseUpgrade(core, req, socket, { client: t.client, host: t.host, port: t.port, decision: 'intercept' }, '', malformed('CONNECT is not accepted inside a tunnel'));
  });

  return {
    name: 'node',
    serve(socket) {
      inner.emit('connection', socket);
    },
    adopt(socket, bytes) {
      inner.emit('connection', socket);
      // The server now reads the socket; the bytes already read go to its parser first.
      if (bytes.length) socket.emit('data', bytes);
      socket.resume();
    },
    close() {
      // Stops the inner server's head-timeout clock (it never listened: the callback gets ERR_SERVER_NOT_RUNNING).
      inner.close(() => undefined);
    },
  };
}
