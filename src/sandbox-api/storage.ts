import { migrate, nowIso, type Db } from '../store/db.js';
import type { ProxyConfig } from '../config/schema.js';
import type { BoxResources, DriverName } from '../sandbox/driver.js';

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
  // Real boxes (sandbox.md): the driver that runs the box, its idle TTL, the resources as applied
  // and the time of its last execution (what the idle TTL counts from).
  `ALTER TABLE sandboxes ADD COLUMN driver TEXT NOT NULL DEFAULT 'none';
   ALTER TABLE sandboxes ADD COLUMN idle_ttl_seconds INTEGER NOT NULL DEFAULT 600;
   ALTER TABLE sandboxes ADD COLUMN resources TEXT;
   ALTER TABLE sandboxes ADD COLUMN last_active_at TEXT`,
];

export type SandboxStatus = 'provisioning' | 'ready' | 'stopped' | 'failed';
export const SANDBOX_STATUSES: SandboxStatus[] = ['provisioning', 'ready', 'stopped', 'failed'];

/** Rows written before boxes were real say `starting`; they read as `provisioning`. */
function statusOf(stored: string): SandboxStatus {
  return stored === 'starting' ? 'provisioning' : (stored as SandboxStatus);
}

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
  driver: DriverName;
  /** Seconds without an execution before the box is stopped; 0 = never. */
  idleTtlSeconds: number;
  /** As applied; null for rows written before resources existed (the template's defaults apply). */
  resources: BoxResources | null;
  /** Last execution (or start); null when never. */
  lastActiveAt: string | null;
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
  driver: string;
  idle_ttl_seconds: number;
  resources: string | null;
  last_active_at: string | null;
  created_at: string;
  updated_at: string;
}

function fromRow(r: Row): SandboxRecord {
  return {
    id: r.id,
    workspaceId: r.workspace_id,
    name: r.name,
    templateName: r.template_name,
    status: statusOf(r.status),
    statusReason: r.status_reason,
    proxyConfig: r.proxy_config === null ? null : (JSON.parse(r.proxy_config) as ProxyConfig),
    proxyPort: r.proxy_port === null ? null : Number(r.proxy_port),
    driver: r.driver as DriverName,
    idleTtlSeconds: Number(r.idle_ttl_seconds),
    resources: r.resources === null ? null : (JSON.parse(r.resources) as BoxResources),
    lastActiveAt: r.last_active_at,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

const COLUMNS = 'id, workspace_id, name, template_name, status, status_reason, proxy_config, proxy_port, driver, idle_ttl_seconds, resources, last_active_at, created_at, updated_at';

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

  async insert(rec: Omit<SandboxRecord, 'createdAt' | 'updatedAt' | 'lastActiveAt'>): Promise<SandboxRecord> {
    const now = nowIso();
    // ON CONFLICT DO NOTHING + changes: one portable way to detect the unique violation on both
    // backends without parsing driver-specific error codes.
    const { changes } = await this.db.run(
      `INSERT INTO sandboxes (${COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
      [
        rec.id,
        rec.workspaceId,
        rec.name,
        rec.templateName,
        rec.status,
        rec.statusReason,
        rec.proxyConfig === null ? null : JSON.stringify(rec.proxyConfig),
        rec.proxyPort,
        rec.driver,
        rec.idleTtlSeconds,
        rec.resources === null ? null : JSON.stringify(rec.resources),
        now,
        now,
        now,
      ],
    );
    if (changes === 0) throw new DuplicateNameError(rec.name);
    return { ...rec, lastActiveAt: now, createdAt: now, updatedAt: now };
  }

  async getByName(workspaceId: string, name: string): Promise<SandboxRecord | undefined> {
    const row = await this.db.get<Row>(`SELECT ${COLUMNS} FROM sandboxes WHERE workspace_id = ? AND name = ?`, [workspaceId, name]);
    return row ? fromRow(row) : undefined;
  }

  async getById(id: string): Promise<SandboxRecord | undefined> {
    const row = await this.db.get<Row>(`SELECT ${COLUMNS} FROM sandboxes WHERE id = ?`, [id]);
    return row ? fromRow(row) : undefined;
  }

  /** A workspace's sandboxes, oldest first (stable order for paging); every one without `page`. */
  async list(workspaceId: string, page?: { limit: number; offset: number }): Promise<SandboxRecord[]> {
    const sql = `SELECT ${COLUMNS} FROM sandboxes WHERE workspace_id = ? ORDER BY created_at, name, id`;
    const rows = page ? await this.db.all<Row>(`${sql} LIMIT ? OFFSET ?`, [workspaceId, page.limit, page.offset]) : await this.db.all<Row>(sql, [workspaceId]);
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

  /** Server start: every box that was up is `provisioning` until restored (stopped and failed stay). */
  async markProvisioning(): Promise<void> {
    await this.db.run("UPDATE sandboxes SET status = 'provisioning' WHERE status IN ('ready', 'starting', 'provisioning')", []);
  }

  async setIdleTtl(id: string, seconds: number): Promise<void> {
    await this.db.run('UPDATE sandboxes SET idle_ttl_seconds = ?, updated_at = ? WHERE id = ?', [seconds, nowIso(), id]);
  }

  /** The box ran something (or started): the idle TTL counts from now. */
  async touch(id: string, at: string = nowIso()): Promise<void> {
    await this.db.run('UPDATE sandboxes SET last_active_at = ? WHERE id = ?', [at, id]);
  }

  async delete(id: string): Promise<boolean> {
    const { changes } = await this.db.run('DELETE FROM sandboxes WHERE id = ?', [id]);
    return changes > 0;
  }
}
