import type { Statement } from 'better-sqlite3';
import { AsyncLocalStorage } from 'node:async_hooks';
import { chmodSync, closeSync, mkdirSync, openSync, statSync } from '../builtins/fs.js';
import path from 'node:path';
import { CliError } from '../command-error.js';

/**
 * The database keygate's servers share: an embedded SQLite file by default, PostgreSQL when
 * `DATABASE_URL` is set. Callers write portable SQL with `?` placeholders (rewritten to `$n` for
 * PostgreSQL) and portable types: TEXT (ids, ISO-8601 timestamps, JSON documents, sealed values),
 * INTEGER/BIGINT, booleans as INTEGER 0/1. Timestamps are produced by the application (`nowIso()`),
 * never by the database, so both backends order and compare them the same way.
 */
export interface Db {
  readonly kind: 'sqlite' | 'postgres';
  all<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<T[]>;
  get<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<T | undefined>;
  run(sql: string, params?: unknown[]): Promise<{ changes: number }>;
  /** Runs `fn` in one transaction; it commits when `fn` resolves, rolls back when it throws. */
  tx<T>(fn: (db: Db) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

export interface OpenDbOptions {
  /** Directory for the SQLite file (`keygate.db`) when no database URL is given. */
  dataDir: string;
  /** `postgres://...`; defaults to `DATABASE_URL`. */
  databaseUrl?: string;
  /**
   * Told when PostgreSQL ends a pooled connection that was idle (a restart, an administrator,
   * idle_session_timeout): the pool drops it and the next query opens a new one. A line for the
   * operator; the server's message names no password.
   */
  onConnectionLost?: (reason: string) => void;
}

export function nowIso(): string {
  return new Date().toISOString();
}

export async function openDb(opts: OpenDbOptions): Promise<Db> {
  const url = opts.databaseUrl ?? process.env.DATABASE_URL;
  if (url) return openPostgres(url, opts.onConnectionLost);
  mkdirSync(opts.dataDir, { recursive: true, mode: 0o700 });
  return openSqlite(path.join(opts.dataDir, 'keygate.db'));
}

// ---------------------------------------------------------------------------------------------
// SQLite (better-sqlite3): synchronous, one connection. Async transactions are serialised with a
// lock so that statements from other requests never land inside someone else's transaction.

/** Booleans are stored as INTEGER 0/1 and `undefined` as NULL on both backends. */
function bindParams(p: unknown[] = []): unknown[] {
  return p.map((v) => (typeof v === 'boolean' ? (v ? 1 : 0) : v === undefined ? null : v));
}

class Mutex {
  private tail: Promise<void> = Promise.resolve();
  lock(): Promise<() => void> {
    let release!: () => void;
    const next = new Promise<void>((r) => (release = r));
    const prev = this.tail;
    this.tail = prev.then(() => next);
    return prev.then(() => release);
  }
}

/**
 * The SQLite driver for this Node. better-sqlite3 12 wraps its objects with Node's internal
 * ObjectWrap, and on Node 24 its statement destructor aborts the process the first time the
 * garbage collector frees a statement (node::RemoveEnvironmentCleanupHook: `(env) != nullptr`).
 * better-sqlite3 13 uses Node-API instead and ships prebuilt binaries, but needs Node >= 22 (it
 * crashes on Node 20). Both are installed (13 under the alias better-sqlite3-napi), with the same
 * API; each Node loads the one that works on it.
 */
async function sqliteDriver(): Promise<typeof import('better-sqlite3')> {
  if (Number(process.versions.node.split('.')[0]) >= 22) return (await import('better-sqlite3-napi')).default;
  return (await import('better-sqlite3')).default;
}

/**
 * The database holds sealed secrets and tokens, API key hashes and every workspace's records:
 * readable by keygate's user only, whatever the data directory's own mode (an operator's
 * directory or a volume may be 0755). A new file is created 0600 before SQLite opens it (SQLite
 * gives its -wal and -shm files the database file's mode); an existing file, and journals left by
 * an earlier run, lose their group and other bits.
 */
function ownerOnly(file: string): void {
  closeSync(openSync(file, 'a', 0o600));
  for (const f of [file, `${file}-wal`, `${file}-shm`]) {
    try {
      const mode = statSync(f).mode & 0o777;
      if (mode & 0o077) chmodSync(f, mode & 0o700);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
}

export async function openSqlite(file: string): Promise<Db> {
  const Database = await sqliteDriver();
  if (file !== ':memory:') ownerOnly(file);
  const sqlite = new Database(file);
  // exec, not pragma(): pragma() prepares a statement that is then left to the garbage collector.
  sqlite.exec('PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000');
  const mutex = new Mutex();
  const inTx = new AsyncLocalStorage<boolean>();

  const params = bindParams;
  // Each SQL text is prepared once and kept (the texts are the program's own, so the set is small).
  // Statements must not be left to the garbage collector: on Node >= 24.19 better-sqlite3 12's
  // Statement destructor aborts the process when a GC runs outside a JS context (an idle GC), the
  // `RemoveEnvironmentCleanupHook: (env) != nullptr` crash. Reuse is also cheaper than re-preparing.
  const prepared = new Map<string, Statement<unknown[]>>();
  const stmt = (sql: string) => {
    let s = prepared.get(sql);
    if (!s) prepared.set(sql, (s = sqlite.prepare(sql)));
    return s;
  };
  // Outside a transaction a statement waits for any running transaction to finish first.
  const guarded = async <T>(fn: () => T): Promise<T> => {
    if (inTx.getStore()) return fn();
    const release = await mutex.lock();
    try {
      return fn();
    } finally {
      release();
    }
  };

  const db: Db = {
    kind: 'sqlite',
    all: <T>(sql: string, p?: unknown[]) => guarded(() => stmt(sql).all(...params(p)) as T[]),
    get: <T>(sql: string, p?: unknown[]) => guarded(() => stmt(sql).get(...params(p)) as T | undefined),
    run: (sql: string, p?: unknown[]) =>
      guarded(() => {
        const s = stmt(sql);
        if (!s.reader) return { changes: s.run(...params(p)).changes };
        s.all(...params(p));
        return { changes: 0 };
      }),
    async tx<T>(fn: (db: Db) => Promise<T>): Promise<T> {
      if (inTx.getStore()) return fn(db);
      const release = await mutex.lock();
      try {
        sqlite.exec('BEGIN IMMEDIATE');
        try {
          const result = await inTx.run(true, () => fn(db));
          sqlite.exec('COMMIT');
          return result;
        } catch (err) {
          sqlite.exec('ROLLBACK');
          throw err;
        }
      } finally {
        release();
      }
    },
    async close() {
      const release = await mutex.lock();
      try {
        sqlite.close();
      } finally {
        release();
      }
    },
  };
  return db;
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL (pg): a pool; a transaction checks out one client and routes its statements there.

function toPg(sql: string): string {
  let n = 0;
  let out = '';
  let quote: string | null = null;
  for (const ch of sql) {
    if (quote) {
      if (ch === quote) quote = null;
      out += ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      out += ch;
    } else if (ch === '?') {
      out += `$${++n}`;
    } else {
      out += ch;
    }
  }
  return out;
}

/**
 * Query parameters of a connection URL that hold a credential: the driver takes every parameter of
 * the query string as a connection setting, `?password=` and `?sslpassword=` included.
 */
const SECRET_PARAM = /pass|secret|token/i;

/** DATABASE_URL as it may be shown: without its password (userinfo or query), and not at all when it does not parse. */
export function shownDatabaseUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    for (const k of [...u.searchParams.keys()]) if (SECRET_PARAM.test(k)) u.searchParams.set(k, '***');
    return ` (${u.toString()})`;
  } catch {
    return ' (not a valid URL)';
  }
}

/** The driver's sentence when the server asks for a password and none was given (it says so in its own terms). */
const NO_PASSWORD = /client password must be a string/;

export async function openPostgres(url: string, onConnectionLost: (reason: string) => void = () => undefined): Promise<Db> {
  const { default: pg } = await import('pg');
  // BIGINT (int8) comes back as a string by default; keygate's counters fit in a JS number.
  pg.types.setTypeParser(20, (v: string) => Number(v));
  // The first connection is a lone client, ended whatever happens: a pool that fails to connect
  // leaves the socket of a login refused half-way (the server asked for a password the URL does
  // not have) open until the server's authentication timeout, a minute during which the failed
  // command cannot exit.
  let probe: InstanceType<typeof pg.Client> | undefined;
  try {
    probe = new pg.Client({ connectionString: url });
    await probe.connect();
    await probe.query('SELECT 1');
  } catch (err) {
    // An operator's mistake (a typo in the URL, a database that is not up or refuses the login),
    // not a bug: one line with the cause (the server's and the network's messages never hold the
    // password; the URL parser's refusal is named, not quoted) and the URL without its password.
    const e = err as { code?: unknown; message?: unknown };
    const code = typeof e.code === 'string' ? e.code : undefined;
    const raw = typeof e.message === 'string' ? e.message.split('\n')[0] : 'unknown error';
    const message = code === 'ERR_INVALID_URL' ? 'the URL does not parse' : NO_PASSWORD.test(raw) ? 'the server asks for a password and DATABASE_URL gives none' : raw;
    const why = code && !message.includes(code) ? `${message} (${code})` : message;
    throw new CliError(`cannot open the database of DATABASE_URL${shownDatabaseUrl(url)}: ${why}`);
  } finally {
    await probe?.end().catch(() => undefined);
  }
  const pool = new pg.Pool({ connectionString: url, max: 10 });
  // Without a listener, the pool's 'error' for an idle client the server ended is an unhandled
  // 'error' event: the whole process went down with it.
  pool.on('error', (err: Error & { code?: unknown }) => {
    onConnectionLost(`${String(err.message ?? '').split('\n')[0]}${typeof err.code === 'string' ? ` (${err.code})` : ''}`);
  });

  type Queryable = { query: (sql: string, params?: unknown[]) => Promise<{ rows: unknown[]; rowCount: number | null }> };
  const make = (q: Queryable, inTx: boolean): Db => {
    const self: Db = {
      kind: 'postgres',
      all: async <T>(sql: string, p?: unknown[]) => (await q.query(toPg(sql), bindParams(p))).rows as T[],
      get: async <T>(sql: string, p?: unknown[]) => (await q.query(toPg(sql), bindParams(p))).rows[0] as T | undefined,
      run: async (sql: string, p?: unknown[]) => ({ changes: (await q.query(toPg(sql), bindParams(p))).rowCount ?? 0 }),
      async tx<T>(fn: (db: Db) => Promise<T>): Promise<T> {
        if (inTx) return fn(self);
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          const result = await fn(make(client as unknown as Queryable, true));
          await client.query('COMMIT');
          return result;
        } catch (err) {
          await client.query('ROLLBACK').catch(() => undefined);
          throw err;
        } finally {
          client.release();
        }
      },
      close: async () => {
        if (!inTx) await pool.end();
      },
    };
    return self;
  };
  return make(pool as unknown as Queryable, false);
}

// ---------------------------------------------------------------------------------------------
// Migrations: each area owns a namespace and an append-only list of steps. A step is one or more
// statements separated by `;` on their own line ends. Applied steps are recorded per namespace.

export async function migrate(db: Db, namespace: string, steps: string[]): Promise<void> {
  await db.run('CREATE TABLE IF NOT EXISTS schema_migrations (namespace TEXT NOT NULL, step INTEGER NOT NULL, applied_at TEXT NOT NULL, PRIMARY KEY (namespace, step))');
  await db.tx(async (tx) => {
    const done = await tx.all<{ step: number }>('SELECT step FROM schema_migrations WHERE namespace = ?', [namespace]);
    const applied = new Set(done.map((r) => Number(r.step)));
    for (let i = 0; i < steps.length; i++) {
      if (applied.has(i)) continue;
      for (const statement of steps[i].split(/;\s*(?:\n|$)/).map((s) => s.trim()).filter(Boolean)) {
        await tx.run(statement);
      }
      await tx.run('INSERT INTO schema_migrations (namespace, step, applied_at) VALUES (?, ?, ?)', [namespace, i, nowIso()]);
    }
  });
}
