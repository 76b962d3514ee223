/**
 * Helpers for the HTTP/2 property tests (property-h2*.test.ts): a client that sends hand-built
 * header blocks, two recording origins, and the generated requests with what each must become.
 *
 * The client is Node's http2 client whose HEADERS frames are rewritten on the way out: every
 * request's (and trailers') header block is replaced by a block of HPACK literals (h2-raw.ts
 * literalBlock: never indexed, no Huffman) that the test wrote byte for byte, so any name, value,
 * order or repetition reaches the proxy exactly as generated, while Node's client still does the
 * rest (flow control, SETTINGS, decoding the proxy's answers with HPACK and Huffman). The
 * literals never touch the proxy's HPACK table, and every block Node encoded is replaced, so the
 * two sides' tables cannot disagree.
 *
 * The origins record what arrived, not what a parser made of it:
 * - h1Recorder: TLS with ALPN http/1.1 only (the proxy translates h2 to HTTP/1.1), every byte of
 *   every connection kept and parsed strictly (one request line, token names, no bare CR/LF/NUL,
 *   one Host, Content-Length or chunked and never both): what does not parse is a framing error.
 * - h2Recorder: node:http2 over TLS (h2 only): each stream's raw header list, its DATA, whether it
 *   ended with END_STREAM or was reset.
 * Neither echoes what it received: the test reads the records, and whatever a client reads back
 * is the origin's fixed answer or the proxy's own.
 */
import http2, { type ClientHttp2Session, type IncomingHttpHeaders } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { Duplex } from 'node:stream';
import tls from 'node:tls';
import fc from 'fast-check';
import { normalisePath, isPathRefusal } from '../../src/rules/path.js';
import type { TestPki } from '../helpers/pki.js';
import { tunnelTls } from './h2-helpers.js';
import { frame, literalBlock, PREFACE } from './h2-raw.js';

// ---- the client ------------------------------------------------------------------------------------

const HEADERS = 0x1;
const CONTINUATION = 0x9;
const F_END_STREAM = 0x1;
const F_END_HEADERS = 0x4;
const F_PADDED = 0x8;
const F_PRIORITY = 0x20;

/**
 * The socket under Node's http2 client: passes every frame to the TLS socket but HEADERS, whose
 * block is replaced by the one registered for that stream (the first HEADERS of a stream by the
 * request's block, the second by the trailers'). A HEADERS with nothing registered is a test bug.
 */
class BlockSwap extends Duplex {
  private buf: Buffer = Buffer.alloc(0);
  private preface = false;
  private readonly blocks = new Map<number, Buffer[]>();
  /** Streams whose replaced HEADERS had CONTINUATION frames still to come (dropped). */
  private readonly swallowing = new Set<number>();
  error: Error | undefined;

  constructor(private readonly socket: tls.TLSSocket) {
    super();
    socket.on('data', (d: Buffer) => {
      if (!this.push(d)) socket.pause();
    });
    socket.on('end', () => this.push(null));
    socket.on('close', () => this.destroy());
    socket.on('error', (err) => this.destroy(err));
  }

  /** The blocks stream `id`'s HEADERS frames get, in order. */
  register(id: number, blocks: Buffer[]): void {
    this.blocks.set(id, [...blocks]);
  }

  override _read(): void {
    this.socket.resume();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: Buffer[] = [];
    if (!this.preface) {
      if (this.buf.length < PREFACE.length) return cb();
      out.push(this.buf.subarray(0, PREFACE.length));
      this.buf = this.buf.subarray(PREFACE.length);
      this.preface = true;
    }
    while (this.buf.length >= 9) {
      const len = this.buf.readUIntBE(0, 3);
      if (this.buf.length < 9 + len) break;
      const type = this.buf[3];
      const flags = this.buf[4];
      const id = this.buf.readUInt32BE(5) & 0x7fffffff;
      const whole = this.buf.subarray(0, 9 + len);
      const payload = this.buf.subarray(9, 9 + len);
      this.buf = this.buf.subarray(9 + len);
      if (type === CONTINUATION && this.swallowing.has(id)) {
        if (flags & F_END_HEADERS) this.swallowing.delete(id);
        continue;
      }
      if (type !== HEADERS) {
        out.push(whole);
        continue;
      }
      const block = this.blocks.get(id)?.shift();
      if (!block) {
        this.error = new Error(`no header block registered for stream ${id}`);
        return cb(this.error);
      }
      let p = 0;
      const pad = flags & F_PADDED ? payload[p++] : 0;
      void pad;
      const priority = flags & F_PRIORITY ? payload.subarray(p, p + 5) : Buffer.alloc(0);
      if (!(flags & F_END_HEADERS)) this.swallowing.add(id);
      const keep = (flags & (F_END_STREAM | F_PRIORITY)) as number;
      // One HEADERS (and CONTINUATIONs when the block is over the default frame size).
      const first = Buffer.concat([priority, block.subarray(0, 16384 - priority.length)]);
      let rest = block.subarray(16384 - priority.length);
      out.push(frame(HEADERS, keep | (rest.length ? 0 : F_END_HEADERS), id, first));
      while (rest.length) {
        const part = rest.subarray(0, 16384);
        rest = rest.subarray(16384);
        out.push(frame(CONTINUATION, rest.length ? 0 : F_END_HEADERS, id, part));
      }
    }
    if (!out.length) return cb();
    this.socket.write(Buffer.concat(out), cb);
  }

  override _final(cb: (err?: Error | null) => void): void {
    this.socket.end();
    cb();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    this.socket.destroy();
    cb(err);
  }
}

export interface RawSession {
  session: ClientHttp2Session;
  swap: BlockSwap;
  /** The session closed or failed (a connection error, a GOAWAY). */
  gone: boolean;
  goawayCode: number | undefined;
  close(): void;
}

/** An HTTP/2 session to HOST:port through the proxy whose request header blocks are the test's. */
export async function rawSession(proxyPort: number, host: string, port: number, ca: string): Promise<RawSession> {
  const t = await tunnelTls(proxyPort, host, port, ca, ['h2']);
  if (t.alpnProtocol !== 'h2') throw new Error(`ALPN chose ${String(t.alpnProtocol)}`);
  const swap = new BlockSwap(t);
  const session = http2.connect(`https://${host}:${port}`, { createConnection: () => swap });
  const rs: RawSession = { session, swap, gone: false, goawayCode: undefined, close: () => session.destroy() };
  session.on('error', () => (rs.gone = true));
  session.on('close', () => (rs.gone = true));
  session.on('goaway', (code) => {
    rs.gone = true;
    rs.goawayCode = code;
  });
  await new Promise<void>((resolve, reject) => {
    session.once('connect', () => resolve());
    session.once('error', reject);
  });
  return rs;
}

/** One request as sent on the wire. */
export interface WireRequest {
  /** The header block's fields, in order, exactly as sent. */
  fields: [string, string][];
  /**
   * DATA frames, in order (none: END_STREAM on the HEADERS frame, unless trailers follow). No
   * empty chunk: Node's client may then never close its stream (its writable side does not
   * finish), though both END_STREAMs went by.
   */
  body?: Buffer[];
  /** A trailer block (HEADERS with END_STREAM after the DATA). */
  trailers?: [string, string][];
  /** The client resets the stream (RST_STREAM, no END_STREAM) after sending its body. */
  reset?: boolean;
  /** The client resets the stream this long after its END_STREAM (it gives up waiting for the answer). */
  resetAfterEndMs?: number;
}

export interface WireAnswer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  trailers: IncomingHttpHeaders;
  /** RST_STREAM code (0 when the stream ended normally). */
  rstCode: number;
  /** The stream neither ended nor was reset within the clock. */
  hung: boolean;
}

/** Sends one request on `rs` and resolves with what came back once the stream closed. */
export function send(rs: RawSession, req: WireRequest, ms = 8000): Promise<WireAnswer> {
  return new Promise((resolve) => {
    const out: WireAnswer = { status: 0, headers: {}, body: Buffer.alloc(0), trailers: {}, rstCode: 0, hung: false };
    const parts: Buffer[] = [];
    const hasBody = req.body !== undefined;
    const hasTrailers = req.trailers !== undefined;
    let stream: http2.ClientHttp2Stream;
    try {
      // The client's own idea of the method decides how it reads the answer (no body after HEAD).
      const method = req.fields.find(([n]) => n === ':method')?.[1] === 'HEAD' ? 'HEAD' : 'POST';
      stream = rs.session.request({ ':method': method, ':path': '/placeholder' }, { endStream: !hasBody && !hasTrailers && !req.reset, waitForTrailers: hasTrailers });
    } catch {
      // The session is gone (a connection error on an earlier stream).
      resolve({ ...out, rstCode: -1 });
      return;
    }
    const blocks = [literalBlock(req.fields)];
    if (req.trailers) blocks.push(literalBlock(req.trailers));
    if (stream.id === undefined) {
      resolve({ ...out, rstCode: -1 });
      return;
    }
    rs.swap.register(stream.id, blocks);
    const timer = setTimeout(() => {
      out.hung = true;
      stream.destroy();
    }, ms);
    stream.on('response', (h) => {
      out.headers = h;
      out.status = Number(h[':status']);
    });
    stream.on('trailers', (h) => (out.trailers = h));
    stream.on('data', (d: Buffer) => parts.push(d));
    stream.on('error', () => undefined);
    stream.on('wantTrailers', () => stream.sendTrailers({ 'x-placeholder': 't' }));
    stream.on('close', () => {
      clearTimeout(timer);
      out.body = Buffer.concat(parts);
      out.rstCode = stream.rstCode ?? 0;
      resolve(out);
    });
    if (hasBody) {
      for (const chunk of req.body!) stream.write(chunk);
      if (req.reset) setTimeout(() => stream.destroy(new Error('client resets')), 50);
      else stream.end();
    } else if (req.reset) setTimeout(() => stream.destroy(new Error('client resets')), 50);
    else if (hasTrailers) stream.end();
    if (req.resetAfterEndMs !== undefined) setTimeout(() => stream.close(http2.constants.NGHTTP2_CANCEL), req.resetAfterEndMs);
  });
}

// ---- the HTTP/1.1 origin --------------------------------------------------------------------------

export interface H1Request {
  conn: number;
  method: string;
  target: string;
  head: string;
  headers: [string, string][];
  body: Buffer;
  /** How the body was framed. */
  framing: 'none' | 'length' | 'chunked';
}

export interface H1Conn {
  id: number;
  bytes: Buffer[];
  closed: boolean;
  /** Bytes after the last complete request (a request cut short by a closed connection). */
  rest: Buffer;
  /** Why the bytes stopped parsing as HTTP/1.1 requests (the connection is then ignored). */
  framingError: string | undefined;
}

export interface H1Recorder {
  port: number;
  conns: H1Conn[];
  requests: H1Request[];
  close(): Promise<void>;
}

const TCHAR = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const REQUEST_LINE = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\/[\x21-\x7e]*) HTTP\/1\.1$/;
const FIELD_LINE = /^([^:]*):[ \t]*(.*?)[ \t]*$/s;
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

type Parsed = { req: Omit<H1Request, 'conn'>; used: number } | { error: string } | undefined;

/** One request at the start of `buf`, parsed strictly; undefined while incomplete. */
function parseH1(buf: Buffer): Parsed {
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) {
    if (buf.length > 65536) return { error: 'head never ends' };
    return undefined;
  }
  const head = buf.toString('latin1', 0, end + 4);
  const lines = head.slice(0, -4).split('\r\n');
  for (const l of lines) if (/[\r\n\0]/.test(l)) return { error: `bare CR, LF or NUL in a head line: ${JSON.stringify(l.slice(0, 80))}` };
  const m = REQUEST_LINE.exec(lines[0]);
  if (!m) return { error: `request line: ${JSON.stringify(lines[0].slice(0, 120))}` };
  const headers: [string, string][] = [];
  for (const l of lines.slice(1)) {
    const f = FIELD_LINE.exec(l);
    if (!f || !TCHAR.test(f[1])) return { error: `field line: ${JSON.stringify(l.slice(0, 80))}` };
    if (!FIELD_VALUE.test(f[2])) return { error: `field value bytes: ${JSON.stringify(l.slice(0, 80))}` };
    headers.push([f[1], f[2]]);
  }
  const get = (n: string) => headers.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);
  if (get('host').length !== 1) return { error: `${get('host').length} Host fields` };
  const te = get('transfer-encoding');
  const cl = get('content-length');
  if (te.length && cl.length) return { error: 'Content-Length and Transfer-Encoding' };
  if (te.length > 1 || (te.length && te[0].toLowerCase() !== 'chunked')) return { error: `Transfer-Encoding ${JSON.stringify(te)}` };
  if (cl.length > 1 || (cl.length && !/^[0-9]+$/.test(cl[0]))) return { error: `Content-Length ${JSON.stringify(cl)}` };
  const base = { method: m[1], target: m[2], head, headers };
  let i = end + 4;
  if (te.length) {
    const parts: Buffer[] = [];
    for (;;) {
      const eol = buf.indexOf('\r\n', i);
      if (eol < 0) return undefined;
      const size = buf.toString('latin1', i, eol);
      if (!/^[0-9a-fA-F]{1,8}$/.test(size)) return { error: `chunk size line ${JSON.stringify(size.slice(0, 40))}` };
      const n = parseInt(size, 16);
      i = eol + 2;
      if (n === 0) {
        // No trailer section from the proxy: the last chunk is followed by the final CRLF.
        if (buf.length < i + 2) return undefined;
        if (buf[i] !== 0x0d || buf[i + 1] !== 0x0a) return { error: 'trailer section in a request' };
        return { req: { ...base, body: Buffer.concat(parts), framing: 'chunked' }, used: i + 2 };
      }
      if (buf.length < i + n + 2) return undefined;
      if (buf[i + n] !== 0x0d || buf[i + n + 1] !== 0x0a) return { error: 'chunk data longer than its size' };
      parts.push(buf.subarray(i, i + n));
      i += n + 2;
    }
  }
  const n = cl.length ? Number(cl[0]) : 0;
  if (buf.length < i + n) return undefined;
  return { req: { ...base, body: buf.subarray(i, i + n), framing: cl.length ? 'length' : 'none' }, used: i + n };
}

/** The HTTP/1.1-only recording origin: answers each complete request with `ok` (no body to HEAD). */
export async function h1Recorder(pki: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<H1Recorder> {
  const conns: H1Conn[] = [];
  const requests: H1Request[] = [];
  const sockets = new Set<tls.TLSSocket>();
  const server = tls.createServer({ key: pki.keyPem, cert: pki.certPem, ALPNProtocols: ['http/1.1'] }, (s) => {
    sockets.add(s);
    const conn: H1Conn = { id: conns.length, bytes: [], closed: false, rest: Buffer.alloc(0), framingError: undefined };
    conns.push(conn);
    s.on('error', () => undefined);
    s.on('close', () => {
      conn.closed = true;
      sockets.delete(s);
    });
    s.on('data', (d: Buffer) => {
      conn.bytes.push(d);
      if (conn.framingError) return;
      conn.rest = conn.rest.length ? Buffer.concat([conn.rest, d]) : d;
      for (;;) {
        const r = parseH1(conn.rest);
        if (!r) return;
        if ('error' in r) {
          conn.framingError = r.error;
          s.destroy();
          return;
        }
        conn.rest = conn.rest.subarray(r.used);
        requests.push({ conn: conn.id, ...r.req });
        // /repos/slow: never answered (a client that gives up first is tested with it).
        if (r.req.target.startsWith('/repos/slow')) continue;
        const body = `ok ${r.req.headers.find(([k]) => k.toLowerCase() === 'x-case-id')?.[1] ?? '-'}`;
        s.write(`HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: ${body.length}\r\n\r\n${r.req.method === 'HEAD' ? '' : body}`);
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as AddressInfo).port,
    conns,
    requests,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

// ---- the HTTP/2 origin ----------------------------------------------------------------------------

export interface H2Stream {
  /** The raw header list (pseudo-headers included), as Node's server received it. */
  raw: string[];
  body: Buffer;
  /** END_STREAM arrived (not a reset). */
  complete: boolean;
  closed: boolean;
  rstCode: number;
}

export interface H2Recorder {
  port: number;
  streams: H2Stream[];
  /** Sessions the origin saw fail with a protocol error (a frame or header block it refused). */
  errors: string[];
  close(): Promise<void>;
}

/** The HTTP/2 recording origin: answers each stream that ended with `ok <case>`. */
export async function h2Recorder(pki: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<H2Recorder> {
  const streams: H2Stream[] = [];
  const errors: string[] = [];
  const server = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem, allowHTTP1: false });
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on('session', (s) => {
    sessions.add(s);
    s.on('error', (err) => errors.push(String(err)));
    s.on('frameError', (type, code) => errors.push(`frameError ${type} ${code}`));
    s.on('close', () => sessions.delete(s));
  });
  server.on('stream', (stream, headers, _flags, raw?: string[]) => {
    const rec: H2Stream = { raw: raw ?? [], body: Buffer.alloc(0), complete: false, closed: false, rstCode: 0 };
    streams.push(rec);
    const parts: Buffer[] = [];
    stream.on('error', () => undefined);
    stream.on('data', (d: Buffer) => parts.push(d));
    stream.on('end', () => {
      rec.body = Buffer.concat(parts);
      // Node ends the readable side on a reset too; only after END_STREAM is the stream still open.
      rec.complete = !stream.closed;
      if (!rec.complete || stream.destroyed || String(headers[':path']).startsWith('/repos/slow')) return;
      const body = `ok ${String(headers['x-case-id'] ?? '-')}`;
      stream.respond({ ':status': 200, 'content-type': 'text/plain' }, { endStream: headers[':method'] === 'HEAD' });
      if (headers[':method'] !== 'HEAD') stream.end(body);
    });
    stream.on('close', () => {
      rec.closed = true;
      rec.body = Buffer.concat(parts);
      rec.rstCode = stream.rstCode ?? 0;
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as AddressInfo).port,
    streams,
    errors,
    async close() {
      for (const s of sessions) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

// ---- generated requests ---------------------------------------------------------------------------

export const SECRET = 'kgSECRET-h2prop-4c1d';
export const KEY = 'kgKEY-h2prop-90ab';
/** The rule: HOST under /repos/* gets Authorization and X-Api-Key. */
export const INJECT: [string, string][] = [
  ['authorization', `Bearer ${SECRET}`],
  ['x-api-key', KEY],
];

/** One header field as generated, with what it must become. */
export interface GenField {
  name: string;
  value: string;
  /**
   * - ok: a valid end-to-end field: reaches the origin exactly (name and value bytes);
   * - inject: the client's value of a field the rule injects: replaced when the rule applies;
   * - drop: must never reach the origin as sent (invalid bytes, hop-by-hop): the field is gone or the stream refused;
   * - refuse: the whole stream must be refused (nothing complete reaches the origin).
   */
  tag: 'ok' | 'inject' | 'drop' | 'refuse';
}

/** An authority value (for `:authority` or `host`) and whether it names the tunnel's. */
export interface GenAuthority {
  value: string;
  /** 'same': names the tunnel; 'other': a valid other authority (421); 'bad': not a valid authority (400 or a stream error). */
  kind: 'same' | 'other' | 'bad';
}

export interface GenRequest {
  method: string;
  scheme: string | undefined;
  path: string | undefined;
  authority: GenAuthority | undefined;
  host: GenAuthority | undefined;
  /** Extra pseudo-headers (unknown, repeated, :protocol): each makes the stream malformed. */
  extraPseudo: [string, string][];
  /** Pseudo-headers placed after the first regular field (malformed). */
  pseudoLate: boolean;
  fields: GenField[];
  body: Buffer[] | undefined;
  /** A content-length field: the value, and whether it equals the body's length. */
  contentLength: { value: string; matches: boolean; valid: boolean } | undefined;
  trailers: [string, string][] | undefined;
  reset: boolean;
}

const token = fc.stringMatching(/^[a-z][a-z0-9-]{0,10}$/).filter((n) => !SPECIAL.has(n) && !n.startsWith('x-case') && !n.startsWith('x-api') && !n.startsWith('x-http-method') && !n.startsWith('x-original') && !n.startsWith('x-rewrite'));
/** Names with a meaning of their own: generated only on purpose. */
const SPECIAL = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'host', 'content-length', 'cookie', 'authorization', 'expect', 'trailer', 'proxy-authorization', 'http2-settings', 'x-api-key', 'x-key']);
/** A valid value: visible ASCII, obs-text and inner spaces or tabs, nothing at either end. */
const okValue = fc
  .array(fc.oneof({ weight: 8, arbitrary: fc.integer({ min: 0x21, max: 0x7e }) }, { weight: 1, arbitrary: fc.constantFrom(0x20, 0x09) }, { weight: 1, arbitrary: fc.integer({ min: 0x80, max: 0xff }) }), { minLength: 1, maxLength: 24 })
  .map((codes) => String.fromCharCode(...codes).replace(/^[ \t]+|[ \t]+$/g, ''))
  .filter((v) => v.length > 0 && !v.includes(SECRET) && !v.includes(KEY));

const okField: fc.Arbitrary<GenField> = fc.record({ name: token, value: okValue }).map((f) => ({ ...f, tag: 'ok' as const }));

const badValue = fc.tuple(okValue, fc.constantFrom('\r', '\n', '\r\n', '\0', ' ', '\t', '\r\nx-smuggled: 1', '\r\n\r\nGET /admin HTTP/1.1\r\nhost: x'), fc.constantFrom('start', 'middle', 'end')).filter(([, bad, at]) => !(at === 'middle' && (bad === ' ' || bad === '\t')))
  .map(([v, bad, at]) => (at === 'start' ? bad + v : at === 'end' ? v + bad : v.slice(0, 1) + bad + v.slice(1)));

const droppedField: fc.Arbitrary<GenField> = fc.oneof(
  // Invalid value bytes (CR, LF, NUL, surrounding whitespace).
  fc.record({ name: token, value: badValue }).map((f) => ({ ...f, tag: 'drop' as const })),
  // Invalid names: upper case, a colon, a space, empty.
  fc.record({ name: fc.constantFrom('X-Upper', 'Content-Length', 'Transfer-Encoding', 'Host', 'x:y', 'x y', 'x\r\ny', ''), value: okValue }).map((f) => ({ ...f, tag: 'drop' as const })),
  // Hop-by-hop fields a proxy drops (not connection-specific to HTTP/2 itself).
  fc.record({ name: fc.constantFrom('proxy-authorization', 'trailer', 'http2-settings'), value: okValue }).map((f) => ({ ...f, tag: 'drop' as const })),
);

const refusedField: fc.Arbitrary<GenField> = fc.oneof(
  // Connection-specific fields (RFC 9113 8.2.2) and TE other than "trailers".
  fc.record({ name: fc.constantFrom('connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade'), value: fc.constantFrom('close', 'chunked', 'websocket', 'timeout=5', 'x-api-key') }),
  fc.record({ name: fc.constant('te'), value: fc.constantFrom('gzip', 'trailers, gzip', 'chunked', '') }),
  // Fields that take one value, twice (one generated here, one next to it: see below).
  fc.record({ name: fc.constantFrom('x-http-method-override', 'x-http-method'), value: fc.constantFrom('TRACE', 'track') }),
  fc.record({ name: fc.constant('expect'), value: fc.constantFrom('x-foo', '200-ok') }),
).map((f) => ({ ...f, tag: 'refuse' as const }));

/** The client's own values for the injected fields, in any spelling. */
const injectField: fc.Arbitrary<GenField> = fc.oneof(
  fc.record({ name: fc.constantFrom('x-api-key', 'x_api_key', 'authorization'), value: okValue }).map((f) => ({ ...f, tag: 'inject' as const })),
  // Upper case: not an HTTP/2 field name at all.
  fc.record({ name: fc.constantFrom('X-Api-Key', 'Authorization', 'X-API-KEY'), value: okValue }).map((f) => ({ ...f, tag: 'drop' as const })),
);

const cookieField: fc.Arbitrary<GenField> = fc.stringMatching(/^[a-z]{1,4}=[a-z0-9]{0,6}$/).map((v) => ({ name: 'cookie', value: v, tag: 'ok' as const }));

const teTrailers: fc.Arbitrary<GenField> = fc.constant({ name: 'te', value: 'trailers', tag: 'ok' as const });

export const SEGMENTS = ['repos', 'repos', 'x', 'a', '.', '..', '%2e', '%2E%2e', '%41b', '%7e', '~u', '%2f', '%5c', '%25', '%2541', '%3f', '%23', '#', ';x', '..;', 'a%20', '', '%c3%a9', 'é', '*', ':', '@'];
const QUERIES = ['', '', '?a=1', '?a=%2f&b', '?x=/../y', '?_method=TRACE', '? a', '?#', '?a=é'];

/** :path values: built from segments (dot segments, escapes, delimiters), or special forms. */
const pathArb: fc.Arbitrary<string | undefined> = fc.oneof(
  { weight: 8, arbitrary: fc.tuple(fc.array(fc.constantFrom(...SEGMENTS), { minLength: 1, maxLength: 5 }), fc.constantFrom(...QUERIES)).map(([segs, q]) => '/' + segs.join('/') + q) },
  { weight: 4, arbitrary: fc.constantFrom('/repos/x', '/repos/a/b?q=1', '/other', '/') },
  { weight: 1, arbitrary: fc.constantFrom(undefined, '', '*', 'repos/x', 'https://fast.test.local/repos/x', '//repos/x', '/repos/x HTTP/1.1', '/repos/x\r\nx: y') },
);

/** Authority variants for the tunnel `host:port`. */
export function authorityArb(host: string, port: number): fc.Arbitrary<GenAuthority> {
  return fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom<GenAuthority>({ value: `${host}:${port}`, kind: 'same' }, { value: `${host.toUpperCase()}:${port}`, kind: 'same' }, { value: `${host}.:${port}`, kind: 'same' }, { value: `Fast.Test.LOCAL.:${port}`, kind: 'same' }) },
    { weight: 2, arbitrary: fc.constantFrom<GenAuthority>({ value: `other.test.local:${port}`, kind: 'other' }, { value: `${host}:${port + 1}`, kind: 'other' }, { value: host, kind: 'other' }, { value: `127.0.0.1:${port}`, kind: 'other' }, { value: `[::1]:${port}`, kind: 'other' }, { value: `${host}.evil.test:${port}`, kind: 'other' }) },
    { weight: 1, arbitrary: fc.constantFrom<GenAuthority>({ value: `${host}..:${port}`, kind: 'bad' }, { value: `user@${host}:${port}`, kind: 'bad' }, { value: '', kind: 'bad' }, { value: `${host}:${port}:1`, kind: 'bad' }, { value: `${host}:0`, kind: 'bad' }, { value: `${host}:${port} `, kind: 'bad' }, { value: `${host}\r\n:${port}`, kind: 'bad' }) },
  );
}

export function requestArb(host: string, port: number): fc.Arbitrary<GenRequest> {
  const auth = authorityArb(host, port);
  const field = fc.oneof({ weight: 6, arbitrary: okField }, { weight: 3, arbitrary: injectField }, { weight: 2, arbitrary: cookieField }, { weight: 1, arbitrary: teTrailers }, { weight: 2, arbitrary: droppedField }, { weight: 1, arbitrary: refusedField });
  return fc
    .record({
      method: fc.oneof({ weight: 8, arbitrary: fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD', 'get') }, { weight: 1, arbitrary: fc.constantFrom('CONNECT', 'TRACE', 'trace', 'TRACK', 'G T', '') }),
      scheme: fc.oneof({ weight: 12, arbitrary: fc.constant('https') }, { weight: 1, arbitrary: fc.constantFrom(undefined, 'http', 'HTTPS', 'ftp', '') }),
      path: pathArb,
      authority: fc.oneof({ weight: 8, arbitrary: auth }, { weight: 1, arbitrary: fc.constant(undefined) }),
      host: fc.oneof({ weight: 4, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: auth }),
      extraPseudo: fc.oneof({ weight: 12, arbitrary: fc.constant([] as [string, string][]) }, { weight: 1, arbitrary: fc.array(fc.constantFrom<[string, string]>([':foo', 'x'], [':status', '200'], [':protocol', 'websocket'], [':path', '/repos/y'], [':method', 'GET'], [':authority', 'other.test.local'], [':scheme', 'https']), { minLength: 1, maxLength: 2 }) }),
      late: fc.integer({ min: 0, max: 15 }),
      fields: fc.array(field, { maxLength: 7 }),
      body: fc.oneof({ weight: 2, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: fc.array(fc.uint8Array({ minLength: 1, maxLength: 40 }).map((a) => Buffer.from(a)), { minLength: 1, maxLength: 3 }) }),
      cl: fc.oneof({ weight: 3, arbitrary: fc.constant('none' as const) }, { weight: 2, arbitrary: fc.constant('match' as const) }, { weight: 1, arbitrary: fc.constantFrom('0', '1', '7', '1000', '5, 5', '+3', '-1', '0x10', '03') }),
      trailers: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: fc.array(fc.constantFrom<[string, string]>(['x-trailer', 'kgTRAILER'], [':path', '/admin'], ['content-length', '0'], ['host', 'evil.test'], ['transfer-encoding', 'chunked'], ['authorization', 'kgTRAILER-auth'], ['x-api-key', 'kgTRAILER-key']), { minLength: 1, maxLength: 2 }) }),
      reset: fc.oneof({ weight: 10, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    })
    .map((g) => {
      const bodyLen = g.body?.reduce((n, b) => n + b.length, 0) ?? 0;
      let contentLength: GenRequest['contentLength'];
      if (g.cl === 'match') contentLength = { value: String(bodyLen), matches: true, valid: true };
      else if (g.cl !== 'none') {
        const valid = /^[0-9]+$/.test(g.cl);
        contentLength = { value: g.cl, matches: valid && Number(g.cl) === bodyLen, valid };
      }
      return {
        method: g.method,
        scheme: g.scheme,
        path: g.path,
        authority: g.authority,
        host: g.host,
        extraPseudo: g.extraPseudo,
        pseudoLate: g.late === 0 && g.fields.length > 0,
        fields: g.fields,
        body: g.body,
        contentLength,
        trailers: g.trailers,
        reset: g.reset,
      };
    });
}

/** The header block of `r`, with `x-case-id: id` last (the origins' records are matched by it). */
export function wireFields(r: GenRequest, id: string): [string, string][] {
  const pseudo: [string, string][] = [];
  pseudo.push([':method', r.method]);
  if (r.scheme !== undefined) pseudo.push([':scheme', r.scheme]);
  if (r.path !== undefined) pseudo.push([':path', r.path]);
  if (r.authority !== undefined) pseudo.push([':authority', r.authority.value]);
  pseudo.push(...r.extraPseudo);
  const regular: [string, string][] = r.fields.map((f) => [f.name, f.value]);
  if (r.host !== undefined) regular.push(['host', r.host.value]);
  if (r.contentLength) regular.push(['content-length', r.contentLength.value]);
  regular.push(['x-case-id', id]);
  if (r.pseudoLate) return [...pseudo.slice(0, 1), ...regular.slice(0, 1), ...pseudo.slice(1), ...regular.slice(1)];
  return [...pseudo, ...regular];
}

export function toWire(r: GenRequest, id: string): WireRequest {
  return { fields: wireFields(r, id), body: r.body, trailers: r.trailers, reset: r.reset };
}

const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'proxy-authorization', 'http2-settings', 'expect', 'host']);
const SINGLE = new Set(['authorization', 'user-agent', 'content-type', 'range', 'if-match', 'referer', 'from', 'date', 'etag']);

/** What a generated request must become, as far as the test can say without the proxy's own code. */
export interface Expectation {
  /** 'good': must reach the origin and come back 200; 'refuse': must not complete at the origin; 'any': either, under the invariants. */
  verdict: 'good' | 'refuse' | 'any';
  /** When refused for the authority alone: the status the client must get. */
  status?: number;
  /** The normalised path and query (when the path normalises). */
  pathAndQuery?: string;
  /** The rule applies (the path is under /repos/). */
  injected: boolean;
  /** Why (for messages). */
  why: string[];
}

export function expectation(r: GenRequest): Expectation {
  const refuse: string[] = [];
  const any: string[] = [];
  if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(r.method)) refuse.push('method not a token');
  if (r.method === 'CONNECT') refuse.push('CONNECT');
  if (/^(TRACE|TRACK)$/i.test(r.method)) refuse.push('reflecting method');
  if (r.scheme !== 'https') refuse.push(`scheme ${String(r.scheme)}`);
  if (r.extraPseudo.length) refuse.push('extra pseudo-header');
  if (r.pseudoLate) refuse.push('pseudo-header after a regular field');
  let pathAndQuery: string | undefined;
  let injected = false;
  if (r.path === undefined || !r.path.startsWith('/')) refuse.push(`path ${JSON.stringify(r.path)}`);
  else {
    const n = normalisePath(r.path);
    if (isPathRefusal(n)) refuse.push(`path: ${n.error}`);
    else {
      pathAndQuery = n.path + n.query;
      injected = /^\/repos\/./.test(n.path);
      if (/(^|[?&;])_method=TRAC[EK]/i.test(n.query)) refuse.push('_method=TRACE');
    }
  }
  const auths = [r.authority, r.host].filter((a): a is GenAuthority => a !== undefined);
  if (auths.length === 0) refuse.push('no authority');
  let misdirected = false;
  for (const a of auths) {
    // A host field whose bytes are no field value is dropped by nghttp2 like any such field: the
    // request then stands on its :authority alone (the host field never goes upstream anyway).
    if (a === r.host && r.authority !== undefined && /[\0\r\n]|^[ \t]|[ \t]$/.test(a.value)) {
      any.push(`host field ${JSON.stringify(a.value)} not a field value`);
      continue;
    }
    if (a.kind === 'bad') refuse.push(`bad authority ${JSON.stringify(a.value)}`);
    if (a.kind === 'other') misdirected = true;
  }
  if (misdirected) refuse.push('misdirected');
  const counts = new Map<string, number>();
  for (const f of r.fields) {
    if (f.tag === 'refuse') refuse.push(`field ${f.name}: ${f.value}`);
    if (f.tag === 'drop') any.push(`dropped field ${JSON.stringify(f.name)}`);
    if (f.tag === 'ok' || f.tag === 'inject') counts.set(f.name, (counts.get(f.name) ?? 0) + 1);
  }
  for (const [name, n] of counts) if (n > 1 && SINGLE.has(name)) refuse.push(`${name} repeated`);
  if (r.contentLength && !r.contentLength.valid) refuse.push('content-length not a number');
  if (r.contentLength && r.contentLength.valid && !r.contentLength.matches) any.push('content-length mismatch');
  if (r.contentLength && r.body === undefined && r.contentLength.value !== '0' && r.contentLength.valid) refuse.push('content-length without a body');
  if (r.trailers?.some(([n]) => n.startsWith(':'))) any.push('pseudo-header in trailers');
  if (r.trailers?.some(([n]) => HOP.has(n) || n === 'content-length')) any.push('trailer field never allowed');
  if (r.reset) any.push('client reset');
  if (r.method === 'HEAD' && r.body) any.push('HEAD with a body');
  const why = [...refuse, ...any];
  if (refuse.length) {
    const onlyAuthority = refuse.length === 1 && refuse[0] === 'misdirected' && !any.length;
    return { verdict: 'refuse', status: onlyAuthority ? 421 : undefined, pathAndQuery, injected, why };
  }
  return { verdict: any.length ? 'any' : 'good', pathAndQuery, injected, why };
}

/** The regular fields that must reach the origin exactly (name lower-case), cookies joined. */
export function expectedFields(r: GenRequest, injected: boolean): [string, string][] {
  const out: [string, string][] = [];
  const cookies: string[] = [];
  for (const f of r.fields) {
    if (f.tag === 'drop' || f.tag === 'refuse') continue;
    if (f.tag === 'inject' && injected) continue;
    if (HOP.has(f.name)) continue;
    if (f.name === 'cookie') cookies.push(f.value);
    else out.push([f.name, f.value]);
  }
  if (cookies.length) out.push(['cookie', cookies.join('; ')]);
  return out;
}

export { HOP };

// ---- what the origin saw, and the invariants -------------------------------------------------------

/** One request as an origin saw it (either leg), regular fields as received. */
export interface Seen {
  complete: boolean;
  method: string;
  scheme: string;
  pathAndQuery: string;
  authority: string;
  /** Regular fields (no pseudo-header, no host on HTTP/1.1), names as received. */
  fields: [string, string][];
  body: Buffer;
  /** HTTP/1.1: how the body was framed. */
  framing?: 'none' | 'length' | 'chunked';
}

export type Leg = 'h1' | 'h2';

/** Everything the origin of `leg` saw for case `id`: complete requests and cut ones. */
export function seenFor(leg: Leg, h1: H1Recorder, h2: H2Recorder, id: string): Seen[] {
  if (leg === 'h1') {
    const out: Seen[] = [];
    for (const r of h1.requests) {
      if (r.headers.find(([k]) => k.toLowerCase() === 'x-case-id')?.[1] !== id) continue;
      const host = r.headers.filter(([k]) => k.toLowerCase() === 'host');
      out.push({ complete: true, method: r.method, scheme: 'https', pathAndQuery: r.target, authority: host[0]?.[1] ?? '', fields: r.headers.filter(([k]) => k.toLowerCase() !== 'host'), body: r.body, framing: r.framing });
    }
    // A head cut short (its connection closed): seen, never complete.
    for (const c of h1.conns) {
      if (c.rest.toString('latin1').includes(`x-case-id: ${id}\r\n`)) out.push({ complete: false, method: '', scheme: '', pathAndQuery: '', authority: '', fields: [], body: Buffer.alloc(0) });
    }
    return out;
  }
  const out: Seen[] = [];
  for (const s of h2.streams) {
    const pairs: [string, string][] = [];
    for (let i = 0; i + 1 < s.raw.length; i += 2) pairs.push([s.raw[i], s.raw[i + 1]]);
    if (pairs.find(([k]) => k === 'x-case-id')?.[1] !== id) continue;
    const p = (n: string) => pairs.find(([k]) => k === n)?.[1] ?? '';
    out.push({ complete: s.complete, method: p(':method'), scheme: p(':scheme'), pathAndQuery: p(':path'), authority: p(':authority'), fields: pairs.filter(([k]) => !k.startsWith(':')), body: s.body });
  }
  return out;
}

const INJECTED_NAMES = new Set(INJECT.map(([n]) => n));
const asVariable = (n: string) => n.toLowerCase().replace(/_/g, '-');

function multiset(pairs: [string, string][]): string[] {
  return pairs.map(([k, v]) => JSON.stringify([k, v])).sort();
}

/**
 * The invariants for one generated stream: what its origin saw (`seen`) and what its client got
 * (`a`), against what it must become (`e`). Returns the violations (empty: all hold).
 */
export function violations(leg: Leg, r: GenRequest, e: Expectation, a: WireAnswer, seen: Seen[], id: string, tunnelAuthority: string): string[] {
  const v: string[] = [];
  const complete = seen.filter((s) => s.complete);
  const fromOrigin = a.status === 200 && a.body.toString('latin1') === (r.method === 'HEAD' ? '' : `ok ${id}`);
  if (a.hung) v.push('the stream neither ended nor was reset');
  // Nothing the proxy returns carries a configured value.
  const returned = JSON.stringify(a.headers) + a.body.toString('latin1') + JSON.stringify(a.trailers);
  if (returned.includes(SECRET) || returned.includes(KEY)) v.push('the answer carries an injected value');
  if (complete.length > 1) v.push(`${complete.length} complete requests at the origin for one stream`);
  if (e.verdict === 'refuse') {
    if (seen.length) v.push(`refused stream reached the origin (${complete.length} complete)`);
    if (a.status === 200) v.push('refused stream answered 200');
    if (e.status !== undefined && a.status !== e.status) v.push(`status ${a.status} (rst ${a.rstCode}), not ${e.status}`);
  }
  if (e.verdict === 'good' && !(complete.length === 1 && fromOrigin && a.rstCode === 0)) v.push(`good stream not served: status ${a.status} rst ${a.rstCode}, ${complete.length} complete at the origin, body ${JSON.stringify(a.body.toString('latin1').slice(0, 120))}`);
  // The proxy's own answers (no complete request behind them) say they are the proxy's.
  if (a.status !== 0 && complete.length === 0 && !String(a.headers['proxy-status'] ?? '').startsWith('keygate')) v.push(`answer ${a.status} without the proxy's Proxy-Status`);
  // A stream cut before its END_STREAM (client reset, a malformed trailer section) never
  // completes at the origin, but for an HTTP/1.1 body whose Content-Length was all sent.
  const bodyBytes = Buffer.concat(r.body ?? []);
  const cutEarly = r.reset || (r.trailers?.some(([n]) => n.startsWith(':')) ?? false);
  for (const s of complete) {
    if (cutEarly && !(leg === 'h1' && s.framing === 'length')) v.push('a stream cut before its end completed at the origin');
    if (s.method !== r.method) v.push(`method ${JSON.stringify(s.method)}, sent ${JSON.stringify(r.method)}`);
    if (s.scheme !== 'https') v.push(`scheme ${s.scheme}`);
    if (s.pathAndQuery !== e.pathAndQuery) v.push(`path ${JSON.stringify(s.pathAndQuery)}, expected ${JSON.stringify(e.pathAndQuery)}`);
    if (s.authority !== tunnelAuthority) v.push(`authority ${JSON.stringify(s.authority)}, not the tunnel's ${tunnelAuthority}`);
    // Injection: exactly the configured values, once each, and no client spelling of them.
    const lower = s.fields.map(([k, val]): [string, string] => [k.toLowerCase(), val]);
    if (e.injected) {
      for (const [name, value] of INJECT) {
        const got = lower.filter(([k]) => k === name).map(([, val]) => val);
        if (got.length !== 1 || got[0] !== value) v.push(`${name}: ${JSON.stringify(got.map((x) => (x === value ? '<configured>' : x)))}`);
      }
      const spelled = lower.filter(([k]) => !INJECTED_NAMES.has(k) && INJECTED_NAMES.has(asVariable(k)));
      if (spelled.length) v.push(`a client spelling of an injected field reached: ${JSON.stringify(spelled.map(([k]) => k))}`);
    } else if (lower.some(([, val]) => val.includes(SECRET) || val.includes(KEY))) v.push('a configured value was sent without the rule');
    // Hop-by-hop and framing fields: only the proxy's own.
    const extras = new Set(leg === 'h1' ? ['connection', 'content-length', 'transfer-encoding'] : ['content-length', 'te']);
    for (const [k, val] of lower) {
      if (HOP.has(k) && !extras.has(k)) v.push(`hop-by-hop field ${k} at the origin`);
      if (k === 'connection' && !/^(keep-alive|close)$/i.test(val)) v.push(`connection: ${val}`);
      if (k === 'te' && val !== 'trailers') v.push(`te: ${val}`);
      if (k === 'transfer-encoding' && val.toLowerCase() !== 'chunked') v.push(`transfer-encoding: ${val}`);
    }
    if (leg === 'h2' && lower.some(([k]) => k === 'te') && !r.fields.some((f) => f.name === 'te' && f.value === 'trailers')) v.push('te: trailers the client did not ask for');
    // Every other field: exactly the client's valid end-to-end fields, bytes unchanged.
    const got = lower.filter(([k]) => !extras.has(k) && k !== 'x-case-id' && !(e.injected && INJECTED_NAMES.has(k)));
    const want = expectedFields(r, e.injected);
    const g = multiset(got);
    const w = multiset(want);
    if (JSON.stringify(g) !== JSON.stringify(w)) v.push(`fields differ: got ${JSON.stringify(g.filter((x) => !w.includes(x)))}, missing ${JSON.stringify(w.filter((x) => !g.includes(x)))}`);
    // The body: what the client sent, or (a declared length) its first bytes.
    const cl = lower.filter(([k]) => k === 'content-length').map(([, val]) => val);
    if (cl.length > 1) v.push('content-length repeated');
    if (cl.length === 1 && Number(cl[0]) !== s.body.length) v.push(`content-length ${cl[0]} with ${s.body.length} bytes`);
    const declared = r.contentLength?.valid ? Number(r.contentLength.value) : undefined;
    if (declared !== undefined) {
      if (s.body.length !== declared || !s.body.equals(bodyBytes.subarray(0, declared)) || declared > bodyBytes.length) v.push(`body of ${s.body.length} bytes for a declared ${declared} (${bodyBytes.length} sent)`);
    } else if (!s.body.equals(bodyBytes)) v.push(`body of ${s.body.length} bytes, ${bodyBytes.length} sent`);
    for (const t of r.trailers ?? []) if (lower.some(([, val]) => val === t[1])) v.push(`trailer field ${t[0]} reached the origin`);
  }
  return v;
}

/** Protocol-level problems at the HTTP/1.1 origin: framing errors, requests no stream sent. */
export function h1Problems(h1: H1Recorder, knownIds: Set<string>, fromConn = 0, fromReq = 0): string[] {
  const v: string[] = [];
  for (const c of h1.conns.slice(fromConn)) if (c.framingError) v.push(`connection ${c.id}: ${c.framingError}`);
  const counts = new Map<string, number>();
  for (const r of h1.requests.slice(fromReq)) {
    const ids = r.headers.filter(([k]) => k.toLowerCase() === 'x-case-id').map(([, val]) => val);
    if (ids.length !== 1 || !knownIds.has(ids[0])) v.push(`a request no stream sent: ${JSON.stringify(r.head.slice(0, 200))}`);
    else counts.set(ids[0], (counts.get(ids[0]) ?? 0) + 1);
  }
  for (const [id, n] of counts) if (n > 1) v.push(`case ${id} reached the origin ${n} times`);
  return v;
}
