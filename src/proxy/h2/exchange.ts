import http2, { type Http2ServerRequest, type Http2ServerResponse, type ServerHttp2Session } from 'node:http2';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { checkExpectationsInPlan, type DataPath } from '../boundary.js';
import type { TunnelTarget } from '../context.js';
import { ProxyError } from '../errors.js';
import type { Exchange } from '../exchange.js';
import { answerThenStopUpload, forward, refuse } from '../forward.js';
import { planIntercepted } from '../plan.js';
import { finishRecord, newRecord, refusedPath } from '../record.js';
import { readH2Request } from './fields.js';
import { h2ServerOptions } from './limits.js';
import { H2Upstream } from './upstream.js';

/**
 * The HTTP/2 exchange: intercepted connections whose client chose `h2` in ALPN, fed to an
 * internal `http2` server that never listens (nghttp2 does the framing, HPACK and flow
 * control). Each stream is one request: its header block is read and checked (fields.ts), the
 * plan step decides, and `forward` sends it upstream with the rule's headers and streams the
 * answer back, trailers included. A refusal answers the stream only; the connection's other
 * streams go on (HTTP/2 framing cannot be desynchronised by one stream's fields).
 */
export interface H2Exchange extends Exchange {
  close(): void;
}

export function createH2Exchange(dp: DataPath): H2Exchange {
  const { core, limits } = dp;
  // Upstream, the HTTP/2 clients' requests go through keygate's own HTTP/2 client (upstream.ts here).
  core.upstream.useH2((host) => new H2Upstream(host));
  const sessions = new WeakMap<ServerHttp2Session, TunnelTarget>();
  let pending: TunnelTarget | undefined;
  const inner = http2.createServer(h2ServerOptions(limits));
  // 'session' is emitted synchronously while 'connection' is handled (serve below).
  inner.on('session', (session: ServerHttp2Session) => {
    const t = pending;
    if (!t) {
      session.destroy();
      return;
    }
    sessions.set(session, t);
    // The idle clock: a connection with no stream in flight and no frame for a while is closed.
    session.setTimeout(limits.idleTimeoutMs, () => {
      if (t.inFlight === 0) session.close();
    });
    session.on('error', () => session.destroy());
  });

  // Expectations: node:http2's compatibility layer would answer them itself, before the checks
  // (a 417 with no Proxy-Status and no record whatever the authority; a 100 before a refusal):
  // the plan step and forward.ts decide instead, as for HTTP/1.1 (boundary.ts).
  checkExpectationsInPlan(inner);

  inner.on('request', (req: Http2ServerRequest, res: Http2ServerResponse) => {
    const started = performance.now();
    const t = sessions.get(req.stream.session as ServerHttp2Session);
    if (!t) {
      req.stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      return;
    }
    const config = core.config(); // one snapshot for the whole request
    const method = req.method ?? '';
    const rec = newRecord(method, { client: t.client, host: t.host, port: t.port, decision: 'intercept' }, '', 'h2');
    t.inFlight++;
    // The client's idle clock, per stream: the session's clock below closes only a session with
    // nothing in flight, so a stream whose client stopped reading or sending would be held
    // forever. No frame on this stream for that long: forward.ts decides (idleCutsExchange).
    req.stream.setTimeout(limits.idleTimeoutMs);
    req.stream.once('close', () => {
      t.inFlight--;
      if (core.draining() && t.inFlight === 0) req.stream.session?.close();
    });
    answerDoneOnlyWhenEnded(req.stream, res);
    // Node's compatibility objects are close enough to HTTP/1's for refuse and forward.
    const hreq = req as unknown as IncomingMessage;
    const hres = res as unknown as ServerResponse;
    const read = readH2Request(req.rawHeaders);
    let planned = read instanceof ProxyError ? read : dp.reportRefusal(planIntercepted(read.facts, t, config, limits));
    if (!(read instanceof ProxyError) && !(planned instanceof ProxyError) && read.hostField !== undefined) {
      // A `host` field besides `:authority` must name the tunnel too (RFC 9113 8.3.1).
      const other = planIntercepted({ ...read.facts, rawHeaders: [...read.fields, 'host', read.hostField] }, t, config, limits);
      if (other instanceof ProxyError) planned = other;
    }
    if (planned instanceof ProxyError) {
      rec.path = refusedPath(req.headers[':path'] ?? '');
      req.resume();
      // A body still coming is read by nobody: the client is asked to stop sending it.
      const refusal = planned;
      if (req.stream.endAfterHeaders) refuse(core, hres, rec, started, refusal);
      else answerThenStopUpload(res, () => refuse(core, hres, rec, started, refusal));
      return;
    }
    const { fields, trailers } = read as Exclude<typeof read, ProxyError>;
    rec.path = planned.path;
    const target = { scheme: 'https', host: t.host, port: t.port, pathAndQuery: planned.pathAndQuery, logPath: planned.path, decision: 'intercept', rule: planned.rule, client: t.client, h2: { fields, body: !req.stream.endAfterHeaders, trailers } } as const;
    // The upstream request starts after the rest of what arrived with this header block has been
    // read: a stream the client resets in the same read (rapid reset, CVE-2023-44487) is then
    // already closed and costs no upstream request, and nghttp2's reset-rate limit ends such a
    // connection after its burst at the speed of parsing, not of a thousand upstream dials.
    setImmediate(() => {
      if (req.stream.destroyed) {
        rec.status = 499;
        rec.error = 'client closed the connection';
        finishRecord(core, rec, started);
        return;
      }
      forward(core, hreq, hres, target, rec, started);
    });
  });

  return {
    name: 'h2',
    serve(socket: TLSSocket, t: TunnelTarget) {
      pending = t;
      // A TLSSocket built by hand (intercept.ts) still says `secureConnecting` after its server
      // handshake ('secure'); Node's http2 session would wait for a 'secureConnect' that a server
      // socket never emits. tls.Server clears the same flag for the sockets it hands out.
      (socket as TLSSocket & { secureConnecting: boolean }).secureConnecting = false;
      try {
        inner.emit('connection', socket);
      } finally {
        pending = undefined;
      }
    },
    close() {
      inner.close();
    },
  };
}

/**
 * The compatibility response, made to say that its answer was all written only when it was: ended
 * by the proxy and its stream's writable side finished. forward.ts takes a response whose
 * `writableFinished` holds at its 'close' for one whose answer went out, and gives up the upstream
 * request only otherwise; node:http2's compatibility response reads its stream's flag, which
 * says nothing of the answer:
 * - a stream that closes before its answer can have its writable side finished by the close
 *   (Node's closeStream ends it; seen when nghttp2 resets a stream for a malformed trailer
 *   section), so it read as all written: the upstream request went on (one still waiting for an
 *   HTTP/1.1 connection was sent later), with a body whose readable side that close ended:
 *   complete and truncated at the origin;
 * - a HEAD stream has its writable side ended as soon as the request arrives (no answer body), so
 *   it read as all written before any answer; and its response emits 'close' only once its answer
 *   was ended (onStreamCloseResponse compares the stream's `headRequest` with the one res.end()
 *   records), so a HEAD stream closed first never told forward.ts at all: the stream's close tells it.
 */
function answerDoneOnlyWhenEnded(stream: Http2ServerRequest['stream'], res: Http2ServerResponse): void {
  Object.defineProperty(res, 'writableFinished', { configurable: true, get: () => res.writableEnded && stream.writableFinished });
  let told = false;
  res.once('close', () => (told = true));
  stream.once('close', () => {
    if (!told) res.emit('close');
  });
}
