import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync, renameSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openDb, type Db } from '../../src/store/db.js';
import { Envelope, SEALED_PATTERN } from '../../src/secrets/envelope.js';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { withFileLock } from '../../src/secrets/lock.js';
import {
  DbSecretStore,
  DirectorySecretStore,
  EncryptedFileSecretStore,
  JsonFileSecretStore,
  ReadOnlyStoreError,
  SecretStoreError,
  migrateSecrets,
  openSecretStore,
} from '../../src/secrets/store.js';

const noEnv: NodeJS.ProcessEnv = {};
let dir: string;

beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-secrets-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

const fileStore = (workspaceId?: string, env: NodeJS.ProcessEnv = noEnv) =>
  new EncryptedFileSecretStore({ file: path.join(dir, 'secrets.json'), workspaceId, keys: () => loadKeyring(dir, env).envelope });

describe('encrypted file store', () => {
  it('round-trips values, lists names sorted, deletes', async () => {
    const s = fileStore();
    await s.set('ZED', 'z-value');
    await s.set('GITHUB_TOKEN', 'ghp_roundtrip_123');
    expect(await s.get('GITHUB_TOKEN')).toBe('ghp_roundtrip_123');
    expect(await s.list()).toEqual(['GITHUB_TOKEN', 'ZED']);
    expect(await s.snapshot()).toEqual(new Map([['GITHUB_TOKEN', 'ghp_roundtrip_123'], ['ZED', 'z-value']]));
    expect(await s.get('MISSING')).toBeUndefined();
    expect(await s.delete('ZED')).toBe(true);
    expect(await s.delete('ZED')).toBe(false);
    expect(await s.list()).toEqual(['GITHUB_TOKEN']);
    // Unicode and overwrite.
    await s.set('GITHUB_TOKEN', 'ünïcødé ✓');
    expect(await s.get('GITHUB_TOKEN')).toBe('ünïcødé ✓');
  });

  it('stores only sealed values, file and key mode 0600, in the documented layout', async () => {
    await fileStore().set('API_KEY', 'plain-text-never-on-disk');
    const file = path.join(dir, 'secrets.json');
    const text = readFileSync(file, 'utf8');
    expect(text).not.toContain('plain-text-never-on-disk');
    const doc = JSON.parse(text);
    expect(doc.version).toBe(1);
    expect(doc.workspaces.default.API_KEY).toMatch(/^kg1\.[0-9a-f]{8}\./);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(statSync(path.join(dir, 'master.key')).mode & 0o777).toBe(0o600);
  });

  it('keeps workspaces apart', async () => {
    await fileStore('ws-a').set('K', 'a');
    await fileStore('ws-b').set('K', 'b');
    expect(await fileStore('ws-a').get('K')).toBe('a');
    expect(await fileStore('ws-b').get('K')).toBe('b');
    expect(await fileStore().list()).toEqual([]);
  });

  it('a wrong master key is a clear error, never garbage', async () => {
    await fileStore().set('K', 'secret-value-1');
    const other = { KEYGATE_MASTER_KEY: randomBytes(32).toString('base64') };
    const err = await fileStore(undefined, other).get('K').catch((e) => e);
    expect(err).toBeInstanceOf(SecretStoreError);
    expect(err.message).toMatch(/another master key/);
    expect(err.message).not.toContain('secret-value-1');
    await expect(fileStore(undefined, other).snapshot()).rejects.toThrow(/another master key/);
    // Names stay listable without the key.
    expect(await fileStore(undefined, other).list()).toEqual(['K']);
  });

  it('refuses to write with a master key that cannot open the existing values', async () => {
    await fileStore().set('K', 'v1');
    const other = { KEYGATE_MASTER_KEY: randomBytes(32).toString('base64') };
    await expect(fileStore(undefined, other).set('NEW', 'v2')).rejects.toThrow(/another master key .*Nothing was written/);
    await expect(fileStore('elsewhere', other).set('NEW', 'v2')).rejects.toThrow(/another master key/);
    expect(await fileStore().list()).toEqual(['K']);
  });

  it('a flipped byte in the ciphertext fails authentication', async () => {
    await fileStore().set('K', 'secret-value-2');
    const file = path.join(dir, 'secrets.json');
    const doc = JSON.parse(readFileSync(file, 'utf8'));
    const sealed: string = doc.workspaces.default.K;
    const parts = sealed.split('.');
    const ct = Buffer.from(parts[3], 'base64url');
    ct[0] ^= 0x01;
    doc.workspaces.default.K = [...parts.slice(0, 3), ct.toString('base64url')].join('.');
    writeFileSync(file, JSON.stringify(doc));
    await expect(fileStore().get('K')).rejects.toThrow(/failed authentication/);
  });

  it('a value moved under another key name fails authentication (aad = key name)', async () => {
    await fileStore().set('A', 'value-of-a');
    const file = path.join(dir, 'secrets.json');
    const doc = JSON.parse(readFileSync(file, 'utf8'));
    doc.workspaces.default.B = doc.workspaces.default.A;
    writeFileSync(file, JSON.stringify(doc));
    await expect(fileStore().get('B')).rejects.toThrow(/failed authentication/);
  });

  it('a damaged file is a clear error that does not echo its content', async () => {
    writeFileSync(path.join(dir, 'secrets.json'), '{"version":1,"workspaces":{"default":{"K":"leaky-plain');
    const err = await fileStore().list().catch((e) => e);
    expect(err.message).toMatch(/not valid JSON/);
    expect(err.message).not.toContain('leaky-plain');
    writeFileSync(path.join(dir, 'secrets.json'), '{"version":2,"workspaces":{}}');
    await expect(fileStore().list()).rejects.toThrow(/unsupported version/);
    // A write refuses to clobber what it cannot read.
    await expect(fileStore().set('K', 'v')).rejects.toThrow(/unsupported version/);
  });

  it('rejects bad names and empty values without echoing the value', async () => {
    await expect(fileStore().set('bad-name', 'v')).rejects.toThrow(/invalid secret name/);
    await expect(fileStore().set('1ABC', 'v')).rejects.toThrow(/invalid secret name/);
    await expect(fileStore().set('K', '')).rejects.toThrow(/empty/);
    await expect(fileStore().get('../etc')).rejects.toThrow(/invalid secret name/);
  });

  it('concurrent writers in one process lose no update (multi-process: see cli.test.ts)', async () => {
    const s = fileStore();
    await Promise.all(Array.from({ length: 30 }, (_, i) => s.set(`K${i}`, `v${i}`)));
    expect((await s.list()).length).toBe(30);
  });
});

describe('lock file', () => {
  it('breaks a lock left by a dead process, waits for a live one', async () => {
    const lock = path.join(dir, 'x.lock');
    // A pid that cannot be alive on this host.
    writeFileSync(lock, `${os.hostname()} 2147483646 deadbeef`);
    expect(await withFileLock(lock, () => 'ran')).toBe('ran');
    expect(existsSync(lock)).toBe(false);
    // Held by this (live) process: a second locker times out with a clear message.
    writeFileSync(lock, `${os.hostname()} ${process.pid} cafebabe`);
    await expect(withFileLock(lock, () => 'never', { timeoutMs: 100 })).rejects.toThrow(/could not lock/);
    // An old lock of a live process on this host is not broken, however old.
    const past0 = new Date(Date.now() - 10 * 60_000);
    (await import('node:fs')).utimesSync(lock, past0, past0);
    await expect(withFileLock(lock, () => 'never', { timeoutMs: 100, staleMs: 1000 })).rejects.toThrow(/could not lock/);
    // An old lock from another host is broken by age.
    writeFileSync(lock, `otherhost 1 0123`);
    const past = new Date(Date.now() - 60_000);
    (await import('node:fs')).utimesSync(lock, past, past);
    expect(await withFileLock(lock, () => 'ran', { staleMs: 30_000 })).toBe('ran');
  });

  it('an empty lock left by a holder killed between creating and writing it is broken, not waited on', async () => {
    // keygate now writes a lock whole (a hard link of a written file), but an older one killed
    // right after O_EXCL left an empty file that every writer waited on for staleMs (30 s): past
    // the 10 s a `secrets set` waits, so writes failed with "could not lock".
    const lock = path.join(dir, 'e.lock');
    writeFileSync(lock, '');
    const fs = await import('node:fs');
    const past = new Date(Date.now() - 5_000);
    fs.utimesSync(lock, past, past);
    expect(await withFileLock(lock, () => 'ran')).toBe('ran');
    // One just created might still be in the middle of being written by such a process: kept.
    writeFileSync(lock, '');
    await expect(withFileLock(lock, () => 'never', { timeoutMs: 100 })).rejects.toThrow(/could not lock/);
  });

  it('a long holder refreshes its lock so another host does not break it', async () => {
    const lock = path.join(dir, 'z.lock');
    const fs = await import('node:fs');
    await withFileLock(
      lock,
      async () => {
        const m0 = fs.statSync(lock).mtimeMs;
        await new Promise((r) => setTimeout(r, 450));
        expect(fs.statSync(lock).mtimeMs).toBeGreaterThan(m0);
      },
      { staleMs: 300 },
    );
  });

  it('serialises critical sections', async () => {
    const lock = path.join(dir, 'y.lock');
    let inside = 0;
    let max = 0;
    await Promise.all(
      Array.from({ length: 8 }, () =>
        withFileLock(lock, async () => {
          inside++;
          max = Math.max(max, inside);
          await new Promise((r) => setTimeout(r, 5));
          inside--;
        }),
      ),
    );
    expect(max).toBe(1);
    // Whole from the moment it exists: what a waiter reads is always `host pid nonce`; and the
    // files it is linked from do not pile up.
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe('plain JSON file store', () => {
  it('reads values, is read-only, re-reads on change', async () => {
    const file = path.join(dir, 's.json');
    writeFileSync(file, JSON.stringify({ B: 'two', A: 'one' }));
    const s = new JsonFileSecretStore(file);
    expect(s.writable).toBe(false);
    expect(await s.list()).toEqual(['A', 'B']);
    expect(await s.get('A')).toBe('one');
    await expect(s.set('A', 'x')).rejects.toBeInstanceOf(ReadOnlyStoreError);
    await expect(s.delete('A')).rejects.toBeInstanceOf(ReadOnlyStoreError);
    writeFileSync(file, JSON.stringify({ A: 'uno' }));
    expect(await s.get('A')).toBe('uno');
    expect(await s.get('B')).toBeUndefined();
  });

  it('errors name the file and key, never the value', async () => {
    const file = path.join(dir, 's.json');
    writeFileSync(file, '{"A": "sekrit-json-value" ');
    const e1 = await new JsonFileSecretStore(file).snapshot().catch((e) => e);
    expect(e1.message).toMatch(/not valid JSON/);
    expect(e1.message).not.toContain('sekrit');
    writeFileSync(file, JSON.stringify({ A: 5 }));
    await expect(new JsonFileSecretStore(file).snapshot()).rejects.toThrow(/value of A must be a string/);
    writeFileSync(file, JSON.stringify({ 'not-valid': 'x' }));
    await expect(new JsonFileSecretStore(file).snapshot()).rejects.toThrow(/invalid secret name/);
    await expect(new JsonFileSecretStore(path.join(dir, 'nope.json')).snapshot()).rejects.toThrow(/ENOENT/);
  });
});

describe('directory store', () => {
  it('reads one file per key, trims one trailing newline, skips dotfiles and invalid names', async () => {
    const d = path.join(dir, 'plain');
    mkdirSync(d);
    writeFileSync(path.join(d, 'TOKEN'), 'abc\n');
    writeFileSync(path.join(d, 'TWO_NL'), 'abc\n\n');
    writeFileSync(path.join(d, 'CRLF'), 'x\r\n');
    writeFileSync(path.join(d, '.hidden'), 'no');
    writeFileSync(path.join(d, 'tls.crt'), 'not a key name');
    // A directory under a name that is not a key is skipped too (one under a key name is an
    // error: fail-closed.test.ts).
    mkdirSync(path.join(d, 'sub.d'));
    const s = new DirectorySecretStore(d);
    expect(await s.snapshot()).toEqual(new Map([['CRLF', 'x'], ['TOKEN', 'abc'], ['TWO_NL', 'abc\n']]));
    await expect(s.set('TOKEN', 'x')).rejects.toBeInstanceOf(ReadOnlyStoreError);
  });

  it('follows the Kubernetes ..data symlink layout and sees an atomic update', async () => {
    // Exactly what the kubelet writes: ..2024_01/<files>, ..data -> ..2024_01, KEY -> ..data/KEY.
    const d = path.join(dir, 'k8s');
    mkdirSync(path.join(d, '..2024_01'), { recursive: true });
    writeFileSync(path.join(d, '..2024_01', 'GITHUB_TOKEN'), 'old-token\n');
    writeFileSync(path.join(d, '..2024_01', 'OTHER'), 'other');
    symlinkSync('..2024_01', path.join(d, '..data'));
    symlinkSync('..data/GITHUB_TOKEN', path.join(d, 'GITHUB_TOKEN'));
    symlinkSync('..data/OTHER', path.join(d, 'OTHER'));
    const s = new DirectorySecretStore(d);
    expect(await s.snapshot()).toEqual(new Map([['GITHUB_TOKEN', 'old-token'], ['OTHER', 'other']]));
    // Update: new timestamped dir, swap ..data atomically (rename of a temp symlink).
    mkdirSync(path.join(d, '..2024_02'));
    writeFileSync(path.join(d, '..2024_02', 'GITHUB_TOKEN'), 'new-token\n');
    writeFileSync(path.join(d, '..2024_02', 'OTHER'), 'other2');
    symlinkSync('..2024_02', path.join(d, '..data_tmp'));
    renameSync(path.join(d, '..data_tmp'), path.join(d, '..data'));
    rmSync(path.join(d, '..2024_01'), { recursive: true });
    expect(await s.get('GITHUB_TOKEN')).toBe('new-token');
    expect(await s.list()).toEqual(['GITHUB_TOKEN', 'OTHER']);
  });
});

describe('database store', () => {
  let db: Db;
  afterEach(async () => {
    await db?.close();
  });

  it('round-trips on SQLite with values sealed without aad', async () => {
    db = await openDb({ dataDir: dir, databaseUrl: '' });
    await migrateSecrets(db);
    const env = new Envelope(randomBytes(32));
    const s = new DbSecretStore({ db, workspaceId: 'ws1', keys: env });
    await s.set('B', 'bee');
    await s.set('A', 'ay');
    await s.set('A', 'ay2');
    expect(await s.list()).toEqual(['A', 'B']);
    expect(await s.get('A')).toBe('ay2');
    expect(await new DbSecretStore({ db, workspaceId: 'ws2', keys: env }).list()).toEqual([]);
    const row = await db.get<{ value_sealed: string }>("SELECT value_sealed FROM workspace_secrets WHERE key = 'A'");
    expect(row!.value_sealed).toMatch(SEALED_PATTERN);
    expect(env.open(row!.value_sealed)).toBe('ay2');
    expect(await s.delete('B')).toBe(true);
    expect(await s.snapshot()).toEqual(new Map([['A', 'ay2']]));
    await expect(new DbSecretStore({ db, workspaceId: 'ws1', keys: new Envelope(randomBytes(32)) }).get('A')).rejects.toThrow(/another master key/);
  });
});

describe('openSecretStore', () => {
  it('chooses by flag, then environment, then database, else the encrypted file', async () => {
    const json = path.join(dir, 's.json');
    writeFileSync(json, '{}');
    const sdir = path.join(dir, 'sd');
    mkdirSync(sdir);
    expect(await openSecretStore({ dataDir: dir, secretsFile: json, env: noEnv })).toBeInstanceOf(JsonFileSecretStore);
    expect(await openSecretStore({ dataDir: dir, secretsDir: sdir, env: noEnv })).toBeInstanceOf(DirectorySecretStore);
    expect(await openSecretStore({ dataDir: dir, env: { KEYGATE_SECRETS_FILE: json } })).toBeInstanceOf(JsonFileSecretStore);
    expect(await openSecretStore({ dataDir: dir, env: { KEYGATE_SECRETS_DIR: sdir } })).toBeInstanceOf(DirectorySecretStore);
    await expect(openSecretStore({ dataDir: dir, secretsFile: json, secretsDir: sdir, env: noEnv })).rejects.toThrow(/not both/);
    const enc = await openSecretStore({ dataDir: dir, env: noEnv, workspaceId: 'w' });
    expect(enc).toBeInstanceOf(EncryptedFileSecretStore);
    expect(enc.description).toContain(path.join(dir, 'secrets.json'));
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    try {
      const s = await openSecretStore({ dataDir: dir, env: noEnv, db });
      expect(s).toBeInstanceOf(DbSecretStore);
      await s.set('K', 'v');
      expect(await s.get('K')).toBe('v');
    } finally {
      await db.close();
    }
    await expect(openSecretStore({ dataDir: dir, env: { KEYGATE_MASTER_KEY: 'dG9vIHNob3J0' } })).rejects.toThrow(/32 bytes/);
  });
});
