import type { IncomingMessage, ServerResponse } from 'node:http';
import http, { STATUS_CODES } from '../node-http.js';
import type { Duplex, Readable } from 'node:stream';
import type { Server } from 'node:net';
import { errorResponse, type ErrorResponse } from './errors.js';
import { followHeadLines, headLinesOf } from './head-lines.js';
import { sendJson } from './http-json.js';

/**
 * Writing the error layer's answers ({@link errorResponse}) on a plain node:http server (`app
 * serve`, the proxy's admin listener, the deployment router), and on a socket whose request Node's
 * HTTP parser refused before any handler saw it (431, 414, 408, 400). The fastify surfaces use the
 * same mapping and the same `clientError` handler (src/server/app.ts).
 */

/** A request body left unread after a refusal is read and dropped up to this many bytes... */
const DISCARD_MAX_BYTES = 64 * 1024 * 1024;
/** ...for at most this long; past either bound the connection is cut. */
const DISCARD_MAX_MS = 10_000;

/** Writes `r` as the response, or cuts the connection when a response has already started. */
export function writeErrorResponse(res: ServerResponse, r: ErrorResponse): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  sendJson(res, r.status, r.body, r.headers);
}

/**
 * Answers an error a handler threw, through {@link errorResponse}: a typed error as it says,
 * anything else as a 500 that names nothing. After headers went out nothing can be said any more,
 * so the connection is cut: the client sees a truncated response, never a second status. Returns
 * the answer (its `internal` flag is the caller's cue to log the error).
 *
 * A refusal that leaves the request's body unread (401, 413, 415...) ends the connection: what is
 * left of the body must not be parsed as the next request.
 */
export function sendError(req: IncomingMessage, res: ServerResponse, err: unknown): ErrorResponse {
  const r = { ...errorResponse(err) }; // a copy: the answer may get a header below
  const unread = !res.headersSent && !req.complete && !req.destroyed;
  if (unread) {
    r.headers = { ...r.headers, Connection: 'close' };
    lingerIfUnread(req);
  }
  writeErrorResponse(res, r);
  return r;
}

/**
 * For an answer that closes the connection before the request's body was read: the rest of the
 * body is read and dropped before the socket closes (see {@link lingerBeforeClosing}), unless it
 * is declared larger than is worth reading. The fastify surfaces call it for their own closing
 * answers (fastify's 413 for a declared length over the limit says `Connection: close`).
 */
export function lingerIfUnread(req: IncomingMessage): void {
  if (req.complete || req.destroyed) return;
  if (Number(req.headers['content-length']) > DISCARD_MAX_BYTES) return;
  lingerBeforeClosing(req);
}

/**
 * Closes a `Connection: close` answer's socket only after the rest of the request body arrived
 * (read and dropped, within {@link DISCARD_MAX_BYTES} and {@link DISCARD_MAX_MS}). Node destroys
 * the socket as soon as the answer is written; while the client is still sending, that resets the
 * connection, and a reset can discard the answer before the client reads it (the app's 413 became
 * the router's 502). Here only the write side ends with the answer; the socket is destroyed when
 * the body ended, the client closed, or a bound was hit.
 */
function lingerBeforeClosing(req: IncomingMessage): void {
  const socket = req.socket as IncomingMessage['socket'] & { destroySoon?: () => void };
  // Node's server calls destroySoon() once a `Connection: close` response is finished.
  socket.destroySoon = () => {
    socket.end();
    closeAfterDraining(socket, req.complete ? undefined : req);
  };
}

/**
 * The bounded wait of both closing paths (a refusal before the body was read, a parser refusal):
 * what still arrives on `body` (the request, or the raw socket whose parser gave up) is read and
 * dropped; once it ended, or the client closed its side, `socket` is destroyed as soon as the
 * answer is flushed (destroy() would drop unsent bytes). Past {@link DISCARD_MAX_BYTES} or
 * {@link DISCARD_MAX_MS} it is cut. No `body`: nothing more to read, close once flushed.
 */
function closeAfterDraining(socket: Duplex, body: Readable | undefined): void {
  const cut = () => {
    clearTimeout(timer);
    socket.destroy();
  };
  const close = () => (socket.writableFinished ? cut() : socket.once('finish', cut));
  const timer = setTimeout(cut, DISCARD_MAX_MS).unref();
  let left = DISCARD_MAX_BYTES;
  socket.once('close', () => clearTimeout(timer));
  socket.once('end', close);
  if (!body) {
    close();
    return;
  }
  body.removeAllListeners('data');
  body.on('data', (chunk: Buffer) => {
    left -= chunk.length;
    if (left < 0) cut();
  });
  if (body !== socket) {
    body.once('end', close);
    body.once('error', cut);
  }
  body.resume();
}

/** A complete HTTP/1.1 response for `r` that closes the connection (the parser state is lost). */
export function rawErrorResponse(r: ErrorResponse): string {
  const body = JSON.stringify(r.body);
  return (
    `HTTP/1.1 ${r.status} ${STATUS_CODES[r.status] ?? 'Error'}\r\n` +
    'Content-Type: application/json\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n` +
    'Cache-Control: no-store\r\n' +
    'Connection: close\r\n\r\n' +
    body
  );
}

/**
 * The `clientError` listener of every server: Node's parser refused the request (header overflow,
 * overlong request line, malformed request, timeout). Answered in the wire shape, then the socket
 * is closed. A socket whose current response already started cannot take another status line, so
 * it is only destroyed.
 */
export function onClientError(err: Error & { code?: string }, socket: Duplex): void {
  // Node's parser stays in its error state and reports again for every later chunk (or a timeout
  // fires): the answer is already going out and the socket is draining; nothing more to do.
  if (answered.has(socket)) return;
  // Node's own handler makes the same check: a response in flight on this socket has begun.
  const inFlight = (socket as Duplex & { _httpMessage?: ServerResponse })._httpMessage;
  if (err.code === 'ECONNRESET' || !socket.writable || inFlight?.headersSent) {
    socket.destroy();
    return;
  }
  // 414 or 431 from the lines of the connection (answerParserErrors follows them), not from how
  // the bytes arrived; so is a bad byte past the head's limit (the parser saw it or the overflow first).
  const lines = headLinesOf(socket);
  const parsed = err as { rawPacket?: unknown; bytesParsed?: number };
  const packet = Buffer.isBuffer(parsed.rawPacket) ? parsed.rawPacket : undefined;
  const limit = (socket as Duplex & { server?: { maxHeaderSize?: number } }).server?.maxHeaderSize ?? http.maxHeaderSize;
  const known = lines?.overflowed(err.code, limit, packet, parsed.bytesParsed) ? { code: 'HPE_HEADER_OVERFLOW', requestLineBytes: lines.requestLineBytes(packet, parsed.bytesParsed) } : err;
  answered.add(socket);
  socket.end(rawErrorResponse(errorResponse(known)));
  // What the client still sends (the rest of an oversized head, a body) is read and dropped until
  // it closes its side: closing over unread bytes in the kernel's receive queue sends a reset
  // instead of a FIN, and a reset can discard the answer before the client reads it (seen as no
  // answer at all when a long head arrived in small pieces). Node's own data handler goes: its
  // parser is in its error state and would only report the same error again.
  closeAfterDraining(socket, socket);
}

/** Sockets whose parser refusal has been answered (see {@link onClientError}). */
const answered = new WeakSet<Duplex>();

/**
 * Every plain node:http server's parser refusals (the admin listener, `app serve`, the deployment
 * router; fastify's `clientErrorHandler` is onClientError, with followHeadLines on its server):
 * answered in the wire shape, a head too large being a 414 or a 431 whatever its segmentation.
 */
export function answerParserErrors(server: Server): void {
  followHeadLines(server);
  server.on('clientError', onClientError);
}
