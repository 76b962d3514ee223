import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'keygate-serve-'));
  dirs.push(d);
  return d;
};
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

async function get(url: string, headers: Record<string, string> = {}) {
  const res = await fetch(url, { headers });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined, headers: res.headers };
}

describe('keygate serve on embedded defaults', () => {
  let server: RunningCli;
  let dataDir: string;
  let key: string;

  beforeAll(async () => {
    dataDir = tmp();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: { KEYGATE_API_KEY: '', DATABASE_URL: '' } });
    key = readFileSync(path.join(dataDir, 'api-key'), 'utf8').trim();
  });
  afterAll(async () => {
    expect(await server.stop()).toBe(0);
  });

  it('generates the first API key into a 0600 file and never prints it', () => {
    expect(key).toMatch(/^kg_[A-Za-z0-9_-]{43}$/);
    expect(statSync(path.join(dataDir, 'api-key')).mode & 0o777).toBe(0o600);
    expect(statSync(path.join(dataDir, 'master.key')).mode & 0o777).toBe(0o600);
    expect(server.output()).not.toContain(key);
  });

  it('answers health checks without credentials', async () => {
    expect((await get(`${server.url}/healthz`)).status).toBe(200);
    expect((await get(`${server.url}/readyz`)).body).toEqual({ ready: true });
  });

  it('serves an OpenAPI document with the three security schemes', async () => {
    const { status, body } = await get(`${server.url}/openapi.json`);
    expect(status).toBe(200);
    expect(body.openapi).toBe('3.1.0');
    expect(Object.keys(body.components.securitySchemes).sort()).toEqual(['API Key', 'Bearer Auth', 'Tenant ID']);
    expect(body.components.securitySchemes['API Key']).toMatchObject({ in: 'header', name: 'X-Api-Key' });
  });

  it('answers unknown paths with 404 {"detail": ...}', async () => {
    const r = await get(`${server.url}/v2/nothing-here`, { 'x-api-key': key });
    expect(r.status).toBe(404);
    expect(r.body).toEqual({ detail: 'Not Found' });
  });

  it('answers a known path with a method it does not take with 405 and Allow, before authentication', async () => {
    for (const [method, url, allow] of [
      ['PUT', '/v2/deployments', 'GET, HEAD, POST'],
      ['POST', '/v2/deployments/00000000-0000-0000-0000-000000000000', 'GET, HEAD, PATCH, DELETE'],
      ['DELETE', '/api/v2/sandboxes/boxes?limit=5', 'GET, HEAD, POST'],
      ['POST', '/v2/auth/tokens', 'GET, HEAD'],
    ] as const) {
      for (const headers of [{ 'x-api-key': key }, {}] as Record<string, string>[]) {
        const res = await fetch(`${server.url}${url}`, { method, headers });
        expect([method, url, res.status]).toEqual([method, url, 405]);
        expect(res.headers.get('allow')).toBe(allow);
        expect(await res.json()).toEqual({ detail: 'Method Not Allowed' });
      }
    }
    // A path no method takes stays a 404.
    expect((await fetch(`${server.url}/v2/deployments/x/nothing`, { method: 'PUT', headers: { 'x-api-key': key } })).status).toBe(404);
  });

  it('keys create issues a key for another workspace, shown once on stdout', () => {
    const r = runCli(['serve', 'keys', 'create', '--workspace', 'team-b', '--user', 'bob', '--data', dataDir]);
    expect(r.status).toBe(0);
    expect(r.stdout.trim()).toMatch(/^kg_/);
    expect(r.stderr).toContain("workspace 'team-b'");
    expect(r.stderr).not.toContain(r.stdout.trim());
  });

  it('exits 0 on SIGTERM (checked in afterAll) and names its address', () => {
    expect(server.output()).toMatch(/keygate serve listening on 127\.0\.0\.1:\d+/);
  });
});

describe('keygate serve configuration', () => {
  it('takes the first key from KEYGATE_API_KEY and rejects a short one', async () => {
    const dataDir = tmp();
    const bad = runCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: { KEYGATE_API_KEY: 'short', DATABASE_URL: '' }, timeoutMs: 20_000 });
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toContain('KEYGATE_API_KEY must be at least 16 characters');
    expect(bad.stderr).not.toContain('short\n');
  });

  it('rejects a malformed --listen with a one-line error', () => {
    const r = runCli(['serve', '--listen', 'nonsense', '--data', tmp()]);
    expect(r.status).toBe(2);
    expect(r.stderr.trim()).toBe("keygate: --listen must be HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:8080 (no port), got 'nonsense'");
  });
});

describe.skipIf(!pgAvailable())('keygate serve on PostgreSQL (DATABASE_URL)', () => {
  it('bootstraps the key from KEYGATE_API_KEY into PostgreSQL and keeps it across restarts', async () => {
    const databaseUrl = await freshPgDatabase();
    const env = { DATABASE_URL: databaseUrl, KEYGATE_API_KEY: 'pg-test-key-0123456789' };
    for (let round = 0; round < 2; round++) {
      const server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp()], { env: round === 0 ? env : { ...env, KEYGATE_API_KEY: '' } });
      try {
        expect(server.output()).toContain('database: PostgreSQL');
        const r = await get(`${server.url}/v2/nothing`, { 'X-API-KEY': 'pg-test-key-0123456789' });
        expect(r.status).toBe(404);
        const denied = await get(`${server.url}/v2/nothing`, { 'X-Api-Key': 'wrong-key-0123456789' });
        expect(denied.status).toBe(404); // unknown routes are 404 before authentication
      } finally {
        await server.stop();
      }
    }
  });
});
