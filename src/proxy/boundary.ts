import type http from 'node:http';
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { formatAuthority } from '../rules/host.js';
import type { ProxyCore, TunnelTarget } from './context.js';
import { chunkExtensionsTooLarge, endThenLinger, headTimeout, malformed, ProxyError, writeRawError } from './errors.js';
import { HeadLines, headOverflowAnswer, type ProxyLimits } from './limits.js';
import type { RequestFacts } from './plan.js';

/**
 * What the data-path steps share, built once by startProxy: the core (configuration snapshot,
 * upstream, log, events), the limits, the intercepted tunnels by socket, and the boundary of
 * Node's HTTP parser (below).
 */
export interface DataPath {
  core: ProxyCore;
  limits: ProxyLimits;
  /** The CONNECT target of each intercepted (TLS) socket. */
  tunnels: WeakMap<Duplex, TunnelTarget>;
  /** Counts a socket as open until it closes (graceful close waits for them). */
  track(s: Duplex): void;
  /** The idle clock of a socket Node's server handed over (CONNECT, upgrade). */
  idleGuard(s: Duplex): void;
  /** An egress refusal from the plan step is logged and emitted (the plan itself has no side effects). */
  reportRefusal<T>(planned: T | ProxyError): T | ProxyError;
  boundary: NodeBoundary;
}

export function clientOf(socket: Socket): string {
  return socket.remoteAddress ? formatAuthority(socket.remoteAddress.replace(/^::ffff:/, ''), socket.remotePort ?? 0) : 'unknown';
}

/**
 * A request the proxy refuses closes its connection: after a framing or size error the
 * connection's framing cannot be trusted, and after a refusal of the request's target, method
 * or destination nothing pipelined behind it is acted on either (RFC 9110 15.5.20: a 421 is
 * retried on another connection anyway).
 */
export const REFUSAL_CLOSES = true;

/**
 * What the plan step needs of a request Node's parser read. That parser reads HTTP/1.x only: a
 * request line saying `HTTP/2.0` (llhttp accepts the version, for HTTP/2's `PRI * HTTP/2.0`
 * preface) is no HTTP/2 request, and its version is reported as none the plan accepts (400), as
 * HTTP/1.2 is. Taken for version 20, it was forwarded (with the rule's headers in a tunnel).
 */
export function factsOf(req: IncomingMessage): RequestFacts {
  const version = req.httpVersionMajor === 1 ? 10 + req.httpVersionMinor : req.httpVersionMajor === 0 ? req.httpVersionMinor : 0;
  return { method: req.method ?? '', target: req.url ?? '', version, rawHeaders: req.rawHeaders };
}

/**
 * The request lists `close` in Connection (or Proxy-Connection, which Node's parser reads as
 * Connection). Node's parser lets an HTTP/1.0 request's `keep-alive` win over its `close` (both
 * said: `Connection: close, keep-alive`, or `Connection: close` with `Proxy-Connection:
 * keep-alive`) and went on reading the connection: a request pipelined behind it was forwarded.
 * RFC 9112 9.6: after `close`, the connection ends with this answer and no further request is
 * processed; the servers' handlers end it (`res.shouldKeepAlive = false`), as the fast path does.
 */
export function asksToClose(req: IncomingMessage): boolean {
  const raw = req.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    if (name !== 'connection' && name !== 'proxy-connection') continue;
    for (const t of raw[i + 1].split(',')) if (t.trim().toLowerCase() === 'close') return true;
  }
  return false;
}

/** Options for both HTTP servers: the parser strict whatever NODE_OPTIONS says, sizes and clocks from the limits. */
export function serverOptions(l: ProxyLimits): http.ServerOptions {
  return {
    insecureHTTPParser: false,
    // Node would answer a missing Host itself, outside the proxy's checks (no Proxy-Status, and a
    // request pipelined behind it would still be acted on): the checks answer it instead.
    requireHostHeader: false,
    maxHeaderSize: l.maxHeaderBytes,
    requestTimeout: 0, // uploads and streams may be long: only idle clocks apply to them
    headersTimeout: l.headerTimeoutMs,
    keepAliveTimeout: l.keepAliveTimeoutMs,
    // Node checks head timeouts on this interval: a quarter of the timeout keeps the answer close to it.
    connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(l.headerTimeoutMs / 4))),
  };
}

/**
 * Runs `go` once every answer to an earlier request on this connection has been written: Node's
 * server hands over a CONNECT or an upgrade as soon as it parses it, while the response to a
 * request pipelined before it may still be on its way (or queued behind another). Answers go out
 * in request order (RFC 9112 9.3.2), so the 200 of a CONNECT or an upgrade's 101 waits for them
 * (writeRawError does the same for refusals). A connection whose earlier answer was cut is closed.
 */
export function afterEarlierAnswers(socket: Duplex, go: () => void): void {
  const inFlight = (socket as { _httpMessage?: http.ServerResponse | null })._httpMessage;
  if (!inFlight || inFlight.writableFinished || inFlight.destroyed) return go();
  // 'close' follows 'finish' by a tick: Node has given the connection to the next queued answer by then.
  inFlight.once('close', () => (inFlight.writableFinished ? afterEarlierAnswers(socket, go) : socket.destroy()));
}

/**
 * A client may end its side of the connection once its last request is sent and still read
 * every answer (RFC 9112 9.6). Node's server, by default, drops the requests it has read and
 * closes on that end: they are answered instead, in order, and the connection closes after the
 * last one (Node's `httpAllowHalfOpen`, not a constructor option).
 */
export function answerAfterHalfClose(server: http.Server): void {
  (server as http.Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
}

/**
 * Node's server ends a connection after a closing answer (`Connection: close`: a refusal, an
 * answer that came before the request's body had all arrived) with `socket.destroySoon()`: its
 * end, then a destroy as soon as that is written, which resets a client still sending before it
 * has read the answer (seen: a client uploading a chunked body got EPIPE and never the 421 or
 * the 413). Each connection the server takes instead ends its side and lingers
 * (endThenLinger), as the fast path and the raw refusals do; a request read meanwhile is
 * never acted on (the connection counts as answered).
 */
export function lingerAfterClosingAnswers(server: http.Server, boundary: NodeBoundary): void {
  server.on('connection', (socket: Socket) => {
    socket.destroySoon = () => boundary.closeAfterAnswer(socket);
  });
}

/** Responses whose client asked for `100 Continue` and has not had it yet (continueIfOwed). */
const owedContinue = new WeakSet<object>();

/**
 * Node's servers (HTTP/1.1 and node:http2's compatibility layer) answer expectations before the
 * proxy's checks; both kinds go to the server's 'request' handler instead, where the plan decides:
 * - an `Expect` other than `100-continue`: Node answered its own 417 and went on reading the
 *   connection (a request pipelined behind it was forwarded, credential included); the plan step
 *   refuses it and the connection closes;
 * - `Expect: 100-continue`: Node sent `100 Continue` at once, so a client was told to send a body
 *   that the proxy's refusal (a 421, a 400 path, an egress refusal after DNS) then read and
 *   dropped. The 100 is owed instead, and sent when the upstream starts reading the body
 *   (forward.ts); a refusal is the client's only answer, and it sends no body.
 */
export function checkExpectationsInPlan(server: { on(event: string, listener: (...args: never[]) => void): unknown; emit(event: string, ...args: unknown[]): boolean }): void {
  server.on('checkExpectation', (req: unknown, res: unknown) => server.emit('request', req, res));
  server.on('checkContinue', (req: ExpectingRequest, res: { writeContinue(): void }) => {
    // No body to wait for: nothing is owed. HTTP/1.1 gets its 100 at once all the same: Node's
    // server closes the connection after an answer sent without the 100 asked for (it cannot know
    // whether a body follows), which dropped a request pipelined behind a bodiless one.
    if (!announcesBody(req)) {
      if (!req.stream) res.writeContinue();
    } else owedContinue.add(res);
    server.emit('request', req, res);
  });
}

export interface ExpectingRequest {
  headers: Record<string, string | string[] | undefined>;
  /** HTTP/2 (node:http2's compatibility request). */
  stream?: { endAfterHeaders: boolean };
}

/** Whether a body follows the head: HTTP/1.1 by its framing fields, HTTP/2 unless the head ended the stream. */
export function announcesBody(req: ExpectingRequest): boolean {
  if (req.stream) return !req.stream.endAfterHeaders;
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

/** Sends the `100 Continue` a client asked for (checkExpectationsInPlan), once. */
export function continueIfOwed(res: { writeContinue(): void }): void {
  if (owedContinue.delete(res)) res.writeContinue();
}

type ParserError = NodeJS.ErrnoException & { rawPacket?: Buffer; bytesParsed?: number };

/** The answer to a request Node's parser refused (or timed out). */
function clientErrorResponse(err: ParserError, l: ProxyLimits, lines: HeadLines = new HeadLines()): ProxyError {
  // A head over the limit is its overflow's answer, whether the parser saw that or a bad byte first.
  if (lines.overflowed(err.code, l.maxHeaderBytes, err.rawPacket, err.bytesParsed)) return headOverflowAnswer(lines, l, err.rawPacket, err.bytesParsed);
  switch (err.code) {
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return headTimeout();
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return chunkExtensionsTooLarge();
    default:
      return malformed(`malformed HTTP request (${/^HPE_[A-Z_]+$/.test(err.code ?? '') ? err.code : 'parse error'})`);
  }
}

/**
 * The boundary of Node's HTTP parser, shared by the listener's server and the Node exchange's:
 * which connections the proxy has answered with a closing refusal (nothing they send from then
 * on is acted on: a pipelined request, a CONNECT, an upgrade), the lines of each connection's
 * heads (a 414 or 431 that does not depend on segmentation), and the answer to a parse error.
 */
export class NodeBoundary {
  private readonly answered = new WeakSet<Duplex>();
  private readonly lines = new WeakMap<Duplex, { lines: HeadLines; listener: (chunk: Buffer) => void }>();

  constructor(
    private readonly core: ProxyCore,
    private readonly limits: ProxyLimits,
    private readonly tunnels: WeakMap<Duplex, TunnelTarget>,
  ) {}

  /** The connection was answered with a closing refusal. */
  answer(socket: Duplex): void {
    this.answered.add(socket);
  }

  isAnswered(socket: Duplex): boolean {
    return this.answered.has(socket);
  }

  /**
   * Our end of a connection after its last answer, then a linger (endThenLinger): what Node's
   * server does after a closing answer (lingerAfterClosingAnswers), and what a socket handed over
   * (CONNECT, upgrade) after the proxy's closing answer gets. Nothing read meanwhile is acted on.
   */
  closeAfterAnswer(socket: Duplex): void {
    this.answered.add(socket);
    endThenLinger(socket);
  }

  /**
   * A socket Node's server handed over (CONNECT, upgrade) on a connection already answered with
   * a closing refusal: nothing from it is acted on, and the connection ends once the answers
   * still owed to the requests before it have gone out (Node writes them in order: a forwarded
   * request's, then the refusal). Ended at once, they were lost, though the origin had acted on
   * the forwarded one.
   */
  closeAfterEarlierAnswers(socket: Duplex): void {
    this.answered.add(socket);
    afterEarlierAnswers(socket, () => endThenLinger(socket));
  }

  /** Follows a connection's lines from its first byte (a later 'data' listener than the parser's). */
  follow(socket: Duplex): void {
    const l = new HeadLines();
    const listener = (chunk: Buffer) => l.feed(chunk);
    this.lines.set(socket, { lines: l, listener });
    socket.on('data', listener);
  }

  /** Node's parser no longer reads this socket (CONNECT, upgrade). */
  stopFollowing(socket: Duplex): void {
    const l = this.lines.get(socket);
    if (!l) return;
    socket.off('data', l.listener);
    this.lines.delete(socket);
  }

  /** The servers' 'clientError': the proxy's answer to what the parser refused, once per connection. */
  readonly onClientError = (err: ParserError, socket: Duplex): void => {
    // Node's parser reports its error again for every chunk that follows: the first answer stands
    // (destroying the socket here would drop that answer before it is flushed).
    if (this.answered.has(socket)) return;
    if (err.code === 'ECONNRESET' || !socket.writable) return void socket.destroy();
    this.answered.add(socket);
    const perr = clientErrorResponse(err, this.limits, this.lines.get(socket)?.lines);
    const client = this.tunnels.get(socket)?.client ?? clientOf(socket as Socket);
    this.core.events.emit('client_error', { client, code: err.code ?? 'UNKNOWN', status: perr.status });
    this.core.logger.info({ type: 'client_error', client, code: err.code, status: perr.status }, 'refused a request the parser rejected');
    writeRawError(socket, perr);
  };
}
