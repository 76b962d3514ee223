/**
 * Helpers for the fast-path tests (test/proxy/h1/fast-path.test.ts): an in-process proxy that
 * records its events, a raw TLS origin that parses requests itself and lets each test write the
 * exact response bytes (so the test controls the framing), and a client-side reader that parses
 * HTTP/1.1 responses from a raw socket one after the other, keeping their wire bytes.
 */
import { mkdtempSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import tls from 'node:tls';
import { expect } from 'vitest';
import { ensureCa, type Ca } from '../../../src/certs/index.js';
import { createLogger } from '../../../src/log.js';
import { startProxy, type ProxyHandle, type ProxyLimits, type RequestRecord } from '../../../src/proxy/server.js';
import { compileConfig } from '../../../src/rules/index.js';
import { interceptedTls } from '../../helpers/connect.js';
import type { TestPki } from '../../helpers/pki.js';

/** The intercepted host (a rule injects X-Key for it) and a second name on the origin's certificate. */
export const HOST = 'fast.test.local';
export const OTHER = 'other.test.local';
export const INJECTED = 'kgINJECTED-fast-7f3a';

// ---- the proxy ----------------------------------------------------------------------------------

let caPromise: Promise<Ca> | undefined;
/** One proxy CA for the whole file (created once, loaded by every proxy). */
function proxyCa(): Promise<Ca> {
  caPromise ??= ensureCa(path.join(mkdtempSync(path.join(os.tmpdir(), 'kg-fast-')), 'certs'));
  return caPromise;
}

export interface TestProxy {
  handle: ProxyHandle;
  caPem: string;
  /** Every 'request' record, in emission order. */
  records: RequestRecord[];
  /** Reasons of every 'fast_path_fallback' event. */
  fallbacks: string[];
  /** The JSON log lines written so far. */
  log(): string;
  /** Makes `HOST:port` and `OTHER:port` reach 127.0.0.1 (the proxy's --resolve map). */
  route(port: number): void;
  /** CONNECT HOST:port through the proxy, then TLS trusting the proxy CA. */
  connect(port: number, host?: string): Promise<tls.TLSSocket>;
  close(graceMs?: number): Promise<void>;
}

export async function startTestProxy(pki: TestPki, opts: { limits?: Partial<ProxyLimits>; fastPath?: boolean } = {}): Promise<TestProxy> {
  const ca = await proxyCa();
  let logText = '';
  const logger = createLogger({ destination: new Writable({ write: (c, _e, cb) => ((logText += c), cb()) }) });
  // Kept by reference in the proxy (Upstream.resolveMap): entries added later apply.
  const resolve = new Map<string, string>();
  const handle = await startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: compileConfig({ no_proxy: [], rules: [{ name: 'fast', match_hosts: [HOST, OTHER], headers: [{ name: 'X-Key', value: INJECTED }] }] }),
    logger,
    resolve,
    upstreamCa: [pki.caPem],
    limits: opts.limits,
    fastPath: opts.fastPath ?? true,
  });
  const records: RequestRecord[] = [];
  const fallbacks: string[] = [];
  handle.events.on('request', (r: RequestRecord) => records.push(r));
  handle.events.on('fast_path_fallback', (e: { reason: string }) => fallbacks.push(e.reason));
  return {
    handle,
    caPem: ca.certPem,
    records,
    fallbacks,
    log: () => logText,
    route(port) {
      resolve.set(`${HOST}:${port}`, '127.0.0.1');
      resolve.set(`${OTHER}:${port}`, '127.0.0.1');
    },
    async connect(port, host = HOST) {
      const t = await interceptedTls(handle.port, host, port, ca.certPem);
      t.on('error', () => undefined);
      return t;
    },
    close: (graceMs = 1000) => handle.close(graceMs),
  };
}

// ---- a scripted origin ---------------------------------------------------------------------------

/** Both exchanges, each routed to the origin: the fast path and the Node path (Node's HTTP server and undici). */
export async function startBothExchanges(pki: TestPki, originPort: number): Promise<Record<'fast' | 'node', TestProxy>> {
  const proxies = {} as Record<'fast' | 'node', TestProxy>;
  for (const name of ['fast', 'node'] as const) {
    proxies[name] = await startTestProxy(pki, { fastPath: name === 'fast' });
    proxies[name].route(originPort);
  }
  return proxies;
}

/** Closes what startBothExchanges started and the origin, and checks no log line holds the injected value. */
export async function closeBothExchanges(proxies: Partial<Record<'fast' | 'node', TestProxy>>, origin: { close(): Promise<void> } | undefined): Promise<void> {
  for (const p of Object.values(proxies)) await p?.close(500);
  await origin?.close();
  for (const p of Object.values(proxies)) expect(p!.log()).not.toContain(INJECTED);
}

export interface OriginConn {
  id: number;
  socket: tls.TLSSocket;
  /** Complete requests received on this connection. */
  requests: number;
  /** Bytes received on it. */
  received: number;
  closed: boolean;
}

export interface OriginRequest {
  method: string;
  target: string;
  path: string;
  /** The head as received (latin1), final CRLF CRLF included. */
  head: string;
  headers: [string, string][];
  /** Body after de-chunking (the wire framing is checked through `head`). */
  body: Buffer;
  conn: OriginConn;
  /** 1-based index of this request on its connection. */
  n: number;
}

export interface ScriptedOrigin {
  port: number;
  conns: OriginConn[];
  requests: OriginRequest[];
  close(): Promise<void>;
}

/** Values of a header (any case) in a pair list. */
export function values(headers: [string, string][], name: string): string[] {
  const lower = name.toLowerCase();
  return headers.filter(([k]) => k.toLowerCase() === lower).map(([, v]) => v);
}

function parseHeadLines(head: string): { start: string; headers: [string, string][] } {
  const lines = head.split('\r\n').filter((l) => l !== '');
  const headers: [string, string][] = [];
  for (const line of lines.slice(1)) {
    const c = line.indexOf(':');
    headers.push([line.slice(0, c), line.slice(c + 1).trim()]);
  }
  return { start: lines[0] ?? '', headers };
}

/**
 * A whole chunked body at the start of `buf` (size lines, data, trailers, final CRLF):
 * its payload and trailer lines, and the bytes it took; undefined while incomplete; throws when malformed.
 */
export function dechunk(buf: Buffer): { payload: Buffer; trailers: string[]; consumed: number } | undefined {
  const parts: Buffer[] = [];
  let i = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', i, 'latin1');
    if (eol < 0) return undefined;
    const sizeText = buf.toString('latin1', i, eol).split(';')[0];
    if (!/^[0-9a-fA-F]+$/.test(sizeText)) throw new Error(`malformed chunk size line: ${JSON.stringify(buf.toString('latin1', i, eol))}`);
    const size = parseInt(sizeText, 16);
    i = eol + 2;
    if (size === 0) {
      const trailers: string[] = [];
      for (;;) {
        const e = buf.indexOf('\r\n', i, 'latin1');
        if (e < 0) return undefined;
        if (e === i) return { payload: Buffer.concat(parts), trailers, consumed: e + 2 };
        trailers.push(buf.toString('latin1', i, e));
        i = e + 2;
      }
    }
    if (buf.length < i + size + 2) return undefined;
    if (buf[i + size] !== 0x0d || buf[i + size + 1] !== 0x0a) throw new Error('chunk data longer than its size');
    parts.push(buf.subarray(i, i + size));
    i += size + 2;
  }
}

/**
 * A TLS origin (certificate from `pki`) that parses each request (Content-Length or chunked
 * body) and calls `handle` with it and the raw socket: the handler writes whatever bytes it
 * wants, or nothing. Requests pipelined on one connection are handled in order.
 */
export async function startScriptedOrigin(pki: Pick<TestPki, 'certPem' | 'keyPem'>, handle: (req: OriginRequest, s: tls.TLSSocket) => void): Promise<ScriptedOrigin> {
  const conns: OriginConn[] = [];
  const requests: OriginRequest[] = [];
  const server = tls.createServer({ key: pki.keyPem, cert: pki.certPem }, (s) => {
    const conn: OriginConn = { id: conns.length, socket: s, requests: 0, received: 0, closed: false };
    conns.push(conn);
    s.on('error', () => undefined);
    s.on('close', () => (conn.closed = true));
    let buf: Buffer = Buffer.alloc(0);
    // The request whose body is being read, with what remains of it (Content-Length) or -1 (chunked).
    let current: { head: string; start: string; headers: [string, string][]; left: number; parts: Buffer[] } | undefined;
    const deliver = (body: Buffer) => {
      const c = current!;
      current = undefined;
      const [method, target] = c.start.split(' ');
      conn.requests++;
      const req: OriginRequest = { method, target, path: target.split('?')[0], head: c.head, headers: c.headers, body, conn, n: conn.requests };
      requests.push(req);
      handle(req, s);
    };
    const pump = () => {
      for (;;) {
        if (!current) {
          const end = buf.indexOf('\r\n\r\n', 0, 'latin1');
          if (end < 0) return;
          const head = buf.toString('latin1', 0, end + 4);
          buf = buf.subarray(end + 4);
          const { start, headers } = parseHeadLines(head);
          const te = values(headers, 'transfer-encoding')[0];
          const cl = values(headers, 'content-length')[0];
          current = { head, start, headers, left: te ? -1 : Number(cl ?? 0), parts: [] };
          if (current.left === 0) {
            deliver(Buffer.alloc(0));
            continue;
          }
        }
        const c = current;
        if (c.left === -1) {
          let r;
          try {
            r = dechunk(buf);
          } catch {
            s.destroy();
            return;
          }
          if (!r) return;
          buf = buf.subarray(r.consumed);
          deliver(r.payload);
          continue;
        }
        if (buf.length === 0) return;
        const take = Math.min(c.left, buf.length);
        c.parts.push(buf.subarray(0, take));
        c.left -= take;
        buf = buf.subarray(take);
        if (c.left > 0) return;
        deliver(Buffer.concat(c.parts));
      }
    };
    s.on('data', (d: Buffer) => {
      conn.received += d.length;
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      pump();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as AddressInfo).port,
    conns,
    requests,
    async close() {
      for (const c of conns) c.socket.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** A response with a Content-Length body. */
export function lengthResponse(body: string | Buffer, headers: string[] = [], status = '200 OK'): Buffer {
  const b = typeof body === 'string' ? Buffer.from(body) : body;
  return Buffer.concat([Buffer.from(`HTTP/1.1 ${status}\r\n${headers.map((h) => h + '\r\n').join('')}Content-Length: ${b.length}\r\n\r\n`, 'latin1'), b]);
}

/** The origin's usual answer: what it received, as JSON. */
export function echo(req: OriginRequest, s: tls.TLSSocket, extraHeaders: string[] = []): void {
  const body = JSON.stringify({ method: req.method, target: req.target, headers: req.headers, bodyLength: req.body.length, conn: req.conn.id, n: req.n });
  s.write(lengthResponse(body, ['Content-Type: application/json', ...extraHeaders]));
}

// ---- the client side -------------------------------------------------------------------------------

export interface Resp {
  status: number;
  head: string;
  headers: [string, string][];
  /** Payload (de-chunked). */
  body: Buffer;
  /** The body bytes exactly as they came on the wire (chunk framing and trailers included). */
  wire: Buffer;
  framing: 'length' | 'chunked' | 'close' | 'none';
  trailers: string[];
}

/** One whole response at the start of `buf` for a request of `method`; undefined while incomplete. */
function parseResponse(buf: Buffer, method: string, eof: boolean): { resp: Resp; consumed: number } | undefined {
  const end = buf.indexOf('\r\n\r\n', 0, 'latin1');
  if (end < 0) return undefined;
  const head = buf.toString('latin1', 0, end + 4);
  const { start, headers } = parseHeadLines(head);
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(start)?.[1] ?? 0);
  const rest = buf.subarray(end + 4);
  const base = { status, head, headers, trailers: [] as string[] };
  if (method === 'HEAD' || status < 200 || status === 204 || status === 304) {
    return { resp: { ...base, body: Buffer.alloc(0), wire: Buffer.alloc(0), framing: 'none' }, consumed: end + 4 };
  }
  if (values(headers, 'transfer-encoding').length) {
    const r = dechunk(rest);
    if (!r) return undefined;
    return { resp: { ...base, body: r.payload, wire: rest.subarray(0, r.consumed), framing: 'chunked', trailers: r.trailers }, consumed: end + 4 + r.consumed };
  }
  const cl = values(headers, 'content-length');
  if (cl.length) {
    const n = Number(cl[0]);
    if (rest.length < n) return undefined;
    const body = rest.subarray(0, n);
    return { resp: { ...base, body, wire: body, framing: 'length' }, consumed: end + 4 + n };
  }
  if (!eof) return undefined;
  return { resp: { ...base, body: rest, wire: rest, framing: 'close' }, consumed: buf.length };
}

/** Reads HTTP/1.1 responses from a raw client socket, one after the other. */
export class Reader {
  private buf: Buffer = Buffer.alloc(0);
  /** The peer ended or the socket closed. */
  eof = false;
  /** The socket is closed. */
  closed = false;
  private wakers: (() => void)[] = [];

  constructor(readonly socket: tls.TLSSocket) {
    socket.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.wake();
    });
    socket.on('end', () => {
      this.eof = true;
      this.wake();
    });
    socket.on('close', () => {
      this.eof = true;
      this.closed = true;
      this.wake();
    });
  }

  private wake(): void {
    const w = this.wakers;
    this.wakers = [];
    for (const f of w) f();
  }

  private changed(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.wakers.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /** Bytes received and not consumed by a response yet. */
  get pending(): Buffer {
    return this.buf;
  }

  /** The next whole response; rejects when the connection ends first or after `ms`. */
  async next(method = 'GET', ms = 10_000): Promise<Resp> {
    const deadline = Date.now() + ms;
    for (;;) {
      const r = parseResponse(this.buf, method, this.eof);
      if (r) {
        this.buf = this.buf.subarray(r.consumed);
        return r.resp;
      }
      if (this.eof) throw new Error(`connection ended before a complete response (${this.buf.length} bytes: ${JSON.stringify(this.buf.toString('latin1').slice(0, 200))})`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no complete response within ${ms} ms (${this.buf.length} bytes: ${JSON.stringify(this.buf.toString('latin1').slice(0, 200))})`);
      await this.changed(left);
    }
  }

  /** Resolves once the connection is closed (true) or after `ms` (false). */
  async waitClosed(ms = 10_000): Promise<boolean> {
    const deadline = Date.now() + ms;
    while (!this.closed) {
      const left = deadline - Date.now();
      if (left <= 0) return false;
      await this.changed(left);
    }
    return true;
  }

  /** Sends `data` and reads the next response. */
  async exchange(data: string | Buffer, method = 'GET', ms = 10_000): Promise<Resp> {
    this.socket.write(data);
    return this.next(method, ms);
  }
}

/** A plain TCP connection to the proxy's listener, for absolute-form `http://` requests. */
export function dialPlain(px: TestProxy): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(px.handle.port, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  });
}

/** The fields of a WebSocket handshake request (RFC 6455 4.1). */
export const WS_HEADERS: [string, string][] = [
  ['Upgrade', 'websocket'],
  ['Connection', 'Upgrade'],
  ['Sec-WebSocket-Key', 'dGhlIHNhbXBsZSBub25jZQ=='],
  ['Sec-WebSocket-Version', '13'],
];

/** A request head (Host first unless `headers` names one), CRLF-terminated, with an optional body. */
export function request(method: string, target: string, host: string | undefined, headers: [string, string][] = [], body?: string | Buffer): Buffer {
  const lines = [`${method} ${target} HTTP/1.1`];
  if (host !== undefined) lines.push(`Host: ${host}`);
  for (const [k, v] of headers) lines.push(`${k}: ${v}`);
  const head = Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1');
  return body === undefined ? head : Buffer.concat([head, typeof body === 'string' ? Buffer.from(body) : body]);
}
