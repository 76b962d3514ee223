import { existsSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { startEchoOrigin, type EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';
import { api, cleanTmp, tmp, viaProxy, waitFor } from './helpers.js';

const KEY = 'pg-sandbox-key-0123456789';
const SECRET = 'pg-secret-VALUE-4444';
const OPAQUE = 'pg-opaque-VALUE-5555';
const HOST = 'api.pg.test';

let origin: EchoOrigin | undefined;
let server: RunningCli | undefined;
afterAll(async () => {
  await server?.stop();
  await origin?.close();
  cleanTmp();
});

describe.skipIf(!pgAvailable())('sandbox API on PostgreSQL (DATABASE_URL)', () => {
  it('create, get, list, secrets in the database, injection, restart', async () => {
    const databaseUrl = await freshPgDatabase();
    const originDir = tmp();
    origin = await startEchoOrigin({ caDir: originDir, hosts: [HOST] });
    const dataDir = tmp();
    const env = {
      DATABASE_URL: databaseUrl,
      KEYGATE_API_KEY: KEY,
      KEYGATE_SANDBOX_PROXY_RESOLVE: `${HOST}:${origin.port}:127.0.0.1`,
      KEYGATE_SANDBOX_PROXY_CA_FILE: path.join(originDir, 'ca.pem'),
    };
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], { env });
    const A = (method: string, url: string, body?: unknown) => api(server!.url, KEY, method, url, body);

    expect((await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'PG_TOKEN', value: SECRET }])).status).toBe(200);
    // The database backend, not the file: no secrets.json was written.
    expect(existsSync(path.join(dataDir, 'secrets.json'))).toBe(false);

    const proxy_config = {
      rules: [
        {
          name: 'pg',
          match_hosts: [HOST],
          headers: [
            { name: 'Authorization', type: 'workspace_secret', value: 'Bearer {PG_TOKEN}' },
            { name: 'X-Opaque', type: 'opaque', value: OPAQUE },
          ],
        },
      ],
    };
    const created = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'pg-box', wait_for_ready: true, proxy_config });
    expect(created.status).toBe(201);
    expect(created.body.status).toBe('ready');
    expect(created.text).not.toContain(SECRET);
    expect(created.text).not.toContain(OPAQUE);
    expect((await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'pg-box' })).status).toBe(409);
    const missing = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'pg-missing', proxy_config: { rules: [{ ...proxy_config.rules[0], headers: [{ name: 'A', type: 'workspace_secret', value: '{NOPE}' }] }] } });
    expect(missing.status).toBe(422);
    expect(missing.body.detail[0].loc).toEqual(['body', 'proxy_config', 'rules', 0, 'headers', 0, 'value']);

    const one = await A('GET', '/api/v2/sandboxes/boxes/pg-box');
    expect(one.body).toMatchObject({ id: created.body.id, name: 'pg-box', status: 'ready' });
    expect(one.body.proxy_config.rules[0].headers[1]).toEqual({ name: 'X-Opaque', type: 'opaque' });
    const list = await A('GET', '/api/v2/sandboxes/boxes');
    expect(list.body.resources.map((b: { name: string }) => b.name)).toEqual(['pg-box']);
    expect((await A('GET', '/api/v1/workspaces/current/secrets')).body).toEqual([{ key: 'PG_TOKEN' }]);

    const res = await viaProxy(created.body.proxy.url, created.body.proxy.ca_cert_pem, `https://${HOST}:${origin.port}/x`);
    expect(res.body.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(res.body.headers['x-opaque']).toBe(OPAQUE);

    // Stored sealed: neither value appears in any row of the database.
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    try {
      const rows = await client.query('SELECT proxy_config FROM sandboxes');
      const secrets = await client.query('SELECT value_sealed FROM workspace_secrets');
      const dump = JSON.stringify([rows.rows, secrets.rows]);
      expect(dump).not.toContain(SECRET);
      expect(dump).not.toContain(OPAQUE);
      expect(dump).toContain('kg1.');
    } finally {
      await client.end();
    }

    expect(await server.stop()).toBe(0);
    const restarted = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], { env });
    server = restarted;
    // The API answers at once; the box reads provisioning until its proxy is back.
    const after = await waitFor(async () => {
      const r = await api(restarted.url, KEY, 'GET', '/api/v2/sandboxes/boxes/pg-box');
      return r.body?.status !== 'provisioning' ? r : undefined;
    }, 'pg-box restored');
    expect(after.body).toMatchObject({ status: 'ready', proxy: { url: created.body.proxy.url } });
    const again = await viaProxy(after.body.proxy.url, after.body.proxy.ca_cert_pem, `https://${HOST}:${origin.port}/x`);
    expect(again.body.headers.authorization).toBe(`Bearer ${SECRET}`);
  });
});
