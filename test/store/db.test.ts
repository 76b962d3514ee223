import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { migrate, nowIso, openDb, type Db } from '../../src/store/db.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const MIGRATIONS = [
  `CREATE TABLE items (id TEXT PRIMARY KEY, n INTEGER NOT NULL, doc TEXT, created_at TEXT NOT NULL);
   CREATE INDEX items_n ON items (n)`,
  `ALTER TABLE items ADD COLUMN flag INTEGER NOT NULL DEFAULT 0`,
];

// The same behaviour is required of both backends, so one suite runs against each.
function suite(name: string, open: () => Promise<Db>) {
  describe(name, () => {
    it('migrates once, idempotently, and records steps per namespace', async () => {
      const db = await open();
      try {
        await migrate(db, 'items', MIGRATIONS);
        await migrate(db, 'items', MIGRATIONS);
        const steps = await db.all<{ step: number }>('SELECT step FROM schema_migrations WHERE namespace = ? ORDER BY step', ['items']);
        expect(steps.map((s) => Number(s.step))).toEqual([0, 1]);
      } finally {
        await db.close();
      }
    });

    it('runs parameterised statements with ? placeholders, including a literal ? inside quotes', async () => {
      const db = await open();
      try {
        await migrate(db, 'items', MIGRATIONS);
        await db.run('INSERT INTO items (id, n, doc, created_at, flag) VALUES (?, ?, ?, ?, ?)', ['a', 1, '{"q":"?"}', nowIso(), true]);
        const row = await db.get<{ id: string; n: number; doc: string; flag: number; lit: string }>("SELECT id, n, doc, flag, '?' AS lit FROM items WHERE id = ?", ['a']);
        expect(row).toMatchObject({ id: 'a', n: 1, doc: '{"q":"?"}', lit: '?' });
        expect(Number(row!.flag)).toBe(1);
        expect((await db.run('UPDATE items SET n = n + 1 WHERE id = ?', ['a'])).changes).toBe(1);
        expect(await db.get('SELECT id FROM items WHERE id = ?', ['missing'])).toBeUndefined();
      } finally {
        await db.close();
      }
    });

    it('commits a transaction as a whole and rolls it back as a whole', async () => {
      const db = await open();
      try {
        await migrate(db, 'items', MIGRATIONS);
        await db.tx(async (tx) => {
          await tx.run('INSERT INTO items (id, n, created_at) VALUES (?, ?, ?)', ['t1', 1, nowIso()]);
          await tx.run('INSERT INTO items (id, n, created_at) VALUES (?, ?, ?)', ['t2', 2, nowIso()]);
        });
        await expect(
          db.tx(async (tx) => {
            await tx.run('INSERT INTO items (id, n, created_at) VALUES (?, ?, ?)', ['t3', 3, nowIso()]);
            throw new Error('boom');
          }),
        ).rejects.toThrow('boom');
        const ids = (await db.all<{ id: string }>("SELECT id FROM items WHERE id LIKE 't%' ORDER BY id")).map((r) => r.id);
        expect(ids).toEqual(['t1', 't2']);
      } finally {
        await db.close();
      }
    });

    it('keeps concurrent statements out of a running transaction', async () => {
      const db = await open();
      try {
        await migrate(db, 'items', MIGRATIONS);
        let release!: () => void;
        const gate = new Promise<void>((r) => (release = r));
        const txDone = db
          .tx(async (tx) => {
            await tx.run('INSERT INTO items (id, n, created_at) VALUES (?, ?, ?)', ['c1', 1, nowIso()]);
            await gate;
            throw new Error('rollback');
          })
          .catch(() => 'rolled back');
        // A statement issued while the transaction is open must not become part of it.
        const outside = db.run('INSERT INTO items (id, n, created_at) VALUES (?, ?, ?)', ['c2', 2, nowIso()]);
        release();
        expect(await txDone).toBe('rolled back');
        await outside;
        const ids = (await db.all<{ id: string }>("SELECT id FROM items WHERE id LIKE 'c%' ORDER BY id")).map((r) => r.id);
        expect(ids).toEqual(['c2']);
      } finally {
        await db.close();
      }
    });
  });
}

suite('SQLite', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-db-'));
  dirs.push(dir);
  return openDb({ dataDir: dir, databaseUrl: '' });
});

describe('the SQLite file', () => {
  const modeOf = (f: string) => statSync(f).mode & 0o777;

  it('is readable by its owner only, with its journals, in a data directory others may read', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-db-'));
    dirs.push(dir);
    chmodSync(dir, 0o755); // an operator's directory or a volume
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    try {
      await migrate(db, 'items', MIGRATIONS);
      await db.run('INSERT INTO items (id, n, created_at) VALUES (?, ?, ?)', ['a', 1, nowIso()]);
      const file = path.join(dir, 'keygate.db');
      for (const f of [file, `${file}-wal`, `${file}-shm`]) expect([f, modeOf(f)]).toEqual([f, 0o600]);
    } finally {
      await db.close();
    }
  });

  it('an existing file others could read is made owner-only when opened', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-db-'));
    dirs.push(dir);
    const first = await openDb({ dataDir: dir, databaseUrl: '' });
    await migrate(first, 'items', MIGRATIONS);
    await first.close();
    const file = path.join(dir, 'keygate.db');
    chmodSync(file, 0o644);
    writeFileSync(`${file}-wal`, '');
    chmodSync(`${file}-wal`, 0o664);
    const again = await openDb({ dataDir: dir, databaseUrl: '' });
    try {
      expect(modeOf(file)).toBe(0o600);
      expect(modeOf(`${file}-wal`)).toBe(0o600);
      expect((await again.all('SELECT step FROM schema_migrations WHERE namespace = ?', ['items'])).length).toBe(2);
    } finally {
      await again.close();
    }
  });
});

describe.skipIf(!pgAvailable())('PostgreSQL backend', () => {
  suite('PostgreSQL', async () => openDb({ dataDir: os.tmpdir(), databaseUrl: await freshPgDatabase() }));
});
