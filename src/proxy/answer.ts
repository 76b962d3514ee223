/**
 * The one check of an origin's answer head, whichever path read it: the fast path's own parser
 * (h1/head.ts), undici's (forward.ts, plain HTTP, the Node exchange and HTTP/2 clients over
 * HTTP/1.1 upstream), node:http2's (h2/upstream.ts, HTTP/2 clients over HTTP/2 upstream) and Node's http client (websocket.ts). Each parser is strict in
 * its own way; what one lets through and another refuses would make the same hostile answer a
 * 502 on one path and relayed on another. Whatever a parser accepted is held to this, and an
 * answer that fails it is a 502 `http_protocol_error` on every path. Pure; one pass over the
 * fields, nothing allocated for a good answer.
 *
 * Checked (RFC 9110, RFC 9112): an HTTP/1.0 or HTTP/1.1 status line (when read from HTTP/1); a
 * status of 100-599 (nothing else has a meaning a client can act on); a reason phrase of HTAB,
 * SP, VCHAR and obs-text only; the head within MAX_ANSWER_HEAD bytes (reason phrase included)
 * and MAX_ANSWER_FIELDS fields; field names that are tokens and values without control bytes;
 * framing that cannot be read two ways (one Content-Length of digits only, never beside
 * Transfer-Encoding, no Transfer-Encoding in HTTP/1.0, and on an answer with a body nothing but
 * one `chunked`, the only coding the proxy re-frames); and a 101 only as the answer to a
 * WebSocket handshake, naming `websocket` in Upgrade and `upgrade` in Connection.
 */

/** An answer head's size limit, status line and reason phrase included (as on the wire: CRLFs counted). */
export const MAX_ANSWER_HEAD = 64 * 1024;
/** The most fields an answer head may have. */
export const MAX_ANSWER_FIELDS = 1000;

export interface AnswerHead {
  /** `10` or `11` for an HTTP/1.x status line (major * 10 + minor, as the parser read it); undefined for an HTTP/2 answer, or when the parser did not say. */
  version: number | undefined;
  status: number;
  /** The reason phrase as read (latin1; empty for HTTP/2). */
  reason: string;
  /** `[name, value, ...]` as read (latin1), values without surrounding whitespace. */
  raw: readonly string[];
  /** The request's method (HEAD answers have no body). */
  method: string;
  /** The request was a WebSocket handshake (a 101 may answer it). */
  websocket?: boolean;
}

// RFC 9110 tchar.
const TCHAR = new Uint8Array(128);
for (const c of "!#$%&'*+-.^_`|~") TCHAR[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) TCHAR[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) TCHAR[c] = 1;
for (let c = 0x61; c <= 0x7a; c++) TCHAR[c] = 1;

function isToken(s: string): boolean {
  if (s.length === 0) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 128 || TCHAR[c] === 0) return false;
  }
  return true;
}

/**
 * HTAB, SP, VCHAR, obs-text: a reason phrase, a field value. Read as latin1, obs-text is
 * 0x80-0xff; undici decodes the reason phrase as UTF-8, where it may be anything from 0x80 up
 * (U+FFFD for bytes that are not UTF-8): only the control bytes are refused.
 */
function isText(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if ((c < 0x20 && c !== 0x09) || c === 0x7f) return false;
  }
  return true;
}

/** An answer with no body whatever its Content-Length or codings say: to HEAD, or 1xx, 204 or 304 (RFC 9110 6.4.1). */
export function bodilessAnswer(method: string | undefined, status: number): boolean {
  return method === 'HEAD' || status < 200 || status === 204 || status === 304;
}

function hasToken(value: string, token: string): boolean {
  for (const t of value.split(',')) if (t.trim().toLowerCase() === token) return true;
  return false;
}

/**
 * Why this answer head is not relayed (a fixed sentence, no byte of the answer in it), or
 * undefined when it may be.
 */
export function answerProblem(a: AnswerHead): string | undefined {
  if (a.version !== undefined && a.version !== 10 && a.version !== 11) return 'unsupported HTTP version';
  if (!Number.isInteger(a.status) || a.status < 100 || a.status > 599) return 'status code out of range';
  if (!isText(a.reason)) return 'control bytes in the reason phrase';
  const raw = a.raw;
  if (raw.length / 2 > MAX_ANSWER_FIELDS) return 'too many header fields';
  // `HTTP/1.1 200 reason CRLF`, each `name: value CRLF`, the final CRLF.
  let size = 15 + a.reason.length;
  let lengths = 0;
  let length = '';
  let codings = 0;
  let coding = '';
  let upgrade = '';
  let connection = '';
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    const value = raw[i + 1];
    size += name.length + value.length + 4;
    if (!isToken(name)) return 'invalid header field name';
    if (!isText(value)) return 'control bytes in a header field value';
    switch (name.length) {
      case 7:
        if (name.toLowerCase() === 'upgrade') upgrade += `${value},`;
        break;
      case 10:
        if (name.toLowerCase() === 'connection') connection += `${value},`;
        break;
      case 14:
        if (name.toLowerCase() === 'content-length') {
          lengths++;
          length = value;
        }
        break;
      case 17:
        if (name.toLowerCase() === 'transfer-encoding') {
          codings++;
          coding = value;
        }
        break;
    }
  }
  if (size + 2 > MAX_ANSWER_HEAD) return 'response head too large';
  if (lengths > 1) return 'conflicting Content-Length';
  if (lengths === 1 && !/^\d{1,15}$/.test(length)) return 'malformed Content-Length';
  if (codings > 0) {
    if (lengths > 0) return 'Content-Length with Transfer-Encoding';
    if (a.version === 10) return 'Transfer-Encoding in HTTP/1.0';
    if (a.status < 200) return 'Transfer-Encoding in an informational answer';
    // A HEAD, 204 or 304 answer may name the codings a GET's would have had (RFC 9112 6.1).
    if (!bodilessAnswer(a.method, a.status) && (codings > 1 || coding.toLowerCase() !== 'chunked')) return 'Transfer-Encoding other than one chunked';
  }
  if (a.status === 101) {
    if (!a.websocket) return 'unexpected protocol switch';
    if (!hasToken(upgrade, 'websocket') || !hasToken(connection, 'upgrade')) return 'protocol switch to something other than WebSocket';
    if (lengths > 0) return 'Content-Length in a protocol switch';
  }
  return undefined;
}
