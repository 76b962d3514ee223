// DATABASE_URL against a PostgreSQL server that checks passwords (scram-sha-256): the real
// `keygate serve` binary says in one line that the login was refused and never prints the
// password, whether it was wrong, right, or given in the URL's query string. The shared test
// cluster trusts every login, so this one is started for these tests alone.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDb } from '../../src/store/db.js';
import pg from 'pg';
import { runCli, startCli } from '../helpers/cli.js';
import { startScramCluster, type ScramCluster } from '../helpers/pg-scram.js';

const RIGHT = 'Right-Pw-' + 'r7'.repeat(8);
const WRONG = 'Wrong-Pw-' + 'w3'.repeat(8);
let cluster: ScramCluster | undefined;
let skip = '';
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kg-pg-auth-'));
  dirs.push(d);
  return d;
};

beforeAll(async () => {
  const c = await startScramCluster(RIGHT);
  if (typeof c === 'string') {
    skip = c;
    console.warn(`[keygate tests] password-auth PostgreSQL tests skipped: ${c}`);
  } else cluster = c;
}, 120_000);
afterAll(() => {
  cluster?.stop();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

const url = (auth: string, query = '') => `postgres://${auth}@${cluster!.host}:${cluster!.port}/postgres${query}`;

function serve(databaseUrl: string) {
  return runCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'none'], { env: { DATABASE_URL: databaseUrl, KEYGATE_API_KEY: 'kg_pg_auth_test_key_0123456789' }, timeoutMs: 60_000 });
}

describe('DATABASE_URL against a server that checks passwords', () => {
  it('the right password opens the database (the server really is password-protected: the cases below fail for their password alone)', async (ctx) => {
    if (skip) ctx.skip();
    const db = await openDb({ dataDir: tmp(), databaseUrl: url(`keygate:${RIGHT}`) });
    expect(await db.get<{ one: number }>('SELECT 1 AS one')).toEqual({ one: 1 });
    await db.close();
  });

  it('a wrong password: one line saying the login was refused, the URL without its password, no password anywhere', async (ctx) => {
    if (skip) ctx.skip();
    const r = serve(url(`keygate:${WRONG}`));
    expect(r.status).toBe(1);
    const out = r.stderr + r.stdout;
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toBe(`keygate: cannot open the database of DATABASE_URL (postgres://keygate:***@${cluster!.host}:${cluster!.port}/postgres): password authentication failed for user "keygate" (28P01)\n`);
    for (const pw of [WRONG, RIGHT]) expect(out).not.toContain(pw);
    expect(out).not.toMatch(/unexpected error|\n\s+at /);
  });

  it('a password in the query string (?password=, which the driver honours) is not shown either', async (ctx) => {
    if (skip) ctx.skip();
    const r = serve(url('keygate', `?password=${WRONG}&application_name=kg`));
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^keygate: cannot open the database of DATABASE_URL \(.*\): password authentication failed for user "keygate" \(28P01\)\n$/);
    expect(r.stderr + r.stdout).not.toContain(WRONG);
    // The rest of the URL still helps the operator.
    expect(r.stderr).toContain('application_name=kg');
  });

  it('no password at all: says the server wants one, not a driver internal', async (ctx) => {
    if (skip) ctx.skip();
    const started = Date.now();
    const r = serve(url('keygate'));
    // Promptly: the refused login's socket used to stay open until the server's authentication
    // timeout (a minute), and the failed command with it.
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(r.status).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^keygate: cannot open the database of DATABASE_URL \(postgres:\/\/keygate@[^)]*\): the server asks for a password and DATABASE_URL gives none\n$/);
    expect(r.stderr).not.toContain(RIGHT);
  });
});

describe('a PostgreSQL connection that the server ends while keygate serve holds it idle', () => {
  it('does not bring keygate serve down; the next request is answered on a new connection', async (ctx) => {
    if (skip) ctx.skip();
    const KEY = 'kg_pg_terminate_test_key_0123456789';
    const server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'none'], { env: { DATABASE_URL: url(`keygate:${RIGHT}`), KEYGATE_API_KEY: KEY, DOCKER_HOST: 'unix:///nonexistent/docker.sock' }, timeoutMs: 60_000 });
    try {
      const list = () => fetch(`${server.url}/v2/deployments`, { headers: { 'x-api-key': KEY } });
      expect((await list()).status).toBe(200);
      // The server ends every other session (an administrator, a restart, idle_session_timeout).
      const admin = new pg.Client({ connectionString: url(`keygate:${RIGHT}`) });
      await admin.connect();
      let ended = 0;
      try {
        const r = await admin.query('SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database() AND backend_type = $1', ['client backend']);
        ended = r.rows.filter((x) => x.ok).length;
      } finally {
        await admin.end();
      }
      expect(ended).toBeGreaterThan(0);
      await new Promise((r) => setTimeout(r, 500));
      expect(server.proc.exitCode, server.output()).toBeNull();
      expect((await list()).status).toBe(200);
      expect(server.proc.exitCode).toBeNull();
      expect(server.output()).toContain('database connection lost');
      expect(server.output()).not.toContain(RIGHT);
    } finally {
      await server.stop();
    }
  });
});
