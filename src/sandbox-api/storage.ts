import { migrate, nowIso, type Db } from '../store/db.js';
import type { ProxyConfig } from '../config/schema.js';

/**
 * Sandbox records. `proxy_config` is the stored form of the configuration: `workspace_secret`
 * values as their `{KEY}` templates and `opaque` values sealed with the envelope (no associated
 * data, so key rotation finds them inside the JSON text). A resolved secret never reaches a row.
 */
export const SANDBOX_MIGRATIONS = [
  `CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL,
    name TEXT NOT NULL,
    template_name TEXT NOT NULL,
    status TEXT NOT NULL,
    status_reason TEXT,
    proxy_config TEXT,
    proxy_port INTEGER,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (workspace_id, name)
  )`,
];

export type SandboxStatus = 'starting' | 'ready' | 'failed';
export const SANDBOX_STATUSES: SandboxStatus[] = ['starting', 'ready', 'failed'];

export interface SandboxRecord {
  id: string;
  workspaceId: string;
  name: string;
  templateName: string;
  status: SandboxStatus;
  /** Why the sandbox is `failed` (names keys and rules, never values); null otherwise. */
  statusReason: string | null;
  /** Stored form (opaque sealed); null when the sandbox was created without one. */
  proxyConfig: ProxyConfig | null;
  proxyPort: number | null;
  createdAt: string;
  updatedAt: string;
}

interface Row {
  id: string;
  workspace_id: string;
  name: string;
  template_name: string;
  status: string;
  status_reason: string | null;
  proxy_config: string | null;
  proxy_port: number | null;
  created_at: string;
  updated_at: string;
}

function fromRow(r: Row): SandboxRecord {
  return {
    id: r.id,
    workspaceId: r.workspace_id,
    name: r.name,
    templateName: r.template_name,
    status: r.status as SandboxStatus,
    statusReason: r.status_reason,
    proxyConfig: r.proxy_config === null ? null : (JSON.parse(r.proxy_config) as ProxyConfig),
    proxyPort: r.proxy_port === null ? null : Number(r.proxy_port),
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

const COLUMNS = 'id, workspace_id, name, template_name, status, status_reason, proxy_config, proxy_port, created_at, updated_at';

/** Raised when (workspace, name) is already taken; the route answers 409. */
export class DuplicateNameError extends Error {
  constructor(readonly sandboxName: string) {
    super(`A sandbox named '${sandboxName}' already exists in this workspace.`);
    this.name = 'DuplicateNameError';
  }
}

export class SandboxStore {
  constructor(private readonly db: Db) {}

  async migrate(): Promise<void> {
    await migrate(this.db, 'sandboxes', SANDBOX_MIGRATIONS);
  }

  async insert(rec: Omit<SandboxRecord, 'createdAt' | 'updatedAt'>): Promise<SandboxRecord> {
    const now = nowIso();
    // ON CONFLICT DO NOTHING + changes: one portable way to detect the unique violation on both
    // backends without parsing driver-specific error codes.
    const { changes } = await this.db.run(
      `INSERT INTO sandboxes (${COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
      [rec.id, rec.workspaceId, rec.name, rec.templateName, rec.status, rec.statusReason, rec.proxyConfig === null ? null : JSON.stringify(rec.proxyConfig), rec.proxyPort, now, now],
    );
    if (changes === 0) throw new DuplicateNameError(rec.name);
    return { ...rec, createdAt: now, updatedAt: now };
  }

  async getByName(workspaceId: string, name: string): Promise<SandboxRecord | undefined> {
    const row = await this.db.get<Row>(`SELECT ${COLUMNS} FROM sandboxes WHERE workspace_id = ? AND name = ?`, [workspaceId, name]);
    return row ? fromRow(row) : undefined;
  }

  async getById(id: string): Promise<SandboxRecord | undefined> {
    const row = await this.db.get<Row>(`SELECT ${COLUMNS} FROM sandboxes WHERE id = ?`, [id]);
    return row ? fromRow(row) : undefined;
  }

  /** A workspace's sandboxes, oldest first (stable order for listings). */
  async list(workspaceId: string): Promise<SandboxRecord[]> {
    const rows = await this.db.all<Row>(`SELECT ${COLUMNS} FROM sandboxes WHERE workspace_id = ? ORDER BY created_at, name`, [workspaceId]);
    return rows.map(fromRow);
  }

  /** Every sandbox of every workspace (restoring proxies at start). */
  async listAll(): Promise<SandboxRecord[]> {
    const rows = await this.db.all<Row>(`SELECT ${COLUMNS} FROM sandboxes ORDER BY created_at, name`);
    return rows.map(fromRow);
  }

  async setConfig(id: string, config: ProxyConfig | null): Promise<void> {
    await this.db.run('UPDATE sandboxes SET proxy_config = ?, updated_at = ? WHERE id = ?', [config === null ? null : JSON.stringify(config), nowIso(), id]);
  }

  async setStatus(id: string, status: SandboxStatus, reason: string | null, port?: number | null): Promise<void> {
    if (port === undefined) {
      await this.db.run('UPDATE sandboxes SET status = ?, status_reason = ?, updated_at = ? WHERE id = ?', [status, reason, nowIso(), id]);
    } else {
      await this.db.run('UPDATE sandboxes SET status = ?, status_reason = ?, proxy_port = ?, updated_at = ? WHERE id = ?', [status, reason, port, nowIso(), id]);
    }
  }

  async delete(id: string): Promise<boolean> {
    const { changes } = await this.db.run('DELETE FROM sandboxes WHERE id = ?', [id]);
    return changes > 0;
  }
}
