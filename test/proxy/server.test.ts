import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle, type RequestRecord } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { connectTunnel } from '../helpers/connect.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-inproc-'));
let origin: TestOrigin;
let proxy: ProxyHandle;
let agent: ProxyAgent;
let logText = '';
const cfg = (value: string) => compileConfig({ no_proxy: [], rules: [{ name: 'api', match_hosts: ['api.test.local'], headers: [{ name: 'X-Key', value }] }] });

beforeAll(async () => {
  const pki = await createTestPki(['api.test.local']);
  origin = await startOrigin(pki);
  const ca = await ensureCa(path.join(dir, 'certs'));
  const logger = createLogger({ destination: new Writable({ write: (c, _e, cb) => ((logText += c), cb()) }) });
  proxy = await startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: cfg('kgFIRST-value'),
    logger,
    resolve: new Map([[`api.test.local:${origin.port}`, '127.0.0.1']]),
    upstreamCa: [pki.caPem],
    denyTargets: ['127.0.0.1:9'],
  });
  agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: ca.certPem } });
});
afterAll(async () => {
  await agent?.close();
  await proxy?.close(1000);
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
  expect(logText).not.toContain('kgFIRST-value');
  expect(logText).not.toContain('kgSECOND-value');
});

const key = async () => {
  const res = await request(`https://api.test.local:${origin.port}/x`, { dispatcher: agent });
  const echo = (await res.body.json()) as { headers: [string, string][] };
  return echo.headers.filter(([k]) => k === 'x-key').map(([, v]) => v);
};

describe('startProxy in-process', () => {
  it('exposes its address, swaps configuration atomically and emits events without values', async () => {
    expect(proxy.url).toBe(`http://127.0.0.1:${proxy.port}`);
    const events: { name: string; payload: unknown }[] = [];
    for (const name of ['request', 'tunnel', 'tls_handshake', 'cert', 'upstream_error']) proxy.events.on(name, (payload) => events.push({ name, payload }));
    expect(await key()).toEqual(['kgFIRST-value']);
    const second = cfg('kgSECOND-value');
    proxy.setConfig(second);
    expect(proxy.getConfig()).toBe(second);
    // Same keep-alive connection: the next request takes the new snapshot.
    expect(await key()).toEqual(['kgSECOND-value']);
    const req = events.find((e) => e.name === 'request')!.payload as RequestRecord;
    expect(req).toMatchObject({ decision: 'intercept', rule: 'api', injected: ['x-key'], status: 200 });
    expect(events.some((e) => e.name === 'tls_handshake' && (e.payload as { ok: boolean }).ok)).toBe(true);
    expect(events.some((e) => e.name === 'cert')).toBe(true);
    expect(JSON.stringify(events)).not.toMatch(/kgFIRST|kgSECOND/);
  });

  it('refuses deny targets (e.g. an admin listener), also added later', async () => {
    expect((await connectTunnel(proxy.port, '127.0.0.1:9')).status).toBe(403);
    proxy.denyTarget('127.0.0.1:10');
    expect((await connectTunnel(proxy.port, '127.0.0.1:10')).status).toBe(403);
  });
});
