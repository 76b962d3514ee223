// The Auth Service's storage steps on a store that already holds data: a store written before a
// step must come out of it consistent (on SQLite and on PostgreSQL).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { OAUTH_MIGRATIONS } from '../../src/auth/migrations.js';
import { migrate, openPostgres, openSqlite, type Db } from '../../src/store/db.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

async function duplicateDefaults(db: Db): Promise<void> {
  await db.run('CREATE TABLE workspaces (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL)');
  await db.run("INSERT INTO workspaces (id, name, created_at) VALUES ('w1', 'w1', '2026-01-01T00:00:00.000Z')");
  // The store as the concurrent sign-ins on PostgreSQL could leave it: three defaults for one
  // user and provider, one for another user.
  await migrate(db, 'oauth', OAUTH_MIGRATIONS.slice(0, 2));
  await db.run(
    "INSERT INTO oauth_providers (workspace_id, provider_id, name, client_id, client_secret_sealed, auth_url, token_url, revocation_url, uses_pkce, token_endpoint_auth_method, scopes, source, created_at, updated_at) VALUES ('w1', 'p', 'p', 'c', NULL, 'https://a', 'https://t', NULL, 1, 'none', '[]', 'api', 'x', 'x')",
  );
  const rows: [string, string, number, string][] = [
    ['t3', 'u1', 1, '2026-01-01T00:00:03.000Z'],
    ['t1', 'u1', 1, '2026-01-01T00:00:01.000Z'],
    ['t2', 'u1', 1, '2026-01-01T00:00:01.000Z'],
    ['t4', 'u1', 0, '2026-01-01T00:00:00.000Z'],
    ['t5', 'u2', 1, '2026-01-01T00:00:05.000Z'],
  ];
  for (const [id, user, def, at] of rows) {
    await db.run(
      "INSERT INTO oauth_tokens (id, workspace_id, user_id, provider_id, access_token_sealed, refresh_token_sealed, token_type, scopes, expires_at, provider_account_label, is_default, deleting_at, created_at, updated_at) VALUES (?, 'w1', ?, 'p', 'sealed', NULL, NULL, '[]', NULL, NULL, ?, NULL, ?, ?)",
      [id, user, def, at, at],
    );
  }
  await migrate(db, 'oauth', OAUTH_MIGRATIONS);
  const after = await db.all<{ id: string; is_default: number }>('SELECT id, is_default FROM oauth_tokens ORDER BY id');
  // The oldest default of each group stays (ties: the smaller id), the others are cleared.
  expect(after.map((r) => [r.id, Number(r.is_default)])).toEqual([
    ['t1', 1],
    ['t2', 0],
    ['t3', 0],
    ['t4', 0],
    ['t5', 1],
  ]);
  // A second default is refused by the store itself from now on.
  await expect(db.run("UPDATE oauth_tokens SET is_default = 1 WHERE id = 't2'")).rejects.toThrow();
}

describe('a store with several default tokens of one user and provider', () => {
  it('keeps the oldest default on SQLite', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-oauth-mig-'));
    dirs.push(dir);
    const db = await openSqlite(path.join(dir, 'db.sqlite'));
    try {
      await duplicateDefaults(db);
    } finally {
      await db.close();
    }
  });

  it.skipIf(!pgAvailable())('keeps the oldest default on PostgreSQL', async () => {
    const db = await openPostgres(await freshPgDatabase());
    try {
      await duplicateDefaults(db);
    } finally {
      await db.close();
    }
  });
});
