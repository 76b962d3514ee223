import type { ServerResponse } from 'node:http';
import { STATUS_CODES } from '../node-http.js';
import type { Duplex } from 'node:stream';
import { RESET_IN_BODY } from './undici-reset.js';

/**
 * Every error the proxy produces itself comes from this module, and every answer it writes for
 * one is rendered here, so that every refusal looks the same: a status, a one-line plain-text
 * reason, and `Proxy-Status` (RFC 9209) naming keygate as its source. Reasons are fixed
 * sentences plus normalised host names and error codes: never a header value.
 *
 * Each error has a stable `code` (as undici's `UND_ERR_*`), for tests, metrics and callers that
 * must tell errors apart without parsing sentences.
 */
export type ProxyErrorCode =
  | 'KEYGATE_MALFORMED'
  | 'KEYGATE_REFUSED'
  | 'KEYGATE_MISDIRECTED'
  | 'KEYGATE_REFLECTING_METHOD'
  | 'KEYGATE_EXPECTATION_FAILED'
  | 'KEYGATE_HEAD_TOO_LARGE'
  | 'KEYGATE_URI_TOO_LONG'
  | 'KEYGATE_CHUNK_EXTENSIONS_TOO_LARGE'
  | 'KEYGATE_HEAD_TIMEOUT'
  | 'KEYGATE_OVERLOADED'
  | 'KEYGATE_SHUTTING_DOWN'
  | 'KEYGATE_EGRESS_DENIED'
  | 'KEYGATE_INTERNAL'
  | 'KEYGATE_UPSTREAM';

export class ProxyError extends Error {
  constructor(
    readonly status: number,
    /** RFC 9209 proxy error type. */
    readonly type: string,
    readonly reason: string,
    readonly code: ProxyErrorCode = status >= 500 ? 'KEYGATE_UPSTREAM' : 'KEYGATE_MALFORMED',
  ) {
    super(reason);
    this.name = 'ProxyError';
  }
}

export const malformed = (reason: string) => new ProxyError(400, 'http_request_error', reason, 'KEYGATE_MALFORMED');
export const refused = (reason: string) => new ProxyError(403, 'http_request_denied', reason, 'KEYGATE_REFUSED');
export const misdirected = (reason: string) => new ProxyError(421, 'http_request_denied', reason, 'KEYGATE_MISDIRECTED');
/**
 * TRACE (TRACK, or a method override asking for one) to an intercepted host: its answer
 * reflects the request it received, injected headers included, and keygate is the sender RFC 9110 9.3.8 forbids to put sensitive fields in one.
 */
export const reflecting = () => new ProxyError(403, 'http_request_denied', 'TRACE (or a request asking to be treated as TRACE or TRACK) is not forwarded to an intercepted host: its answer would reflect the injected credentials', 'KEYGATE_REFLECTING_METHOD');
/** An `Expect` other than `100-continue` (RFC 9110 10.1.1): Node answered it itself, without closing, before the checks. */
export const expectationFailed = () => new ProxyError(417, 'http_request_error', 'only Expect: 100-continue is accepted', 'KEYGATE_EXPECTATION_FAILED');
export const tooLarge = (reason: string) => new ProxyError(431, 'http_request_error', reason, 'KEYGATE_HEAD_TOO_LARGE');
export const uriTooLong = (reason: string) => new ProxyError(414, 'http_request_error', reason, 'KEYGATE_URI_TOO_LONG');
export const chunkExtensionsTooLarge = () => new ProxyError(413, 'http_request_error', 'chunk extensions too large', 'KEYGATE_CHUNK_EXTENSIONS_TOO_LARGE');
export const headTimeout = () => new ProxyError(408, 'http_request_error', 'request head not received in time', 'KEYGATE_HEAD_TIMEOUT');
export const overloaded = (reason: string) => new ProxyError(503, 'proxy_internal_response', reason, 'KEYGATE_OVERLOADED');
export const shuttingDown = () => new ProxyError(503, 'proxy_internal_response', 'proxy is shutting down', 'KEYGATE_SHUTTING_DOWN');
/** An origin's answer the proxy does not relay (answer.ts, or a parser's refusal): the same 502 on every path. `why` is a fixed sentence. */
export const invalidAnswer = (host: string, why: string) => new ProxyError(502, 'http_protocol_error', `upstream ${host} sent an invalid response (${why})`);
export const internal = (reason: string) => new ProxyError(500, 'proxy_internal_error', reason, 'KEYGATE_INTERNAL');

function clean(reason: string): string {
  // Printable ASCII only: the reason goes into a header and must stay one line.
  return reason.replace(/[^\x20-\x7e]/g, '?').slice(0, 300);
}

export function proxyStatus(err: ProxyError): string {
  return `keygate; error=${err.type}; details="${clean(err.reason).replace(/["\\]/g, '\\$&')}"`;
}

export function errorBody(err: ProxyError): string {
  return `${clean(err.reason)}\n`;
}

/** The header fields of a proxy error's answer, as `[name, value]` pairs: one list for both renderings below. */
function errorFields(err: ProxyError, body: string, close: boolean): [string, string][] {
  const fields: [string, string][] = [
    ['Content-Type', 'text/plain; charset=utf-8'],
    ['Content-Length', String(Buffer.byteLength(body))],
    ['Proxy-Status', proxyStatus(err)],
    ['Cache-Control', 'no-store'],
  ];
  if (close) fields.push(['Connection', 'close']);
  return fields;
}

/** Answers an HTTP request (Node's server) with the proxy's own error (if nothing was sent yet). */
export function sendError(res: ServerResponse, err: ProxyError, close = false): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(err);
  res.writeHead(err.status, errorFields(err, body, close).flat());
  res.end(body);
}

/** The whole response for a proxy error, as written on a raw connection (and by the fast path). */
export function errorResponse(err: ProxyError, close: boolean): string {
  const body = errorBody(err);
  let head = `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status] ?? 'Error'}\r\n`;
  for (const [name, value] of errorFields(err, body, close)) head += `${name}: ${value}\r\n`;
  return head + '\r\n' + body;
}

/** How long a connection answered with a closing error may stay half-open while its client reads the answer. */
const LINGER_MS = 2000;
/** How long the tail of a last answer may wait for a client that reads slowly (or not at all). */
const TAIL_MS = 30_000;

/**
 * Answers on a raw socket (CONNECT refusals, failed upgrades, parse errors) and closes it: the
 * answer, then our end of the connection; the client's end is waited for a moment, so that a
 * client still sending (a huge head) reads the answer instead of a reset.
 */
export function writeRawError(socket: Duplex, err: ProxyError): void {
  // A response to an earlier, complete request on this connection still being written (a
  // pipelined request refused behind it): answers go out in request order, so this one waits for
  // it. An error in the body of the request being answered is that request's: it goes out now.
  const inFlight = (socket as { _httpMessage?: ServerResponse | null })._httpMessage;
  if (inFlight && inFlight.req?.complete && !inFlight.writableFinished && !inFlight.destroyed) {
    // Node's server ends the connection in its own 'finish' handler when that answer is the
    // connection's last (`_last`): after a client's half-close (RFC 9112 9.6: it still reads
    // every answer), the last one queued is. Waiting for 'close' then found the connection ended
    // and this answer was lost. Written first instead, before that handler, unless the answer in
    // flight itself closes the connection (the client asked for it, or the proxy: nothing after
    // it is answered). With answers still queued behind it, 'close' hands over to the next one.
    let written = false;
    inFlight.prependOnceListener('finish', () => {
      if (!(inFlight as { _last?: boolean })._last || !inFlight.shouldKeepAlive || !socket.writable || socket.destroyed) return;
      written = true;
      socket.end(errorResponse(err, true));
      endThenLinger(socket);
    });
    inFlight.once('close', () => {
      if (written) return;
      if (inFlight.writableFinished) writeRawError(socket, err);
      else socket.destroy();
    });
    return;
  }
  if (!socket.writable || socket.destroyed) {
    socket.destroy();
    return;
  }
  socket.end(errorResponse(err, true));
  endThenLinger(socket);
}

/**
 * The end of a connection after its last answer (handed to the socket): ends the proxy's side
 * if the caller has not, goes on reading, and dropping, what the client still sends, then
 * destroys the socket LINGER_MS
 * after everything it was to write has gone out (its 'finish'). Destroyed at once, a socket with
 * bytes it has not read resets the connection, and a client still sending (a body or a head
 * nobody reads) may lose the answer it has not read yet (RFC 9112 9.6). Counted from the end
 * instead of from 'finish', the clock cut the tail of an answer still queued for a client that
 * reads slowly. A client that does not read at all holds the connection for TAIL_MS at most, and
 * one that never sends its FIN no longer than the linger: neither keeps it until some idle clock.
 */
export function endThenLinger(socket: Duplex): void {
  if (socket.destroyed) return;
  if (socket.writable) socket.end();
  const destroy = () => socket.destroy();
  let clock = setTimeout(destroy, socket.writableFinished ? LINGER_MS : TAIL_MS);
  if (!socket.writableFinished) {
    socket.once('finish', () => {
      clearTimeout(clock);
      clock = setTimeout(destroy, LINGER_MS);
    });
  }
  socket.once('close', () => clearTimeout(clock));
  socket.resume();
}

/**
 * The codes of the failures below the proxy that keygate's own code reports (a connection closed
 * or reset, a DNS answer missing, a clock run out, its HTTP/2 client's states), named as Node and
 * undici name them, so upstreamError maps one the same whether Node, undici or keygate saw it.
 */
export type LayerCode =
  | 'ECONNRESET'
  | 'ETIMEDOUT'
  | 'ENOTFOUND'
  | 'UND_ERR_SOCKET'
  | 'UND_ERR_CLOSED'
  | 'UND_ERR_DESTROYED'
  | 'UND_ERR_ABORTED'
  | 'UND_ERR_CONNECT_TIMEOUT'
  | 'UND_ERR_HEADERS_TIMEOUT'
  | 'UND_ERR_BODY_TIMEOUT';

/** A failure below the proxy, as keygate's own code reports it (see LayerCode); `message` is a fixed sentence plus host names. */
export function layerError(message: string, code: LayerCode): Error & { code: LayerCode } {
  return Object.assign(new Error(message), { code });
}

const TLS_CERT_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_REVOKED',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'CERT_SIGNATURE_FAILURE',
  'INVALID_CA',
  'ERR_TLS_CERT_ALTNAME_INVALID',
  'HOSTNAME_MISMATCH',
]);

function codeOf(err: unknown): string | undefined {
  const e = err as { code?: unknown; cause?: { code?: unknown } } | undefined;
  const code = typeof e?.code === 'string' ? e.code : undefined;
  if (code && code !== 'UND_ERR_SOCKET' && code !== 'UND_ERR_CONNECT') return code;
  return typeof e?.cause?.code === 'string' ? e.cause.code : code;
}

/** Maps an upstream failure (undici, net, tls) to the proxy's answer: 502, or 504 for timeouts. */
export function upstreamError(err: unknown, host: string): ProxyError {
  if (err instanceof ProxyError) return err;
  const code = codeOf(err) ?? 'UNKNOWN';
  if (TLS_CERT_CODES.has(code)) {
    return new ProxyError(502, 'tls_certificate_error', `upstream TLS certificate of ${host} not trusted (${code})`);
  }
  if (code.startsWith('ERR_SSL') || code.startsWith('ERR_TLS') || code === 'EPROTO') {
    return new ProxyError(502, 'tls_protocol_error', `TLS handshake with ${host} failed (${code})`);
  }
  // undici's parser (llhttp) refusing the answer: the same failure the fast path reports as
  // http_protocol_error. Its errors carry an HPE_ code, or none at all (then only their name
  // says what they are); the bytes they quote (`data`) are the origin's and stay out of the reason.
  if (code.startsWith('HPE_') || (err as { name?: unknown } | undefined)?.name === 'HTTPParserError' || code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH') {
    return new ProxyError(502, 'http_protocol_error', `upstream ${host} sent an invalid response (${code === 'UNKNOWN' ? 'not HTTP' : code})`);
  }
  // undici's own bound on an answer head (Agent maxHeaderSize, the answer check's limit).
  if (code === 'UND_ERR_HEADERS_OVERFLOW') return invalidAnswer(host, 'response head too large');
  switch (code) {
    case 'ECONNREFUSED':
      return new ProxyError(502, 'connection_refused', `upstream ${host} refused the connection`);
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
    case 'EAI_FAIL':
      return new ProxyError(502, 'dns_error', `cannot resolve ${host} (${code})`);
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
    case 'EADDRNOTAVAIL':
      return new ProxyError(502, 'destination_unavailable', `upstream ${host} unreachable (${code})`);
    case 'ETIMEDOUT':
    case 'UND_ERR_CONNECT_TIMEOUT':
      return new ProxyError(504, 'connection_timeout', `connecting to ${host} timed out`);
    case 'UND_ERR_HEADERS_TIMEOUT':
      return new ProxyError(504, 'http_response_timeout', `upstream ${host} did not answer in time`);
    case 'UND_ERR_BODY_TIMEOUT':
      return new ProxyError(504, 'connection_read_timeout', `upstream ${host} stalled`);
    case 'ECONNRESET':
    case RESET_IN_BODY:
    case 'EPIPE':
    case 'UND_ERR_SOCKET':
    case 'UND_ERR_CLOSED':
      return new ProxyError(502, 'connection_terminated', `upstream ${host} closed the connection`);
    case 'UND_ERR_DESTROYED':
      // The proxy's own upstream clients were destroyed under the request: its shutdown.
      return shuttingDown();
    case 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH':
      return new ProxyError(400, 'http_request_error', 'request body does not match its Content-Length');
    default:
      return new ProxyError(502, 'proxy_internal_error', `request to ${host} failed (${code})`);
  }
}
