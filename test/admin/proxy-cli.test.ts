// `keygate proxy` with --data (secrets from the encrypted store), --admin, SIGHUP and file-watch
// reload, as a real child process (dist/, built before the tests run).
import { mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { sealOpaqueValues } from '../../src/secrets/opaque.js';
import { runCli } from '../helpers/cli.js';
import { connectTunnel } from '../helpers/connect.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';

const HOST = 'api.test.local';
const V1 = 'kgCLI-token-v1-a1b2';
const V2 = 'kgCLI-token-v2-c3d4';
const OPAQUE = 'kgCLI-opaque-e5f6';
const ADMIN_TOKEN = 'kgCLI-admin-token-0123456789';

let pki: TestPki;
let origin: TestOrigin;
let dir: string;
const cleanEnv = { KEYGATE_MASTER_KEY: '', KEYGATE_NEW_MASTER_KEY: '', KEYGATE_SECRETS_FILE: '', KEYGATE_SECRETS_DIR: '', DATABASE_URL: '', KEYGATE_DATA_DIR: '', KEYGATE_ADMIN_TOKEN: '' };

const config = (gen: string) => ({
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
  ],
});

function adminAddress(p: SpawnedProxy): string {
  const m = /admin listener on (http:\/\/[0-9.]+:\d+|unix:\S+?)["\s]/.exec(p.output());
  if (!m) throw new Error(`no admin address in output:\n${p.output()}`);
  return m[1];
}

async function seen(p: SpawnedProxy, agent: ProxyAgent): Promise<Record<string, string>> {
  const r = await request(`https://${HOST}:${origin.port}/x`, { dispatcher: agent });
  const body = await r.body.text();
  expect(r.statusCode, body).toBe(200);
  return Object.fromEntries((JSON.parse(body).headers as [string, string][]).map(([k, v]) => [k.toLowerCase(), v]));
}

async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 8000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`condition not reached; last value ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  origin = await startOrigin(pki);
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-proxy-cli-'));
});
afterAll(async () => {
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('keygate proxy --data --admin', () => {
  it('resolves from the data directory, reloads on secret and config changes and on SIGHUP, serves the admin API', async () => {
    const data = path.join(dir, 'data');
    expect(runCli(['secrets', 'set', 'API_TOKEN', '--data', data], { input: V1, env: cleanEnv }).status).toBe(0);
    // A config file as keygate writes it: the opaque value sealed with the data directory's key.
    const configFile = path.join(dir, 'proxy.json');
    const envelope = loadKeyring(data, {}).envelope;
    writeFileSync(configFile, JSON.stringify(sealOpaqueValues(config('g1'), envelope)));
    expect(readFileSync(configFile, 'utf8')).not.toContain(OPAQUE);

    const proxy = await spawnProxy({
      config: configFile,
      resolve: [`${HOST}:${origin.port}:127.0.0.1`],
      upstreamCa: [pki.caPem],
      extraArgs: ['--data', data, '--admin', '127.0.0.1:0'],
      env: { ...cleanEnv, KEYGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
    try {
      const admin = adminAddress(proxy);
      const auth = { authorization: `Bearer ${ADMIN_TOKEN}` };
      expect(await seen(proxy, agent)).toMatchObject({ authorization: `Bearer ${V1}`, 'x-opaque': OPAQUE, 'x-gen': 'g1' });

      // Rotate the secret with the CLI: the store's file changes, the proxy re-resolves.
      expect(runCli(['secrets', 'set', 'API_TOKEN', '--data', data], { input: V2, env: cleanEnv }).status).toBe(0);
      await until(() => seen(proxy, agent), (h) => h.authorization === `Bearer ${V2}`);

      // The config file replaced (editor-style rename).
      writeFileSync(`${configFile}.tmp`, JSON.stringify(sealOpaqueValues(config('g2'), envelope)));
      renameSync(`${configFile}.tmp`, configFile);
      await until(() => seen(proxy, agent), (h) => h['x-gen'] === 'g2');

      // A broken file: logged, rejected, old config kept, proxy alive.
      writeFileSync(configFile, JSON.stringify({ rules: [{ name: 'api', match_hosts: [HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {NOT_THERE}' }] }] }));
      await until(async () => proxy.output(), (o) => /reload rejected/.test(o));
      expect(proxy.output()).toMatch(/NOT_THERE/);
      expect((await seen(proxy, agent))['x-gen']).toBe('g2');

      // SIGHUP re-reads too (fix the file, signal right away).
      writeFileSync(configFile, JSON.stringify(sealOpaqueValues(config('g3'), envelope)));
      proxy.child.kill('SIGHUP');
      await until(() => seen(proxy, agent), (h) => h['x-gen'] === 'g3');

      // Admin API: auth, redacted config, metrics, push.
      expect((await request(`${admin}/config`)).statusCode).toBe(401);
      const cfg = await request(`${admin}/config`, { headers: auth });
      const cfgText = await cfg.body.text();
      expect(cfg.statusCode).toBe(200);
      expect(JSON.parse(cfgText).proxy_config.rules[0].headers[2]).toEqual({ name: 'X-Opaque', type: 'opaque' });
      expect(cfgText).not.toMatch(new RegExp(`${V1}|${V2}|${OPAQUE}|kg1\\.`));
      const push = await request(`${admin}/config`, { method: 'PUT', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify(config('pushed')) });
      expect(push.statusCode).toBe(200);
      expect(await push.body.json()).toMatchObject({ applied: true });
      expect((await seen(proxy, agent))['x-gen']).toBe('pushed');
      const metrics = await (await request(`${admin}/metrics`, { headers: auth })).body.text();
      expect(metrics).toMatch(/keygate_proxy_requests_total\{decision="intercept",rule="api",status="200",proto="h1"\} \d+/);
      expect(metrics).toMatch(/keygate_proxy_config_applies_total\{source="file",result="rejected"\} [1-9]/);
      expect(metrics).toMatch(/keygate_proxy_config_applies_total\{source="sighup",result="applied"\} [1-9]/);
      expect((await request(`${admin}/readyz`, { headers: auth })).statusCode).toBe(200);

      // Not through the proxy port.
      const port = new URL(admin).port;
      const t = await connectTunnel(proxy.port, `127.0.0.1:${port}`);
      expect(t.status).toBeGreaterThanOrEqual(400);
      t.socket.destroy();
    } finally {
      await agent.close();
      const out = proxy.output();
      expect(await proxy.stop()).toBe(0);
      for (const v of [V1, V2, OPAQUE, ADMIN_TOKEN]) expect(out).not.toContain(v);
    }
  });

  it('generates the admin token into the data directory (0600) and never prints it; unix socket admin', async () => {
    const data = path.join(dir, 'data2');
    writeFileSync(path.join(dir, 'plain.json'), JSON.stringify({ rules: [] }));
    const sock = path.join(dir, 'admin.sock');
    const proxy = await spawnProxy({ config: path.join(dir, 'plain.json'), extraArgs: ['--data', data, '--admin', `unix:${sock}`], env: cleanEnv });
    try {
      const tokenFile = path.join(data, 'admin.token');
      expect(statSync(tokenFile).mode & 0o777).toBe(0o600);
      expect(statSync(sock).mode & 0o777).toBe(0o600);
      const token = readFileSync(tokenFile, 'utf8').trim();
      expect(proxy.output()).not.toContain(token);
      expect(proxy.output()).toContain(tokenFile);
      const http = await import('node:http');
      const status = (headers: Record<string, string>) =>
        new Promise<number>((resolve, reject) => {
          const req = http.request({ socketPath: sock, path: '/healthz', headers }, (res) => {
            res.resume();
            resolve(res.statusCode!);
          });
          req.on('error', reject);
          req.end();
        });
      expect(await status({})).toBe(401);
      expect(await status({ authorization: `Bearer ${token}` })).toBe(200);
    } finally {
      expect(await proxy.stop()).toBe(0);
    }
  });
});
