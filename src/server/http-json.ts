/**
 * JSON over the hand-rolled `node:http` servers (`keygate app serve`, the proxy's admin listener,
 * the deployment router): the one JSON writer and the one bounded body reader. Refusals are the
 * typed errors of ./errors.ts (one mapping for every surface); ./http-errors.ts writes them.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { jsonErrorLocation } from '../validation/json.js';
import { HttpError, HttpValidationError, MAX_URL_LENGTH, URL_TOO_LONG } from './errors.js';

export { MAX_URL_LENGTH };

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

/** 414 for a request target over {@link MAX_URL_LENGTH}. */
export function checkUrlLength(req: IncomingMessage): void {
  if ((req.url ?? '').length > MAX_URL_LENGTH) throw new HttpError(414, URL_TOO_LONG);
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
 * The request's bytes, at most `maxBytes` of them (else `tooLarge()` is thrown). Reading stops at
 * once but the request is left intact (paused, not destroyed), so the refusal can still be
 * answered on its connection; the error writer drops the rest (./http-errors.ts).
 */
function readBounded(req: IncomingMessage, maxBytes: number, tooLarge: () => Error): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (err?: Error) => {
      req.off('data', onData).off('end', onEnd).off('error', onError).off('close', onClose);
      if (err) {
        req.pause();
        reject(err);
      } else resolve(Buffer.concat(chunks, size));
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBytes) return done(tooLarge());
      chunks.push(chunk);
    };
    const onEnd = () => done();
    const onError = (err: Error) => done(err);
    const onClose = () => done(new Error('The client closed the request before its body arrived.'));
    req.on('data', onData).once('end', onEnd).once('error', onError).once('close', onClose);
  });
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
    throw new HttpError(415, 'Unsupported media type: send Content-Type: application/json.');
  }
  const tooLarge = () => new HttpError(413, opts.tooLarge ?? `Request body too large (limit ${opts.maxBytes} bytes).`);
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > opts.maxBytes) throw tooLarge();

  const bytes = await readBounded(req, opts.maxBytes, tooLarge);
  if (bytes.length === 0) return undefined; // chunked with no data: no body either

  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw new HttpValidationError([{ loc: ['body'], msg: 'JSON decode error: the body is not valid UTF-8', type: 'json_invalid' }]);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new HttpValidationError([{ loc: ['body'], msg: `JSON decode error at ${jsonErrorLocation(text, err)}`, type: 'json_invalid' }]);
  }
}

/** The 422 for a route whose body is required but absent. */
export const bodyMissing = () => new HttpValidationError([{ loc: ['body'], msg: 'Field required', type: 'missing' }]);
