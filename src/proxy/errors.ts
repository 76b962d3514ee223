import type { ServerResponse } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Every response the proxy produces itself is built here, so that every refusal looks the same:
 * a status, a one-line plain-text reason, and `Proxy-Status` (RFC 9209) naming keygate as its
 * source. Reasons are fixed sentences plus normalised host names and error codes: never a header
 * value.
 */
export class ProxyError extends Error {
  constructor(
    readonly status: number,
    /** RFC 9209 proxy error type. */
    readonly type: string,
    readonly reason: string,
  ) {
    super(reason);
    this.name = 'ProxyError';
  }
}

export const malformed = (reason: string) => new ProxyError(400, 'http_request_error', reason);
export const refused = (reason: string) => new ProxyError(403, 'http_request_denied', reason);
export const misdirected = (reason: string) => new ProxyError(421, 'http_request_denied', reason);
/**
 * TRACE to an intercepted host: its answer reflects the request it received, injected headers
 * included, and keygate is the sender RFC 9110 9.3.8 forbids to put sensitive fields in one.
 */
export const reflecting = () => refused('TRACE is not forwarded to an intercepted host: its answer would reflect the injected credentials');

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

/** Answers an HTTP request with the proxy's own error (if nothing was sent yet). */
export function sendError(res: ServerResponse, err: ProxyError, close = false): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(err);
  const headers: Record<string, string | number> = {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'proxy-status': proxyStatus(err),
    'cache-control': 'no-store',
  };
  if (close) headers.connection = 'close';
  res.writeHead(err.status, headers);
  res.end(body);
}

/** The whole response for a proxy error, as written on a raw connection. */
export function errorResponse(err: ProxyError, close: boolean): string {
  const body = errorBody(err);
  return (
    `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status] ?? 'Error'}\r\n` +
    'Content-Type: text/plain; charset=utf-8\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n` +
    `Proxy-Status: ${proxyStatus(err)}\r\n` +
    'Cache-Control: no-store\r\n' +
    (close ? 'Connection: close\r\n' : '') +
    '\r\n' +
    body
  );
}

/** How long a connection answered with a closing error may stay half-open while its client reads the answer. */
const LINGER_MS = 2000;

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
    inFlight.once('close', () => (inFlight.writableFinished ? writeRawError(socket, err) : socket.destroy()));
    return;
  }
  if (!socket.writable || socket.destroyed) {
    socket.destroy();
    return;
  }
  socket.end(errorResponse(err, true));
  const linger = setTimeout(() => socket.destroy(), LINGER_MS);
  socket.once('close', () => clearTimeout(linger));
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
    case 'EPIPE':
    case 'UND_ERR_SOCKET':
    case 'UND_ERR_CLOSED':
      return new ProxyError(502, 'connection_terminated', `upstream ${host} closed the connection`);
    case 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH':
      return new ProxyError(400, 'http_request_error', 'request body does not match its Content-Length');
    default:
      return new ProxyError(502, 'proxy_internal_error', `request to ${host} failed (${code})`);
  }
}
