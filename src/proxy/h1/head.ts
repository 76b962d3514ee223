import { answerProblem, bodilessAnswer, MAX_ANSWER_FIELDS, MAX_ANSWER_HEAD } from '../answer.js';

/**
 * Strict HTTP/1.1 head parsing for the intercepted fast path (src/proxy/h1/connection.ts). Pure.
 *
 * The request side accepts only heads whose meaning no HTTP/1.1 implementation can read
 * differently: anything else is `'fallback'`, and the connection's bytes go, untouched, to
 * Node's own parser (llhttp, never lenient) and the proxy's checks, which answer exactly as
 * they always have. So this parser never has to produce an error, and it must never accept a
 * head that Node's parser would refuse or read otherwise; test/proxy/h1/head.test.ts checks
 * that against Node's parser.
 *
 * Accepted: `METHOD SP origin-form SP HTTP/1.1 CRLF`, a method from a fixed list, a target of
 * RFC 3986 path and query characters only, header lines `token ":" OWS value OWS CRLF` with
 * visible ASCII, space and tab in values, exactly one Host, at most one digits-only
 * Content-Length, and none of Transfer-Encoding, Upgrade, Expect or `Connection: upgrade`
 * (Proxy-Connection counts as Connection, as it does for llhttp);
 * the head, its request line and its field count within the proxy's limits.
 */

export interface HeadLimits {
  maxHeaderBytes: number;
  maxHeaderCount: number;
  maxRequestLineBytes: number;
}

export interface RequestHead {
  method: string;
  /** Origin-form request target as sent (starts with `/`). */
  target: string;
  /** `[name, value, ...]`: names as sent, values without surrounding whitespace. */
  rawHeaders: string[];
  /** The one Host header's value. */
  host: string;
  /** Body length (0 when there is no Content-Length). */
  contentLength: number;
  /** The client listed `close` in Connection. */
  close: boolean;
  /** Bytes of the head, final CRLF CRLF included: the body (or the next request) starts here. */
  headBytes: number;
}

export type RequestParse = RequestHead | 'incomplete' | 'fallback';

const FAST_METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);

// RFC 9110 tchar.
const TCHAR = new Uint8Array(256);
for (const c of "!#$%&'*+-.^_`|~") TCHAR[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) TCHAR[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) TCHAR[c] = 1;
for (let c = 0x61; c <= 0x7a; c++) TCHAR[c] = 1;

// RFC 3986 pchar without pct-encoded's own check, plus `/` and `?`: unreserved, sub-delims, ':', '@', '%'.
const TARGET = new Uint8Array(256);
for (const c of "-._~!$&'()*+,;=:@/?%") TARGET[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) TARGET[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) TARGET[c] = 1;
for (let c = 0x61; c <= 0x7a; c++) TARGET[c] = 1;

const CR = 0x0d;
const LF = 0x0a;
const SP = 0x20;
const HTAB = 0x09;

/** Fields whose values llhttp reads itself (it takes Proxy-Connection for Connection). */
const INTERPRETED = new Set(['content-length', 'transfer-encoding', 'connection', 'proxy-connection']);

/** Request values: visible ASCII, space, tab. Response values may also carry obs-text (0x80-0xff). */
function valueByte(b: number, obsText: boolean): boolean {
  return (b >= 0x20 && b <= 0x7e) || b === HTAB || (obsText && b >= 0x80);
}

/** Index of the CR of the first CRLF CRLF at or after `from`, or -1. */
function headEnd(buf: Buffer, from: number, limit: number): number {
  const end = Math.min(buf.length, limit);
  const i = buf.indexOf('\r\n\r\n', from, 'latin1');
  return i >= 0 && i + 4 <= end ? i : -1;
}

interface Fields {
  raw: string[];
  /** Index just past the final CRLF CRLF. */
  end: number;
}

/**
 * Header lines from `pos` (just after the start line's CRLF) up to the empty line at `crlf2`.
 * Undefined when any line is not `token ":" OWS value OWS` with allowed bytes, or on obs-fold.
 */
function parseFields(buf: Buffer, pos: number, crlf2: number, obsText: boolean, maxCount: number): Fields | undefined {
  const raw: string[] = [];
  // The empty line: the start line's own CRLF may be the first half of CRLF CRLF.
  while (pos < crlf2 + 2) {
    const lineEnd = buf.indexOf(CR, pos);
    if (lineEnd < 0 || buf[lineEnd + 1] !== LF) return undefined;
    // Name.
    let i = pos;
    while (i < lineEnd && TCHAR[buf[i]]) i++;
    if (i === pos || buf[i] !== 0x3a) return undefined; // empty name, obs-fold, space before ':'
    const name = buf.toString('latin1', pos, i);
    i++;
    // Value without leading and trailing OWS.
    while (i < lineEnd && (buf[i] === SP || buf[i] === HTAB)) i++;
    let j = lineEnd;
    while (j > i && (buf[j - 1] === SP || buf[j - 1] === HTAB)) j--;
    // llhttp ends the values it interprets at a tab: `Content-Length: 5<HTAB>` is refused,
    // `chunked<HTAB>` is not chunked, `close<HTAB>` is not close.
    if (j < lineEnd && buf.subarray(j, lineEnd).includes(HTAB) && INTERPRETED.has(name.toLowerCase())) return undefined;
    for (let k = i; k < j; k++) if (!valueByte(buf[k], obsText)) return undefined;
    raw.push(name, buf.toString('latin1', i, j));
    if (raw.length / 2 > maxCount) return undefined;
    pos = lineEnd + 2;
  }
  return { raw, end: crlf2 + 4 };
}

/** `1*DIGIT`, at most 15 digits (always a safe integer). */
function digits(v: string): number | undefined {
  if (v.length === 0 || v.length > 15) return undefined;
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return undefined;
  }
  return Number(v);
}

/**
 * Comma-separated tokens of a list header, lower-cased, delimited as llhttp reads Connection:
 * spaces and tabs before a token, only spaces after it (`keep-alive<HTAB>,` is not `keep-alive`).
 */
function tokens(v: string): string[] {
  return v.split(',').map((t) => t.replace(/^[ \t]+| +$/g, '').toLowerCase());
}

/**
 * `close`, also with tabs after it: llhttp versions differ on `close<HTAB>, x` (Node 20 keeps
 * the connection, Node 24 closes it), and closing is the safe direction of the two.
 */
function isClose(t: string): boolean {
  return t.replace(/[ \t]+$/, '') === 'close';
}

/**
 * Parses the request head at the start of `buf`. `'incomplete'`: wait for more bytes (the
 * head is not complete and still within the limits). `'fallback'`: let Node's parser have
 * these bytes (unusual, malformed or over a limit: it answers or proceeds as it always has).
 */
export function parseRequestHead(buf: Buffer, limits: HeadLimits): RequestParse {
  const end = headEnd(buf, 0, limits.maxHeaderBytes);
  if (end < 0) return buf.length >= limits.maxHeaderBytes || bareLineEnding(buf) ? 'fallback' : 'incomplete';
  // Request line.
  const lineEnd = buf.indexOf(CR);
  if (buf[lineEnd + 1] !== LF || lineEnd > limits.maxRequestLineBytes) return 'fallback';
  const sp1 = buf.indexOf(SP);
  if (sp1 <= 0 || sp1 > 16 || sp1 > lineEnd) return 'fallback';
  const method = buf.toString('latin1', 0, sp1);
  if (!FAST_METHODS.has(method)) return 'fallback';
  if (buf[sp1 + 1] !== 0x2f /* '/' */) return 'fallback';
  let i = sp1 + 1;
  while (i < lineEnd && TARGET[buf[i]]) i++;
  if (buf[i] !== SP || lineEnd - i !== 9 || buf.toString('latin1', i + 1, lineEnd) !== 'HTTP/1.1') return 'fallback';
  const target = buf.toString('latin1', sp1 + 1, i);
  const fields = parseFields(buf, lineEnd + 2, end, false, limits.maxHeaderCount);
  if (!fields) return 'fallback';
  const raw = fields.raw;
  let host: string | undefined;
  let hosts = 0;
  let contentLength = 0;
  let lengths = 0;
  let close = false;
  for (let k = 0; k < raw.length; k += 2) {
    const name = raw[k].toLowerCase();
    switch (name) {
      case 'host':
        hosts++;
        host = raw[k + 1];
        break;
      case 'content-length': {
        lengths++;
        const n = digits(raw[k + 1]);
        if (n === undefined) return 'fallback';
        contentLength = n;
        break;
      }
      case 'transfer-encoding':
      case 'upgrade':
      case 'expect':
        return 'fallback';
      case 'connection':
      case 'proxy-connection':
        for (const t of tokens(raw[k + 1])) {
          if (t === 'upgrade') return 'fallback';
          if (isClose(t)) close = true;
        }
        break;
    }
  }
  if (hosts !== 1 || lengths > 1 || host === undefined || host === '') return 'fallback';
  return { method, target, rawHeaders: raw, host, contentLength, close, headBytes: fields.end };
}

/** A LF not preceded by CR, or a CR not followed by LF, in what is buffered so far. */
function bareLineEnding(buf: Buffer): boolean {
  for (let i = buf.indexOf(LF); i >= 0; i = buf.indexOf(LF, i + 1)) if (i === 0 || buf[i - 1] !== CR) return true;
  for (let i = buf.indexOf(CR); i >= 0 && i + 1 < buf.length; i = buf.indexOf(CR, i + 1)) if (buf[i + 1] !== LF) return true;
  return false;
}

// ---- responses --------------------------------------------------------------------------

/** An answer with no body whatever its Content-Length or codings say (answer.ts: one definition for every path). */
export { bodilessAnswer } from '../answer.js';

/** How a response body is delimited (RFC 9112 6.3). */
export type Framing = { kind: 'none' } | { kind: 'length'; length: number } | { kind: 'chunked' } | { kind: 'close' };

export interface ResponseHead {
  status: number;
  /** `[name, value, ...]` as received (values trimmed). */
  rawHeaders: string[];
  framing: Framing;
  /** The connection can carry another request after this response. */
  reusable: boolean;
  headBytes: number;
}

export type ResponseParse = ResponseHead | 'incomplete' | { error: string };

/**
 * Parses a response head at the start of `buf`, for a request of `method`. A 1xx comes back
 * as itself (framing `none`): the caller skips it and parses what follows. What this parser
 * reads is then held to the check every path shares (answer.ts): the same answer is refused
 * here as on the paths that read answers with undici or Node's client. Errors are fixed
 * sentences (no bytes of the response in them).
 */
export function parseResponseHead(buf: Buffer, method: string, maxHeaderBytes = MAX_ANSWER_HEAD, maxHeaderCount = MAX_ANSWER_FIELDS): ResponseParse {
  const end = headEnd(buf, 0, maxHeaderBytes);
  if (end < 0) {
    if (buf.length >= maxHeaderBytes) return { error: 'response head too large' };
    return bareLineEnding(buf) ? { error: 'malformed upstream response head' } : 'incomplete';
  }
  const lineEnd = buf.indexOf(CR);
  // `HTTP/1.x NNN` then an optional reason.
  if (buf[lineEnd + 1] !== LF || lineEnd < 12) return { error: 'malformed upstream status line' };
  const version = buf.toString('latin1', 0, 9);
  if ((version !== 'HTTP/1.1 ' && version !== 'HTTP/1.0 ') || (lineEnd > 12 && buf[12] !== SP)) return { error: 'malformed upstream status line' };
  const status = digits(buf.toString('latin1', 9, 12));
  if (status === undefined) return { error: 'malformed upstream status line' };
  const fields = parseFields(buf, lineEnd + 2, end, true, maxHeaderCount + 1);
  if (!fields) return { error: 'malformed upstream response header' };
  const raw = fields.raw;
  if (raw.length / 2 > maxHeaderCount) return { error: 'too many header fields' };
  const http10 = version === 'HTTP/1.0 ';
  const problem = answerProblem({ version: http10 ? 10 : 11, status, reason: lineEnd > 13 ? buf.toString('latin1', 13, lineEnd) : '', raw, method });
  if (problem) return { error: problem };
  let chunked = false;
  let length: number | undefined;
  let close = false;
  let keepAlive = false;
  for (let k = 0; k < raw.length; k += 2) {
    const name = raw[k].toLowerCase();
    if (name === 'transfer-encoding') chunked = true;
    else if (name === 'content-length') length = Number(raw[k + 1]);
    else if (name === 'connection' || name === 'proxy-connection') {
      for (const t of tokens(raw[k + 1])) {
        if (isClose(t)) close = true;
        else if (t === 'keep-alive') keepAlive = true;
      }
    }
  }
  // HTTP/1.0 closes unless it says keep-alive; `close` wins whatever the order.
  if (http10 && !keepAlive) close = true;
  if (status < 200) return { status, rawHeaders: raw, framing: { kind: 'none' }, reusable: true, headBytes: fields.end };
  let framing: Framing;
  if (bodilessAnswer(method, status)) framing = { kind: 'none' };
  else if (chunked) framing = { kind: 'chunked' };
  else if (length !== undefined) framing = { kind: 'length', length };
  else framing = { kind: 'close' };
  return { status, rawHeaders: raw, framing, reusable: !close && framing.kind !== 'close', headBytes: fields.end };
}
