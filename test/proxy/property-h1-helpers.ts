/**
 * Helpers for the HTTP/1.1 property tests (test/proxy/property-h1.test.ts):
 *
 * - a strict recording origin (TLS with the test CA, or plain TCP) that keeps every byte it
 *   receives and parses requests itself, strictly (RFC 9112, no leniency: anything a lenient
 *   parser would have to guess at is a violation), answering each complete request with a
 *   keep-alive 200 that names the request's sequence number (`X-Origin-Req`);
 * - a client-side parser of the responses a raw client read, one after the other;
 * - an independent oracle for the path normalisation of proxy.md (not the code under test).
 */
import net, { type AddressInfo } from 'node:net';
import tls from 'node:tls';
import type { TestPki } from '../helpers/pki.js';

// ---- the strict origin ------------------------------------------------------------------------

export interface StrictRequest {
  /** Global sequence number at this origin (what `X-Origin-Req` says back). */
  seq: number;
  conn: number;
  method: string;
  target: string;
  headers: [string, string][];
  /** The payload (de-chunked). */
  body: Buffer;
  /** The head exactly as received. */
  head: string;
}

export interface StrictOrigin {
  port: number;
  requests: StrictRequest[];
  /** What this origin could not parse strictly (a description and the bytes, latin1, cut). */
  violations: string[];
  /** Every byte received, per connection (latin1). */
  received: string[];
  close(): Promise<void>;
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

type Parsed = { req: Omit<StrictRequest, 'seq' | 'conn'>; consumed: number } | 'incomplete' | { error: string };

/** One strict request at the start of `buf`. */
export function parseStrictRequest(buf: Buffer): Parsed {
  const end = buf.indexOf('\r\n\r\n', 0, 'latin1');
  if (end < 0) {
    const text = buf.toString('latin1');
    if (/[^\r]\n|^\n|\r[^\n]/.test(text)) return { error: 'bare CR or LF in a head' };
    return buf.length > 65536 ? { error: 'head too large' } : 'incomplete';
  }
  const head = buf.toString('latin1', 0, end + 4);
  const lines = head.slice(0, -4).split('\r\n');
  for (const l of lines) if (/[\r\n]/.test(l)) return { error: 'bare CR or LF in a head' };
  const m = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP\/1\.1$/.exec(lines[0]);
  if (!m) return { error: `malformed request line ${JSON.stringify(lines[0].slice(0, 200))}` };
  if (!/^[\x21-\x7e]+$/.test(m[2])) return { error: 'bad byte in the request target' };
  const headers: [string, string][] = [];
  for (const line of lines.slice(1)) {
    const c = line.indexOf(':');
    if (c <= 0) return { error: `not a field line ${JSON.stringify(line.slice(0, 200))}` };
    const name = line.slice(0, c);
    const value = line.slice(c + 1).replace(/^[ \t]+|[ \t]+$/g, '');
    if (!TOKEN.test(name)) return { error: `field name not a token ${JSON.stringify(name.slice(0, 100))}` };
    if (!VALUE.test(value)) return { error: `control byte in field ${name}` };
    headers.push([name, value]);
  }
  const cls = values(headers, 'content-length');
  const tes = values(headers, 'transfer-encoding');
  if (cls.length > 1) return { error: 'more than one Content-Length' };
  if (cls.length && tes.length) return { error: 'Content-Length with Transfer-Encoding' };
  if (tes.length > 1 || (tes.length === 1 && tes[0] !== 'chunked')) return { error: `Transfer-Encoding ${JSON.stringify(tes)}` };
  if (values(headers, 'host').length !== 1) return { error: `${values(headers, 'host').length} Host fields` };
  let body: Buffer;
  let consumed: number;
  const rest = buf.subarray(end + 4);
  if (tes.length) {
    const r = strictDechunk(rest);
    if (r === 'incomplete' || 'error' in r) return r;
    body = r.payload;
    consumed = end + 4 + r.consumed;
  } else if (cls.length) {
    if (!/^\d{1,15}$/.test(cls[0])) return { error: `Content-Length ${JSON.stringify(cls[0])}` };
    const n = Number(cls[0]);
    if (rest.length < n) return 'incomplete';
    body = rest.subarray(0, n);
    consumed = end + 4 + n;
  } else {
    body = Buffer.alloc(0);
    consumed = end + 4;
  }
  return { req: { method: m[1], target: m[2], headers, body: Buffer.from(body), head }, consumed };
}

/** A strict chunked body (RFC 9112 7.1) at the start of `buf`. */
export function strictDechunk(buf: Buffer): { payload: Buffer; consumed: number } | 'incomplete' | { error: string } {
  const parts: Buffer[] = [];
  let i = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', i, 'latin1');
    if (eol < 0) return /\n/.test(buf.toString('latin1', i)) ? { error: 'bare LF in a chunk size line' } : 'incomplete';
    const line = buf.toString('latin1', i, eol);
    const m = /^([0-9a-fA-F]{1,12})(;[\x21-\x7e \t]*)?$/.exec(line);
    if (!m) return { error: `malformed chunk size line ${JSON.stringify(line.slice(0, 100))}` };
    const size = parseInt(m[1], 16);
    i = eol + 2;
    if (size === 0) {
      for (;;) {
        const e = buf.indexOf('\r\n', i, 'latin1');
        if (e < 0) return 'incomplete';
        if (e === i) return { payload: Buffer.concat(parts), consumed: e + 2 };
        const t = buf.toString('latin1', i, e);
        const c = t.indexOf(':');
        if (c <= 0 || !TOKEN.test(t.slice(0, c)) || !VALUE.test(t.slice(c + 1))) return { error: 'malformed trailer' };
        i = e + 2;
      }
    }
    if (buf.length < i + size + 2) return 'incomplete';
    if (buf[i + size] !== 0x0d || buf[i + size + 1] !== 0x0a) return { error: 'chunk data longer than its size' };
    parts.push(buf.subarray(i, i + size));
    i += size + 2;
  }
}

/** Values of a field (any case) in a pair list. */
export function values(headers: [string, string][], name: string): string[] {
  const lower = name.toLowerCase();
  return headers.filter(([k]) => k.toLowerCase() === lower).map(([, v]) => v);
}

/** The strict origin: TLS with `pki`, plain TCP without. */
export async function startStrictOrigin(pki?: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<StrictOrigin> {
  const requests: StrictRequest[] = [];
  const violations: string[] = [];
  const received: string[] = [];
  const sockets = new Set<net.Socket>();
  const onSocket = (s: net.Socket) => {
    const conn = received.length;
    received.push('');
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    let buf: Buffer = Buffer.alloc(0);
    s.on('data', (d: Buffer) => {
      received[conn] += d.toString('latin1');
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      for (;;) {
        const r = parseStrictRequest(buf);
        if (r === 'incomplete') return;
        if ('error' in r) {
          violations.push(`connection ${conn}: ${r.error}: ${JSON.stringify(buf.toString('latin1').slice(0, 300))}`);
          buf = Buffer.alloc(0);
          s.destroy();
          return;
        }
        buf = buf.subarray(r.consumed);
        const seq = requests.length;
        requests.push({ ...r.req, seq, conn });
        const body = `origin-${seq}`;
        s.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Origin-Req: ${seq}\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      }
    });
  };
  const server = pki ? tls.createServer({ key: pki.keyPem, cert: pki.certPem }, onSocket) : net.createServer(onSocket);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    requests,
    violations,
    received,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

// ---- the client's side ------------------------------------------------------------------------

export interface ClientResponse {
  status: number;
  headers: [string, string][];
  body: string;
}

/**
 * The responses in what a client read (latin1), in order: 1xx skipped, bodies by Content-Length,
 * chunked, or the connection's end. `error` when the bytes are not a sequence of responses.
 */
export function parseResponses(text: string): { responses: ClientResponse[]; error?: string } {
  const responses: ClientResponse[] = [];
  let i = 0;
  while (i < text.length) {
    const end = text.indexOf('\r\n\r\n', i);
    if (end < 0) return { responses, error: `incomplete response head ${JSON.stringify(text.slice(i, i + 200))}` };
    const lines = text.slice(i, end).split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})(?: .*)?$/.exec(lines[0]);
    if (!m) return { responses, error: `not a status line ${JSON.stringify(lines[0].slice(0, 200))}` };
    const headers: [string, string][] = lines.slice(1).map((l) => {
      const c = l.indexOf(':');
      return [l.slice(0, c), l.slice(c + 1).trim()];
    });
    const status = Number(m[1]);
    i = end + 4;
    if (status < 200) continue;
    const cl = values(headers, 'content-length');
    const te = values(headers, 'transfer-encoding');
    let body = '';
    if (te.length) {
      const r = strictDechunk(Buffer.from(text.slice(i), 'latin1'));
      if (r === 'incomplete' || 'error' in r) return { responses, error: `bad chunked response body (${r === 'incomplete' ? 'incomplete' : r.error})` };
      body = r.payload.toString('latin1');
      i += r.consumed;
    } else if (cl.length) {
      const n = Number(cl[0]);
      if (text.length - i < n) return { responses, error: 'response body shorter than its Content-Length' };
      body = text.slice(i, i + n);
      i += n;
    } else if (status !== 204 && status !== 304) {
      body = text.slice(i);
      i = text.length;
    }
    responses.push({ status, headers, body });
  }
  return { responses };
}

/** Reads from `socket` until it closes or `deadlineMs` passes, after writing `pieces` (one write each) and ending. */
export function exchange(socket: net.Socket, pieces: Buffer[], deadlineMs: number): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    let text = '';
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ text, closed });
    };
    const timer = setTimeout(() => finish(false), deadlineMs);
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.on('error', () => finish(true));
    socket.on('close', () => finish(true));
    void (async () => {
      for (const p of pieces) {
        if (socket.destroyed) return;
        socket.write(p);
        await new Promise((r) => setImmediate(r));
      }
      if (!socket.destroyed) socket.end();
    })();
  });
}

// ---- the path oracle --------------------------------------------------------------------------

const UNRESERVED = /^[A-Za-z0-9\-._~]$/;

/**
 * proxy.md's path normalisation, written independently for the alphabet the generators use:
 * escapes of unreserved characters decoded (others upper-cased), `.` and `..` resolved, and a
 * refusal for an encoded `/` or `\`, `..` above the root, and a segment that is only an encoded
 * space (an origin stripping trailing whitespace would merge it away). Undefined: refused.
 */
export function oraclePath(rawPath: string): string | undefined {
  if (/%2f|%5c/i.test(rawPath)) return undefined;
  let decoded = '';
  for (let i = 0; i < rawPath.length; i++) {
    if (rawPath[i] !== '%') {
      decoded += rawPath[i];
      continue;
    }
    const hex = rawPath.slice(i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return undefined;
    const ch = String.fromCharCode(parseInt(hex, 16));
    decoded += UNRESERVED.test(ch) ? ch : `%${hex.toUpperCase()}`;
    i += 2;
  }
  const out: string[] = [];
  const segs = decoded.slice(1).split('/');
  for (let i = 0; i < segs.length; i++) {
    const s = segs[i];
    const last = i === segs.length - 1;
    if (s === '.' || s === '..') {
      if (s === '..') {
        if (out.length === 0) return undefined;
        out.pop();
      }
      if (last) out.push('');
      continue;
    }
    if (s === '%20') return undefined;
    out.push(s);
  }
  return '/' + out.join('/');
}
