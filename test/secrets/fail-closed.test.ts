// Fail closed: a store that cannot be read as a whole, or whose key is gone, is a clear error
// naming the file or the entry, never an empty or partial store silently used, and never the value.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { DbSecretStore, DirectorySecretStore, JsonFileSecretStore, MAX_SECRET_BYTES, SecretStoreError, migrateSecrets, openSecretStore } from '../../src/secrets/store.js';
import { openDb, type Db } from '../../src/store/db.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-failclosed-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

async function failure(p: Promise<unknown>): Promise<Error> {
  const err = await p.then(
    () => undefined,
    (e: Error) => e,
  );
  if (!err) throw new Error('expected the store to fail, it answered');
  return err;
}

describe('directory store (mounted secrets)', () => {
  const VALUE = 'mounted-value-7f3a9c';
  const mount = () => {
    const d = path.join(dir, 'mnt');
    mkdirSync(d);
    writeFileSync(path.join(d, 'GOOD'), `${VALUE}\n`);
    return d;
  };

  it('a key entry that is a symbolic link out of the directory is an error, not followed', async () => {
    const d = mount();
    writeFileSync(path.join(dir, 'elsewhere'), 'outside-value-0b1d');
    symlinkSync(path.join(dir, 'elsewhere'), path.join(d, 'STOLEN'));
    const err = await failure(new DirectorySecretStore(d).snapshot());
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/STOLEN/);
    expect(err.message).toMatch(/outside/);
    expect(err.message).not.toContain('outside-value');
    expect(err.message).not.toContain(VALUE);
    // get() answers from the same snapshot: no partial store either.
    await expect(new DirectorySecretStore(d).get('GOOD')).rejects.toBeInstanceOf(SecretStoreError);
  });

  it('a ..data link pointing out of the directory is an error', async () => {
    const d = mount();
    const other = path.join(dir, 'other');
    mkdirSync(other);
    writeFileSync(path.join(other, 'GOOD'), 'other-value');
    symlinkSync(other, path.join(d, '..data'));
    const err = await failure(new DirectorySecretStore(d).snapshot());
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/\.\.data/);
    expect(err.message).not.toContain('other-value');
  });

  it('a key entry that is a directory or a FIFO is an error naming it', async () => {
    const d = mount();
    mkdirSync(path.join(d, 'API_TOKEN'));
    const err = await failure(new DirectorySecretStore(d).snapshot());
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/API_TOKEN/);
    expect(err.message).toMatch(/not a regular file/);
    rmSync(path.join(d, 'API_TOKEN'), { recursive: true });
    execFileSync('mkfifo', [path.join(d, 'PIPE')]);
    await expect(new DirectorySecretStore(d).snapshot()).rejects.toThrow(/PIPE.*not a regular file/);
  });

  it('a value larger than a secret may be is an error, not read into memory whole', async () => {
    const d = mount();
    writeFileSync(path.join(d, 'HUGE'), Buffer.alloc(MAX_SECRET_BYTES + 10, 0x41));
    const err = await failure(new DirectorySecretStore(d).snapshot());
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/HUGE.*larger than/);
    expect(err.message).not.toContain('AAAA');
    // Exactly the limit, plus the one newline a file usually ends with, is fine.
    writeFileSync(path.join(d, 'HUGE'), Buffer.concat([Buffer.alloc(MAX_SECRET_BYTES, 0x41), Buffer.from('\n')]));
    expect((await new DirectorySecretStore(d).snapshot()).get('HUGE')).toHaveLength(MAX_SECRET_BYTES);
  });

  it('links inside the directory (the Kubernetes layout) still work', async () => {
    const d = mount();
    mkdirSync(path.join(d, '..2024_01'));
    writeFileSync(path.join(d, '..2024_01', 'OTHER'), 'inside\n');
    symlinkSync('..2024_01/OTHER', path.join(d, 'OTHER'));
    expect(await new DirectorySecretStore(d).snapshot()).toEqual(
      new Map([
        ['GOOD', VALUE],
        ['OTHER', 'inside'],
      ]),
    );
  });
});

describe('plain JSON file store', () => {
  it('a value larger than a secret may be is an error naming the key', async () => {
    const file = path.join(dir, 's.json');
    writeFileSync(file, JSON.stringify({ OK: 'fine', BIG: 'B'.repeat(MAX_SECRET_BYTES + 1) }));
    const err = await failure(new JsonFileSecretStore(file).snapshot());
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/BIG.*larger than/);
  });
});

describe('a missing master key', () => {
  const VALUE = 'sealed-before-the-key-went-7c1e';

  it('is an error when the secrets file holds values, and no new key is made over them', async () => {
    const s = await openSecretStore({ dataDir: dir, env: {} });
    await s.set('TOKEN', VALUE);
    const keyFile = path.join(dir, 'master.key');
    rmSync(keyFile);
    const err = await failure(openSecretStore({ dataDir: dir, env: {} }));
    expect(err.message).toMatch(/master\.key/);
    expect(err.message).toMatch(/missing/);
    expect(err.message).not.toContain(VALUE);
    expect(existsSync(keyFile)).toBe(false);
    // Every other reader of the key refuses the same way.
    expect(() => loadKeyring(dir, {})).toThrow(/missing/);
    expect(existsSync(keyFile)).toBe(false);
  });

  it('is an error while a rotation left a key file behind', async () => {
    await (await openSecretStore({ dataDir: dir, env: {} })).set('TOKEN', VALUE);
    writeFileSync(path.join(dir, 'master.key.next'), randomBytes(32).toString('base64') + '\n');
    writeFileSync(path.join(dir, 'secrets.json'), '{"version":1,"workspaces":{}}\n');
    rmSync(path.join(dir, 'master.key'));
    expect(() => loadKeyring(dir, {})).toThrow(/missing/);
    expect(existsSync(path.join(dir, 'master.key'))).toBe(false);
  });

  it('a first start with an empty secrets file still creates the key', async () => {
    writeFileSync(path.join(dir, 'secrets.json'), '{"version":1,"workspaces":{}}\n');
    const s = await openSecretStore({ dataDir: dir, env: {} });
    await s.set('A', 'a');
    expect(await s.get('A')).toBe('a');
    expect(readFileSync(path.join(dir, 'master.key'), 'utf8')).toMatch(/^[A-Za-z0-9+/=]{44}\n$/);
  });
});

describe('database store with a different master key', () => {
  let db: Db | undefined;
  afterEach(async () => {
    await db?.close();
    db = undefined;
  });

  const refusesMixedKeys = async (open: () => Promise<Db>) => {
    db = await open();
    await migrateSecrets(db);
    const keysA = { KEYGATE_MASTER_KEY: randomBytes(32).toString('base64') };
    const keysB = { KEYGATE_MASTER_KEY: randomBytes(32).toString('base64') };
    await new DbSecretStore({ db, workspaceId: 'ws1', keys: () => loadKeyring(dir, keysA).envelope }).set('A', 'first-value');
    // Another workspace, another key: a write under B would leave the table under two keys, which
    // no key can then open whole (and rotate-key refuses forever).
    const other = new DbSecretStore({ db, workspaceId: 'ws2', keys: () => loadKeyring(dir, keysB).envelope });
    const err = await failure(other.set('B', 'second-value'));
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/another master key/);
    expect(err.message).not.toContain('second-value');
    expect(await other.list()).toEqual([]);
    // The right key still writes.
    await new DbSecretStore({ db, workspaceId: 'ws2', keys: () => loadKeyring(dir, keysA).envelope }).set('B', 'second-value');
  };

  it('refuses to write on SQLite', async () => {
    await refusesMixedKeys(() => openDb({ dataDir: dir, databaseUrl: '' }));
  });

  it.skipIf(!pgAvailable())('refuses to write on PostgreSQL', async () => {
    const url = await freshPgDatabase();
    await refusesMixedKeys(() => openDb({ dataDir: dir, databaseUrl: url }));
  });
});
