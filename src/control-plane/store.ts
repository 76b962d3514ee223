import { migrate, nowIso, type Db } from '../store/db.js';
import { canTransition, IllegalTransition } from './state.js';
import type { DeploymentRow, DeploymentStatus, DeploymentType, RevisionRow, RevisionStatus, Source } from './types.js';

export const CONTROL_PLANE_MIGRATIONS = [
  `CREATE TABLE cp_deployments (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL, name TEXT NOT NULL, source TEXT NOT NULL, deployment_type TEXT NOT NULL, status TEXT NOT NULL, latest_revision_id TEXT, active_revision_id TEXT, front_port INTEGER, secrets TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, seq BIGINT NOT NULL, UNIQUE (workspace_id, name));
   CREATE INDEX cp_deployments_ws ON cp_deployments (workspace_id, seq);
   CREATE TABLE cp_revisions (id TEXT PRIMARY KEY, deployment_id TEXT NOT NULL, workspace_id TEXT NOT NULL, status TEXT NOT NULL, status_message TEXT, source TEXT NOT NULL, source_revision_config TEXT NOT NULL, secrets TEXT NOT NULL, replaced_by TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, seq BIGINT NOT NULL);
   CREATE INDEX cp_revisions_dep ON cp_revisions (deployment_id, seq);
   CREATE TABLE cp_logs (deployment_id TEXT NOT NULL, revision_id TEXT, type TEXT NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL, ts TEXT NOT NULL);
   CREATE INDEX cp_logs_dep_ts ON cp_logs (deployment_id, ts);
   CREATE TABLE cp_uploads (path TEXT PRIMARY KEY, workspace_id TEXT NOT NULL, size BIGINT NOT NULL, sha256 TEXT NOT NULL, created_at TEXT NOT NULL)`,
];

let lastSeq = 0;
/**
 * A strictly increasing ordering key (microseconds since the epoch, bumped on ties), so "newest
 * first" is exact even for rows created within the same millisecond.
 */
export function nextSeq(): number {
  const now = Date.now() * 1000;
  lastSeq = Math.max(now, lastSeq + 1);
  return lastSeq;
}

export async function migrateControlPlane(db: Db): Promise<void> {
  await migrate(db, 'control-plane', CONTROL_PLANE_MIGRATIONS);
  // Seqs from before a restart may be ahead of a clock that went backwards; never reuse one.
  const row = await db.get<{ m: number | null }>('SELECT MAX(seq) AS m FROM cp_revisions');
  lastSeq = Math.max(lastSeq, Number(row?.m ?? 0));
}

const num = <T extends { seq: number; front_port?: number | null }>(r: T | undefined): T | undefined =>
  r && { ...r, seq: Number(r.seq), ...('front_port' in r ? { front_port: r.front_port === null ? null : Number(r.front_port) } : {}) };

export interface NewDeployment {
  id: string;
  workspaceId: string;
  name: string;
  source: Source;
  deploymentType: DeploymentType;
  secrets: string;
}

export interface NewRevision {
  id: string;
  deploymentId: string;
  workspaceId: string;
  source: Source;
  sourceRevisionConfig: string;
  secrets: string;
  status: RevisionStatus;
}

export interface ListFilter {
  workspaceId: string;
  limit: number;
  offset: number;
  nameContains?: string;
  status?: DeploymentStatus;
  deploymentType?: DeploymentType;
}

/** All SQL of the control plane. Every read that serves a request is scoped by workspace. */
export class ControlPlaneStore {
  constructor(readonly db: Db) {}

  async insertDeployment(d: NewDeployment, rev: NewRevision): Promise<void> {
    const now = nowIso();
    await this.db.tx(async (tx) => {
      await tx.run(
        `INSERT INTO cp_deployments (id, workspace_id, name, source, deployment_type, status, latest_revision_id, active_revision_id, front_port, secrets, created_at, updated_at, seq)
         VALUES (?, ?, ?, ?, ?, 'READY', ?, NULL, NULL, ?, ?, ?, ?)`,
        [d.id, d.workspaceId, d.name, d.source, d.deploymentType, rev.id, d.secrets, now, now, nextSeq()],
      );
      await this.insertRevisionIn(tx, rev, now);
    });
  }

  private async insertRevisionIn(tx: Db, r: NewRevision, now: string): Promise<void> {
    await tx.run(
      `INSERT INTO cp_revisions (id, deployment_id, workspace_id, status, status_message, source, source_revision_config, secrets, replaced_by, created_at, updated_at, seq)
       VALUES (?, ?, ?, ?, NULL, ?, ?, ?, NULL, ?, ?, ?)`,
      [r.id, r.deploymentId, r.workspaceId, r.status, r.source, r.sourceRevisionConfig, r.secrets, now, now, nextSeq()],
    );
  }

  /**
   * Adds a revision and makes it the latest, atomically; with `deploymentSecrets`, the deployment's
   * secrets change in the same transaction (a PATCH is applied whole or not at all).
   */
  async addRevision(r: NewRevision, opts: { deploymentSecrets?: string } = {}): Promise<void> {
    const now = nowIso();
    await this.db.tx(async (tx) => {
      await this.insertRevisionIn(tx, r, now);
      if (opts.deploymentSecrets !== undefined) {
        await tx.run('UPDATE cp_deployments SET latest_revision_id = ?, secrets = ?, updated_at = ? WHERE id = ?', [r.id, opts.deploymentSecrets, now, r.deploymentId]);
      } else {
        await tx.run('UPDATE cp_deployments SET latest_revision_id = ?, updated_at = ? WHERE id = ?', [r.id, now, r.deploymentId]);
      }
    });
  }

  async getDeployment(workspaceId: string, id: string): Promise<DeploymentRow | undefined> {
    return num(await this.db.get<DeploymentRow>('SELECT * FROM cp_deployments WHERE id = ? AND workspace_id = ?', [id, workspaceId]));
  }

  /** Unscoped: for the runtime (restore, workers), never for a request. */
  async getDeploymentById(id: string): Promise<DeploymentRow | undefined> {
    return num(await this.db.get<DeploymentRow>('SELECT * FROM cp_deployments WHERE id = ?', [id]));
  }

  async allDeployments(): Promise<DeploymentRow[]> {
    return (await this.db.all<DeploymentRow>('SELECT * FROM cp_deployments ORDER BY seq')).map((r) => num(r)!);
  }

  async nameTaken(workspaceId: string, name: string): Promise<boolean> {
    return Boolean(await this.db.get('SELECT id FROM cp_deployments WHERE workspace_id = ? AND name = ?', [workspaceId, name]));
  }

  async listDeployments(f: ListFilter): Promise<DeploymentRow[]> {
    const where = ['workspace_id = ?'];
    const params: unknown[] = [f.workspaceId];
    if (f.nameContains) {
      // instr() exists in SQLite, strpos() in PostgreSQL; LIKE needs escaping: do it once.
      where.push(`name LIKE ? ESCAPE '\\'`);
      params.push(`%${f.nameContains.replace(/[\\%_]/g, (c) => `\\${c}`)}%`);
    }
    if (f.status) {
      where.push('status = ?');
      params.push(f.status);
    }
    if (f.deploymentType) {
      where.push('deployment_type = ?');
      params.push(f.deploymentType);
    }
    params.push(f.limit, f.offset);
    return (await this.db.all<DeploymentRow>(`SELECT * FROM cp_deployments WHERE ${where.join(' AND ')} ORDER BY seq DESC LIMIT ? OFFSET ?`, params)).map((r) => num(r)!);
  }

  async updateDeployment(id: string, fields: Partial<Pick<DeploymentRow, 'status' | 'active_revision_id' | 'front_port' | 'secrets'>>): Promise<void> {
    const keys = Object.keys(fields) as (keyof typeof fields)[];
    if (keys.length === 0) return;
    await this.db.run(`UPDATE cp_deployments SET ${keys.map((k) => `${k} = ?`).join(', ')}, updated_at = ? WHERE id = ?`, [...keys.map((k) => fields[k]), nowIso(), id]);
  }

  async deleteDeployment(id: string): Promise<void> {
    await this.db.tx(async (tx) => {
      await tx.run('DELETE FROM cp_logs WHERE deployment_id = ?', [id]);
      await tx.run('DELETE FROM cp_revisions WHERE deployment_id = ?', [id]);
      await tx.run('DELETE FROM cp_deployments WHERE id = ?', [id]);
    });
  }

  async getRevision(deploymentId: string, id: string): Promise<RevisionRow | undefined> {
    return num(await this.db.get<RevisionRow>('SELECT * FROM cp_revisions WHERE id = ? AND deployment_id = ?', [id, deploymentId]));
  }

  async listRevisions(deploymentId: string, limit = 1000, offset = 0): Promise<RevisionRow[]> {
    return (await this.db.all<RevisionRow>('SELECT * FROM cp_revisions WHERE deployment_id = ? ORDER BY seq DESC LIMIT ? OFFSET ?', [deploymentId, limit, offset])).map((r) => num(r)!);
  }

  /**
   * Moves a revision to `to` if the state machine allows it from its current status. Returns false
   * (and writes nothing) when the revision is gone (deployment deleted meanwhile).
   */
  async setRevisionStatus(id: string, to: RevisionStatus, message: string | null = null): Promise<boolean> {
    return this.db.tx(async (tx) => {
      const cur = await tx.get<{ status: RevisionStatus }>('SELECT status FROM cp_revisions WHERE id = ?', [id]);
      if (!cur) return false;
      if (!canTransition(cur.status, to)) throw new IllegalTransition(cur.status, to);
      await tx.run('UPDATE cp_revisions SET status = ?, status_message = ?, updated_at = ? WHERE id = ?', [to, message, nowIso(), id]);
      return true;
    });
  }

  /** The new revision is live: it becomes active, the previous active one is marked replaced. */
  async activate(deploymentId: string, revisionId: string): Promise<string | null> {
    return this.db.tx(async (tx) => {
      const now = nowIso();
      const dep = await tx.get<{ active_revision_id: string | null }>('SELECT active_revision_id FROM cp_deployments WHERE id = ?', [deploymentId]);
      if (!dep) return null;
      const cur = await tx.get<{ status: RevisionStatus }>('SELECT status FROM cp_revisions WHERE id = ?', [revisionId]);
      if (!cur) return null;
      if (!canTransition(cur.status, 'DEPLOYED')) throw new IllegalTransition(cur.status, 'DEPLOYED');
      await tx.run('UPDATE cp_revisions SET status = ?, status_message = NULL, updated_at = ? WHERE id = ?', ['DEPLOYED', now, revisionId]);
      if (dep.active_revision_id && dep.active_revision_id !== revisionId) {
        // Still DEPLOYED (it was), but no longer serving: the message and replaced_by say so.
        await tx.run('UPDATE cp_revisions SET replaced_by = ?, status_message = ?, updated_at = ? WHERE id = ?', [
          revisionId,
          `replaced by revision ${revisionId}; no longer serving`,
          now,
          dep.active_revision_id,
        ]);
      }
      await tx.run('UPDATE cp_deployments SET active_revision_id = ?, updated_at = ? WHERE id = ?', [revisionId, now, deploymentId]);
      return dep.active_revision_id;
    });
  }

  async recordUpload(u: { path: string; workspaceId: string; size: number; sha256: string }): Promise<void> {
    await this.db.run('INSERT INTO cp_uploads (path, workspace_id, size, sha256, created_at) VALUES (?, ?, ?, ?, ?)', [u.path, u.workspaceId, u.size, u.sha256, nowIso()]);
  }

  async getUpload(workspaceId: string, p: string): Promise<{ path: string; size: number; sha256: string } | undefined> {
    return this.db.get('SELECT path, size, sha256 FROM cp_uploads WHERE path = ? AND workspace_id = ?', [p, workspaceId]);
  }
}
