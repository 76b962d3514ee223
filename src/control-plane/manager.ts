import { randomBytes, randomUUID } from 'node:crypto';
import { copyFileSync, constants as fsc, mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { hashApiKey } from '../server/auth.js';
import type { ServerContext } from '../server/context.js';
import { BuildError, DeployError, failureReason, type RuntimeDriver } from './drivers/types.js';
import { LogStore, makeRedactor } from './logs.js';
import { FrontRouter } from './router.js';
import { recoveryAction } from './state.js';
import type { ControlPlaneStore } from './store.js';
import { ReplicaSet } from './supervisor.js';
import type { DeploymentRow, LogType, RevisionRow, Source } from './types.js';
import { loggableMessage } from '../server/errors.js';

export interface ManagerConfig {
  host: string;
  buildConcurrency: number;
  deployTimeoutMs: number;
  drainTimeoutMs: number;
  stopGraceMs: number;
}

interface DeploymentRuntime {
  router: FrontRouter;
  /** The worker loop building and deploying queued revisions, if running. */
  worker: Promise<void> | null;
  again: boolean;
  abort: AbortController;
  deleting: boolean;
  /** A revision being started (DEPLOYING), so delete and close can stop it too. */
  pending: ReplicaSet | null;
}

class Semaphore {
  private waiting: (() => void)[] = [];
  private used = 0;
  constructor(private readonly size: number) {}
  async acquire(): Promise<() => void> {
    if (this.used >= this.size) await new Promise<void>((r) => this.waiting.push(r));
    else this.used++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) next();
      else this.used--;
    };
  }
}

export function deploymentDir(dataDir: string, id: string): string {
  return path.join(dataDir, 'deployments', id);
}
export function revisionDir(dataDir: string, depId: string, revId: string): string {
  return path.join(deploymentDir(dataDir, depId), 'revisions', revId);
}

/**
 * The key the front router sends to a replica (its X-Api-Key). The app can read it (from
 * /proc/self/environ, though the runtime hides it from process.env), so it is redacted from the
 * revision's logs like the deployment's secrets.
 */
function replicaApiKey(): string {
  return `kgi_${randomBytes(24).toString('base64url')}`;
}

/**
 * Runs what the database describes: one front router per deployment, one worker per deployment
 * walking its queued revisions through build and deploy, the replica sets, restore after a restart.
 */
export class ControlPlaneManager {
  private readonly runtimes = new Map<string, DeploymentRuntime>();
  private readonly builds: Semaphore;
  private closing = false;
  /** The background restore, awaited by close(): it may attach routers and start replicas. */
  private restoring: Promise<void> | undefined;

  constructor(
    private readonly ctx: ServerContext,
    private readonly store: ControlPlaneStore,
    readonly logs: LogStore,
    private readonly drivers: { local: RuntimeDriver; docker: RuntimeDriver },
    private readonly cfg: ManagerConfig,
  ) {
    this.builds = new Semaphore(cfg.buildConcurrency);
  }

  driverFor(source: Source): RuntimeDriver {
    return source === 'internal_source' ? this.drivers.local : this.drivers.docker;
  }

  urlOf(dep: DeploymentRow): string | null {
    const rt = this.runtimes.get(dep.id);
    if (rt) return rt.router.url;
    return dep.front_port ? `http://${this.cfg.host}:${dep.front_port}` : null;
  }

  log(depId: string, revId: string | null, type: LogType, level: 'info' | 'warn' | 'error', message: string): void {
    this.logs.append(depId, revId, type, level, message);
  }

  /** Copies an upload into the revision's directory: the revision keeps its source for rebuilds. */
  stageSource(depId: string, revId: string, uploadPath: string): void {
    const dir = revisionDir(this.ctx.dataDir, depId, revId);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    copyFileSync(path.join(this.ctx.dataDir, uploadPath), path.join(dir, 'source.tar.gz'), fsc.COPYFILE_FICLONE);
  }

  /** Gives a deployment its router (stable port, persisted) and kicks its worker. */
  async attach(dep: DeploymentRow): Promise<FrontRouter> {
    let rt = this.runtimes.get(dep.id);
    if (!rt) {
      const router = new FrontRouter({
        deploymentId: dep.id,
        host: this.cfg.host,
        logger: this.ctx.logger,
        authenticate: async (key) => {
          const row = await this.ctx.db.get<{ workspace_id: string }>('SELECT workspace_id FROM api_keys WHERE key_hash = ?', [hashApiKey(key)]);
          if (!row) return 'unknown';
          return row.workspace_id === dep.workspace_id ? 'ok' : 'other-workspace';
        },
      });
      rt = { router, worker: null, again: false, abort: new AbortController(), deleting: false, pending: null };
      this.runtimes.set(dep.id, rt);
      const port = await router.listen(dep.front_port);
      if (port !== dep.front_port) {
        if (dep.front_port) this.log(dep.id, null, 'deploy', 'warn', `port ${dep.front_port} is taken; the deployment moved to ${router.url}`);
        await this.store.updateDeployment(dep.id, { front_port: port });
      }
    }
    return rt.router;
  }

  /** Wakes the deployment's worker (new revision queued). */
  kick(depId: string): void {
    const rt = this.runtimes.get(depId);
    if (!rt || rt.deleting || this.closing) return;
    if (rt.worker) {
      rt.again = true;
      return;
    }
    rt.worker = this.work(depId, rt).finally(() => {
      rt.worker = null;
      if (rt.again && !rt.deleting && !this.closing) {
        rt.again = false;
        this.kick(depId);
      }
    });
  }

  private async work(depId: string, rt: DeploymentRuntime): Promise<void> {
    for (;;) {
      rt.again = false;
      if (rt.deleting || this.closing) return;
      const revs = await this.store.listRevisions(depId);
      const queued = revs.filter((r) => r.status === 'QUEUED');
      if (queued.length === 0) return;
      const [next, ...older] = queued;
      for (const r of older) {
        await this.store.setRevisionStatus(r.id, 'SKIPPED', `superseded by revision ${next.id} before it was built`);
        this.log(depId, r.id, 'build', 'info', `revision ${r.id} skipped: superseded by ${next.id}`);
      }
      try {
        await this.runRevision(depId, next, rt);
      } catch (err) {
        // A bug or the database going away: never leave the worker wedged.
        this.ctx.logger.error({ deployment_id: depId, revision_id: next.id, err: { message: loggableMessage(err) } }, 'revision worker failed');
        if (!this.closing && !rt.deleting) {
          await this.store.setRevisionStatus(next.id, 'DEPLOY_FAILED', 'internal error while deploying').catch(() => undefined);
        }
      }
    }
  }

  private secretsOf(rev: RevisionRow): Record<string, string> {
    const sealed = JSON.parse(rev.secrets || '{}') as Record<string, string>;
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(sealed)) out[k] = this.ctx.envelope.open(v);
    return out;
  }

  private async runRevision(depId: string, rev: RevisionRow, rt: DeploymentRuntime): Promise<void> {
    const dep = await this.store.getDeploymentById(depId);
    if (!dep) return;
    const driver = this.driverFor(rev.source);
    let secrets: Record<string, string>;
    try {
      secrets = this.secretsOf(rev);
    } catch {
      await this.store.setRevisionStatus(rev.id, 'BUILDING');
      await this.store.setRevisionStatus(rev.id, 'BUILD_FAILED', 'the deployment secrets cannot be decrypted with the current master key');
      return;
    }
    // Every line written for this revision goes through the redactor: the app's output, the
    // replica set's events (restart failures quote errors) and our own messages alike.
    const apiKey = replicaApiKey();
    const redact = makeRedactor([...Object.values(secrets), apiKey]);
    const bsafe = (level: 'info' | 'warn' | 'error', line: string) => this.log(depId, rev.id, 'build', level, redact(line));
    const dlog = (level: 'info' | 'warn' | 'error', line: string) => this.log(depId, rev.id, 'deploy', level, redact(line));

    const release = await this.builds.acquire();
    let artifact: string;
    try {
      if (rt.deleting || this.closing) return;
      if (!(await this.store.setRevisionStatus(rev.id, 'BUILDING'))) return;
      bsafe('info', `build of revision ${rev.id} started (driver: ${driver.name})`);
      const why = await driver.unavailableReason();
      if (why) throw new BuildError(why);
      const out = await driver.build({
        deploymentId: depId,
        revisionId: rev.id,
        revisionDir: revisionDir(this.ctx.dataDir, depId, rev.id),
        source: rev.source,
        config: JSON.parse(rev.source_revision_config),
        log: bsafe,
        signal: rt.abort.signal,
      });
      artifact = out.artifact;
      bsafe('info', 'build succeeded');
    } catch (err) {
      if (rt.deleting || this.closing) return; // the restart or the delete decides what happens to it
      const msg = failureReason(err);
      bsafe('error', `build failed: ${msg}`);
      await this.store.setRevisionStatus(rev.id, 'BUILD_FAILED', redact(msg));
      return;
    } finally {
      release();
    }

    if (!(await this.store.setRevisionStatus(rev.id, 'DEPLOYING'))) return;
    const count = dep.deployment_type === 'prod' ? 2 : 1;
    dlog('info', `deploying revision ${rev.id}: starting ${count} replica(s)`);
    const set = new ReplicaSet({
      driver,
      count,
      spec: {
        deploymentId: depId,
        revisionId: rev.id,
        artifact,
        env: secrets,
        apiKey,
        log: (level, line) => dlog(level, line),
        startTimeoutMs: this.cfg.deployTimeoutMs,
        redact,
      },
      event: (level, line) => dlog(level, line),
    });
    rt.pending = set;
    try {
      await set.start();
    } catch (err) {
      rt.pending = null;
      if (rt.deleting || this.closing) return;
      const msg = err instanceof DeployError ? err.message : `deploy failed: ${failureReason(err)}`;
      const serving = rt.router.activeSet?.revisionId;
      dlog('error', `deploy failed: ${msg}; ${serving ? `revision ${serving} keeps serving` : 'nothing is serving: no revision of this deployment is deployed'}`);
      await this.store.setRevisionStatus(rev.id, 'DEPLOY_FAILED', redact(msg));
      return;
    }
    rt.pending = null;
    if (rt.deleting || this.closing) {
      await set.stop(this.cfg.stopGraceMs);
      return;
    }
    // The switch: one reference swap; requests already running finish on the old replicas.
    const old = rt.router.setActive(set);
    await this.store.activate(depId, rev.id);
    dlog('info', `revision ${rev.id} is live at ${rt.router.url}`);
    if (old) {
      const drained = await old.drain(this.cfg.drainTimeoutMs);
      this.log(depId, old.revisionId, 'deploy', drained ? 'info' : 'warn', `revision ${old.revisionId} replaced by ${rev.id}; ${drained ? 'drained' : 'drain timed out'}, stopping its replicas`);
      await old.stop(this.cfg.stopGraceMs);
    }
  }

  /**
   * After a (re)start: routers on their persisted ports, the active revision's replicas back from
   * its built directory, unfinished revisions resolved (see state.recoveryAction).
   */
  restore(): Promise<void> {
    this.restoring ??= this.restoreAll();
    return this.restoring;
  }

  private async restoreAll(): Promise<void> {
    // First the replicas a killed predecessor left behind: otherwise the restored ones would run
    // next to them, and nothing would ever stop the old ones.
    for (const driver of new Set([this.drivers.local, this.drivers.docker])) {
      if (this.closing) return;
      try {
        await driver.reapOrphans?.(this.cfg.stopGraceMs);
      } catch (err) {
        this.ctx.logger.error({ driver: driver.name, err: { message: loggableMessage(err) } }, 'could not stop replicas left by a previous server');
      }
    }
    for (const dep of await this.store.allDeployments()) {
      if (this.closing) return;
      try {
        await this.restoreOne(dep);
      } catch (err) {
        this.ctx.logger.error({ deployment_id: dep.id, err: { message: loggableMessage(err) } }, 'could not restore deployment');
      }
    }
  }

  private async restoreOne(dep: DeploymentRow): Promise<void> {
    if (dep.status === 'AWAITING_DELETE') {
      await this.remove(dep.id);
      return;
    }
    const router = await this.attach(dep);
    const rt = this.runtimes.get(dep.id)!;
    if (this.closing) return; // close() stops what attach() started
    const revs = await this.store.listRevisions(dep.id);
    for (const r of revs) {
      const action = recoveryAction(r.status, r.id === dep.latest_revision_id);
      if (action === 'skip') await this.store.setRevisionStatus(r.id, 'SKIPPED', 'superseded before it was built (server restarted)');
      if (action === 'interrupt' || action === 'interrupt-and-rebuild') {
        await this.store.setRevisionStatus(r.id, 'INTERRUPTED', 'the server restarted while this revision was being built or deployed');
        this.log(dep.id, r.id, 'build', 'warn', `revision ${r.id} interrupted by a server restart`);
      }
      if (action === 'interrupt-and-rebuild') {
        const id = randomUUID();
        this.stageSourceFromRevision(dep.id, r.id, id, r);
        await this.store.addRevision({ id, deploymentId: dep.id, workspaceId: dep.workspace_id, source: r.source, sourceRevisionConfig: r.source_revision_config, secrets: r.secrets, status: 'QUEUED' });
        this.log(dep.id, id, 'build', 'info', `revision ${id} queued to rebuild interrupted revision ${r.id}`);
      }
    }
    const active = dep.active_revision_id ? revs.find((r) => r.id === dep.active_revision_id) : undefined;
    if (active && active.status === 'DEPLOYED') {
      const driver = this.driverFor(active.source);
      let secrets: Record<string, string>;
      try {
        secrets = this.secretsOf(active);
      } catch {
        // Fail closed: an application started without the secrets it was deployed with may fall
        // back to defaults it should never run with (no auth, a public key). It stays down,
        // answering 503, until it is redeployed with secrets the current master key opens.
        this.log(dep.id, active.id, 'deploy', 'error', `cannot restore revision ${active.id}: its secrets cannot be decrypted with the current master key; not started (redeploy it with its secrets)`);
        this.kick(dep.id);
        return;
      }
      const artifact = active.source === 'internal_source' ? path.join(revisionDir(this.ctx.dataDir, dep.id, active.id), 'app') : (JSON.parse(active.source_revision_config).image_uri as string);
      const apiKey = replicaApiKey();
      const redact = makeRedactor([...Object.values(secrets), apiKey]);
      const dlog = (level: 'info' | 'warn' | 'error', line: string) => this.log(dep.id, active.id, 'deploy', level, redact(line));
      const set = new ReplicaSet({
        driver,
        count: dep.deployment_type === 'prod' ? 2 : 1,
        spec: { deploymentId: dep.id, revisionId: active.id, artifact, env: secrets, apiKey, log: dlog, startTimeoutMs: this.cfg.deployTimeoutMs, redact },
        event: dlog,
      });
      dlog('info', `restoring revision ${active.id} after a server restart`);
      rt.pending = set;
      try {
        await set.start();
        rt.pending = null;
        if (rt.deleting || this.closing) await set.stop(this.cfg.stopGraceMs);
        else router.setActive(set);
      } catch (err) {
        rt.pending = null;
        dlog('error', `could not restore revision ${active.id}: ${failureReason(err)}`);
      }
    }
    this.kick(dep.id);
  }

  private stageSourceFromRevision(depId: string, fromRev: string, toRev: string, r: RevisionRow): void {
    if (r.source !== 'internal_source') return;
    const dir = revisionDir(this.ctx.dataDir, depId, toRev);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    copyFileSync(path.join(revisionDir(this.ctx.dataDir, depId, fromRev), 'source.tar.gz'), path.join(dir, 'source.tar.gz'), fsc.COPYFILE_FICLONE);
  }

  /** Stops everything of a deployment and removes its rows and files. */
  async remove(depId: string): Promise<void> {
    const rt = this.runtimes.get(depId);
    await this.store.updateDeployment(depId, { status: 'AWAITING_DELETE' });
    if (rt) {
      rt.deleting = true;
      rt.abort.abort();
      const active = rt.router.setActive(null);
      await rt.router.close();
      await Promise.all([active?.stop(this.cfg.stopGraceMs), rt.pending?.stop(this.cfg.stopGraceMs)]);
      await rt.worker?.catch(() => undefined);
      this.runtimes.delete(depId);
    }
    this.logs.forget(depId);
    await this.store.deleteDeployment(depId);
    rmSync(deploymentDir(this.ctx.dataDir, depId), { recursive: true, force: true });
  }

  /** Process ids of a deployment's running replicas (operators, tests). */
  pids(depId: string): number[] {
    const rt = this.runtimes.get(depId);
    return [...(rt?.router.activeSet?.pids() ?? []), ...(rt?.pending?.pids() ?? [])];
  }

  /** Server shutdown: builds are cancelled, replicas stopped; the database keeps what to restore. */
  async close(): Promise<void> {
    this.closing = true;
    await this.stopRuntimes();
    // A restore still under way returns at its next step (stopping the replica set it was
    // starting, see restoreOne); what it attached meanwhile is stopped by the second pass, and the
    // database stays open until it is done.
    await this.restoring?.catch(() => undefined);
    await this.stopRuntimes();
    await this.logs.close();
  }

  private async stopRuntimes(): Promise<void> {
    const ids = [...this.runtimes.keys()];
    const all = [...this.runtimes.values()];
    for (const rt of all) rt.abort.abort();
    await Promise.all(
      all.map(async (rt) => {
        const active = rt.router.setActive(null);
        await rt.router.close();
        await Promise.all([active?.stop(this.cfg.stopGraceMs), rt.pending?.stop(this.cfg.stopGraceMs)]);
      }),
    );
    await Promise.all(all.map((rt) => rt.worker?.catch(() => undefined)));
    for (const id of ids) this.runtimes.delete(id);
  }
}
