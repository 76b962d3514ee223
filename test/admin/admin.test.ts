// The admin listener against a real in-process proxy, a real HTTPS origin and undici clients.
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigHolder } from '../../src/admin/config-holder.js';
import { ProxyMetrics } from '../../src/admin/metrics.js';
import { resolveAdminToken, startAdmin, type AdminHandle } from '../../src/admin/server.js';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { EncryptedFileSecretStore } from '../../src/secrets/store.js';
import { connectTunnel, rawExchange } from '../helpers/connect.js';
import { h2Request, h2Through } from '../proxy/h2-helpers.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';

const TOKEN_V1 = 'kgADMIN-tok-v1-0d9e';
const TOKEN_V2 = 'kgADMIN-tok-v2-77aa';
const PUSHED = 'kgADMIN-pushed-31c4';
const OPAQUE = 'kgADMIN-opaque-5b0f';
const ADMIN_TOKEN = 'admin-token-for-tests-0123456789';

const HOST = 'api.test.local';
const TUNNEL_HOST = 'plain.test.local';

let dir: string;
let origin: TestOrigin;
let ca: Ca;
let proxy: ProxyHandle;
let admin: AdminHandle;
let holder: ConfigHolder;
let metrics: ProxyMetrics;
let store: EncryptedFileSecretStore;
let agent: ProxyAgent;
let logs = '';

const config = (gen: string, extra: object[] = []) => ({
  no_proxy: ['bypass.test.local'],
  rules: [
    {
      name: 'api',
      match_hosts: [HOST],
      headers: [
        { name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' },
        { name: 'X-Gen', type: 'plaintext', value: gen },
        { name: 'X-Opaque', type: 'opaque', value: OPAQUE },
      ],
    },
    ...extra,
  ],
});

const auth = { authorization: `Bearer ${ADMIN_TOKEN}` };

async function adminCall(method: string, p: string, body?: unknown, headers: Record<string, string> = auth) {
  const r = await request(`${admin.url}${p}`, {
    method: method as 'GET',
    headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.body.text();
  return { status: r.statusCode, headers: r.headers, text, json: () => JSON.parse(text) };
}

/** One request through the proxy to the origin; returns the headers the origin received. */
async function viaProxy(p = '/x', a: ProxyAgent = agent): Promise<{ status: number; headers: Record<string, string> }> {
  const r = await request(`https://${HOST}:${origin.port}${p}`, { dispatcher: a });
  const text = await r.body.text();
  if (r.statusCode !== 200) return { status: r.statusCode, headers: {} };
  const echo = JSON.parse(text) as { headers: [string, string][] };
  const headers: Record<string, string> = {};
  for (const [name, value] of echo.headers) headers[name.toLowerCase()] = value;
  return { status: r.statusCode, headers };
}

function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?) (\S+)$/.exec(line);
    expect(m, `bad exposition line: ${line}`).not.toBeNull();
    out.set(m![1], Number(m![2]));
  }
  return out;
}

async function scrape(): Promise<Map<string, number>> {
  const r = await adminCall('GET', '/metrics');
  expect(r.status).toBe(200);
  expect(r.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
  return parseMetrics(r.text);
}

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-admin-'));
  const pki = await createTestPki([HOST, TUNNEL_HOST]);
  origin = await startOrigin(pki);
  ca = await ensureCa(path.join(dir, 'certs'));
  store = new EncryptedFileSecretStore({ file: path.join(dir, 'secrets.json'), keys: () => loadKeyring(dir, {}).envelope });
  await store.set('API_TOKEN', TOKEN_V1);
  const logger = createLogger({
    level: 'debug',
    destination: new Writable({
      write(chunk, _enc, cb) {
        logs += chunk.toString();
        cb();
      },
    }),
  });
  metrics = new ProxyMetrics();
  let proxyRef: ProxyHandle | undefined;
  holder = new ConfigHolder({ proxy: { setConfig: (c) => proxyRef!.setConfig(c) }, store, envelope: () => loadKeyring(dir, {}).envelope, metrics, logger });
  const initial = await holder.prepare(config('g1'), { source: 'startup' });
  proxy = await startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: initial.compiled,
    logger,
    resolve: new Map([
      [`${HOST}:${origin.port}`, '127.0.0.1'],
      [`${TUNNEL_HOST}:${origin.port}`, '127.0.0.1'],
    ]),
    upstreamCa: [pki.caPem],
  });
  proxyRef = proxy;
  holder.markApplied(initial.config, initial.compiled, { source: 'startup' });
  metrics.attach(proxy.events);
  admin = await startAdmin({ listen: { host: '127.0.0.1', port: 0 }, token: ADMIN_TOKEN, holder, metrics, proxy, logger });
  agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: [ca.certPem, pki.caPem] } });
});

afterAll(async () => {
  await agent?.close();
  await admin?.close();
  await proxy?.close(1000);
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
  // Nothing secret ever reached a log line.
  for (const v of [TOKEN_V1, TOKEN_V2, PUSHED, OPAQUE, ADMIN_TOKEN]) expect(logs).not.toContain(v);
});

describe('admin authentication', () => {
  it('refuses no token, a wrong token and a wrong scheme with 401 and no hint', async () => {
    for (const p of ['/config', '/metrics', '/healthz', '/readyz', '/nope']) {
      for (const headers of [{} as Record<string, string>, { authorization: 'Bearer wrong-token-wrong-token' }, { authorization: `Basic ${ADMIN_TOKEN}` }, { authorization: `Bearer ${ADMIN_TOKEN}x` }, { authorization: `Bearer ${ADMIN_TOKEN.slice(0, -1)}` }]) {
        const r = await adminCall('GET', p, undefined, headers);
        expect(r.status, `${p} ${JSON.stringify(headers)}`).toBe(401);
        expect(r.json().detail).toMatch(/admin credentials/);
        expect(r.text).not.toContain(ADMIN_TOKEN);
        expect(r.headers['www-authenticate']).toMatch(/^Bearer/);
      }
    }
    const put = await adminCall('PUT', '/config', config('hack'), { authorization: 'Bearer nope' });
    expect(put.status).toBe(401);
    expect((await viaProxy()).headers['x-gen']).toBe('g1');
    expect((await adminCall('GET', '/healthz')).json()).toEqual({ status: 'ok' });
  });

  it('is not reachable through the proxy port (CONNECT or absolute-form, any loopback spelling)', async () => {
    const before = logs.length;
    for (const host of ['127.0.0.1', 'localhost']) {
      const t = await connectTunnel(proxy.port, `${host}:${admin.port}`);
      expect(t.status, t.head).toBeGreaterThanOrEqual(400);
      t.socket.destroy();
      // Plain HTTP through the proxy (absolute-form), with the right token even.
      const r = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: proxy.port, method: 'GET', path: `http://${host}:${admin.port}/config`, headers: { ...auth, host: `${host}:${admin.port}` } }, (res) => {
          let body = '';
          res.on('data', (d) => (body += d));
          res.on('end', () => resolve({ status: res.statusCode!, body }));
        });
        req.on('error', reject);
        req.end();
      });
      expect(r.status).toBeGreaterThanOrEqual(400);
      expect(r.body).not.toMatch(/proxy_config|generation/);
    }
    // The admin listener logged no request at all (it never saw one).
    expect(logs.slice(before)).not.toMatch(/admin request/);
  });

  it('generates a 0600 token file when KEYGATE_ADMIN_TOKEN is not set, reuses it, prefers the variable', () => {
    const d = mkdtempSync(path.join(os.tmpdir(), 'kg-admin-token-'));
    try {
      const a = resolveAdminToken(d, {});
      expect(a.source).toBe('file');
      expect(a.token.length).toBeGreaterThanOrEqual(32);
      expect(statSync(a.file!).mode & 0o777).toBe(0o600);
      expect(resolveAdminToken(d, {}).token).toBe(a.token);
      expect(resolveAdminToken(d, { KEYGATE_ADMIN_TOKEN: 'from-env-0123456789' })).toEqual({ token: 'from-env-0123456789', source: 'env' });
      expect(() => resolveAdminToken(d, { KEYGATE_ADMIN_TOKEN: 'short' })).toThrow(/too short/);
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});

describe('configuration', () => {
  it('GET /config: opaque values omitted, secrets as templates', async () => {
    const r = await adminCall('GET', '/config');
    expect(r.status).toBe(200);
    const body = r.json();
    expect(body.generation).toBeGreaterThanOrEqual(1);
    const headers = body.proxy_config.rules[0].headers;
    expect(headers[0]).toEqual({ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' });
    expect(headers[2]).toEqual({ name: 'X-Opaque', type: 'opaque' });
    expect(r.text).not.toMatch(new RegExp(`${TOKEN_V1}|${OPAQUE}|kg1\\.`));
  });

  it('injects what the configuration says', async () => {
    const r = await viaProxy();
    expect(r.status).toBe(200);
    expect(r.headers.authorization).toBe(`Bearer ${TOKEN_V1}`);
    expect(r.headers['x-opaque']).toBe(OPAQUE);
    expect(r.headers['x-gen']).toBe('g1');
  });

  it('an invalid push is rejected with 422 and exact loc; the old configuration stays', async () => {
    const gen = holder.generation;
    const bad1 = await adminCall('PUT', '/config', { rules: [{ name: 'r', match_hosts: ['bad host!'], headers: [] }] });
    expect(bad1.status).toBe(422);
    expect(bad1.json().detail[0].loc).toEqual(['body', 'rules', 0, 'match_hosts', 0]);
    const bad2 = await adminCall('PUT', '/config', { proxy_config: { rules: [{ name: 'r', match_hosts: [HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {NOPE}' }] }] } });
    expect(bad2.status).toBe(422);
    expect(bad2.json().detail).toEqual([expect.objectContaining({ loc: ['body', 'proxy_config', 'rules', 0, 'headers', 0, 'value'], type: 'missing_secret' })]);
    expect(bad2.json().detail[0].msg).toMatch(/NOPE/);
    const bad3 = await adminCall('PUT', '/config', { proxy_config: config('x'), secrets: { 'bad-name': 'v', OK: 5 }, extra: 1 });
    expect(bad3.status).toBe(422);
    expect(bad3.json().detail.map((d: { loc: unknown[] }) => d.loc)).toEqual([['body', 'extra'], ['body', 'secrets', 'bad-name'], ['body', 'secrets', 'OK']]);
    const bad4 = await adminCall('PUT', '/config', '{"rules": [ "kgADMIN-never-echoed');
    expect(bad4.status).toBe(422);
    expect(bad4.json().detail[0]).toEqual({ loc: ['body'], msg: expect.stringMatching(/^JSON decode error at line 1, column \d+$|^JSON decode error at unexpected end of input$/), type: 'json_invalid' });
    expect(bad4.text).not.toContain('never-echoed');
    const bad5 = await adminCall('PUT', '/config', [1, 2]);
    expect(bad5.status).toBe(422);
    expect((await adminCall('PUT', '/config', 'x', { ...auth, 'content-type': 'text/plain' })).status).toBe(415);
    expect((await adminCall('PUT', '/config', JSON.stringify({ no_proxy: ['a'.repeat(2 * 1024 * 1024)] }))).status).toBe(413);
    expect((await adminCall('POST', '/config', {})).status).toBe(405);
    // Still the old one.
    expect(holder.generation).toBe(gen);
    expect((await viaProxy()).headers['x-gen']).toBe('g1');
    expect((await adminCall('GET', '/config')).json().generation).toBe(gen);
  });

  it('a push holding a lone UTF-16 surrogate is a 422 string_unicode: a secret is never applied altered', async () => {
    const gen = holder.generation;
    // JSON carries "\ud800"; UTF-8 cannot: the value would reach the wire as something the operator never set.
    const r = await adminCall('PUT', '/config', `{"proxy_config": ${JSON.stringify(config('g-lone'))}, "secrets": {"API_TOKEN": "kgLONE-ok\\ud800"}}`);
    expect(r.status).toBe(422);
    expect(r.json().detail).toEqual([expect.objectContaining({ loc: ['body', 'secrets', 'API_TOKEN'], type: 'string_unicode' })]);
    expect(r.text).not.toContain('kgLONE');
    const plain = await adminCall('PUT', '/config', `{"rules": [{"name": "r\\udc00", "match_hosts": ["${HOST}"], "headers": []}]}`);
    expect(plain.status).toBe(422);
    expect(plain.json().detail[0]).toEqual(expect.objectContaining({ loc: ['body', 'rules', 0, 'name'], type: 'string_unicode' }));
    expect(holder.generation).toBe(gen);
  });

  it('a push carrying its own secrets resolves the templates with them', async () => {
    const r = await adminCall('PUT', '/config', { proxy_config: config('g-pushed'), secrets: { API_TOKEN: PUSHED } });
    expect(r.status).toBe(200);
    expect(r.json()).toEqual({ applied: true, generation: holder.generation });
    const seen = await viaProxy();
    expect(seen.headers.authorization).toBe(`Bearer ${PUSHED}`);
    expect(seen.headers['x-gen']).toBe('g-pushed');
    expect((await adminCall('GET', '/config')).text).not.toContain(PUSHED);
  });

  it('rotating a secret in the store and re-applying takes effect for the next request', async () => {
    expect((await adminCall('PUT', '/config', config('g-store'))).status).toBe(200);
    expect((await viaProxy()).headers.authorization).toBe(`Bearer ${TOKEN_V1}`);
    await store.set('API_TOKEN', TOKEN_V2);
    // Not before re-applying: secrets are resolved when a configuration is applied.
    expect((await viaProxy()).headers.authorization).toBe(`Bearer ${TOKEN_V1}`);
    await holder.reapply('sighup');
    expect((await viaProxy()).headers.authorization).toBe(`Bearer ${TOKEN_V2}`);
    // Deleting a referenced secret makes a re-apply fail; the old configuration stays.
    await store.delete('API_TOKEN');
    await expect(holder.reapply('sighup')).rejects.toThrow(/API_TOKEN/);
    expect((await viaProxy()).headers.authorization).toBe(`Bearer ${TOKEN_V2}`);
    await store.set('API_TOKEN', TOKEN_V1);
  });

  it('a push during a load of requests drops nothing; the first request after it sees the new header', async () => {
    expect((await adminCall('PUT', '/config', config('before'))).status).toBe(200);
    const clients = 8;
    const agents = Array.from({ length: clients }, () => new ProxyAgent({ uri: proxy.url, requestTls: { ca: [ca.certPem] } }));
    // Each client keeps its own keep-alive connection(s) through the proxy.
    const results: { start: number; end: number; status: number; gen: string; err?: string }[] = [];
    let pushStartedAt = Infinity;
    let pushedAt = Infinity; // when the PUT answered
    const stopAt = performance.now() + 3000;
    const pushTimer = setTimeout(async () => {
      pushStartedAt = performance.now();
      const r = await adminCall('PUT', '/config', config('after'));
      expect(r.status).toBe(200);
      pushedAt = performance.now();
      // The very next request, started right now, must see the new header.
      const first = await viaProxy();
      results.push({ start: pushedAt, end: performance.now(), status: first.status, gen: first.headers['x-gen'] ?? '' });
    }, 1500);
    await Promise.all(
      agents.map(async (a) => {
        while (performance.now() < stopAt) {
          const start = performance.now();
          try {
            const r = await viaProxy('/load', a);
            results.push({ start, end: performance.now(), status: r.status, gen: r.headers['x-gen'] ?? '' });
          } catch (err) {
            results.push({ start, end: performance.now(), status: 0, gen: '', err: (err as Error).message });
          }
        }
      }),
    );
    clearTimeout(pushTimer);
    await Promise.all(agents.map((a) => a.close()));
    expect(pushedAt).toBeLessThan(Infinity);
    const failed = results.filter((r) => r.status !== 200);
    expect(failed, JSON.stringify(failed.slice(0, 3))).toEqual([]);
    expect(results.length).toBeGreaterThan(50);
    // Every request started after the push answered saw the new configuration...
    const after = results.filter((r) => r.start >= pushedAt);
    expect(after.length).toBeGreaterThan(0);
    expect(after.every((r) => r.gen === 'after')).toBe(true);
    // ...every request finished before the push started saw the old one; none saw anything else.
    expect(results.filter((r) => r.end < pushStartedAt).every((r) => r.gen === 'before')).toBe(true);
    expect(results.every((r) => r.gen === 'before' || r.gen === 'after')).toBe(true);
    expect(results.some((r) => r.gen === 'before')).toBe(true);
  });
});

describe('health and metrics', () => {
  it('healthz and readyz', async () => {
    expect((await adminCall('GET', '/healthz')).status).toBe(200);
    const ready = await adminCall('GET', '/readyz');
    expect(ready.status).toBe(200);
    expect(ready.json()).toEqual({ status: 'ready', generation: holder.generation });
    // A listener whose holder has applied nothing is alive but not ready.
    const empty = new ConfigHolder({ proxy: { setConfig: () => undefined } });
    const a2 = await startAdmin({ listen: { host: '127.0.0.1', port: 0 }, token: ADMIN_TOKEN, holder: empty, metrics: new ProxyMetrics() });
    try {
      const r = await request(`${a2.url}/readyz`, { headers: auth });
      expect(r.statusCode).toBe(503);
      expect(await r.body.json()).toEqual({ detail: 'No configuration has been applied yet.' });
      const h = await request(`${a2.url}/healthz`, { headers: auth });
      expect(h.statusCode).toBe(200);
      await h.body.dump();
      const c = await request(`${a2.url}/config`, { headers: auth });
      expect(c.statusCode).toBe(404);
      await c.body.dump();
    } finally {
      await a2.close();
    }
  });

  it('counts requests, injections, handshakes, certificates, tunnels, upstream errors and latency', async () => {
    expect((await adminCall('PUT', '/config', config('m'))).status).toBe(200);
    const m0 = await scrape();
    const key = (name: string, labels = '') => `${name}${labels}`;
    const get = (m: Map<string, number>, k: string) => m.get(k) ?? 0;
    const reqKey = key('keygate_proxy_requests_total', '{decision="intercept",rule="api",status="200",proto="h1"}');

    // 5 requests over one fresh connection: one CONNECT, one handshake, one certificate lookup.
    const fresh = new ProxyAgent({ uri: proxy.url, requestTls: { ca: [ca.certPem] }, connections: 1 });
    for (let i = 0; i < 5; i++) expect((await viaProxy('/m', fresh)).status).toBe(200);
    await fresh.close();
    // A blind tunnel (no rule for the host), held open while we scrape.
    const t = await connectTunnel(proxy.port, `${TUNNEL_HOST}:${origin.port}`);
    expect(t.status).toBe(200);
    await new Promise((r) => setTimeout(r, 50));
    const mOpen = await scrape();
    expect(get(mOpen, 'keygate_proxy_open_tunnels')).toBe(get(m0, 'keygate_proxy_open_tunnels') + 1);
    t.socket.destroy();
    // An upstream that refuses the connection: 502 and an upstream error.
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', () => r()));
    const deadPort = (closed.address() as net.AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    const dead = await connectTunnel(proxy.port, `127.0.0.1:${deadPort}`);
    expect(dead.status).toBe(502);
    dead.socket.destroy();
    await new Promise((r) => setTimeout(r, 100));

    const m1 = await scrape();
    expect(get(m1, reqKey) - get(m0, reqKey)).toBe(5);
    expect(get(m1, 'keygate_proxy_injections_total{rule="api"}') - get(m0, 'keygate_proxy_injections_total{rule="api"}')).toBe(5);
    expect(get(m1, 'keygate_proxy_injected_headers_total{rule="api"}') - get(m0, 'keygate_proxy_injected_headers_total{rule="api"}')).toBe(15);
    expect(get(m1, 'keygate_proxy_tls_handshakes_total{result="ok"}') - get(m0, 'keygate_proxy_tls_handshakes_total{result="ok"}')).toBe(1);
    // The host's certificate was minted earlier in this file: this connection hit the cache.
    expect(get(m1, 'keygate_proxy_certificate_cache_hits_total') - get(m0, 'keygate_proxy_certificate_cache_hits_total')).toBe(1);
    expect(get(m1, 'keygate_proxy_certificates_minted_total')).toBe(1);
    expect(get(m1, 'keygate_proxy_open_tunnels')).toBe(get(m0, 'keygate_proxy_open_tunnels'));
    expect(get(m1, 'keygate_proxy_tunnels_total{decision="tunnel",status="200"}') - get(m0, 'keygate_proxy_tunnels_total{decision="tunnel",status="200"}')).toBe(1);
    expect(get(m1, 'keygate_proxy_upstream_errors_total') - get(m0, 'keygate_proxy_upstream_errors_total')).toBe(1);
    const count = 'keygate_proxy_request_duration_seconds_count{decision="intercept",proto="h1"}';
    expect(get(m1, count) - get(m0, count)).toBe(5);
    expect(get(m1, 'keygate_proxy_request_duration_seconds_bucket{decision="intercept",proto="h1",le="+Inf"}')).toBe(get(m1, count));
    expect(get(m1, 'keygate_proxy_request_duration_seconds_sum{decision="intercept",proto="h1"}')).toBeGreaterThan(0);
    expect(get(m1, 'keygate_proxy_config_generation')).toBe(holder.generation);
    expect(get(m1, 'keygate_proxy_config_applies_total{source="push",result="rejected"}')).toBeGreaterThanOrEqual(2);
    const text = (await adminCall('GET', '/metrics')).text;
    for (const v of [TOKEN_V1, TOKEN_V2, PUSHED, OPAQUE]) expect(text).not.toContain(v);
  });

  it('labels requests and their latency with the client protocol: h1 and h2 clients on the same host', async () => {
    expect((await adminCall('PUT', '/config', config('p'))).status).toBe(200);
    const m0 = await scrape();
    const get = (m: Map<string, number>, k: string) => m.get(k) ?? 0;
    const req = (proto: string) => `keygate_proxy_requests_total{decision="intercept",rule="api",status="200",proto="${proto}"}`;
    const dur = (proto: string) => `keygate_proxy_request_duration_seconds_count{decision="intercept",proto="${proto}"}`;
    // 3 over HTTP/1.1 (undici offers only http/1.1), 2 over one h2 connection.
    for (let i = 0; i < 3; i++) expect((await viaProxy('/p1')).status).toBe(200);
    const s = await h2Through(proxy.port, HOST, origin.port, ca.certPem);
    try {
      for (let i = 0; i < 2; i++) expect((await h2Request(s, { ':path': '/p2', ':authority': `${HOST}:${origin.port}` })).status).toBe(200);
    } finally {
      s.close();
    }
    await new Promise((r) => setTimeout(r, 50));
    const m1 = await scrape();
    expect(get(m1, req('h1')) - get(m0, req('h1'))).toBe(3);
    expect(get(m1, req('h2')) - get(m0, req('h2'))).toBe(2);
    expect(get(m1, dur('h1')) - get(m0, dur('h1'))).toBe(3);
    expect(get(m1, dur('h2')) - get(m0, dur('h2'))).toBe(2);
  });
});

describe('framing errors', () => {
  it('a body-less PUT is 422 missing whatever its Content-Type; parser refusals are JSON (431, 414)', async () => {
    for (const type of ['application/json', 'text/plain']) {
      const r = await adminCall('PUT', '/config', undefined, { ...auth, 'content-type': type });
      expect(r.status, type).toBe(422);
      expect(r.json().detail[0], type).toMatchObject({ loc: ['body'], type: 'missing' });
    }
    const send = (bytes: string) =>
      new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect(admin.port!, '127.0.0.1', () => resolve(s));
        s.once('error', reject);
      }).then((s) => rawExchange(s, bytes));
    const big = await send(`GET /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ${ADMIN_TOKEN}\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(big.status).toBe(431);
    expect(JSON.parse(big.body)).toEqual({ detail: expect.any(String) });
    const url = await send(`GET /${'a'.repeat(20_000)} HTTP/1.1\r\nHost: t\r\n\r\n`);
    expect(url.status).toBe(414);
    expect(JSON.parse(url.body)).toEqual({ detail: expect.any(String) });
  });
});

describe('unix socket listener', () => {
  it('listens on a 0600 socket and requires the token there too', async () => {
    const sock = path.join(dir, 'admin.sock');
    const a = await startAdmin({ listen: { path: sock }, token: ADMIN_TOKEN, holder, metrics });
    try {
      expect(a.url).toBe(`unix:${sock}`);
      expect(statSync(sock).mode & 0o777).toBe(0o600);
      const call = (headers: Record<string, string>) =>
        new Promise<number>((resolve, reject) => {
          const req = http.request({ socketPath: sock, path: '/readyz', headers }, (res) => {
            res.resume();
            resolve(res.statusCode!);
          });
          req.on('error', reject);
          req.end();
        });
      expect(await call({})).toBe(401);
      expect(await call(auth)).toBe(200);
    } finally {
      await a.close();
    }
  });
});
