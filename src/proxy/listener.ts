import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import http from '../node-http.js';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { formatAuthority, parseAuthority } from '../rules/host.js';
import { answerAfterHalfClose, asksToClose, checkExpectationsInPlan, clientOf, factsOf, lingerAfterClosingAnswers, REFUSAL_CLOSES, serverOptions, type DataPath } from './boundary.js';
import { EgressDenied } from './egress.js';
import { malformed, overloaded, ProxyError, refused, shuttingDown, writeRawError } from './errors.js';
import { forward, refuse } from './forward.js';
import { connectTarget, planPlain } from './plan.js';
import { newRecord } from './record.js';
import { openTunnel } from './tunnel.js';
import { refuseUpgrade, relayUpgrade } from './websocket.js';

/**
 * The listener step: the proxy's port. Connection limits first; then `CONNECT host:port` is
 * decided (blind tunnel, or `intercept` for a rule host) after the deny list and the egress
 * policy by name, and an absolute-form `http://` request goes through the plan step and is
 * forwarded as is (never with a rule's headers). Everything refused closes the connection.
 */
export function createListener(dp: DataPath, intercept: (client: Socket, head: Buffer, host: string, port: number, clientAddr: string) => void): Server {
  const { core, limits, boundary } = dp;
  const front = http.createServer(serverOptions(limits));
  front.timeout = limits.idleTimeoutMs;
  checkExpectationsInPlan(front);
  answerAfterHalfClose(front);
  lingerAfterClosingAnswers(front, boundary);

  front.on('connect', (req: IncomingMessage, client: Socket, head: Buffer) => {
    boundary.stopFollowing(client);
    if (overLimit.has(client)) return;
    if (boundary.isAnswered(client)) {
      boundary.closeAfterEarlierAnswers(client);
      return;
    }
    const clientAddr = clientOf(client);
    client.on('error', () => client.destroy());
    dp.idleGuard(client);
    const target = connectTarget(factsOf(req), limits);
    if (target instanceof ProxyError) {
      refuseUpgrade(core, req, client, { client: clientAddr, host: '', port: 0, decision: 'tunnel' }, '', target);
      return;
    }
    const { host, port } = target;
    const config = core.config();
    const decision = config.decide(host, port);
    if (core.draining()) {
      refuseUpgrade(core, req, client, { client: clientAddr, host, port, decision }, '', shuttingDown());
      return;
    }
    if (core.isDenied(host, port)) {
      refuseUpgrade(core, req, client, { client: clientAddr, host, port, decision }, '', refused(`${formatAuthority(host, port)} is not reachable through this proxy`));
      return;
    }
    const refusal = config.egress.checkName(host, port);
    if (refusal) {
      refuseUpgrade(core, req, client, { client: clientAddr, host, port, decision }, '', dp.reportRefusal(new EgressDenied(refusal, host, port)));
      return;
    }
    if (decision === 'intercept') intercept(client, head, host, port, clientAddr);
    else openTunnel(core, client, head, { host, port, client: clientAddr, decision }, dp.track);
  });

  front.on('request', (req: IncomingMessage, res: ServerResponse) => {
    if (overLimit.has(req.socket) || boundary.isAnswered(req.socket)) return;
    const started = performance.now();
    const clientAddr = clientOf(req.socket);
    const config = core.config();
    const t = dp.reportRefusal(planPlain(factsOf(req), config, limits, core.isDenied));
    if (core.draining() || asksToClose(req)) res.shouldKeepAlive = false;
    if (t instanceof ProxyError) {
      const rec = newRecord(req.method ?? '', { client: clientAddr, host: '', port: 0, decision: 'tunnel' }, '');
      try {
        const m = /^[a-z]+:\/\/([^/?#]*)([^?#]*)/i.exec(req.url ?? '');
        if (m) {
          const a = parseAuthority(m[1], 80);
          Object.assign(rec, { host: a.host, port: a.port, path: m[2] || '/', decision: config.decide(a.host, a.port) });
        }
      } catch {
        /* the record keeps an empty host */
      }
      req.resume();
      // Answered and closing: a request (or CONNECT) pipelined behind this one is never acted on.
      boundary.answer(req.socket);
      refuse(core, res, rec, started, t, REFUSAL_CLOSES);
      return;
    }
    const logPath = t.pathAndQuery.split('?')[0];
    const rec = newRecord(req.method ?? '', { client: clientAddr, host: t.host, port: t.port, decision: t.decision }, logPath);
    void forward(core, req, res, { scheme: 'http', host: t.host, port: t.port, pathAndQuery: t.pathAndQuery, logPath, decision: t.decision, client: clientAddr }, rec, started);
  });

  front.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    boundary.stopFollowing(socket);
    if (overLimit.has(socket)) return;
    if (boundary.isAnswered(socket)) {
      boundary.closeAfterEarlierAnswers(socket);
      return;
    }
    const clientAddr = clientOf(socket as Socket);
    dp.idleGuard(socket);
    const t = dp.reportRefusal(planPlain(factsOf(req), core.config(), limits, core.isDenied));
    if (t instanceof ProxyError) {
      refuseUpgrade(core, req, socket, { client: clientAddr, host: '', port: 0, decision: 'tunnel' }, '', t);
      return;
    }
    if (String(req.headers.upgrade).toLowerCase() !== 'websocket') {
      refuseUpgrade(core, req, socket, { client: clientAddr, host: t.host, port: t.port, decision: t.decision }, '', malformed('only WebSocket upgrades are supported'));
      return;
    }
    const logPath = t.pathAndQuery.split('?')[0];
    relayUpgrade(core, req, socket, head, { scheme: 'http', host: t.host, port: t.port, pathAndQuery: t.pathAndQuery, logPath, decision: t.decision, client: clientAddr });
  });

  front.on('clientError', boundary.onClientError);

  // Connection limits: counted per listener and per client address; over the limit the
  // client hears why (503) instead of a silent reset, and nothing it sent is acted on.
  let connections = 0;
  const perClient = new Map<string, number>();
  const overLimit = new WeakSet<Duplex>();
  front.on('connection', (s: Socket) => {
    dp.track(s);
    const addr = (s.remoteAddress ?? '').replace(/^::ffff:/, '');
    const mine = (perClient.get(addr) ?? 0) + 1;
    if (connections + 1 > limits.maxConnections || mine > limits.maxConnectionsPerClient) {
      overLimit.add(s);
      const total = connections + 1 > limits.maxConnections;
      core.events.emit('connection_refused', { client: addr, reason: total ? 'max_connections' : 'max_connections_per_client' });
      core.logger.warn({ type: 'connection_refused', client: addr, connections, from_client: mine - 1 }, 'connection limit reached');
      s.on('error', () => s.destroy());
      writeRawError(s, overloaded(total ? `the proxy has reached its limit of ${limits.maxConnections} connections; retry later` : `this client has reached its limit of ${limits.maxConnectionsPerClient} connections; close some first`));
      return;
    }
    connections++;
    perClient.set(addr, mine);
    boundary.follow(s);
    s.once('close', () => {
      connections--;
      const n = (perClient.get(addr) ?? 1) - 1;
      if (n <= 0) perClient.delete(addr);
      else perClient.set(addr, n);
    });
  });

  return front;
}
