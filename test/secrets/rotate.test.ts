import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openDb, type Db } from '../../src/store/db.js';
import { Envelope, SEALED_PATTERN, keyIdOf } from '../../src/secrets/envelope.js';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { rotateMasterKey } from '../../src/secrets/rotate.js';
import { EncryptedFileSecretStore, openSecretStore } from '../../src/secrets/store.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';

const noEnv: NodeJS.ProcessEnv = {};
let dir: string;
const dbs: Db[] = [];

beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-rotate-'));
});
afterEach(async () => {
  for (const db of dbs.splice(0)) await db.close();
  rmSync(dir, { recursive: true, force: true });
});

const store = (env: NodeJS.ProcessEnv = noEnv, workspaceId?: string) =>
  new EncryptedFileSecretStore({ file: path.join(dir, 'secrets.json'), workspaceId, keys: () => loadKeyring(dir, env).envelope });

/**
 * A database shaped like the other areas': a sandbox row whose proxy_config JSON holds sealed
 * opaque values, a token table with whole sealed strings, a table without a primary key, a null,
 * and plain text that merely looks similar.
 */
async function seedDb(db: Db, env: Envelope): Promise<Record<string, string>> {
  await db.run('CREATE TABLE sandboxes (workspace_id TEXT NOT NULL, name TEXT NOT NULL, proxy_config TEXT NOT NULL, note TEXT, PRIMARY KEY (workspace_id, name))');
  await db.run('CREATE TABLE oauth_tokens (id TEXT PRIMARY KEY, access_sealed TEXT, refresh_sealed TEXT, scopes TEXT)');
  await db.run('CREATE TABLE loose (payload TEXT)');
  const cfg = (v1: string, v2: string) =>
    JSON.stringify({ rules: [{ name: 'r', match_hosts: ['api.x'], headers: [{ name: 'X-A', type: 'opaque', value: env.seal(v1) }, { name: 'X-B', type: 'opaque', value: env.seal(v2) }, { name: 'X-P', type: 'plaintext', value: 'kg1.notsealed' }] }] });
  await db.run('INSERT INTO sandboxes VALUES (?, ?, ?, ?)', ['w1', 'box1', cfg('opaque-1', 'opaque-2'), 'no secrets here']);
  await db.run('INSERT INTO sandboxes VALUES (?, ?, ?, ?)', ['w1', 'box2', cfg('opaque-3', 'opaque-4'), null]);
  await db.run('INSERT INTO oauth_tokens VALUES (?, ?, ?, ?)', ['t1', env.seal('access-1'), env.seal('refresh-1'), '["repo"]']);
  await db.run('INSERT INTO oauth_tokens VALUES (?, ?, ?, ?)', ['t2', env.seal('access-2'), null, '[]']);
  await db.run('INSERT INTO loose VALUES (?)', [`prefix ${env.seal('loose-1')} middle ${env.seal('loose-2')} suffix`]);
  return { 'opaque-1': '', 'opaque-2': '', 'opaque-3': '', 'opaque-4': '', 'access-1': '', 'refresh-1': '', 'access-2': '', 'loose-1': '', 'loose-2': '' };
}

/** Every sealed value in the database, opened with `env` (throws if any cannot be opened). */
async function openAll(db: Db, env: Envelope): Promise<string[]> {
  const out: string[] = [];
  const rows = [
    ...(await db.all<{ v: string }>('SELECT proxy_config AS v FROM sandboxes')),
    ...(await db.all<{ v: string }>('SELECT access_sealed AS v FROM oauth_tokens')),
    ...(await db.all<{ v: string }>('SELECT refresh_sealed AS v FROM oauth_tokens')),
    ...(await db.all<{ v: string }>('SELECT payload AS v FROM loose')),
  ];
  for (const { v } of rows) if (v) for (const m of v.match(SEALED_PATTERN) ?? []) out.push(env.open(m));
  return out.sort();
}

async function rotationLosesNothing(db: Db) {
  const oldEnv = loadKeyring(dir, noEnv).envelope;
  const expected = Object.keys(await seedDb(db, oldEnv)).sort();
  await store().set('GITHUB_TOKEN', 'ghp_file_value');
  await store(noEnv, 'other').set('K', 'other-ws-value');
  const oldKeyFile = readFileSync(path.join(dir, 'master.key'), 'utf8');

  const report = await rotateMasterKey({ dataDir: dir, db, env: noEnv });
  expect(report.source).toBe('file');
  expect(report.oldKeyId).toBe(oldEnv.keyId);
  expect(report.newKeyId).not.toBe(oldEnv.keyId);
  expect(report.secretsFileValues).toBe(2);
  const counts = Object.fromEntries(report.dbValues.map((c) => [`${c.table}.${c.column}`, c.values]));
  expect(counts).toEqual({ 'sandboxes.proxy_config': 4, 'oauth_tokens.access_sealed': 2, 'oauth_tokens.refresh_sealed': 1, 'loose.payload': 2 });

  // The key file was replaced atomically, stays 0600, rotation files are gone.
  const newKeyFile = readFileSync(path.join(dir, 'master.key'), 'utf8');
  expect(newKeyFile).not.toBe(oldKeyFile);
  expect(statSync(path.join(dir, 'master.key')).mode & 0o777).toBe(0o600);
  expect(existsSync(path.join(dir, 'master.key.prev'))).toBe(false);
  expect(existsSync(path.join(dir, 'master.key.next'))).toBe(false);

  // Everything opens with the NEW key ALONE, nothing with the old one.
  const newOnly = new Envelope(Buffer.from(newKeyFile.trim(), 'base64'));
  expect(newOnly.keyId).toBe(report.newKeyId);
  expect(await openAll(db, newOnly)).toEqual(expected);
  await expect(openAll(db, new Envelope(Buffer.from(oldKeyFile.trim(), 'base64')))).rejects.toThrow(/another master key/);
  const fileDoc = JSON.parse(readFileSync(path.join(dir, 'secrets.json'), 'utf8'));
  expect(newOnly.open(fileDoc.workspaces.default.GITHUB_TOKEN, 'GITHUB_TOKEN')).toBe('ghp_file_value');
  expect(newOnly.open(fileDoc.workspaces.other.K, 'K')).toBe('other-ws-value');
  expect(await store().get('GITHUB_TOKEN')).toBe('ghp_file_value');
  // Plain text that only looks like a sealed prefix is untouched.
  const box = await db.get<{ proxy_config: string; note: string }>("SELECT proxy_config, note FROM sandboxes WHERE name = 'box1'");
  expect(box!.proxy_config).toContain('"kg1.notsealed"');
  expect(box!.note).toBe('no secrets here');

  // A second rotation works on top of the first.
  const again = await rotateMasterKey({ dataDir: dir, db, env: noEnv });
  expect(again.oldKeyId).toBe(report.newKeyId);
  expect(await openAll(db, loadKeyring(dir, noEnv).envelope)).toEqual(expected);
}

describe('rotate-key', () => {
  it('re-seals the secrets file and every sealed value in a SQLite database, losing nothing', async () => {
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    dbs.push(db);
    await rotationLosesNothing(db);
  });

  it.skipIf(!pgAvailable())('does the same on PostgreSQL (json and text columns)', async () => {
    const db = await openDb({ dataDir: dir, databaseUrl: await freshPgDatabase() });
    dbs.push(db);
    await rotationLosesNothing(db);
    // jsonb columns are found too.
    const env = loadKeyring(dir, noEnv).envelope;
    await db.run('CREATE TABLE docs (id INTEGER PRIMARY KEY, body JSONB)');
    await db.run('INSERT INTO docs VALUES (1, ?)', [JSON.stringify({ token: env.seal('jsonb-value') })]);
    const r = await rotateMasterKey({ dataDir: dir, db, env: noEnv });
    expect(r.dbValues.find((c) => c.table === 'docs')?.values).toBe(1);
    const row = await db.get<{ body: { token: string } }>('SELECT body FROM docs');
    expect(new Envelope(Buffer.from(readFileSync(path.join(dir, 'master.key'), 'utf8').trim(), 'base64')).open(row!.body.token)).toBe('jsonb-value');
  });

  it('works with no database and an empty store', async () => {
    loadKeyring(dir, noEnv);
    const r = await rotateMasterKey({ dataDir: dir, env: noEnv });
    expect(r.secretsFileValues).toBe(0);
    expect(r.newKeyId).not.toBe(r.oldKeyId);
  });

  it('a database value that cannot be opened aborts everything: nothing changes, nothing is lost', async () => {
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    dbs.push(db);
    const env = loadKeyring(dir, noEnv).envelope;
    await store().set('K', 'file-value');
    const fileBefore = readFileSync(path.join(dir, 'secrets.json'), 'utf8');
    await db.run('CREATE TABLE t (id TEXT PRIMARY KEY, a TEXT, b TEXT)');
    await db.run('INSERT INTO t VALUES (?, ?, ?)', ['1', env.seal('fine'), env.seal('bound', 'some-aad')]);
    const before = await db.all('SELECT * FROM t');
    const err = await rotateMasterKey({ dataDir: dir, db, env: noEnv }).catch((e) => e);
    expect(err.message).toMatch(/table t, column b: .*failed authentication.*without associated data/);
    expect(err.message).not.toMatch(/bound|fine/);
    expect(await db.all('SELECT * FROM t')).toEqual(before);
    expect(readFileSync(path.join(dir, 'secrets.json'), 'utf8')).toBe(fileBefore);
    // The key did not change (master.key still the original; the pending next key is harmless).
    expect(loadKeyring(dir, noEnv).envelope.keyId).toBe(env.keyId);
    expect(await store().get('K')).toBe('file-value');
  });

  it('an interrupted rotation stays readable and is completed by running it again', async () => {
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    dbs.push(db);
    const oldEnv = loadKeyring(dir, noEnv).envelope;
    const expected = Object.keys(await seedDb(db, oldEnv)).sort();
    await store().set('A', 'a-value');
    await store().set('B', 'b-value');
    // Simulate a crash in step 2: prev and next written, some values already re-sealed.
    const oldKey = readFileSync(path.join(dir, 'master.key'), 'utf8');
    const newKey = randomBytes(32);
    writeFileSync(path.join(dir, 'master.key.prev'), oldKey, { mode: 0o600 });
    writeFileSync(path.join(dir, 'master.key.next'), newKey.toString('base64') + '\n', { mode: 0o600 });
    const half = new Envelope(newKey);
    const doc = JSON.parse(readFileSync(path.join(dir, 'secrets.json'), 'utf8'));
    doc.workspaces.default.A = half.seal('a-value', 'A');
    writeFileSync(path.join(dir, 'secrets.json'), JSON.stringify(doc));
    await db.run("UPDATE oauth_tokens SET access_sealed = ? WHERE id = 't1'", [half.seal('access-1')]);

    // Every process still reads everything in this state.
    expect(await store().snapshot()).toEqual(new Map([['A', 'a-value'], ['B', 'b-value']]));
    expect(await openAll(db, loadKeyring(dir, noEnv).envelope)).toEqual(expected);

    const r = await rotateMasterKey({ dataDir: dir, db, env: noEnv });
    expect(r.resumed).toBe(true);
    expect(r.newKeyId).toBe(keyIdOf(newKey));
    expect(existsSync(path.join(dir, 'master.key.next'))).toBe(false);
    expect(existsSync(path.join(dir, 'master.key.prev'))).toBe(false);
    expect(await openAll(db, new Envelope(newKey))).toEqual(expected);
    expect(await store().snapshot()).toEqual(new Map([['A', 'a-value'], ['B', 'b-value']]));
  });

  it('a crash after installing the new key (prev left behind) is finished before the next rotation', async () => {
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    dbs.push(db);
    const oldEnv = loadKeyring(dir, noEnv).envelope;
    const expected = Object.keys(await seedDb(db, oldEnv)).sort();
    // master.key is already the new key, prev the old one, nothing re-sealed yet (worst case).
    const oldKey = readFileSync(path.join(dir, 'master.key'), 'utf8');
    writeFileSync(path.join(dir, 'master.key.prev'), oldKey, { mode: 0o600 });
    writeFileSync(path.join(dir, 'master.key'), randomBytes(32).toString('base64') + '\n', { mode: 0o600 });
    const r = await rotateMasterKey({ dataDir: dir, db, env: noEnv });
    expect(await openAll(db, new Envelope(Buffer.from(readFileSync(path.join(dir, 'master.key'), 'utf8').trim(), 'base64')))).toEqual(expected);
    expect(r.dbValues.reduce((n, c) => n + c.values, 0)).toBeGreaterThanOrEqual(expected.length);
  });

  it('with KEYGATE_MASTER_KEY it requires KEYGATE_NEW_MASTER_KEY and re-seals under it', async () => {
    const oldB64 = randomBytes(32).toString('base64');
    const newB64 = randomBytes(32).toString('base64');
    const envOld = { KEYGATE_MASTER_KEY: oldB64 };
    await store(envOld).set('K', 'env-mode-value');
    await expect(rotateMasterKey({ dataDir: dir, env: envOld })).rejects.toThrow(/KEYGATE_NEW_MASTER_KEY/);
    const r = await rotateMasterKey({ dataDir: dir, env: { ...envOld, KEYGATE_NEW_MASTER_KEY: newB64 } });
    expect(r.source).toBe('env');
    expect(r.secretsFileValues).toBe(1);
    expect(existsSync(path.join(dir, 'master.key'))).toBe(false);
    // While both are set both open; after the switch the new key alone does.
    expect(await store({ ...envOld, KEYGATE_NEW_MASTER_KEY: newB64 }).get('K')).toBe('env-mode-value');
    expect(await store({ KEYGATE_MASTER_KEY: newB64 }).get('K')).toBe('env-mode-value');
    await expect(store(envOld).get('K')).rejects.toThrow(/another master key/);
  });

  it('a concurrent writer during rotation waits, then seals with the new key', async () => {
    await store().set('A', 'a');
    const s = await openSecretStore({ dataDir: dir, env: noEnv });
    const [r] = await Promise.all([rotateMasterKey({ dataDir: dir, env: noEnv }), s.set('B', 'b')]);
    const newOnly = new Envelope(Buffer.from(readFileSync(path.join(dir, 'master.key'), 'utf8').trim(), 'base64'));
    const doc = JSON.parse(readFileSync(path.join(dir, 'secrets.json'), 'utf8'));
    expect(newOnly.open(doc.workspaces.default.A, 'A')).toBe('a');
    expect(newOnly.open(doc.workspaces.default.B, 'B')).toBe('b');
    expect(r.newKeyId).toBe(newOnly.keyId);
  });
});
