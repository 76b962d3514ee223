/**
 * Shared set-up for the end-to-end proxy tests: a trusted test origin, an untrusted one, a
 * configuration exercising every rule feature, and a proxy child process reaching them via
 * --resolve and --upstream-ca.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent } from 'undici';
import { afterAll, beforeAll, expect } from 'vitest';
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
