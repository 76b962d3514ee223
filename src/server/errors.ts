import { ajvToIssues, type ValidationIssue } from '../validation/errors.js';

/**
 * The one error layer of every HTTP surface (wire.md, "Errors"): whatever went wrong, the client
 * gets `{"detail": "sentence"}` or, for a validation failure, `422 {"detail": [{loc, msg, type}]}`.
 * {@link errorResponse} is the single, pure mapping from an error (ours, fastify's, ajv's, Node's
 * HTTP parser's) to that answer; the servers only write what it returns.
 */

/** An error an API route wants answered as `{"detail": "sentence"}` with `status` (wire.md), maybe with headers (`Allow`, `WWW-Authenticate`). */
export class HttpError extends Error {
  readonly code: string;
  readonly headers: Record<string, string>;
  constructor(
    readonly status: number,
    readonly detail: string,
    opts: { code?: string; headers?: Record<string, string> } = {},
  ) {
    super(detail);
    this.name = 'HttpError';
    this.code = opts.code ?? `http_${status}`;
    this.headers = opts.headers ?? {};
  }
}

/** A 422 raised by route code (semantic checks after schema validation), with exact `loc`s. */
export class HttpValidationError extends Error {
  readonly code = 'validation_error';
  constructor(readonly issues: ValidationIssue[]) {
    super(issues.map((i) => i.msg).join('; '));
    this.name = 'HttpValidationError';
  }
}

export const notFound = (detail: string) => new HttpError(404, detail);
export const conflict = (detail: string) => new HttpError(409, detail);
export const forbidden = (detail: string) => new HttpError(403, detail);
export const badGateway = (detail: string) => new HttpError(502, detail);
export const unavailable = (detail: string) => new HttpError(503, detail);

/** Longer request targets are refused with 414 (Node itself only bounds the whole header block). */
export const MAX_URL_LENGTH = 8 * 1024;
export const URL_TOO_LONG = `Request URL too long (limit ${MAX_URL_LENGTH} bytes).`;

export interface ErrorBody {
  detail: string | ValidationIssue[];
}

/** What to answer for an error. `code` names the cause for logs (never sent); `internal` marks a bug. */
export interface ErrorResponse {
  status: number;
  body: ErrorBody;
  code: string;
  internal?: boolean;
  /** Response headers the error asks for (`Allow` on a 405, `WWW-Authenticate` on a 401). */
  headers?: Record<string, string>;
}

export const JSON_DECODE_ISSUE: ValidationIssue = { loc: ['body'], msg: 'JSON decode error', type: 'json_invalid' };

/**
 * Errors raised before a route's own code runs, by their code: fastify's (content-type parsing,
 * routing) and Node's HTTP parser's (`clientError`). Sentences are ours: the frameworks' messages
 * may quote the request (a URL can carry a token), so they are never passed on.
 */
const BY_CODE: Record<string, readonly [number, string]> = {
  FST_ERR_CTP_BODY_TOO_LARGE: [413, 'Request body is too large.'],
  FST_ERR_CTP_INVALID_MEDIA_TYPE: [415, 'Unsupported media type: send Content-Type: application/json.'],
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: [400, 'Request body size did not match Content-Length.'],
  FST_ERR_ROUTE_MISSING_CONTENT_TYPE: [415, 'Missing Content-Type: send Content-Type: application/json.'],
  FST_ERR_BAD_URL: [400, 'The URL is not valid (bad percent-encoding).'],
  FST_ERR_MAX_PARAM_LENGTH: [414, 'A path parameter is too long.'],
  FST_ERR_ASYNC_CONSTRAINT: [500, 'Internal server error.'],
  HPE_HEADER_OVERFLOW: [431, 'Request headers are too large.'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'The request took too long to arrive.'],
  ERR_HTTP_HEADERS_TIMEOUT: [408, 'The request headers took too long to arrive.'],
  HPE_HEADER_TIMEOUT: [408, 'The request took too long to arrive.'],
  HPE_INVALID_METHOD: [400, 'Malformed HTTP request: unknown method.'],
  HPE_INVALID_URL: [400, 'Malformed HTTP request: invalid request target.'],
  HPE_UNEXPECTED_CONTENT_LENGTH: [400, 'Malformed HTTP request: conflicting Content-Length and Transfer-Encoding.'],
  HPE_INVALID_TRANSFER_ENCODING: [400, 'Malformed HTTP request: invalid Transfer-Encoding.'],
  HPE_CHUNK_EXTENSIONS_OVERFLOW: [413, 'Request body is too large.'],
};
const JSON_DECODE_CODES = new Set(['FST_ERR_CTP_INVALID_JSON_BODY', 'FST_ERR_CTP_EMPTY_JSON_BODY']);

/** fastify's name of a request part -> wire.md's `loc[0]`. */
const PART_TO_LOC: Record<string, string> = { body: 'body', querystring: 'query', params: 'path', headers: 'header' };

const INTERNAL: ErrorResponse = { status: 500, body: { detail: 'Internal server error.' }, code: 'internal', internal: true };

interface ErrorLike {
  code?: unknown;
  statusCode?: unknown;
  validation?: unknown;
  validationContext?: unknown;
  name?: unknown;
  /** The overflowing head's request line, bytes, when the server followed the connection's lines. */
  requestLineBytes?: unknown;
}

/**
 * Node's parser reports an oversized head as one overflow; when the head's request line is over
 * {@link MAX_URL_LENGTH}, the URL is what is too long. Its length comes from the lines the server
 * followed on the connection (`requestLineBytes`, set by onClientError in http-errors.ts from
 * src/server/head-lines.ts), never from the parser's last chunk alone, whose content depends on
 * how the bytes arrived. Unknown: 431.
 */
function requestLineTooLong(e: ErrorLike): boolean {
  return typeof e.requestLineBytes === 'number' && e.requestLineBytes > MAX_URL_LENGTH;
}

/**
 * The answer for `err`. Pure and total: anything unknown is a 500 with a fixed sentence (the error's
 * own message may hold a secret or a path), so callers log `code` and the message themselves.
 */
export function errorResponse(err: unknown): ErrorResponse {
  if (err instanceof HttpError) {
    const r: ErrorResponse = { status: err.status, body: { detail: err.detail }, code: err.code };
    if (Object.keys(err.headers).length > 0) r.headers = err.headers;
    return r;
  }
  if (err instanceof HttpValidationError) return { status: 422, body: { detail: err.issues }, code: err.code };
  if (!err || typeof err !== 'object') return INTERNAL;
  const e = err as ErrorLike;
  const code = typeof e.code === 'string' ? e.code : '';
  if (Array.isArray(e.validation)) {
    const where = PART_TO_LOC[typeof e.validationContext === 'string' ? e.validationContext : 'body'] ?? 'body';
    return { status: 422, body: { detail: ajvToIssues(e.validation as never, [where]) }, code: 'validation_error' };
  }
  if (JSON_DECODE_CODES.has(code) || (e.statusCode === 400 && err instanceof SyntaxError)) {
    return { status: 422, body: { detail: [JSON_DECODE_ISSUE] }, code: code || 'json_invalid' };
  }
  if (code === 'HPE_HEADER_OVERFLOW' && requestLineTooLong(e)) return { status: 414, body: { detail: URL_TOO_LONG }, code };
  const known = BY_CODE[code];
  if (known) return { status: known[0], body: { detail: known[1] }, code, internal: known[0] >= 500 };
  if (code.startsWith('HPE_')) return { status: 400, body: { detail: 'Malformed HTTP request.' }, code };
  const status = typeof e.statusCode === 'number' ? e.statusCode : 0;
  if (status >= 400 && status < 500) {
    // A 4xx we have no sentence for (a fastify error added in a later version): its status holds,
    // its message does not travel.
    return { status, body: { detail: STATUS_SENTENCE[status] ?? 'The request was not accepted.' }, code: code || `http_${status}` };
  }
  return { ...INTERNAL, code: code || INTERNAL.code };
}

const STATUS_SENTENCE: Record<number, string> = {
  400: 'Bad request.',
  401: 'Missing or invalid credentials.',
  403: 'Not allowed.',
  404: 'Not Found',
  405: 'Method not allowed.',
  406: 'Not acceptable.',
  408: 'The request took too long to arrive.',
  413: 'Request body is too large.',
  414: 'The request URL is too long.',
  415: 'Unsupported media type.',
  429: 'Too many requests.',
  431: 'Request headers are too large.',
};

/** Methods whose requests may carry a body: fastify parses one when it is there. */
const BODY_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'QUERY']);

/**
 * Every status the error layer itself may answer for a route, apart from what the route's own code
 * raises (those the route declares in its schema); OpenAPI lists both. A method that may carry a
 * body can meet a too large (413), unsupported (415) or unparsable (422) one whatever its schema.
 */
export function frameworkStatuses(route: { method: string; authenticated: boolean; validated: boolean }): number[] {
  const out: number[] = [];
  if (route.authenticated) out.push(401, 403);
  const body = BODY_METHODS.has(route.method.toUpperCase());
  if (body) out.push(413, 415);
  if (body || route.validated) out.push(422);
  return out;
}

/**
 * An error's message fit for a log line. Our own messages never carry a value; Node's argument
 * checks do: ERR_INVALID_ARG_VALUE, ERR_INVALID_ARG_TYPE, ERR_OUT_OF_RANGE and their kin end with
 * `Received <the value, inspected>` (a spawn refusing an argument quotes the whole command line or
 * environment value it was given). That tail is dropped; the code and the sentence before it stay.
 */
export function loggableMessage(err: unknown): string {
  const e = err as { message?: unknown; code?: unknown } | null | undefined;
  const message = typeof e?.message === 'string' ? e.message : String(err);
  if (typeof e?.code !== 'string' || !e.code.startsWith('ERR_')) return message;
  return message.replace(/\.?\s*Received\b[\s\S]*$/, '. Received: [not logged]');
}

/** An error's stack with its message made loggable ({@link loggableMessage}) in it. */
export function loggableStack(err: unknown): string {
  const e = err as { message?: unknown; stack?: unknown } | null | undefined;
  const stack = typeof e?.stack === 'string' ? e.stack : loggableMessage(err);
  const message = typeof e?.message === 'string' ? e.message : '';
  return message ? stack.split(message).join(loggableMessage(err)) : stack;
}
