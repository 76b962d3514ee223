/**
 * The decision of proxy.md ("Decision for a target host", "Which rule applies") taken again for
 * every request with the configuration snapshot that request starts with: a push that changes
 * the decision for a host applies to the next request on a keep-alive (HTTP/1.1, both intercepted
 * paths) or HTTP/2 connection already open to it. Real proxy in-process, real clients (undici,
 * Node's http2 client), a local HTTPS origin with its own test CA that echoes what it received.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigHolder } from '../../src/admin/config-holder.js';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle, type RequestRecord } from '../../src/proxy/server.js';
import { compileConfig, type ResolvedProxyConfig } from '../../src/rules/index.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { h2Request, h2Through } from './h2-helpers.js';

const HOST = 'live.test.local';
const VALUE = 'kgLIVE-decision-7c41';
const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-live-'));
let pki: TestPki;
let ca: Ca;
let origin: TestOrigin;
let logText = '';

const RULE = { name: 'live', match_hosts: [HOST], headers: [{ name: 'X-Key', value: VALUE }] };
const intercepting = (): ResolvedProxyConfig => ({ no_proxy: [], rules: [RULE] });

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  origin = await startOrigin(pki);
  ca = await ensureCa(path.join(dir, 'certs'));
});
afterAll(async () => {
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
  expect(logText).not.toContain(VALUE);
});

async function proxyWith(fastPath: boolean): Promise<{ p: ProxyHandle; records: RequestRecord[] }> {
  const logger = createLogger({ destination: new Writable({ write: (c, _e, cb) => ((logText += c), cb()) }) });
  const p = await startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: compileConfig(intercepting()),
    logger,
    fastPath,
    resolve: new Map([[`${HOST}:${origin.port}`, '127.0.0.1']]),
    upstreamCa: [pki.caPem],
  });
  const records: RequestRecord[] = [];
  p.events.on('request', (r: RequestRecord) => records.push(r));
  return { p, records };
}

type Echo = { url: string; headers: [string, string][] };
const injected = (e: Echo) => e.headers.filter(([k]) => k.toLowerCase() === 'x-key').map(([, v]) => v);

/**
 * Pushes that take the host (or this request) out of the rule's reach: after each, the next
 * request on the connection already open gets nothing injected.
 */
const CHANGES: [string, ResolvedProxyConfig][] = [
  ['config-level no_proxy now names the host', { no_proxy: [HOST], rules: [RULE] }],
  ['config-level no_proxy now names the host and its port', { no_proxy: [`${HOST}:${0}`], rules: [RULE] }],
  ['config-level no_proxy is now *', { no_proxy: ['*'], rules: [RULE] }],
  ['the rule now has a no_proxy for the host', { no_proxy: [], rules: [{ ...RULE, no_proxy: [HOST] }] }],
  ['the rule now covers other paths only', { no_proxy: [], rules: [{ ...RULE, match_paths: ['/other/*'] }] }],
  ['no rule any more', { no_proxy: [], rules: [] }],
];
const withPort = (c: ResolvedProxyConfig): ResolvedProxyConfig => ({ ...c, no_proxy: c.no_proxy.map((e) => e.replace(':0', `:${origin.port}`)) });

describe('a push applies to the next request on a connection already open', () => {
  for (const [name, fastPath] of [
    ['HTTP/1.1, fast path', true],
    ['HTTP/1.1, Node path', false],
  ] as const) {
    describe(name, () => {
      it.each(CHANGES)('%s', async (_what, change) => {
        const { p, records } = await proxyWith(fastPath);
        // One connection for both requests: keep-alive, pipelining off.
        const agent = new ProxyAgent({ uri: p.url, requestTls: { ca: ca.certPem }, connections: 1, pipelining: 1 });
        try {
          const get = async (pathname: string) => (await (await request(`https://${HOST}:${origin.port}${pathname}`, { dispatcher: agent })).body.json()) as Echo;
          expect(injected(await get('/a/1'))).toEqual([VALUE]);
          p.setConfig(compileConfig(withPort(change)));
          expect(injected(await get('/a/2')), 'injected after the push').toEqual([]);
          // The same connection served both (one CONNECT): else this proves nothing.
          const rec = records.find((r) => r.path === '/a/2');
          expect(rec).toMatchObject({ rule: null, injected: [] });
          expect(records.filter((r) => r.path.startsWith('/a/')).map((r) => r.via)).toEqual([fastPath ? 'fast' : 'node', fastPath ? 'fast' : 'node']);
        } finally {
          await agent.close();
          await p.close(200);
        }
      });
    });
  }

  describe('HTTP/2', () => {
    it.each(CHANGES)('%s', async (_what, change) => {
      const { p } = await proxyWith(true);
      const s = await h2Through(p.port, HOST, origin.port, ca.certPem);
      try {
        const get = async (pathname: string) => JSON.parse((await h2Request(s, { ':method': 'GET', ':path': pathname })).body) as Echo;
        expect(injected(await get('/a/1'))).toEqual([VALUE]);
        p.setConfig(compileConfig(withPort(change)));
        expect(injected(await get('/a/2')), 'injected after the push').toEqual([]);
      } finally {
        s.close();
        await p.close(200);
      }
    });
  });
});

describe('on a connection already open', () => {
  it('a push whose egress policy now refuses the host refuses the next request (403), nothing sent', async () => {
    for (const fastPath of [true, false]) {
      const { p } = await proxyWith(fastPath);
      const agent = new ProxyAgent({ uri: p.url, requestTls: { ca: ca.certPem }, connections: 1, pipelining: 1 });
      try {
        const get = (pathname: string) => request(`https://${HOST}:${origin.port}${pathname}`, { dispatcher: agent });
        const first = await get('/e/1');
        expect(injected((await first.body.json()) as Echo)).toEqual([VALUE]);
        const before = origin.requests;
        p.setConfig(compileConfig({ ...intercepting(), access_control: { deny_hosts: [HOST] } }));
        const second = await get('/e/2');
        expect(second.statusCode, fastPath ? 'fast path' : 'Node path').toBe(403);
        await second.body.dump();
        expect(origin.requests).toBe(before);
      } finally {
        await agent.close();
        await p.close(200);
      }
    }
  });

  it('a push that fails validation, resolution or compilation leaves the configuration in force whole', async () => {
    const { p } = await proxyWith(true);
    const holder = new ConfigHolder({ proxy: { setConfig: (c) => p.setConfig(c) } });
    const good = { no_proxy: [], rules: [{ name: 'live', match_hosts: [HOST], headers: [{ name: 'X-Key', type: 'workspace_secret', value: 'Bearer {K}' }] }] };
    await holder.apply(good, { source: 'push', secrets: new Map([['K', VALUE]]) });
    const agent = new ProxyAgent({ uri: p.url, requestTls: { ca: ca.certPem }, connections: 1, pipelining: 1 });
    const s = await h2Through(p.port, HOST, origin.port, ca.certPem);
    try {
      const h1 = async () => injected((await (await request(`https://${HOST}:${origin.port}/v`, { dispatcher: agent })).body.json()) as Echo);
      const h2 = async () => injected(JSON.parse((await h2Request(s, { ':method': 'GET', ':path': '/v' })).body) as Echo);
      const want = [`Bearer ${VALUE}`];
      expect(await h1()).toEqual(want);
      expect(await h2()).toEqual(want);
      const bad: [string, unknown, Map<string, string>][] = [
        // Each would take the host out of the rule (config-level no_proxy) if any part of it applied.
        ['a bad pattern', { ...good, no_proxy: [HOST, '*.'] }, new Map([['K', 'other']])],
        ['a missing secret', { ...good, no_proxy: [HOST], rules: [{ ...good.rules[0], headers: [{ name: 'X-Key', type: 'workspace_secret', value: '{MISSING}' }] }] }, new Map()],
        ['an illegal header value', { ...good, no_proxy: [HOST], rules: [{ ...good.rules[0], headers: [{ name: 'X-Key', type: 'plaintext', value: 'a\r\nb' }] }] }, new Map()],
        ['a bad path pattern', { ...good, no_proxy: [HOST], rules: [{ ...good.rules[0], match_paths: ['/a/%2f/*'] }] }, new Map([['K', 'other']])],
      ];
      for (const [what, config, secrets] of bad) {
        await expect(holder.apply(config, { source: 'push', secrets }), what).rejects.toThrow();
        expect(await h1(), what).toEqual(want);
        expect(await h2(), what).toEqual(want);
      }
    } finally {
      s.close();
      await agent.close();
      await p.close(200);
    }
  });
});
