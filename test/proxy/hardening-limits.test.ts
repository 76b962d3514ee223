/**
 * Limits (issue #9 part 1), each over real sockets against a spawned `keygate proxy` configured
 * with `--limit` to a few hundred milliseconds, plus in-process proxies for connection counts and
 * the certificate cache. Streams that make progress outlive every idle clock.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { parseLimitFlag, resolveLimits } from '../../src/proxy/limits.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { connectTunnel, interceptedTls, tlsOverTunnel } from '../helpers/connect.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { runCli, spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { dial, readUntilClose, rawPlain, startRecordingOrigin, type RecordingOrigin } from './hardening-helpers.js';

const HOSTS = ['api.test.local', 'silent.test.local', 'a.test.local', 'b.test.local'];
let pki: TestPki;
let origin: TestOrigin;
let plain: RecordingOrigin;
let silent: net.Server;
let silentPort = 0;
let hanging: net.Server;
let hangingPort = 0;
let proxy: SpawnedProxy;
let agent: ProxyAgent;
const held = new Set<net.Socket>();

beforeAll(async () => {
  pki = await createTestPki(HOSTS);
  origin = await startOrigin(pki);
  plain = await startRecordingOrigin();
  // Accepts TCP and never speaks: a TLS connect to it can only time out.
  silent = net.createServer((s) => {
    held.add(s);
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  silentPort = (silent.address() as net.AddressInfo).port;
  // Reads a request and never answers.
  hanging = net.createServer((s) => {
    held.add(s);
    s.on('error', () => undefined);
    s.resume();
  });
  await new Promise<void>((r) => hanging.listen(0, '127.0.0.1', r));
  hangingPort = (hanging.address() as net.AddressInfo).port;
  proxy = await spawnProxy({
    config: { rules: [{ name: 'api', match_hosts: ['api.test.local', 'silent.test.local'], headers: [{ name: 'X-Key', type: 'plaintext', value: 'v' }] }] },
    resolve: [`api.test.local:${origin.port}:127.0.0.1`, `silent.test.local:${silentPort}:127.0.0.1`],
    upstreamCa: [pki.caPem],
    extraArgs: [
      ...['header_timeout_ms=400', 'idle_timeout_ms=700', 'tls_handshake_timeout_ms=400', 'max_header_bytes=4096', 'max_header_count=20'],
      ...['max_request_line_bytes=1024', 'connect_timeout_ms=500', 'response_header_timeout_ms=500'],
    ].flatMap((l) => ['--limit', l]),
  });
  agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
});

afterAll(async () => {
  await agent?.close();
  for (const s of held) s.destroy();
  await proxy?.stop();
  await origin?.close();
  await plain?.close();
  await new Promise((r) => silent?.close(r));
  await new Promise((r) => hanging?.close(r));
});

const plainGet = (extra: string[] = [], target = `/x`) => `GET http://127.0.0.1:${plain.port}${target} HTTP/1.1\r\nHost: plain.test.local:${plain.port}\r\n${extra.map((h) => h + '\r\n').join('')}Connection: close\r\n\r\n`;

/** CONNECT + TLS to an intercepted host; the TLS socket. */
async function intercepted(host = 'api.test.local', port = origin.port) {
  return interceptedTls(proxy.port, host, port, proxy.caPem);
}

function proxyStatusOf(text: string): string {
  return /\r\nProxy-Status: ([^\r\n]+)/i.exec(text)?.[1] ?? '';
}

describe('request head size, field count and request line', () => {
  it('431 for too many header fields (plain), and the origin receives nothing', async () => {
    const before = plain.connections;
    const res = await rawPlain(proxy.port, plainGet(Array.from({ length: 25 }, (_, i) => `X-H${i}: v`)));
    expect(res.status).toBe(431);
    expect(res.text).toMatch(/more than 20 header fields/);
    expect(proxyStatusOf(res.text)).toMatch(/^keygate; error=http_request_error/);
    expect(plain.connections).toBe(before);
    // Exactly the limit passes.
    const ok = await rawPlain(proxy.port, plainGet(Array.from({ length: 18 }, (_, i) => `X-H${i}: v`)));
    expect(ok.status).toBe(200);
  });

  it('431 for a head larger than max_header_bytes', async () => {
    const before = plain.connections;
    const res = await rawPlain(proxy.port, plainGet([`X-Big: ${'a'.repeat(5000)}`]));
    expect(res.status).toBe(431);
    expect(res.text).toMatch(/larger than 4096 bytes/);
    expect(plain.connections).toBe(before);
  });

  it('414 for a request line longer than max_request_line_bytes, also when it alone overflows the head', async () => {
    const before = plain.connections;
    const res = await rawPlain(proxy.port, plainGet([], `/${'p'.repeat(1500)}`));
    expect(res.status).toBe(414);
    const huge = await rawPlain(proxy.port, plainGet([], `/${'p'.repeat(6000)}`));
    expect(huge.status).toBe(414);
    expect(plain.connections).toBe(before);
  });

  it('the same limits inside an intercepted tunnel (431 and 414), nothing reaches the origin', async () => {
    const before = origin.requests;
    const t = await intercepted();
    const head = `GET /x HTTP/1.1\r\nHost: api.test.local:${origin.port}\r\n${Array.from({ length: 25 }, (_, i) => `X-H${i}: v\r\n`).join('')}\r\n`;
    const res = await readUntilClose(t, head);
    expect(res.status).toBe(431);
    const t2 = await intercepted();
    const res2 = await readUntilClose(t2, `GET /${'q'.repeat(2000)} HTTP/1.1\r\nHost: api.test.local:${origin.port}\r\n\r\n`);
    expect(res2.status).toBe(414);
    expect(origin.requests).toBe(before);
  });

  it('a CONNECT with too many fields is refused too', async () => {
    const res = await rawPlain(proxy.port, `CONNECT api.test.local:${origin.port} HTTP/1.1\r\n${Array.from({ length: 25 }, (_, i) => `X-H${i}: v\r\n`).join('')}\r\n`);
    expect(res.status).toBe(431);
  });
});

describe('slow-loris: header timeout (408) and idle clocks', () => {
  it('408 then close for a request head that never completes (plain)', async () => {
    const res = await rawPlain(proxy.port, `GET http://127.0.0.1:${plain.port}/ HTTP/1.1\r\nHost: plain`, 4000);
    expect(res.closed).toBe(true);
    expect(res.status).toBe(408);
  });

  it('408 then close inside an intercepted tunnel', async () => {
    const t = await intercepted();
    const res = await readUntilClose(t, `GET /x HTTP/1.1\r\nHost: api.test.local`, 4000);
    expect(res.closed).toBe(true);
    expect(res.status).toBe(408);
  });

  it('a connection that never sends a byte is closed', async () => {
    const res = await readUntilClose(await dial(proxy.port), undefined, 4000);
    expect(res.closed).toBe(true);
  });

  it('TLS handshake timeout: nothing, or half a ClientHello, after CONNECT 200 -> closed', async () => {
    const c = await connectTunnel(proxy.port, `api.test.local:${origin.port}`);
    expect(c.status).toBe(200);
    expect((await readUntilClose(c.socket, undefined, 4000)).closed).toBe(true);
    const c2 = await connectTunnel(proxy.port, `api.test.local:${origin.port}`);
    const half = await readUntilClose(c2.socket, Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]), 4000);
    expect(half.closed).toBe(true);
    expect(half.text).toBe('');
  });

  it('an idle blind tunnel is closed after idle_timeout_ms', async () => {
    // other.test.local is no rule host: a blind tunnel to the plain origin.
    const c = await connectTunnel(proxy.port, `127.0.0.1:${plain.port}`);
    expect(c.status).toBe(200);
    const res = await readUntilClose(c.socket, undefined, 5000);
    expect(res.closed).toBe(true);
  });

  it('an upload that stalls mid-body is cut by the idle clock', async () => {
    const s = await dial(proxy.port);
    const res = await readUntilClose(s, `POST http://127.0.0.1:${hangingPort}/up HTTP/1.1\r\nHost: 127.0.0.1:${hangingPort}\r\nContent-Length: 100\r\n\r\n0123456789`, 5000);
    expect(res.closed).toBe(true);
  });
});

describe('streams that make progress outlive every idle clock', () => {
  it('an SSE stream longer than the idle timeout, an event every 250 ms, keeps going', async () => {
    const res = await request(`https://api.test.local:${origin.port}/sse?n=9`, { dispatcher: agent });
    expect(res.statusCode).toBe(200);
    const releaser = setInterval(() => origin.release(), 250);
    const started = Date.now();
    try {
      const text = await res.body.text();
      for (let i = 1; i <= 9; i++) expect(text).toContain(`data: ${i}\n\n`);
    } finally {
      clearInterval(releaser);
    }
    // The stream lasted well past idle_timeout_ms (700) and the response timeouts (500).
    expect(Date.now() - started).toBeGreaterThan(1500);
  });

  it('a slow upload that keeps sending (a chunk every 250 ms for 2 s) keeps going', async () => {
    let n = 0;
    const body = Readable.from(
      (async function* () {
        for (; n < 8; n++) {
          await new Promise((r) => setTimeout(r, 250));
          yield Buffer.alloc(1000, 0x61);
        }
      })(),
    );
    const res = await request(`https://api.test.local:${origin.port}/upload`, { dispatcher: agent, method: 'POST', body });
    expect(res.statusCode).toBe(200);
    expect(((await res.body.json()) as { bytes: number }).bytes).toBe(8000);
  });
});

describe('upstream timeouts (504)', () => {
  it('connect timeout: an upstream that accepts TCP and never answers TLS', async () => {
    const res = await request(`https://silent.test.local:${silentPort}/x`, { dispatcher: agent });
    expect(res.statusCode).toBe(504);
    expect(res.headers['proxy-status']).toMatch(/error=connection_timeout/);
    expect(await res.body.text()).toMatch(/timed out/);
  });

  it('response header timeout: an upstream that reads the request and never answers', async () => {
    const res = await rawPlain(proxy.port, `GET http://127.0.0.1:${hangingPort}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    expect(res.status).toBe(504);
    expect(proxyStatusOf(res.text)).toMatch(/error=http_response_timeout/);
  });
});

describe('connection limits (in-process proxy)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-limits-'));
  let p: ProxyHandle;
  beforeAll(async () => {
    const ca = await ensureCa(path.join(dir, 'certs'));
    p = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca,
      config: compileConfig({ rules: [], no_proxy: [] }),
      logger: createLogger({ level: 'silent' }),
      limits: { maxConnections: 3, maxConnectionsPerClient: 2 },
    });
  });
  afterAll(async () => {
    await p?.close(500);
    rmSync(dir, { recursive: true, force: true });
  });

  const from = (localAddress: string) =>
    new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect({ port: p.port, host: '127.0.0.1', localAddress }, () => resolve(s));
      s.once('error', reject);
    });

  it('per client: the third connection from one address hears 503 and why; another address still gets in', async () => {
    const a1 = await from('127.0.0.1');
    const a2 = await from('127.0.0.1');
    const refusedEvents: unknown[] = [];
    p.events.on('connection_refused', (e) => refusedEvents.push(e));
    const a3 = await readUntilClose(await from('127.0.0.1'), `GET http://127.0.0.1:${plain.port}/ HTTP/1.1\r\nHost: x\r\n\r\n`);
    expect(a3.status).toBe(503);
    expect(a3.text).toMatch(/this client has reached its limit of 2 connections/);
    expect(proxyStatusOf(a3.text)).toMatch(/^keygate; /);
    expect(refusedEvents).toEqual([{ client: '127.0.0.1', reason: 'max_connections_per_client' }]);
    // The refused request was never forwarded.
    const b1 = await from('127.0.0.2');
    // In total: 3 open; a fourth from yet another address is over the total.
    const c1 = await readUntilClose(await from('127.0.0.3'), `GET http://127.0.0.1:${plain.port}/ HTTP/1.1\r\nHost: x\r\n\r\n`);
    expect(c1.status).toBe(503);
    expect(c1.text).toMatch(/limit of 3 connections/);
    // Closing one frees a slot: counts follow closes.
    a1.destroy();
    await new Promise((r) => setTimeout(r, 100));
    const ok = await readUntilClose(await from('127.0.0.1'), `GET http://127.0.0.1:${plain.port}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    expect(ok.status).toBe(200);
    a2.destroy();
    b1.destroy();
  });
});

describe('certificate cache (LRU, configurable)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-certcache-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  async function minted(size: number): Promise<boolean[]> {
    const ca = await ensureCa(path.join(dir, `certs-${size}`));
    const p = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca,
      config: compileConfig({ rules: [{ name: 'all', match_hosts: ['*.test.local'], headers: [] }], no_proxy: [] }),
      logger: createLogger({ level: 'silent' }),
      limits: { certCacheSize: size },
    });
    const cached: boolean[] = [];
    p.events.on('cert', (e: { cached: boolean }) => cached.push(e.cached));
    try {
      for (const host of ['a.test.local', 'b.test.local', 'a.test.local']) {
        const c = await connectTunnel(p.port, `${host}:${origin.port}`);
        const t = await tlsOverTunnel(c.socket, host, ca.certPem);
        t.destroy();
      }
    } finally {
      await p.close(200);
    }
    return cached;
  }

  it('size 1 evicts (a, b, a mints three times); size 2 keeps a', async () => {
    expect(await minted(1)).toEqual([false, false, false]);
    expect(await minted(2)).toEqual([false, false, true]);
  });
});

describe('--limit parsing', () => {
  it('accepts known keys with ranges; the CLI rejects unknown keys and bad values with exit 2', async () => {
    expect(parseLimitFlag('idle_timeout_ms=500')).toEqual(['idleTimeoutMs', 500]);
    expect(() => parseLimitFlag('nope=1')).toThrow(/unknown limit 'nope'/);
    expect(() => parseLimitFlag('max_header_bytes=10')).toThrow(/between 1024/);
    expect(() => parseLimitFlag('max_connections=0')).toThrow(/at least 1/);
    expect(resolveLimits({ maxConnections: 5 }, { maxConnections: undefined }).maxConnections).toBe(5);
    const r = await runCli(['proxy', '--config', '/nonexistent.json', '--limit', 'max_connections=-1']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--limit must be KEY=INTEGER/);
  });
});

describe('the idle clock is request-aware (in-process proxy)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-idle-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('a request waiting longer than idle_timeout_ms for a slow upstream still gets its answer', async () => {
    const slow = net.createServer((s) => {
      s.on('error', () => undefined);
      s.once('data', () => setTimeout(() => s.end('HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nslow'), 900));
    });
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    const ca = await ensureCa(path.join(dir, 'certs'));
    const p = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca,
      config: compileConfig({ rules: [], no_proxy: [] }),
      logger: createLogger({ level: 'silent' }),
      limits: { idleTimeoutMs: 300, responseHeaderTimeoutMs: 5000 },
    });
    try {
      const port = (slow.address() as net.AddressInfo).port;
      const res = await rawPlain(p.port, `GET http://127.0.0.1:${port}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
      expect(res.status).toBe(200);
      expect(res.text.endsWith('slow')).toBe(true);
      // The same client idle with no request in flight is cut.
      const idle = await readUntilClose(await dial(p.port), undefined, 3000);
      expect(idle.closed).toBe(true);
    } finally {
      await p.close(200);
      await new Promise((r) => slow.close(r));
    }
  });
});
