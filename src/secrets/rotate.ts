import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, renameSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import type { Db } from '../store/db.js';
import { Envelope, EnvelopeError, MASTER_KEY_FILE, SEALED_PATTERN, keyIdOf, parseMasterKey, removeLeftoverTemps, writeFileAtomic } from './envelope.js';
import { lockFileFor, readSecretsDoc, secretsFilePath, writeSecretsDoc, type SecretsDoc } from './file-store.js';
import { NEXT_KEY_FILE, PREV_KEY_FILE } from './keyring.js';
import { withFileLock } from './lock.js';
import { SecretStoreError } from './types.js';

/**
 * `keygate secrets rotate-key`: every sealed value keygate stores is re-sealed under a new master
 * key, and no value is lost whatever point the process dies at.
 *
 * Key file mode (`<data>/master.key`):
 *   1. keep the current key as `master.key.prev`, write the new key to `master.key.next`
 *      (both atomically) before anything is sealed with it; every process opens with both;
 *   2. re-seal the database (one transaction) and the secrets file (written inside that
 *      transaction, so a failure of either rolls the database back);
 *   3. rename `master.key.next` over `master.key`, check nothing under the old key is left (a
 *      writer that still held the old key), then delete `master.key.prev`.
 *   A rotation interrupted before step 3 is completed by running the command again: it picks up
 *   the same `master.key.next`.
 * Environment mode (`KEYGATE_MASTER_KEY`): keygate cannot change the variable, so the operator
 * supplies the new key in `KEYGATE_NEW_MASTER_KEY`, keygate re-seals everything with it, and the
 * operator then moves it into `KEYGATE_MASTER_KEY`. While both are set, both open.
 *
 * The secrets file is locked for the whole rotation, so a concurrent `secrets set` waits and then
 * seals with the new key. Running servers keep the key they loaded: restart them afterwards.
 */

export interface RotateOptions {
  dataDir: string;
  /** The server database to re-seal (SQLite `<data>/keygate.db` or PostgreSQL); omit when there is none. */
  db?: Db;
  env?: NodeJS.ProcessEnv;
}

export interface ColumnReport {
  table: string;
  column: string;
  values: number;
}

export interface RotateReport {
  source: 'file' | 'env';
  oldKeyId: string;
  newKeyId: string;
  /** True when this run completed a rotation that an earlier run had started. */
  resumed: boolean;
  secretsFileValues: number;
  dbValues: ColumnReport[];
}

type Resealer = (sealed: string, aad?: string) => string;

function makeResealer(envelope: Envelope): Resealer {
  return (sealed, aad = '') => (sealed.split('.')[1] === envelope.keyId ? sealed : envelope.seal(envelope.open(sealed, aad), aad));
}

/** Re-seals every value of the secrets document (aad = key name). Returns how many changed. */
function resealDoc(doc: SecretsDoc, reseal: Resealer, file: string): number {
  let n = 0;
  for (const [ws, entries] of Object.entries(doc.workspaces)) {
    for (const [key, sealed] of Object.entries(entries)) {
      let next: string;
      try {
        next = reseal(sealed, key);
      } catch (err) {
        if (err instanceof EnvelopeError) throw new SecretStoreError(`secret ${key} of workspace ${ws} in ${file}: ${err.message}; nothing was changed`);
        throw err;
      }
      if (next !== sealed) {
        entries[key] = next;
        n++;
      }
    }
  }
  return n;
}

const quoteIdent = (name: string) => `"${name.replace(/"/g, '""')}"`;

interface TableShape {
  table: string;
  columns: string[];
  /** Columns identifying a row, or a pseudo column (`rowid`, `ctid`). */
  key: string[];
}

async function tableShapes(db: Db): Promise<TableShape[]> {
  const shapes: TableShape[] = [];
  if (db.kind === 'sqlite') {
    const tables = await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name");
    for (const { name } of tables) {
      const cols = await db.all<{ name: string; pk: number }>(`PRAGMA table_info(${quoteIdent(name)})`);
      const pk = cols.filter((c) => c.pk > 0).sort((a, b) => a.pk - b.pk).map((c) => c.name);
      // Every column: SQLite's affinity does not stop a TEXT value from living in any of them.
      shapes.push({ table: name, columns: cols.map((c) => c.name), key: pk.length ? pk : ['rowid'] });
    }
  } else {
    const cols = await db.all<{ table_name: string; column_name: string; data_type: string }>(
      `SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c
       JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
       WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
         AND c.data_type IN ('text', 'character varying', 'character', 'json', 'jsonb')
       ORDER BY c.table_name, c.ordinal_position`,
    );
    const byTable = new Map<string, string[]>();
    for (const c of cols) byTable.set(c.table_name, [...(byTable.get(c.table_name) ?? []), c.column_name]);
    // ctid identifies the row inside this transaction; all of a row's columns change in one UPDATE.
    for (const [table, columns] of byTable) shapes.push({ table, columns, key: ['ctid'] });
  }
  return shapes;
}

/** Re-seals every sealed value found in any text column of any table, inside the caller's transaction. */
export async function resealDatabase(tx: Db, reseal: Resealer): Promise<ColumnReport[]> {
  const report: ColumnReport[] = [];
  for (const shape of await tableShapes(tx)) {
    if (shape.table === 'schema_migrations' || shape.columns.length === 0) continue;
    const cast = (c: string) => (tx.kind === 'postgres' ? `${quoteIdent(c)}::text` : quoteIdent(c));
    const where = shape.columns.map((c) => `${cast(c)} LIKE '%kg1.%'`).join(' OR ');
    const keySel = shape.key.map((k, i) => (k === 'ctid' ? `ctid::text AS "__k${i}"` : `${quoteIdent(k)} AS "__k${i}"`)).join(', ');
    const colSel = shape.columns.map((c) => `${cast(c)} AS ${quoteIdent(c)}`).join(', ');
    const rows = await tx.all<Record<string, unknown>>(`SELECT ${keySel}, ${colSel} FROM ${quoteIdent(shape.table)} WHERE ${where}`);
    const counts = new Map<string, number>();
    for (const row of rows) {
      const changed: [string, string][] = [];
      for (const column of shape.columns) {
        const value = row[column];
        if (typeof value !== 'string' || !value.includes('kg1.')) continue;
        let n = 0;
        let next: string;
        try {
          next = value.replace(SEALED_PATTERN, (sealed) => {
            const out = reseal(sealed);
            if (out !== sealed) n++;
            return out;
          });
        } catch (err) {
          if (err instanceof EnvelopeError) {
            throw new SecretStoreError(`table ${shape.table}, column ${column}: ${err.message} (database values must be sealed without associated data); nothing was changed`);
          }
          throw err;
        }
        if (n > 0) {
          changed.push([column, next]);
          counts.set(column, (counts.get(column) ?? 0) + n);
        }
      }
      if (changed.length === 0) continue;
      const set = changed.map(([c]) => `${quoteIdent(c)} = ?`).join(', ');
      const match = shape.key.map((k, i) => (k === 'ctid' ? 'ctid = ?::tid' : `${quoteIdent(k)} = ?`)).join(' AND ');
      const { changes } = await tx.run(`UPDATE ${quoteIdent(shape.table)} SET ${set} WHERE ${match}`, [...changed.map(([, v]) => v), ...shape.key.map((_, i) => row[`__k${i}`])]);
      if (changes !== 1) throw new SecretStoreError(`table ${shape.table}: could not update a row while re-sealing (${changes} rows matched); nothing was changed`);
    }
    for (const [column, values] of counts) report.push({ table: shape.table, column, values });
  }
  return report;
}

/** Re-seals the database and the secrets file; the file is written inside the transaction. */
async function resealEverything(dataDir: string, db: Db | undefined, envelope: Envelope): Promise<{ fileValues: number; dbValues: ColumnReport[] }> {
  const reseal = makeResealer(envelope);
  const file = secretsFilePath(dataDir);
  const doc = readSecretsDoc(file);
  const fileValues = resealDoc(doc, reseal, file);
  const writeFile = () => {
    if (fileValues > 0) writeSecretsDoc(file, doc);
  };
  if (!db) {
    writeFile();
    return { fileValues, dbValues: [] };
  }
  const dbValues = await db.tx(async (tx) => {
    const report = await resealDatabase(tx, reseal);
    writeFile();
    return report;
  });
  return { fileValues, dbValues };
}

function readKey(file: string): Buffer {
  return parseMasterKey(readFileSync(file, 'utf8'), file);
}

function keyText(key: Buffer): string {
  return key.toString('base64') + '\n';
}

export async function rotateMasterKey(opts: RotateOptions): Promise<RotateReport> {
  const env = opts.env ?? process.env;
  const { dataDir } = opts;
  const secretsLock = lockFileFor(secretsFilePath(dataDir));
  // Long enough for a large database; the lock is never considered stale while we hold it
  // because our pid is alive.
  return withFileLock(secretsLock, async () => {
    if (env.KEYGATE_MASTER_KEY) {
      const oldKey = parseMasterKey(env.KEYGATE_MASTER_KEY);
      if (!env.KEYGATE_NEW_MASTER_KEY) {
        throw new SecretStoreError('the master key comes from KEYGATE_MASTER_KEY: put a new key in KEYGATE_NEW_MASTER_KEY (32 random bytes, base64, e.g. `openssl rand -base64 32`) and run rotate-key again');
      }
      const newKey = parseMasterKey(env.KEYGATE_NEW_MASTER_KEY, 'KEYGATE_NEW_MASTER_KEY');
      const older = [oldKey, ...[PREV_KEY_FILE, NEXT_KEY_FILE, MASTER_KEY_FILE].map((f) => path.join(dataDir, f)).filter(existsSync).map(readKey)];
      const envelope = new Envelope(newKey, older.filter((k) => !k.equals(newKey)));
      const { fileValues, dbValues } = await resealEverything(dataDir, opts.db, envelope);
      return { source: 'env', oldKeyId: keyIdOf(oldKey), newKeyId: keyIdOf(newKey), resumed: oldKey.equals(newKey), secretsFileValues: fileValues, dbValues };
    }

    const masterFile = path.join(dataDir, MASTER_KEY_FILE);
    const prevFile = path.join(dataDir, PREV_KEY_FILE);
    const nextFile = path.join(dataDir, NEXT_KEY_FILE);
    if (!existsSync(masterFile)) {
      if (!existsSync(nextFile)) throw new SecretStoreError(`there is no master key in ${dataDir} yet: nothing to rotate`);
      // Died between the rename in step 3... cannot happen (rename is atomic); a missing
      // master.key with a next key means someone deleted it: refuse rather than guess.
      throw new SecretStoreError(`${masterFile} is missing but ${nextFile} exists; restore the master key before rotating`);
    }
    const oldKey = readKey(masterFile);
    const resumed = existsSync(nextFile);
    const prevKey = existsSync(prevFile) ? readKey(prevFile) : undefined;
    let carried = { fileValues: 0, dbValues: [] as ColumnReport[] };
    if (prevKey && !prevKey.equals(oldKey)) {
      // An earlier rotation died after installing its key but before its final check: finish
      // it (values may still be sealed with the key in `prev`) before `prev` is reused.
      if (resumed) throw new SecretStoreError(`${prevFile} and ${nextFile} both exist and do not belong to one rotation; restore a backup of the data directory`);
      carried = await resealEverything(dataDir, opts.db, new Envelope(oldKey, [prevKey]));
      unlinkSync(prevFile);
    }
    const newKey = resumed ? readKey(nextFile) : randomBytes(32);
    // Step 1. `prev` is only needed after the rename, but writing it first means every key that
    // may have sealed something is on disk before any value changes.
    writeFileAtomic(prevFile, keyText(oldKey), 0o600);
    if (!resumed) writeFileAtomic(nextFile, keyText(newKey), 0o600);
    const envelope = new Envelope(newKey, [oldKey]);

    // Step 2.
    const { fileValues, dbValues } = await resealEverything(dataDir, opts.db, envelope);

    // Step 3.
    renameSync(nextFile, masterFile);
    const late = await resealEverything(dataDir, opts.db, envelope);
    for (const c of [...carried.dbValues, ...late.dbValues]) {
      const same = dbValues.find((d) => d.table === c.table && d.column === c.column);
      if (same) same.values += c.values;
      else dbValues.push(c);
    }
    unlinkSync(prevFile);
    // A rotation killed while writing a key file left a copy of it beside: the retired key must
    // not outlive the rotation there either.
    for (const f of [masterFile, prevFile, nextFile]) removeLeftoverTemps(f, false);
    return { source: 'file', oldKeyId: keyIdOf(oldKey), newKeyId: keyIdOf(newKey), resumed, secretsFileValues: carried.fileValues + fileValues + late.fileValues, dbValues };
  }, { timeoutMs: 30_000, staleMs: 10 * 60_000 });
}
