/**
 * Faults without leaks (issue #9 part 3): origins that refuse, reset mid-body, hang or answer
 * garbage; clients that abort mid-upload and mid-download; DNS failure; a CA close to expiry.
 * After each fault the spawned proxy's open descriptors return to their baseline, and its RSS
 * stays bounded over the whole file.
 */
import 'reflect-metadata';
import { webcrypto } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import * as x509 from '@peculiar/x509';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { memoryOf, spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { dial, eventually, fdCount, rawPlain, readUntilClose, sleep } from './hardening-helpers.js';
import { pumpChunks } from '../helpers/pump.js';

let faulty: net.Server;
let faultyPort = 0;
let closedPort = 0;
let proxy: SpawnedProxy;
let baselineFds = 0;
let baselineRssKb = 0;
const held = new Set<net.Socket>();
let uploadBytes = 0;

/** A raw origin whose behaviour is chosen by the request path. */
function onFaultySocket(s: net.Socket): void {
  held.add(s);
  s.on('close', () => held.delete(s));
  s.on('error', () => undefined);
  let head = '';
  s.on('data', (d: Buffer) => {
    if (head.includes('\r\n\r\n')) {
      uploadBytes += d.length;
      return;
    }
    head += d.toString('latin1');
    if (!head.includes('\r\n\r\n')) return;
    const p = /^[A-Z]+ (\S+)/.exec(head)?.[1] ?? '/';
    if (p === '/ok') s.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    else if (p === '/reset-mid-body') {
      s.write(`HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n${'x'.repeat(1000)}`);
      setTimeout(() => s.resetAndDestroy(), 50);
    } else if (p === '/malformed-length') s.end('HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nbody');
    else if (p === '/garbage') s.end('this is not HTTP at all\r\n\r\n');
    else if (p === '/bad-header') s.end('HTTP/1.1 200 OK\r\nX-Bad: a\x00b\r\nContent-Length: 0\r\n\r\n');
    else if (p === '/download') {
      s.write('HTTP/1.1 200 OK\r\nContent-Length: 50000000\r\n\r\n');
      pumpChunks(s, Buffer.alloc(64 * 1024, 0x62));
    } else if (p === '/upload') {
      /* reads forever, never answers */
    } else if (p === '/hang') {
      /* never answers */
    }
  });
}

beforeAll(async () => {
  faulty = net.createServer(onFaultySocket);
  await new Promise<void>((r) => faulty.listen(0, '127.0.0.1', r));
  faultyPort = (faulty.address() as net.AddressInfo).port;
  const closed = net.createServer();
  await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
  closedPort = (closed.address() as net.AddressInfo).port;
  await new Promise((r) => closed.close(r));
  proxy = await spawnProxy({
    config: { rules: [] },
    extraArgs: ['keep_alive_timeout_ms=300', 'response_header_timeout_ms=600', 'idle_timeout_ms=1500'].flatMap((l) => ['--limit', l]),
  });
  // Warm up (first-use allocations) before taking the baseline.
  for (let i = 0; i < 3; i++) expect((await get('/ok')).status).toBe(200);
  await sleep(500);
  baselineFds = fdCount(proxy.pid);
  baselineRssKb = memoryOf(proxy.pid).rssKb;
});

afterAll(async () => {
  for (const s of held) s.destroy();
  await proxy?.stop();
  await new Promise((r) => faulty?.close(r));
});

function get(p: string, port = faultyPort) {
  return rawPlain(proxy.port, `GET http://127.0.0.1:${port}${p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
}

/** Descriptors back to the baseline (keep-alive upstream sockets close after 300 ms). */
async function expectNoFdLeak(what: string) {
  const ok = await eventually(() => fdCount(proxy.pid) <= baselineFds, 5000);
  expect(ok, `${what}: proxy has ${fdCount(proxy.pid)} open descriptors, baseline ${baselineFds}`).toBe(true);
}

describe('origin faults', () => {
  it('origin refusing the connection: 502 connection_refused', async () => {
    const r = await get('/x', closedPort);
    expect(r.status).toBe(502);
    expect(r.text).toMatch(/error=connection_refused/);
    expect(r.text).toMatch(/refused the connection/);
    await expectNoFdLeak('refused');
  });

  it('origin resetting mid-body: the client sees a broken response (never a complete one)', async () => {
    const r = await get('/reset-mid-body');
    expect(r.status).toBe(200);
    expect(r.closed).toBe(true);
    const body = r.text.slice(r.text.indexOf('\r\n\r\n') + 4);
    expect(body.length).toBeLessThan(100000);
    await expectNoFdLeak('reset mid-body');
    const line = () => proxy.logs().find((l) => l.type === 'request' && l.path === '/reset-mid-body');
    expect(await eventually(() => line() !== undefined, 2000), JSON.stringify(proxy.logs().slice(-3))).toBe(true);
    expect(line()!.error).toBeDefined();
  });

  it('origin hanging: 504 after response_header_timeout_ms', async () => {
    const r = await get('/hang');
    expect(r.status).toBe(504);
    expect(r.text).toMatch(/error=http_response_timeout/);
    await expectNoFdLeak('hang');
  });

  it('origin sending a malformed response (bad Content-Length, garbage, a NUL in a header): 502', async () => {
    for (const p of ['/malformed-length', '/garbage', '/bad-header']) {
      const r = await get(p);
      expect(r.status, p).toBe(502);
      expect(r.text).toMatch(/Proxy-Status: keygate; error=/i);
    }
    await expectNoFdLeak('malformed');
  });

  it('DNS failure: 502 dns_error naming the host', async () => {
    const r = await rawPlain(proxy.port, 'GET http://does-not-exist.invalid/ HTTP/1.1\r\nHost: does-not-exist.invalid\r\nConnection: close\r\n\r\n');
    expect(r.status).toBe(502);
    expect(r.text).toMatch(/error=dns_error/);
    expect(r.text).toMatch(/cannot resolve does-not-exist\.invalid/);
    const c = await rawPlain(proxy.port, 'CONNECT does-not-exist.invalid:443 HTTP/1.1\r\nHost: does-not-exist.invalid:443\r\n\r\n');
    expect(c.status).toBe(502);
    await expectNoFdLeak('dns');
  });
});

describe('client faults', () => {
  it('client aborting mid-download: the upstream transfer is cancelled', async () => {
    const s = await dial(proxy.port);
    let got = 0;
    await new Promise<void>((resolve) => {
      s.on('data', (d: Buffer) => {
        got += d.length;
        if (got > 1_000_000) {
          s.destroy();
          resolve();
        }
      });
      s.write(`GET http://127.0.0.1:${faultyPort}/download HTTP/1.1\r\nHost: x\r\n\r\n`);
    });
    // The origin's socket is closed by the proxy (no transfer continues into the void).
    expect(await eventually(() => [...held].every((h) => h.destroyed || h.readableEnded), 5000)).toBe(true);
    await expectNoFdLeak('abort mid-download');
  });

  it('client aborting mid-upload: the upstream request is aborted too', async () => {
    const s = await dial(proxy.port);
    s.write(`POST http://127.0.0.1:${faultyPort}/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n`);
    s.write(Buffer.alloc(200_000, 0x61));
    expect(await eventually(() => uploadBytes > 0, 5000)).toBe(true);
    s.destroy();
    expect(await eventually(() => held.size === 0, 5000)).toBe(true);
    await expectNoFdLeak('abort mid-upload');
  });

  it('client aborting a tunnel mid-stream', async () => {
    const c = await rawPlain(proxy.port, `CONNECT 127.0.0.1:${faultyPort} HTTP/1.1\r\nHost: x\r\n\r\n`, 300);
    expect(c.status).toBe(200);
    const s = await dial(proxy.port);
    await readUntilClose(s, `CONNECT 127.0.0.1:${faultyPort} HTTP/1.1\r\nHost: x\r\n\r\nGET /download HTTP/1.1\r\nHost: x\r\n\r\n`, 300);
    await expectNoFdLeak('tunnel abort');
  });

  it('memory stays bounded across all the faults above', async () => {
    const rss = memoryOf(proxy.pid).rssKb;
    const growthMb = (rss - baselineRssKb) / 1024;
    expect(growthMb, `RSS grew ${growthMb.toFixed(1)} MB`).toBeLessThan(64);
    expect(await eventually(() => fdCount(proxy.pid) <= baselineFds, 3000)).toBe(true);
  });
});

describe('CA expiry approaching', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-ca-expiry-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  async function caExpiringIn(days: number): Promise<string> {
    x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);
    const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
    const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
    const cert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber: '01',
      name: 'CN=keygate expiring CA',
      notBefore: new Date(Date.now() - 3600_000),
      notAfter: new Date(Date.now() + days * 24 * 3600_000 + 3600_000),
      signingAlgorithm: alg,
      keys,
      extensions: [new x509.BasicConstraintsExtension(true, 0, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true), await x509.SubjectKeyIdentifierExtension.create(keys.publicKey)],
    });
    const certs = path.join(dir, `ca-${days}`);
    mkdirSync(certs);
    const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey)).toString('base64');
    writeFileSync(path.join(certs, 'ca-key.pem'), `-----BEGIN PRIVATE KEY-----\n${der.replace(/(.{64})/g, '$1\n')}\n-----END PRIVATE KEY-----\n`, { mode: 0o600 });
    writeFileSync(path.join(certs, 'ca.pem'), cert.toString('pem') + '\n');
    return certs;
  }

  it('warns in the log (and as an event) N days before, configurable; silent outside the window', async () => {
    const certs = await caExpiringIn(5);
    const warned = await spawnProxy({ config: { rules: [] }, certsDir: certs, extraArgs: ['--limit', 'ca_expiry_warn_days=10'] });
    try {
      expect(await eventually(() => warned.logs().some((l) => l.type === 'ca_expiry'), 3000)).toBe(true);
      const line = warned.logs().find((l) => l.type === 'ca_expiry')!;
      expect(line.days_left).toBe(5);
      expect(line.level).toBe(40);
      expect(String(line.msg)).toMatch(/expires in 5 days/);
    } finally {
      await warned.stop();
    }
    const quiet = await spawnProxy({ config: { rules: [] }, certsDir: certs, extraArgs: ['--limit', 'ca_expiry_warn_days=3'] });
    try {
      await sleep(300);
      expect(quiet.logs().some((l) => l.type === 'ca_expiry')).toBe(false);
    } finally {
      await quiet.stop();
    }
  });
});
