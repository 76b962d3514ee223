import { migrate, nowIso, type Db } from '../store/db.js';
import { Envelope, EnvelopeError } from './envelope.js';
import { DEFAULT_WORKSPACE, SecretStoreError, assertSecretKey, assertSecretValue, assertWorkspaceId, type SecretStore } from './types.js';

/**
 * Workspace secrets in the server database (`keygate serve`): one row per (workspace, key), the
 * value sealed with the envelope.
 *
 * Values in the database are sealed WITHOUT associated data. That is the rule for every sealed
 * value any area stores in the database: key rotation re-seals them with one generic scan of
 * every text column (rotate.ts), which cannot know a per-value context.
 */
export const SECRETS_MIGRATIONS: string[] = [
  `CREATE TABLE IF NOT EXISTS workspace_secrets (
    workspace_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value_sealed TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, key)
  )`,
];

export async function migrateSecrets(db: Db): Promise<void> {
  await migrate(db, 'secrets', SECRETS_MIGRATIONS);
}

export interface DbSecretStoreOptions {
  db: Db;
  workspaceId?: string;
  keys: Envelope | (() => Envelope);
}

export class DbSecretStore implements SecretStore {
  readonly writable = true;
  readonly workspaceId: string;
  private readonly db: Db;
  private readonly keys: () => Envelope;

  /** Call `migrateSecrets(db)` once before use (the factory does). */
  constructor(opts: DbSecretStoreOptions) {
    this.db = opts.db;
    this.workspaceId = opts.workspaceId ?? DEFAULT_WORKSPACE;
    assertWorkspaceId(this.workspaceId);
    const k = opts.keys;
    this.keys = typeof k === 'function' ? k : () => k;
  }

  get description(): string {
    return `${this.db.kind} table workspace_secrets (workspace ${this.workspaceId})`;
  }

  private open(envelope: Envelope, key: string, sealed: string): string {
    try {
      return envelope.open(sealed);
    } catch (err) {
      if (err instanceof EnvelopeError) throw new SecretStoreError(`secret ${key} of workspace ${this.workspaceId}: ${err.message}`);
      throw err;
    }
  }

  async get(key: string): Promise<string | undefined> {
    assertSecretKey(key);
    const row = await this.db.get<{ value_sealed: string }>('SELECT value_sealed FROM workspace_secrets WHERE workspace_id = ? AND key = ?', [this.workspaceId, key]);
    return row ? this.open(this.keys(), key, row.value_sealed) : undefined;
  }

  async list(): Promise<string[]> {
    const rows = await this.db.all<{ key: string }>('SELECT key FROM workspace_secrets WHERE workspace_id = ?', [this.workspaceId]);
    return rows.map((r) => r.key).sort();
  }

  async snapshot(): Promise<Map<string, string>> {
    const rows = await this.db.all<{ key: string; value_sealed: string }>('SELECT key, value_sealed FROM workspace_secrets WHERE workspace_id = ?', [this.workspaceId]);
    const envelope = this.keys();
    rows.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    return new Map(rows.map((r) => [r.key, this.open(envelope, r.key, r.value_sealed)]));
  }

  /**
   * Refuses to add a value under a key that cannot open what the table already holds (a wrong
   * KEYGATE_MASTER_KEY): the table would be left under two keys, which no single key opens whole
   * and which rotate-key then refuses to re-seal. The encrypted file store checks the same.
   */
  private async assertSameKey(envelope: Envelope): Promise<void> {
    const rows = await this.db.all<{ key_id: string }>('SELECT DISTINCT substr(value_sealed, 5, 8) AS key_id FROM workspace_secrets');
    const foreign = rows.map((r) => r.key_id).filter((id) => !envelope.hasKey(id));
    if (foreign.length) {
      throw new SecretStoreError(`table workspace_secrets holds values encrypted with another master key (key id ${foreign.sort().join(', ')}); this key is ${envelope.keyId}. Nothing was written`);
    }
  }

  async set(key: string, value: string): Promise<void> {
    assertSecretKey(key);
    assertSecretValue(key, value);
    const now = nowIso();
    const envelope = this.keys();
    await this.assertSameKey(envelope);
    await this.db.run(
      `INSERT INTO workspace_secrets (workspace_id, key, value_sealed, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
       ON CONFLICT (workspace_id, key) DO UPDATE SET value_sealed = excluded.value_sealed, updated_at = excluded.updated_at`,
      [this.workspaceId, key, envelope.seal(value), now, now],
    );
  }

  async delete(key: string): Promise<boolean> {
    assertSecretKey(key);
    const { changes } = await this.db.run('DELETE FROM workspace_secrets WHERE workspace_id = ? AND key = ?', [this.workspaceId, key]);
    return changes > 0;
  }
}
