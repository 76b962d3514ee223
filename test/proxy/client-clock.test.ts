/**
 * The client's idle clock (`idle_timeout_ms`) during an exchange, one policy on every path
 * (limits.ts idleCutsExchange): a client that stopped reading the answer, or stopped sending the
 * body it announced, is cut once nothing moved for that long (an HTTP/1.1 client's connection;
 * an HTTP/2 client's stream alone, RST_STREAM(CANCEL)), its upstream request is given up, and
 * the access record says which it was; a client waiting for a slow upstream is left to the
 * upstream clocks. Before, an HTTP/2 client's session clock closed only a session with no stream
 * in flight: a client could hold streams, and the upstream connections and streams behind them,
 * for as long as it liked. Real clients (node:http2, raw TLS) through the proxy to real origins
 * (one speaking HTTP/2, one HTTP/1.1) on loopback.
 */
import http2, { type ClientHttp2Stream, type ServerHttp2Stream } from 'node:http2';
import type net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import type { RequestRecord } from '../../src/proxy/context.js';
import { eventually } from './hardening-helpers.js';
import { h2Through } from './h2-helpers.js';
import { HOST, INJECTED, Reader, request, startScriptedOrigin, startTestProxy, type ScriptedOrigin, type TestProxy } from './h1/fast-helpers.js';
import { pumpChunks } from '../helpers/pump.js';

const IDLE_MS = 600;
const BIG = 32 << 20;

let pki: TestPki;
let px: TestProxy;
/** The same limits with the fast path off: HTTP/1.1 clients through Node's server. */
let nodePx: TestProxy;
/** HTTP/2: /big answers 32 MiB; /upload reads the body to its end; /slow answers after 3 idle clocks. */
let h2o: http2.Http2SecureServer;
let h2Port = 0;
/** Whether each origin stream (by path) ended its life, and how. */
const originEnd = new Map<string, string>();
/** HTTP/1.1: /big answers 32 MiB; anything else reads its body to the end, then answers. */
let h1o: ScriptedOrigin;
/** HTTP/1.1, hand-written: reads a request head, then nothing more, ever. */
let deaf: tls.Server;
let deafPort = 0;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  px = await startTestProxy(pki, { limits: { idleTimeoutMs: IDLE_MS } });
  nodePx = await startTestProxy(pki, { limits: { idleTimeoutMs: IDLE_MS }, fastPath: false });
  h2o = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem });
  h2o.on('stream', (s: ServerHttp2Stream, h) => {
    const path = String(h[':path']);
    s.on('error', () => undefined);
    s.on('close', () => originEnd.set(path, s.rstCode ? `reset ${s.rstCode}` : 'closed'));
    if (path.startsWith('/big')) {
      s.respond({ ':status': 200 });
      pumpChunks(s, Buffer.alloc(64 * 1024, 0x61), BIG / (64 * 1024));
    } else if (path.startsWith('/deaf')) {
      s.pause(); // reads nothing of the body, ever
    } else if (path.startsWith('/slow')) {
      setTimeout(() => {
        s.respond({ ':status': 200 });
        s.end('slow but sure');
      }, IDLE_MS * 3);
    } else {
      s.resume();
      s.on('end', () => {
        s.respond({ ':status': 200 });
        s.end('whole');
      });
    }
  });
  await new Promise<void>((r) => h2o.listen(0, '127.0.0.1', () => r()));
  h2Port = (h2o.address() as net.AddressInfo).port;
  h1o = await startScriptedOrigin(pki, (req, s) => {
    const body = req.path.startsWith('/big') ? Buffer.alloc(BIG, 0x61) : Buffer.from('whole');
    s.write(Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n\r\n`), body]));
  });
  deaf = tls.createServer({ key: pki.keyPem, cert: pki.certPem }, (s) => {
    s.on('error', () => undefined);
    s.once('data', () => s.pause());
  });
  await new Promise<void>((r) => deaf.listen(0, '127.0.0.1', () => r()));
  deafPort = (deaf.address() as net.AddressInfo).port;
  for (const p of [px, nodePx]) {
    p.route(h2Port);
    p.route(h1o.port);
    p.route(deafPort);
  }
});

afterAll(async () => {
  await px?.close(200);
  await nodePx?.close(200);
  deaf?.close();
  h2o?.close();
  await h1o?.close();
  // The rule's injected value never reaches a log line, cut exchanges included.
  for (const p of [px, nodePx]) expect(p?.log() ?? '').not.toContain(INJECTED);
});

/** Resolves with how the client's stream ended: `reset N`, `closed`, or `open` after `ms`. */
function endOf(req: ClientHttp2Stream, ms: number): Promise<string> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve('open'), ms);
    req.on('error', () => undefined);
    req.on('close', () => {
      clearTimeout(timer);
      resolve(req.rstCode ? `reset ${req.rstCode}` : 'closed');
    });
  });
}

/** The access record of the request for `path`, once written (undefined after `ms`). */
async function recordOf(p: TestProxy, path: string, ms = 2000): Promise<RequestRecord | undefined> {
  const find = () => p.records.find((r) => r.path === path);
  await eventually(() => find() !== undefined, ms, 20);
  return find();
}

const origins = [
  ['an HTTP/2 origin', () => h2Port],
  ['an HTTP/1.1 origin', () => h1o.port],
] as const;

describe.each(origins)('an HTTP/2 client, %s', (_name, port) => {
  it('that stops reading the answer: its stream is reset after the idle clock, and the upstream request given up', async () => {
    const p = port();
    const c = await h2Through(px.handle.port, HOST, p, px.caPem);
    try {
      const path = `/big-stall-${p}`;
      const req = c.request({ ':path': path, ':authority': `${HOST}:${p}` });
      // Reads one chunk, then nothing: its window closes, the proxy's queue toward it fills.
      req.once('data', () => req.pause());
      const ended = endOf(req, IDLE_MS * 8);
      expect(await ended).toBe(`reset ${http2.constants.NGHTTP2_CANCEL}`);
      if (p === h2Port) {
        await eventually(() => originEnd.has(path), 2000, 20);
        expect(originEnd.get(path)).toMatch(/^reset /);
      }
      expect((await recordOf(px, path))?.error).toBe('client stopped reading');
    } finally {
      c.destroy();
    }
  });

  it('that stops sending the body it announced: its stream is reset after the idle clock', async () => {
    const p = port();
    const c = await h2Through(px.handle.port, HOST, p, px.caPem);
    try {
      const path = `/upload-stall-${p}`;
      const req = c.request({ ':path': path, ':authority': `${HOST}:${p}`, ':method': 'POST' }, { endStream: false });
      req.write('the first part, and nothing after it');
      expect(await endOf(req, IDLE_MS * 8)).toBe(`reset ${http2.constants.NGHTTP2_CANCEL}`);
      expect((await recordOf(px, path))?.error).toBe('client stopped sending the request body');
    } finally {
      c.destroy();
    }
  });

  it('that reads slowly but steadily is not cut', async () => {
    const p = port();
    const c = await h2Through(px.handle.port, HOST, p, px.caPem);
    try {
      const req = c.request({ ':path': `/big-steady-${p}`, ':authority': `${HOST}:${p}` });
      let got = 0;
      // Pauses shorter than the idle clock between reads.
      req.on('data', (d: Buffer) => {
        got += d.length;
        if (got % (4 << 20) < d.length) {
          req.pause();
          setTimeout(() => req.resume(), IDLE_MS / 2);
        }
      });
      expect(await endOf(req, 30_000)).toBe('closed');
      expect(got).toBe(BIG);
    } finally {
      c.destroy();
    }
  }, 40_000);
});

it.each([
  ['an HTTP/2 origin', () => h2Port, '/deaf'],
  ['an HTTP/1.1 origin', () => deafPort, '/deaf'],
] as const)('an HTTP/2 client whose upstream (%s) stops reading its body: the stream is reset, and the record blames the upstream', async (_name, port, prefix) => {
  const p = port();
  const c = await h2Through(px.handle.port, HOST, p, px.caPem);
  const path = `${prefix}-h2-${p}`;
  const req = c.request({ ':path': path, ':authority': `${HOST}:${p}`, ':method': 'POST' }, { endStream: false });
  const stop = pumpChunks(req, Buffer.alloc(16 * 1024, 0x61));
  try {
    expect(await endOf(req, IDLE_MS * 8)).toBe(`reset ${http2.constants.NGHTTP2_CANCEL}`);
    expect((await recordOf(px, path))?.error).toBe('upstream stopped reading the request body');
  } finally {
    stop();
    c.destroy();
  }
});

it('an HTTP/2 client waiting for a slow upstream is left to the upstream clocks, not cut by its idle clock', async () => {
  const c = await h2Through(px.handle.port, HOST, h2Port, px.caPem);
  try {
    const req = c.request({ ':path': '/slow', ':authority': `${HOST}:${h2Port}` });
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (d: string) => (body += d));
    expect(await endOf(req, IDLE_MS * 10)).toBe('closed');
    expect(body).toBe('slow but sure');
  } finally {
    c.destroy();
  }
});

describe.each(['fast', 'node'] as const)('an HTTP/1.1 client (the %s exchange)', (exchange) => {
  const proxy = () => (exchange === 'fast' ? px : nodePx);

  it('that stops reading the answer: its connection is cut after the idle clock', async () => {
    const path = `/big-h1-${exchange}`;
    const t = await proxy().connect(h1o.port);
    const c = new Reader(t);
    t.write(request('GET', path, `${HOST}:${h1o.port}`));
    t.pause();
    try {
      // A paused client sees no end: the proxy's record says when it cut, then the client reads.
      expect((await recordOf(proxy(), path, IDLE_MS * 8))?.error).toBe('client stopped reading');
      t.resume();
      expect(await c.waitClosed(5000)).toBe(true);
      expect(c.pending.length).toBeLessThan(BIG);
    } finally {
      t.destroy();
    }
  });

  // A Content-Length upload takes the fast path; a chunked one Node's server on either.
  it.each(['length', 'chunked'] as const)('that stops sending its %s body: its connection is cut after the idle clock', async (framing) => {
    const path = `/upload-h1-${exchange}-${framing}`;
    const t = await proxy().connect(h1o.port);
    const c = new Reader(t);
    const head: [string, string] = framing === 'length' ? ['Content-Length', '100000'] : ['Transfer-Encoding', 'chunked'];
    t.write(request('POST', path, `${HOST}:${h1o.port}`, [head], framing === 'length' ? 'x'.repeat(1000) : `3e8\r\n${'x'.repeat(1000)}\r\n`));
    try {
      expect(await c.waitClosed(IDLE_MS * 8)).toBe(true);
      expect((await recordOf(proxy(), path))?.error).toBe('client stopped sending the request body');
    } finally {
      t.destroy();
    }
  });
});

describe.each(['fast', 'node'] as const)('an HTTP/1.1 client whose upstream stops reading its body (the %s exchange)', (exchange) => {
  const proxy = () => (exchange === 'fast' ? px : nodePx);
  it.each(['length', 'chunked'] as const)('%s body: the connection is cut, and the record blames the upstream', async (framing) => {
    const path = `/deaf-h1-${exchange}-${framing}`;
    const t = await proxy().connect(deafPort);
    const c = new Reader(t);
    const piece = Buffer.alloc(16 * 1024, 0x61);
    const head: [string, string] = framing === 'length' ? ['Content-Length', String(1 << 30)] : ['Transfer-Encoding', 'chunked'];
    t.write(request('POST', path, `${HOST}:${deafPort}`, [head]));
    const stop = pumpChunks(t, framing === 'length' ? piece : Buffer.concat([Buffer.from('4000\r\n'), piece, Buffer.from('\r\n')]));
    try {
      expect(await c.waitClosed(IDLE_MS * 8)).toBe(true);
      expect((await recordOf(proxy(), path))?.error).toBe('upstream stopped reading the request body');
    } finally {
      stop();
      t.destroy();
    }
  });
});

describe('a client waiting for its CONNECT answer', () => {
  // The proxy mints a leaf for a new host before its 200: the client waits for the proxy then,
  // it is not idle. The first mint exports the leaf key (a crypto job on libuv's thread pool); a
  // pool kept busy (here by pbkdf2, in production as well by slow DNS lookups) makes it wait far
  // longer than this idle clock. The connection used to be destroyed with no answer at all.
  it('is not cut by its idle clock while the proxy mints its leaf', async () => {
    const { mkdtempSync, rmSync } = await import('node:fs');
    const crypto = await import('node:crypto');
    const os = await import('node:os');
    const path = await import('node:path');
    const { ensureCa } = await import('../../src/certs/index.js');
    const { createLogger } = await import('../../src/log.js');
    const { startProxy } = await import('../../src/proxy/server.js');
    const { compileConfig } = await import('../../src/rules/index.js');
    const { connectTunnel } = await import('../helpers/connect.js');
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-mint-idle-'));
    const idleMs = 150;
    const handle = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca: await ensureCa(path.join(dir, 'certs')),
      config: compileConfig({ no_proxy: [], rules: [{ name: 'one', match_hosts: ['mint.test.local'], headers: [{ name: 'X-Key', value: INJECTED }] }] }),
      logger: createLogger({ level: 'silent' }),
      limits: { idleTimeoutMs: idleMs },
    });
    try {
      // Every thread of the pool busy for longer than the idle clock (measured, not assumed).
      const started = performance.now();
      const threads = Number(process.env.UV_THREADPOOL_SIZE) || 4;
      const busy = Array.from({ length: threads }, () => new Promise<number>((r) => crypto.pbkdf2('p', 's', 400_000, 64, 'sha512', () => r(performance.now() - started))));
      const c = await connectTunnel(handle.port, 'mint.test.local:443').then(
        (a) => String(a.status),
        (err: Error) => err.message,
      );
      const held = Math.min(...(await Promise.all(busy)));
      expect(held, 'the pool was busy for longer than the idle clock').toBeGreaterThan(idleMs);
      expect(c).toBe('200');
    } finally {
      await handle.close(200);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
