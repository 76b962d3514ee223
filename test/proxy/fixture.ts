/**
 * Shared set-up for the end-to-end proxy tests: a trusted test origin, an untrusted one, a
 * configuration exercising every rule feature, and a proxy child process reaching them via
 * --resolve and --upstream-ca. useProxyPair: the in-process fast-path and Node-path proxies that
 * tests running each case on both exchanges share.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { ProxyAgent } from 'undici';
import { afterAll, beforeAll, expect } from 'vitest';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import type { ResolvedRule } from '../../src/rules/compile.js';
import { compileConfig } from '../../src/rules/index.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';

export const SECRET = 'kgTOKEN-5e1f-9a7c-secret';
export const OPAQUE = 'kgOPAQUE-77d2-b3e8-value';

export const NAMES = ['api.test.local', 'x.y.test.local', 'a.test.local', 'test.local', 'other.test.local', 'skip.test.local', 'bypass.test.local'];

export const CONFIG = {
  no_proxy: ['bypass.test.local'],
  rules: [
    {
      name: 'api-repos',
      match_hosts: ['api.test.local'],
      match_paths: ['/repos/*', '/ws'],
      headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }],
    },
    {
      name: 'wild',
      match_hosts: ['*.test.local'],
      match_paths: ['/w/*'],
      no_proxy: ['skip.test.local'],
      headers: [
        { name: 'X-Api-Key', type: 'opaque', value: OPAQUE },
        { name: 'X-Plain', type: 'plaintext', value: 'plain-value' },
      ],
    },
    { name: 'untrusted', match_hosts: ['evil.test.local'], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }] },
  ],
};

export interface Fixture {
  pki: TestPki;
  badPki: TestPki;
  origin: TestOrigin;
  evil: TestOrigin;
  proxy: SpawnedProxy;
  /** proxy CA + origin CA in one file (for clients that also reach blind-tunnelled hosts). */
  bundlePath: string;
  url(host: string, pathAndQuery: string): string;
  close(): Promise<void>;
}

export async function startFixture(): Promise<Fixture> {
  const pki = await createTestPki(NAMES);
  const badPki = await createTestPki(['evil.test.local'], 'untrusted CA');
  const origin = await startOrigin(pki);
  const evil = await startOrigin(badPki);
  const resolve = [...NAMES.map((n) => `${n}:${origin.port}:127.0.0.1`), `evil.test.local:${evil.port}:127.0.0.1`];
  const proxy = await spawnProxy({ config: CONFIG, secrets: { API_TOKEN: SECRET, UNUSED: 'kgUNUSED-never-printed' }, resolve, upstreamCa: [pki.caPem] });
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-fixture-'));
  const bundlePath = path.join(dir, 'bundle.pem');
  writeFileSync(bundlePath, proxy.caPem + pki.caPem);
  return {
    pki,
    badPki,
    origin,
    evil,
    proxy,
    bundlePath,
    url: (host, p) => `https://${host}:${host === 'evil.test.local' ? evil.port : origin.port}${p}`,
    async close() {
      await proxy.stop();
      await origin.close();
      await evil.close();
    },
  };
}

/**
 * The usual set-up of an end-to-end proxy test file: the fixture and an undici ProxyAgent that
 * trusts the proxy CA (and the origin's), started once for the file; on teardown, proof that no
 * configured value (secret, opaque, plaintext, unused secret) appeared in anything the proxy printed.
 */
export function useProxyFixture(): { readonly f: Fixture; readonly agent: ProxyAgent } {
  const state = {} as { f: Fixture; agent: ProxyAgent };
  beforeAll(async () => {
    state.f = await startFixture();
    state.agent = new ProxyAgent({ uri: state.f.proxy.url, requestTls: { ca: [state.f.proxy.caPem, state.f.pki.caPem] } });
  });
  afterAll(async () => {
    await state.agent?.close();
    const output = state.f?.proxy.output() ?? '';
    await state.f?.close();
    for (const value of [SECRET, OPAQUE, 'plain-value', 'kgUNUSED']) expect(output).not.toContain(value);
  });
  return state;
}

/** What useProxyPair sets up: an HTTPS origin, one proxy CA, and two in-process proxies sharing them. */
export interface ProxyPair {
  ca: Ca;
  origin: TestOrigin;
  /** [fast path, Node path]: the same configuration, `fastPath` true then false. */
  proxies: [ProxyHandle, ProxyHandle];
}

/**
 * The in-process set-up of tests that run every case on both HTTP/1.1 exchanges: a local HTTPS
 * origin whose certificate names `names` (test CA trusted upstream), and two proxies (the fast
 * path, then the Node path) with the given rules, each name pinned to 127.0.0.1 at the origin's
 * port. Started once for the file; the CA directory is removed on teardown.
 */
export function useProxyPair(opts: { names: string[]; rules: ResolvedRule[]; tmpPrefix: string }): ProxyPair {
  const state = {} as ProxyPair;
  const dir = mkdtempSync(path.join(os.tmpdir(), opts.tmpPrefix));
  beforeAll(async () => {
    const pki = await createTestPki(opts.names);
    state.origin = await startOrigin(pki);
    state.ca = await ensureCa(path.join(dir, 'certs'));
    const pins = new Map(opts.names.filter((n) => !net.isIP(n)).map((n): [string, string] => [`${n}:${state.origin.port}`, '127.0.0.1']));
    const proxies: ProxyHandle[] = [];
    for (const fastPath of [true, false]) {
      proxies.push(
        await startProxy({
          listen: { host: '127.0.0.1', port: 0 },
          ca: state.ca,
          config: compileConfig({ no_proxy: [], rules: opts.rules }),
          logger: createLogger({ destination: new Writable({ write: (_c, _e, cb) => cb() }) }),
          fastPath,
          resolve: pins,
          upstreamCa: [pki.caPem],
        }),
      );
    }
    state.proxies = proxies as [ProxyHandle, ProxyHandle];
  });
  afterAll(async () => {
    for (const p of state.proxies ?? []) await p.close(200);
    await state.origin?.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return state;
}
