/**
 * A sweep of docs' proxy.md (the proxy's security properties) over real sockets, on both
 * intercepted paths (the strict HTTP/1.1 fast path and Node's parser, `fastPath: false`) and
 * HTTP/2 where it applies, against a local HTTPS origin with its own test CA that keeps every
 * byte it receives. Each case is one line of proxy.md an earlier review did not cover:
 *
 * - the admin listener bound to a wildcard address is reachable by no address of the host;
 * - a client's chunked trailer (or HTTP/2 trailing HEADERS) carrying an injected header's name
 *   never reaches the origin beside the injected value;
 * - a 3xx from the origin is handed back, never followed;
 * - upstream TLS that fails verification (a name the certificate does not cover) is 502, nothing sent;
 * - cleartext HTTP inside a CONNECT tunnel to a rule host is 403, never forwarded.
 */
import http from 'node:http';
import { mkdtempSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigHolder } from '../../src/admin/config-holder.js';
import { ProxyMetrics } from '../../src/admin/metrics.js';
import { startAdmin, type AdminHandle } from '../../src/admin/server.js';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { connectTunnel, interceptedTls } from '../helpers/connect.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { spawnProxy } from '../helpers/proxy.js';
import { h2Through } from './h2-helpers.js';

const HOST = 'sweep.test.local';
/** A name the origin's certificate does not cover (pinned to the same origin). */
const WRONG = 'wrongname.test.local';
/** An internationalised rule host (`bücher.test.local` in the configuration) and its ASCII form. */
const IDN = 'xn--bcher-kva.test.local';
/** An intercepted host whose one rule covers only `/only/*`. */
const PATHS_HOST = 'paths.test.local';
const SECRET = 'kgSECRET-sweep-3b7f0a';
const ADMIN_TOKEN = 'kgADMIN-sweep-token-0123456789abcdef';

// ---- an origin that keeps every byte and what its HTTP parser made of them ---------------------

interface Seen {
  method: string;
  url: string;
  rawHeaders: string[];
  rawTrailers: string[];
}

interface Origin {
  port: number;
  /** Every byte received on every connection, in arrival order (latin1). */
  bytes(): string;
  /** Requests as the origin's HTTP server read them. */
  seen: Seen[];
  close(): Promise<void>;
}

async function startOrigin(pki: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<Origin> {
  let bytes = '';
  const seen: Seen[] = [];
  const app = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', rawHeaders: req.rawHeaders, rawTrailers: req.rawTrailers });
      if (req.url === '/redirect') {
        res.writeHead(302, { location: `https://${WRONG}:1/stolen`, 'content-length': '0' });
        res.end();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('origin');
    });
  });
  const sockets = new Set<net.Socket>();
  const server = tls.createServer({ key: pki.keyPem, cert: pki.certPem, ALPNProtocols: ['http/1.1'] }, (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('data', (d: Buffer) => (bytes += d.toString('latin1')));
    app.emit('connection', s);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as net.AddressInfo).port,
    bytes: () => bytes,
    seen,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

// ---- proxies -----------------------------------------------------------------------------------

let pki: TestPki;
let ca: Ca;
let origin: Origin;
let logs = '';
const proxies = new Map<boolean, ProxyHandle>();

/** A logger into `logs` (checked for the secret after all tests). */
const kept = () => createLogger({ destination: new Writable({ write: (c, _e, cb) => ((logs += c), cb()) }) });

async function proxy(fastPath: boolean): Promise<ProxyHandle> {
  const logger = kept();
  return startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: compileConfig({
      no_proxy: [],
      rules: [
        { name: 'sweep', match_hosts: [HOST, WRONG, 'bücher.test.local'], headers: [{ name: 'X-Key', value: SECRET }] },
        { name: 'paths', match_hosts: [PATHS_HOST], match_paths: ['/only/*'], headers: [{ name: 'X-Key', value: SECRET }] },
      ],
    }),
    logger,
    resolve: new Map([
      [`${HOST}:${origin.port}`, '127.0.0.1'],
      [`${HOST}:80`, '127.0.0.1'],
      [`${WRONG}:${origin.port}`, '127.0.0.1'],
      [`${IDN}:${origin.port}`, '127.0.0.1'],
      [`${PATHS_HOST}:${origin.port}`, '127.0.0.1'],
    ]),
    upstreamCa: [pki.caPem],
    fastPath,
  });
}

beforeAll(async () => {
  pki = await createTestPki([HOST, IDN, PATHS_HOST]);
  ca = await ensureCa(path.join(mkdtempSync(path.join(os.tmpdir(), 'kg-sweep-')), 'certs'));
  origin = await startOrigin(pki);
  proxies.set(true, await proxy(true));
  proxies.set(false, await proxy(false));
});

afterAll(async () => {
  for (const p of proxies.values()) await p.close(200);
  await origin?.close();
  expect(logs).not.toContain(SECRET);
  expect(logs).not.toContain(ADMIN_TOKEN);
});

/** Writes `data`, reads until the peer closes or `ms` passes. */
function converse(s: net.Socket | tls.TLSSocket, data: string | Buffer, ms = 3000): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    const timer = setTimeout(() => finish(), ms);
    const finish = () => {
      clearTimeout(timer);
      s.destroy();
      resolve(text);
    };
    s.on('data', (d: Buffer) => (text += d.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', finish);
    s.write(data);
  });
}

/** The values of header `name` (any case) in a flat raw list. */
function valuesOf(raw: string[], name: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) if (raw[i].toLowerCase() === name) out.push(raw[i + 1]);
  return out;
}

const PATHS = [
  ['fast path', true],
  ['Node path', false],
] as const;

// ---- the admin listener on a wildcard address --------------------------------------------------

describe('the admin listener bound to every address (0.0.0.0) is never reachable through the proxy port', () => {
  let admin: AdminHandle;
  let p: ProxyHandle;

  beforeAll(async () => {
    const metrics = new ProxyMetrics();
    p = await startProxy({ listen: { host: '127.0.0.1', port: 0 }, ca, config: compileConfig({ no_proxy: [], rules: [] }), logger: kept() });
    const holder = new ConfigHolder({ proxy: { setConfig: (c) => p.setConfig(c) }, metrics });
    admin = await startAdmin({ listen: { host: '0.0.0.0', port: 0 }, token: ADMIN_TOKEN, holder, metrics, proxy: p });
  });

  afterAll(async () => {
    await admin?.close();
    await p?.close(200);
  });

  /** Every address of this host the wildcard listener answers on, in the spellings a client can use. */
  function spellings(): string[] {
    const out = ['127.0.0.2', '127.9.9.9', '127.1', '2130706434', '[::ffff:127.0.0.2]', '[::ffff:7f00:3]'];
    for (const list of Object.values(os.networkInterfaces())) {
      for (const a of list ?? []) {
        if (a.internal || a.address.startsWith('fe80')) continue;
        out.push(a.family === 'IPv6' ? `[${a.address}]` : a.address);
      }
    }
    return out;
  }

  it('by CONNECT to any loopback or interface address of the host', async () => {
    for (const host of spellings()) {
      const c = await connectTunnel(p.port, `${host}:${admin.port!}`);
      let answer = c.body;
      if (c.status === 200) answer = await converse(c.socket, `GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_TOKEN}\r\n\r\n`);
      expect(c.status, `CONNECT ${host}: ${answer.slice(0, 120)}`).toBe(403);
      expect(answer).not.toMatch(/"status"/);
      c.socket.destroy();
    }
  });

  it('by an absolute-form http:// request to any of them', async () => {
    for (const host of spellings()) {
      const s = net.connect(p.port, '127.0.0.1');
      const answer = await converse(s, `GET http://${host}:${admin.port!}/healthz HTTP/1.1\r\nHost: ${host}:${admin.port!}\r\nAuthorization: Bearer ${ADMIN_TOKEN}\r\n\r\n`);
      expect(answer, host).toMatch(/^HTTP\/1\.1 403 /);
      expect(answer).not.toMatch(/"status"/);
    }
  });
});

describe('a deny target named by a loopback address covers its port on every address of the host', () => {
  // What the sandbox API does for its own server (src/sandbox-api/area.ts): it denies
  // 127.0.0.1, localhost and [::1] at its port, whatever address the server is bound to.
  it('a server on 0.0.0.0 denied as 127.0.0.1:PORT is reached by no other loopback or interface address', async () => {
    let reached = 0;
    const api = net.createServer((s) => {
      reached++;
      s.on('error', () => undefined);
      s.end('HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\napi');
    });
    await new Promise<void>((r) => api.listen(0, '0.0.0.0', r));
    const port = (api.address() as net.AddressInfo).port;
    const p = await startProxy({ listen: { host: '127.0.0.1', port: 0 }, ca, config: compileConfig({ no_proxy: [], rules: [] }), logger: kept() });
    try {
      for (const h of ['127.0.0.1', 'localhost', '[::1]']) p.denyTarget(`${h}:${port}`);
      const hosts = ['127.0.0.2', '[::ffff:127.0.0.9]', '2130706435'];
      for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) if (!a.internal && !a.address.startsWith('fe80')) hosts.push(a.family === 'IPv6' ? `[${a.address}]` : a.address);
      for (const host of hosts) {
        const c = await connectTunnel(p.port, `${host}:${port}`);
        expect(c.status, `CONNECT ${host}`).toBe(403);
        c.socket.destroy();
        const answer = await converse(net.connect(p.port, '127.0.0.1'), `GET http://${host}:${port}/ HTTP/1.1\r\nHost: ${host}:${port}\r\n\r\n`);
        expect(answer, `GET ${host}`).toMatch(/^HTTP\/1\.1 403 /);
      }
      expect(reached).toBe(0);
      // Another port of the same host stays reachable: the deny is the port, not the host.
      const other = net.createServer((s) => s.end());
      await new Promise<void>((r) => other.listen(0, '127.0.0.2', r));
      const c = await connectTunnel(p.port, `127.0.0.2:${(other.address() as net.AddressInfo).port}`);
      expect(c.status).toBe(200);
      c.socket.destroy();
      await new Promise<void>((r) => other.close(() => r()));
    } finally {
      await p.close(100);
      await new Promise<void>((r) => api.close(() => r()));
    }
  });
});

describe('a proxy bound to every address (0.0.0.0) never connects to itself (a loop)', () => {
  it('CONNECT and absolute-form to its own port by loopback and interface addresses are 403', async () => {
    const p = await startProxy({ listen: { host: '0.0.0.0', port: 0 }, ca, config: compileConfig({ no_proxy: [], rules: [] }), logger: kept() });
    try {
      const hosts = ['127.0.0.1', '127.0.0.2', 'localhost', '[::ffff:127.0.0.3]', '2130706433'];
      for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) if (!a.internal && !a.address.startsWith('fe80')) hosts.push(a.family === 'IPv6' ? `[${a.address}]` : a.address);
      for (const host of hosts) {
        const c = await connectTunnel(p.port, `${host}:${p.port}`);
        expect(c.status, `CONNECT ${host}`).toBe(403);
        c.socket.destroy();
        const answer = await converse(net.connect(p.port, '127.0.0.1'), `GET http://${host}:${p.port}/ HTTP/1.1\r\nHost: ${host}:${p.port}\r\n\r\n`);
        expect(answer, `GET ${host}`).toMatch(/^HTTP\/1\.1 403 /);
      }
    } finally {
      await p.close(100);
    }
  });
});

// ---- trailers carrying an injected header's name -----------------------------------------------

describe.each(PATHS)('a client trailer cannot put a second value beside the injected one (%s)', (_name, fast) => {
  it('a chunked request whose trailer names the injected header: the origin gets the injected value only, in the head', async () => {
    const p = proxies.get(fast)!;
    const t = await interceptedTls(p.port, HOST, origin.port, ca.certPem);
    const mark = origin.bytes().length;
    const before = origin.seen.length;
    const answer = await converse(
      t,
      `POST /trailer HTTP/1.1\r\nHost: ${HOST}:${origin.port}\r\nTransfer-Encoding: chunked\r\nTrailer: X-Key\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\nX-Key: client-trailer\r\nx-KEY: client-trailer-2\r\n\r\n`,
    );
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    expect(answer).not.toContain(SECRET);
    const got = origin.seen.slice(before);
    expect(got).toHaveLength(1);
    expect(valuesOf(got[0].rawHeaders, 'x-key')).toEqual([SECRET]);
    expect(valuesOf(got[0].rawTrailers, 'x-key')).toEqual([]);
    expect(origin.bytes().slice(mark)).not.toContain('client-trailer');
  });
});

describe('HTTP/2: trailing HEADERS carrying the injected name', () => {
  it('never reach the origin; the injected value is the only one', async () => {
    const s = await h2Through(proxies.get(true)!.port, HOST, origin.port, ca.certPem);
    const mark = origin.bytes().length;
    const before = origin.seen.length;
    const status = await new Promise<number>((resolve) => {
      const req = s.request({ ':method': 'POST', ':path': '/trailer', 'x-key': 'client-head' }, { waitForTrailers: true });
      let st = 0;
      req.on('response', (h) => (st = Number(h[':status'])));
      req.on('wantTrailers', () => req.sendTrailers({ 'x-key': 'client-trailer', authorization: 'client-trailer-auth' }));
      req.on('error', () => undefined);
      req.resume();
      req.on('close', () => resolve(st));
      req.end('hello');
    });
    s.close();
    expect(status).toBe(200);
    const got = origin.seen.slice(before);
    expect(got).toHaveLength(1);
    expect(valuesOf(got[0].rawHeaders, 'x-key')).toEqual([SECRET]);
    expect(got[0].rawTrailers).toEqual([]);
    expect(origin.bytes().slice(mark)).not.toMatch(/client-(head|trailer)/);
  });
});

// ---- answers the proxy hands back, never acts on ------------------------------------------------

describe.each(PATHS)('destination integrity (%s)', (_name, fast) => {
  it('a 3xx Location to another host comes back to the client; the proxy does not follow it', async () => {
    const p = proxies.get(fast)!;
    const t = await interceptedTls(p.port, HOST, origin.port, ca.certPem);
    const before = origin.seen.length;
    const answer = await converse(t, `GET /redirect HTTP/1.1\r\nHost: ${HOST}:${origin.port}\r\nConnection: close\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 302 /);
    expect(answer).toContain(`https://${WRONG}:1/stolen`);
    expect(origin.seen.length - before).toBe(1);
  });

  it('an origin whose certificate does not cover the name is 502 with a reason, and gets no request', async () => {
    const p = proxies.get(fast)!;
    const t = await interceptedTls(p.port, WRONG, origin.port, ca.certPem);
    const mark = origin.bytes().length;
    const before = origin.seen.length;
    const answer = await converse(t, `GET /x HTTP/1.1\r\nHost: ${WRONG}:${origin.port}\r\nConnection: close\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 502 /);
    expect(answer).toMatch(/\r\nProxy-Status: keygate; /i);
    expect(answer).not.toContain(SECRET);
    expect(origin.seen.length).toBe(before);
    // The origin saw a TLS handshake at most: no HTTP bytes (they would be encrypted in the
    // recording only after the handshake completed, and it never did).
    expect(origin.bytes().slice(mark)).not.toContain('GET /x');
  });

  it('a Host naming the tunnel\'s internationalised host in UTF-8 (or latin1) is the same host: forwarded, injected once', async () => {
    const p = proxies.get(fast)!;
    for (const encoding of ['utf8', 'latin1'] as const) {
      const t = await interceptedTls(p.port, IDN, origin.port, ca.certPem);
      const before = origin.seen.length;
      const answer = await converse(t, Buffer.from(`GET /idn HTTP/1.1\r\nHost: BÜCHER.test.local.:${origin.port}\r\nX-Key: client\r\nConnection: close\r\n\r\n`, encoding));
      expect(answer, encoding).toMatch(/^HTTP\/1\.1 200 /);
      const got = origin.seen[before];
      expect(valuesOf(got.rawHeaders, 'x-key')).toEqual([SECRET]);
      expect(valuesOf(got.rawHeaders, 'host')).toEqual([`${IDN}:${origin.port}`]);
    }
  });

  it('a Host naming another host in UTF-8 is still 421', async () => {
    const p = proxies.get(fast)!;
    const t = await interceptedTls(p.port, IDN, origin.port, ca.certPem);
    const before = origin.seen.length;
    const answer = await converse(t, Buffer.from(`GET /idn HTTP/1.1\r\nHost: bücher2.test.local:${origin.port}\r\nConnection: close\r\n\r\n`, 'utf8'));
    expect(answer).toMatch(/^HTTP\/1\.1 421 /);
    expect(origin.seen.length).toBe(before);
  });

  it('cleartext HTTP inside a CONNECT tunnel to a rule host (port 80) is 403, and nothing reaches an origin', async () => {
    const p = proxies.get(fast)!;
    const c = await connectTunnel(p.port, `${HOST}:80`);
    expect(c.status).toBe(200);
    const answer = await converse(c.socket, `GET /plain HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 403 /);
    expect(answer).toMatch(/only over HTTPS/);
    expect(answer).toMatch(/\r\nProxy-Status: keygate; /i);
  });
});


// ---- IP literals in every spelling meet the no_proxy lists -------------------------------------

describe('an IPv4-mapped IPv6 literal is the IPv4 address for no_proxy (config and rule level)', () => {
  const configs = {
    'config no_proxy': { no_proxy: ['127.0.0.1'], rules: [{ name: 'all', match_hosts: ['*'], headers: [{ name: 'X-Key', value: SECRET }] }] },
    'rule no_proxy': { no_proxy: [], rules: [{ name: 'all', match_hosts: ['*'], no_proxy: ['127.0.0.1'], headers: [{ name: 'X-Key', value: SECRET }] }] },
  };

  it.each(Object.keys(configs))('%s: CONNECT [::ffff:127.0.0.1] is a blind tunnel (the origin\'s own certificate, nothing injected)', async (which) => {
    const p = await startProxy({ listen: { host: '127.0.0.1', port: 0 }, ca, config: compileConfig(configs[which as keyof typeof configs]), logger: kept() });
    try {
      for (const host of ['127.0.0.1', '[::ffff:127.0.0.1]', '[::ffff:7f00:1]', '2130706433']) {
        const c = await connectTunnel(p.port, `${host}:${origin.port}`);
        expect(c.status, host).toBe(200);
        const t = await new Promise<tls.TLSSocket>((resolve, reject) => {
          const s = tls.connect({ socket: c.socket, servername: HOST, rejectUnauthorized: false, ALPNProtocols: ['http/1.1'] }, () => resolve(s));
          s.once('error', reject);
        });
        expect(t.getPeerX509Certificate()?.fingerprint256, `${host}: the certificate is the origin's, not one keygate minted`).toBe(pki.fingerprint256);
        const before = origin.seen.length;
        const answer = await converse(t, `GET /np HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n\r\n`);
        expect(answer).toMatch(/^HTTP\/1\.1 200 /);
        expect(valuesOf(origin.seen[before].rawHeaders, 'x-key')).toEqual([]);
      }
    } finally {
      await p.close(200);
    }
  });
});

// ---- no credentials over cleartext, however the plain request names the rule host ---------------

describe('plain http:// to a rule host in any spelling is 403 (credentials only over HTTPS)', () => {
  let plainOrigin: net.Server;
  let plainPort: number;
  let plainBytes = '';

  beforeAll(async () => {
    plainOrigin = net.createServer((s) => {
      s.on('data', (d: Buffer) => {
        plainBytes += d.toString('latin1');
        if (plainBytes.includes('\r\n\r\n') && !s.writableEnded) s.end('HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nplain');
      });
      s.on('error', () => undefined);
    });
    await new Promise<void>((r) => plainOrigin.listen(0, '127.0.0.1', r));
    plainPort = (plainOrigin.address() as net.AddressInfo).port;
  });

  afterAll(async () => {
    await new Promise<void>((r) => plainOrigin.close(() => r()));
  });

  const variants = (port: number) => [
    `GET HTTP://SWEEP.TEST.LOCAL.:${port}/x HTTP/1.1\r\nHost: SWEEP.TEST.LOCAL.:${port}\r\n\r\n`,
    `GET http://${HOST}:443/x HTTP/1.1\r\nHost: ${HOST}:443\r\n\r\n`,
    `GET http://${HOST}/x HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`,
    `GET ws://${HOST}:${port}/socket HTTP/1.1\r\nHost: ${HOST}:${port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
    `GET http://b\u00fccher.test.local:${port}/x HTTP/1.1\r\nHost: xn--bcher-kva.test.local:${port}\r\n\r\n`,
    `GET http://${IDN}:${port}/x HTTP/1.1\r\nHost: ${IDN}:${port}\r\n\r\n`,
  ];

  it.each(PATHS)('%s proxy: refused with the reason, nothing reaches an origin', async (_n, fast) => {
    const p = proxies.get(fast)!;
    for (const v of variants(origin.port)) {
      const mark = origin.bytes().length;
      const answer = await converse(net.connect(p.port, '127.0.0.1'), Buffer.from(v, 'latin1'));
      // A name Node's parser refuses outright (raw non-ASCII in the request line) is 400; every other is 403.
      if (/[^\x00-\x7f]/.test(v.split('\r\n')[0])) {
        expect(answer, v).toMatch(/^HTTP\/1\.1 400 /);
      } else {
        expect(answer, v).toMatch(/^HTTP\/1\.1 403 /);
        expect(answer).toMatch(/credentials are injected only over HTTPS/);
      }
      expect(answer).toMatch(/\r\nProxy-Status: keygate; /i);
      expect(answer).not.toContain(SECRET);
      expect(origin.bytes().slice(mark)).toBe('');
    }
  });

  it.each(PATHS)('%s proxy: a Host naming the rule host does not make a plain request to another host carry credentials', async (_n, fast) => {
    const p = proxies.get(fast)!;
    plainBytes = '';
    const answer = await converse(net.connect(p.port, '127.0.0.1'), `GET http://127.0.0.1:${plainPort}/x HTTP/1.1\r\nHost: ${HOST}\r\nX-Key: client\r\nConnection: close\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    expect(plainBytes).toMatch(/^GET \/x HTTP\/1\.1\r\n/);
    expect(plainBytes).not.toContain(SECRET);
    expect(plainBytes.toLowerCase()).toContain('x-key: client');
  });
});

// ---- upstream trust: NODE_EXTRA_CA_CERTS of the proxy process ----------------------------------

describe('upstream TLS is verified against NODE_EXTRA_CA_CERTS (a spawned keygate proxy)', () => {
  it('an origin signed by a CA only in NODE_EXTRA_CA_CERTS is reached, with the injected value; without it, 502 and nothing sent', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-sweep-extra-'));
    const caFile = path.join(dir, 'origin-ca.pem');
    writeFileSync(caFile, pki.caPem);
    const config = { no_proxy: [], rules: [{ name: 'sweep', match_hosts: [HOST], headers: [{ name: 'X-Key', type: 'workspace_secret', value: '{K}' }] }] };
    const resolve = [`${HOST}:${origin.port}:127.0.0.1`];
    for (const [extra, want] of [[caFile, 200], [undefined, 502]] as const) {
      const p = await spawnProxy({ config, secrets: { K: SECRET }, resolve, env: { NODE_EXTRA_CA_CERTS: extra ?? '' } });
      try {
        const t = await interceptedTls(p.port, HOST, origin.port, p.caPem);
        const before = origin.seen.length;
        const answer = await converse(t, `GET /extra HTTP/1.1\r\nHost: ${HOST}:${origin.port}\r\nConnection: close\r\n\r\n`);
        expect(answer.slice(0, 12), String(extra)).toBe(`HTTP/1.1 ${want}`);
        expect(answer).not.toContain(SECRET);
        if (want === 200) expect(valuesOf(origin.seen[before].rawHeaders, 'x-key')).toEqual([SECRET]);
        else expect(origin.seen.length).toBe(before);
      } finally {
        await p.stop();
        expect(p.output()).not.toContain(SECRET);
      }
    }
  });
});

// ---- upstream certificates out of their validity -----------------------------------------------

describe('an origin certificate out of its validity (expired, not yet valid) is 502 with a reason; nothing sent', () => {
  it.each(PATHS)('%s', async (_n, fast) => {
    const day = 24 * 3600_000;
    const bad = {
      expired: await createTestPki([HOST], 'sweep expired CA', { notBefore: new Date(Date.now() - 30 * day), notAfter: new Date(Date.now() - day) }),
      'not yet valid': await createTestPki([HOST], 'sweep future CA', { notBefore: new Date(Date.now() + day), notAfter: new Date(Date.now() + 30 * day) }),
    };
    for (const [why, badPki] of Object.entries(bad)) {
      const o = await startOrigin(badPki);
      const p = await startProxy({
        listen: { host: '127.0.0.1', port: 0 },
        ca,
        config: compileConfig({ no_proxy: [], rules: [{ name: 'sweep', match_hosts: [HOST], headers: [{ name: 'X-Key', value: SECRET }] }] }),
        logger: kept(),
        resolve: new Map([[`${HOST}:${o.port}`, '127.0.0.1']]),
        upstreamCa: [badPki.caPem],
        fastPath: fast,
      });
      try {
        const t = await interceptedTls(p.port, HOST, o.port, ca.certPem);
        const answer = await converse(t, `GET /x HTTP/1.1\r\nHost: ${HOST}:${o.port}\r\nConnection: close\r\n\r\n`);
        expect(answer, why).toMatch(/^HTTP\/1\.1 502 /);
        expect(answer).toMatch(/\r\nProxy-Status: keygate; error=tls_/i);
        expect(o.seen).toEqual([]);
        expect(o.bytes()).not.toContain('GET /x');
      } finally {
        await p.close(100);
        await o.close();
      }
    }
  });
});

// ---- a request no rule matches passes unchanged ------------------------------------------------

describe('a request to an intercepted host that no rule matches passes unchanged (hop-by-hop and Host aside)', () => {
  const clientFields: [string, string][] = [
    ['X-Key', 'client-1'],
    ['authorization', 'Bearer client-token'],
    ['x-KEY', 'client-2'],
    ['Cookie', 'a=1'],
    ['X-Dup', 'one'],
    ['x-dup', 'two, three'],
    ['Accept', '*/*'],
  ];
  const sent = clientFields.map(([n, v]) => `${n}: ${v}\r\n`).join('');
  /** What the origin got, hop-by-hop fields and Host left out. */
  const endToEnd = (raw: string[]) => {
    const out: [string, string][] = [];
    for (let i = 0; i < raw.length; i += 2) if (!['host', 'connection', 'keep-alive', 'content-length', 'transfer-encoding'].includes(raw[i].toLowerCase())) out.push([raw[i].toLowerCase(), raw[i + 1]]);
    return out;
  };
  const want = clientFields.map(([n, v]) => [n.toLowerCase(), v]);

  it.each(PATHS)('%s', async (_n, fast) => {
    const p = proxies.get(fast)!;
    for (const [path_, injected] of [['/other/x', false], ['/only/x', true]] as const) {
      const t = await interceptedTls(p.port, PATHS_HOST, origin.port, ca.certPem);
      const before = origin.seen.length;
      const answer = await converse(t, `GET ${path_} HTTP/1.1\r\nHost: ${PATHS_HOST}:${origin.port}\r\n${sent}Connection: close\r\n\r\n`);
      expect(answer).toMatch(/^HTTP\/1\.1 200 /);
      const got = endToEnd(origin.seen[before].rawHeaders);
      if (!injected) expect(got, path_).toEqual(want);
      else expect(got, path_).toEqual([...want.filter(([n]) => n !== 'x-key'), ['x-key', SECRET]]);
    }
  });

  it('HTTP/2 (cookies joined, as RFC 9113 8.2.3 has it)', async () => {
    const s = await h2Through(proxies.get(true)!.port, PATHS_HOST, origin.port, ca.certPem);
    try {
      for (const [path_, injected] of [['/other/x', false], ['/only/x', true]] as const) {
        const before = origin.seen.length;
        const status = await new Promise<number>((resolve) => {
          const fields: Record<string, string | string[]> = { ':method': 'GET', ':path': path_ };
          for (const [n, v] of clientFields) {
            const k = n.toLowerCase();
            const had = fields[k];
            fields[k] = had === undefined ? v : [...(Array.isArray(had) ? had : [had]), v];
          }
          const req = s.request(fields);
          let st = 0;
          req.on('response', (h) => (st = Number(h[':status'])));
          req.on('error', () => undefined);
          req.resume();
          req.on('close', () => resolve(st));
        });
        expect(status).toBe(200);
        const got = endToEnd(origin.seen[before].rawHeaders).sort();
        const base = want.filter(([n]) => !injected || n !== 'x-key');
        expect(got, path_).toEqual([...base, ...(injected ? [['x-key', SECRET]] : [])].sort());
      }
    } finally {
      s.close();
    }
  });
});

describe('HTTP/2: upstream verification', () => {
  it('an origin whose certificate does not cover the name: the stream is answered 502, the origin reads no request', async () => {
    const s = await h2Through(proxies.get(true)!.port, WRONG, origin.port, ca.certPem);
    try {
      const mark = origin.bytes().length;
      const before = origin.seen.length;
      const answer = await new Promise<{ status: number; headers: Record<string, unknown> }>((resolve) => {
        const req = s.request({ ':method': 'GET', ':path': '/h2wrong' });
        let out = { status: 0, headers: {} as Record<string, unknown> };
        req.on('response', (h) => (out = { status: Number(h[':status']), headers: h }));
        req.on('error', () => undefined);
        req.resume();
        req.on('close', () => resolve(out));
      });
      expect(answer.status).toBe(502);
      expect(String(answer.headers['proxy-status'])).toMatch(/^keygate; error=tls_/);
      expect(origin.seen.length).toBe(before);
      expect(origin.bytes().slice(mark)).not.toContain('/h2wrong');
    } finally {
      s.close();
    }
  });
});
