/**
 * JSON over the hand-rolled `node:http` servers (the proxy's admin listener and `keygate app
 * serve`): one bounded body reader, one JSON writer, one error answer, and the answer to Node's own
 * parser refusals. Everything comes out in the wire.md shape: `{"detail": "sentence"}`, or 422
 * with `{"detail": [{loc, msg, type}]}`.
 *
 * The fastify surfaces get the same statuses from their own error handler (src/server/app.ts);
 * this module is for the servers that have no framework.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ValidationIssue } from '../validation/errors.js';
import { jsonErrorLocation } from '../validation/json.js';

/** A refusal a route wants answered as JSON with `status` (and maybe extra headers). */
export class HttpProblem extends Error {
  constructor(
    readonly status: number,
    readonly body: { detail: string | ValidationIssue[] },
    readonly headers: Record<string, string> = {},
  ) {
    super(typeof body.detail === 'string' ? body.detail : body.detail.map((i) => i.msg).join('; '));
    this.name = 'HttpProblem';
  }

  /** True when the connection must not carry another request (a body was left unread). */
  get closesConnection(): boolean {
    return this.headers.Connection === 'close';
  }
}

/** `{"detail": sentence}` with `status`. */
export const problem = (status: number, sentence: string, headers?: Record<string, string>) => new HttpProblem(status, { detail: sentence }, headers);
/** 422 with the issues' exact `loc`s. */
export const invalid = (issues: ValidationIssue[]) => new HttpProblem(422, { detail: issues });

/** Longer request targets are refused with 414 (Node itself only bounds the whole header block). */
export const MAX_URL_LENGTH = 8 * 1024;

/** The one JSON writer: status, `application/json`, exact length, never cached. */
export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': String(Buffer.byteLength(text)),
    'Cache-Control': 'no-store',
    ...headers,
  });
  res.end(text);
}

/**
 * Answers an error a handler threw: an {@link HttpProblem} as it says, anything else as a 500 that
 * names nothing (the caller logs it). After headers went out nothing can be said any more, so the
 * connection is cut: the client sees a truncated response, never a second status. Returns true
 * when the error was unexpected (the caller's cue to log it).
 */
export function sendError(req: IncomingMessage, res: ServerResponse, err: unknown): boolean {
  const unexpected = !(err instanceof HttpProblem);
  if (res.headersSent) {
    res.destroy();
    return unexpected;
  }
  if (err instanceof HttpProblem) {
    sendJson(res, err.status, err.body, err.headers);
    // A refused body that was not read must not be parsed as the next request on this connection.
    if (err.closesConnection) res.once('finish', () => req.destroy());
    return false;
  }
  sendJson(res, 500, { detail: 'Internal server error.' });
  return true;
}

/** 414 for a request target over {@link MAX_URL_LENGTH}. */
export function checkUrlLength(req: IncomingMessage): void {
  if ((req.url ?? '').length > MAX_URL_LENGTH) {
    throw problem(414, `Request URL too long (limit ${MAX_URL_LENGTH} bytes).`, { Connection: 'close' });
  }
}

/**
 * True when the request carries a body. Without `Transfer-Encoding` and with no or a zero
 * `Content-Length` there is none (RFC 9112 section 6.3), whatever `Content-Type` says.
 */
export function hasBody(req: IncomingMessage): boolean {
  if (req.headers['transfer-encoding'] !== undefined) return true;
  const len = req.headers['content-length'];
  return len !== undefined && len !== '0' && Number(len) !== 0;
}

/** `application/json`, `application/*+json`, or no type at all (read as JSON, as FastAPI does). */
export function isJsonContentType(value: string | undefined): boolean {
  if (value === undefined) return true;
  const type = value.split(';')[0].trim().toLowerCase();
  return type === 'application/json' || /^application\/[a-z0-9.+-]+\+json$/.test(type);
}

export interface ReadJsonOptions {
  /** Largest accepted body in bytes. */
  maxBytes: number;
  /** Sentence for the 413 (default names the limit). */
  tooLarge?: string;
}

/**
 * Reads a JSON body: `undefined` when the request has none (the caller decides whether that is a
 * 422 `missing`), else the parsed value. A body of another content type is 415; more than
 * `maxBytes` (declared or streamed) is 413 and stops reading at once; bytes that are not UTF-8 or
 * not JSON are 422 `json_invalid` with a line and column, never the parser's message (it quotes
 * the input, which may hold a secret).
 */
export async function readJsonBody(req: IncomingMessage, opts: ReadJsonOptions): Promise<unknown> {
  if (!hasBody(req)) return undefined;
  if (!isJsonContentType(req.headers['content-type'])) {
    throw problem(415, 'Unsupported media type: send Content-Type: application/json.', { Connection: 'close' });
  }
  const tooLarge = () => problem(413, opts.tooLarge ?? `Request body too large (limit ${opts.maxBytes} bytes).`, { Connection: 'close' });
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > opts.maxBytes) throw tooLarge();

  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > opts.maxBytes) throw tooLarge();
    chunks.push(chunk);
  }
  if (size === 0) return undefined; // chunked with no data: no body either

  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(chunks, size));
  } catch {
    throw invalid([{ loc: ['body'], msg: 'JSON decode error: the body is not valid UTF-8', type: 'json_invalid' }]);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw invalid([{ loc: ['body'], msg: `JSON decode error at ${jsonErrorLocation(text, err)}`, type: 'json_invalid' }]);
  }
}

/** The 422 for a route whose body is required but absent. */
export const bodyMissing = () => invalid([{ loc: ['body'], msg: 'Field required', type: 'missing' }]);

const REASONS: Record<number, string> = {
  400: 'Bad Request',
  408: 'Request Timeout',
  414: 'URI Too Long',
  431: 'Request Header Fields Too Large',
};

/**
 * What to answer when Node's HTTP parser refuses a request (pure, for testing): the status and
 * the sentence. `rawPacket` is what the parser had received; a header overflow whose request line
 * alone is over the URL limit is a 414, otherwise a 431.
 */
export function parserRefusal(err: { code?: string; rawPacket?: Buffer }): { status: number; detail: string } | null {
  switch (err.code) {
    case 'ECONNRESET':
      return null;
    case 'HPE_HEADER_OVERFLOW': {
      const raw = err.rawPacket;
      const eol = raw ? raw.indexOf('\r\n') : -1;
      const requestLine = raw ? (eol === -1 ? raw.length : eol) : 0;
      if (requestLine > MAX_URL_LENGTH) return { status: 414, detail: `Request URL too long (limit ${MAX_URL_LENGTH} bytes).` };
      return { status: 431, detail: 'Request header fields too large.' };
    }
    case 'ERR_HTTP_REQUEST_TIMEOUT':
    case 'HPE_HEADER_TIMEOUT':
      return { status: 408, detail: 'The request took too long to arrive.' };
    default:
      return { status: 400, detail: 'Malformed HTTP request.' };
  }
}

/**
 * The server's `clientError` listener: answers Node's parser refusals (431, 414, 408, 400) with a
 * JSON body and closes the connection, instead of Node's bare status line. A socket whose current
 * response already started cannot take another status line, so it is only destroyed.
 */
export function answerClientError(err: Error & { code?: string; rawPacket?: Buffer }, socket: Duplex): void {
  const refusal = parserRefusal(err);
  // Node's own handler makes the same check: a response in flight on this socket has begun.
  const inFlight = (socket as Duplex & { _httpMessage?: ServerResponse })._httpMessage;
  if (!refusal || !socket.writable || inFlight?.headersSent) {
    socket.destroy();
    return;
  }
  const body = JSON.stringify({ detail: refusal.detail });
  socket.end(
    `HTTP/1.1 ${refusal.status} ${REASONS[refusal.status]}\r\n` +
      'Content-Type: application/json\r\n' +
      `Content-Length: ${Buffer.byteLength(body)}\r\n` +
      'Cache-Control: no-store\r\n' +
      'Connection: close\r\n\r\n' +
      body,
  );
}
