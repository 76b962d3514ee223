import { STATUS_CODES, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { errorResponse, type ErrorResponse } from './errors.js';

/**
 * Writing the error layer's answers on a plain node:http server (the deployment router, and the
 * hand-rolled servers), and on a socket whose request Node's HTTP parser refused before any
 * framework saw it (431 for oversized headers, 400 for malformed requests).
 */

/** Writes `r` as the response, or cuts the connection when a response has already started. */
export function writeErrorResponse(res: ServerResponse, r: ErrorResponse, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify(r.body);
  res.writeHead(r.status, { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/** A complete HTTP/1.1 response for `r` that closes the connection (the parser state is lost). */
export function rawErrorResponse(r: ErrorResponse): string {
  const body = JSON.stringify(r.body);
  return `HTTP/1.1 ${r.status} ${STATUS_CODES[r.status] ?? 'Error'}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

/**
 * The `clientError` listener of every server: Node's parser refused the request (header overflow,
 * malformed request line, timeout). Answered in the wire shape, then the socket is closed.
 */
export function onClientError(err: Error & { code?: string }, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  if (socket.writable) socket.end(rawErrorResponse(errorResponse(err)));
  // end() flushes the answer; destroy afterwards in case the peer never reads it.
  setTimeout(() => socket.destroy(), 1000).unref();
}
