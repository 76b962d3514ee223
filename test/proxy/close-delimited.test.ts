/**
 * An answer delimited by the end of the origin's connection (no Content-Length, not chunked:
 * RFC 9112 6.3 rule 8) is complete when the origin ends the connection, and not when the
 * connection breaks: a TCP reset in its body must reach every client path as a broken answer
 * (an HTTP/1.1 connection closed before the answer ends; an HTTP/2 stream reset with
 * INTERNAL_ERROR), never as a complete one. The end of a TLS connection with or without
 * close_notify cannot be told apart through Node's TLS socket (both are 'end'), so the clean end
 * is the only end this can check.
 */
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { h2Request, h2Through } from './h2-helpers.js';
import { dialPlain, HOST, INJECTED, Reader, request, startTestProxy, WS_HEADERS, type TestProxy } from './h1/fast-helpers.js';

type End = 'end' | 'reset';

let pki: TestPki;
let origin: net.Server;
let plainOrigin: net.Server;
let port = 0;
let plainPort = 0;
let fast: TestProxy;
let node: TestProxy;

/**
 * Answers each request with a body delimited by the end of the connection, then ends (`/end`) or
 * resets (`/reset`) the TCP connection `raw` under it (`s` is `raw` itself, or TLS on top of it).
 */
function answerThenClose(s: net.Socket, raw: net.Socket): void {
  s.on('error', () => undefined);
  let buf = '';
  s.on('data', (d: Buffer) => {
    buf += d.toString('latin1');
    if (!buf.includes('\r\n\r\n')) return;
    const end = (/^GET \S*\/(\w+) /.exec(buf)?.[1] ?? 'end') as End;
    s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello', () => setTimeout(() => (end === 'reset' ? raw.resetAndDestroy() : s.end()), 50));
  });
}

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return (server.address() as net.AddressInfo).port;
}

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  // A raw TCP server wrapping each connection in TLS itself, so the test can end the TCP
  // connection under the TLS layer (a reset) after the answer's bytes went out.
  origin = net.createServer((raw) => {
    raw.on('error', () => undefined);
    answerThenClose(new tls.TLSSocket(raw, { isServer: true, key: pki.keyPem, cert: pki.certPem, ALPNProtocols: ['http/1.1'] }), raw);
  });
  port = await listen(origin);
  // The same answer over plain HTTP (absolute-form requests through the proxy's listener).
  plainOrigin = net.createServer((s) => answerThenClose(s, s));
  plainPort = await listen(plainOrigin);
  fast = await startTestProxy(pki);
  fast.route(port);
  node = await startTestProxy(pki, { fastPath: false });
  node.route(port);
});

afterAll(async () => {
  for (const p of [fast, node]) await p?.close(200);
  origin?.close();
  plainOrigin?.close();
  // The rule's injected value never reaches the log, whatever broke.
  for (const p of [fast, node]) expect(p?.log() ?? '').not.toContain(INJECTED);
});

/** 'cut' when the connection ended before a whole answer to `req`, else the body. */
async function viaH1(s: net.Socket, req: Buffer): Promise<string> {
  const r = new Reader(s as tls.TLSSocket);
  try {
    const resp = await r.exchange(req);
    return resp.status === 200 ? resp.body.toString('latin1') : `status ${resp.status}`;
  } catch {
    return 'cut';
  } finally {
    s.destroy();
  }
}

/** Intercepted; `ws`: the request is a WebSocket handshake the origin refuses (its answer relayed by websocket.ts). */
async function viaTunnel(px: TestProxy, end: End, ws = false): Promise<string> {
  return viaH1(await px.connect(port), request('GET', `/${end}`, `${HOST}:${port}`, ws ? WS_HEADERS : []));
}

async function viaPlain(end: End): Promise<string> {
  return viaH1(await dialPlain(fast), request('GET', `http://127.0.0.1:${plainPort}/${end}`, `127.0.0.1:${plainPort}`));
}

async function viaH2(end: End): Promise<string> {
  const s = await h2Through(fast.handle.port, HOST, port, fast.caPem);
  try {
    const a = await h2Request(s, { ':method': 'GET', ':path': `/${end}`, ':authority': `${HOST}:${port}`, ':scheme': 'https' });
    if (a.rstCode !== 0) return a.rstCode === http2.constants.NGHTTP2_INTERNAL_ERROR ? 'cut' : `reset ${a.rstCode}`;
    return a.status === 200 ? a.body : `status ${a.status}`;
  } finally {
    s.destroy();
  }
}

describe('an answer delimited by the end of the connection', () => {
  it.each(['fast', 'node'] as const)('HTTP/1.1 client, %s path: complete when the origin ends the connection', async (path) => {
    expect(await viaTunnel(path === 'fast' ? fast : node, 'end')).toBe('hello');
  });
  it.each(['fast', 'node'] as const)('HTTP/1.1 client, %s path: cut when the connection is reset in its body', async (path) => {
    expect(await viaTunnel(path === 'fast' ? fast : node, 'reset')).toBe('cut');
  });
  it('a refused WebSocket handshake: complete when the origin ends the connection', async () => {
    expect(await viaTunnel(fast, 'end', true)).toBe('hello');
  });
  it('a refused WebSocket handshake: cut when the connection is reset in its body', async () => {
    expect(await viaTunnel(fast, 'reset', true)).toBe('cut');
  });
  it('plain HTTP: complete when the origin ends the connection', async () => {
    expect(await viaPlain('end')).toBe('hello');
  });
  it('plain HTTP: cut when the connection is reset in its body', async () => {
    expect(await viaPlain('reset')).toBe('cut');
  });
  it('HTTP/2 client: complete when the origin ends the connection', async () => {
    expect(await viaH2('end')).toBe('hello');
  });
  it('HTTP/2 client: cut when the connection is reset in its body', async () => {
    expect(await viaH2('reset')).toBe('cut');
  });
});
