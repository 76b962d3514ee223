import { randomUUID } from 'node:crypto';
import { existsSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { principalOf } from '../server/auth.js';
import { guardStream } from '../server/streams.js';
import type { ServerContext } from '../server/context.js';
import { conflict, notFound, HttpValidationError } from '../server/errors.js';
import type { ValidationIssue } from '../validation/errors.js';
import { isoToMicros, microsToIso, parseSince } from './logs.js';
import { deploymentDir, revisionDir, type ControlPlaneManager } from './manager.js';
import { schemas } from './schemas.js';
import type { ControlPlaneStore } from './store.js';
import { receiveUpload, UPLOAD_PATH_RE } from './uploads.js';
import type { TarLimits } from './tarball.js';
import { RESERVED_SECRET_NAME, type DeploymentRow, type DeploymentStatus, type DeploymentType, type LogEntry, type LogType, type RevisionRow, type Source, type SourceRevisionConfig } from './types.js';

export interface RouteConfig {
  maxUploadBytes: number;
  tarLimits: TarLimits;
  /** The log stream's heartbeat, and how often it re-checks its caller and its deployment. */
  heartbeatMs: number;
}

interface SecretIn {
  name: string;
  value: string;
}
interface CreateBody {
  name: string;
  source: Source;
  source_config?: { deployment_type?: DeploymentType };
  source_revision_config: SourceRevisionConfig;
  secrets?: SecretIn[];
}
interface PatchBody {
  name?: string;
  source?: Source;
  source_config?: { deployment_type?: DeploymentType };
  source_revision_config?: SourceRevisionConfig | null;
  secrets?: SecretIn[] | null;
}
type DepParams = { deployment_id: string };

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function registerRoutes(app: FastifyInstance, ctx: ServerContext, store: ControlPlaneStore, manager: ControlPlaneManager, cfg: RouteConfig): void {
  const deploymentView = (d: DeploymentRow) => {
    const url = manager.urlOf(d);
    return {
      id: d.id,
      name: d.name,
      source: d.source,
      source_config: { deployment_type: d.deployment_type, custom_url: url },
      secrets: Object.keys(JSON.parse(d.secrets || '{}') as Record<string, string>).map((name) => ({ name })),
      status: d.status,
      latest_revision_id: d.latest_revision_id,
      active_revision_id: d.active_revision_id,
      url,
      created_at: d.created_at,
      updated_at: d.updated_at,
    };
  };
  /** `serving`: this revision is the deployment's active one (a replaced DEPLOYED one is not). */
  const revisionView = (r: RevisionRow, dep: DeploymentRow) => ({
    id: r.id,
    deployment_id: r.deployment_id,
    status: r.status,
    status_message: r.status_message,
    replaced_by: r.replaced_by,
    serving: r.id === dep.active_revision_id,
    source: r.source,
    source_revision_config: JSON.parse(r.source_revision_config) as SourceRevisionConfig,
    created_at: r.created_at,
    updated_at: r.updated_at,
  });

  const loadDeployment = async (req: FastifyRequest<{ Params: DepParams }>): Promise<DeploymentRow> => {
    const id = req.params.deployment_id;
    const dep = UUID_RE.test(id) ? await store.getDeployment(principalOf(req).workspaceId, id.toLowerCase()) : undefined;
    if (!dep || dep.status === 'AWAITING_DELETE') throw notFound(`Deployment ID ${id} not found.`);
    return dep;
  };

  const sealSecrets = (secrets: SecretIn[], base: (string | number)[]): string => {
    const issues: ValidationIssue[] = [];
    const seen = new Set<string>();
    secrets.forEach((s, i) => {
      if (seen.has(s.name)) issues.push({ loc: [...base, i, 'name'], msg: `Secret ${s.name} is given more than once`, type: 'value_error' });
      if (RESERVED_SECRET_NAME.test(s.name)) issues.push({ loc: [...base, i, 'name'], msg: `Secret name ${s.name} is reserved by the runtime`, type: 'value_error' });
      // A secret becomes an environment variable of the app, and no environment can carry a NUL:
      // refused here, with its place and never its value, instead of failing every start later.
      if (s.value.includes('\u0000')) issues.push({ loc: [...base, i, 'value'], msg: `Secret ${s.name}: a value cannot contain a NUL character (environment variables cannot carry one)`, type: 'value_error' });
      seen.add(s.name);
    });
    if (issues.length) throw new HttpValidationError(issues);
    const sealed: Record<string, string> = {};
    for (const s of secrets) sealed[s.name] = ctx.envelope.seal(s.value);
    return JSON.stringify(sealed);
  };

  /** Checks the revision config against the source; returns the normalised config to store. */
  const checkRevisionConfig = async (workspaceId: string, source: Source, c: SourceRevisionConfig): Promise<SourceRevisionConfig> => {
    const loc = ['body', 'source_revision_config'];
    // A field the source does not use is refused, not stored and ignored: the caller meant
    // something by it (null stands for "not given").
    const unused: keyof SourceRevisionConfig = source === 'internal_source' ? 'image_uri' : 'source_tarball_path';
    if (c[unused] !== null && c[unused] !== undefined) {
      const takes = source === 'internal_source' ? 'source_tarball_path (an upload)' : 'image_uri';
      throw new HttpValidationError([{ loc: [...loc, unused], msg: `${unused} is not used by source ${source} (it takes ${takes}); leave it out`, type: 'value_error' }]);
    }
    if (source === 'internal_source') {
      const p = c.source_tarball_path;
      if (!p) throw new HttpValidationError([{ loc: [...loc, 'source_tarball_path'], msg: 'Field required for source internal_source (upload with POST /v2/uploads first)', type: 'missing' }]);
      if (!UPLOAD_PATH_RE.test(p) || !(await store.getUpload(workspaceId, p)) || !existsSync(path.join(ctx.dataDir, p))) {
        throw new HttpValidationError([{ loc: [...loc, 'source_tarball_path'], msg: 'Unknown upload: use the source_tarball_path returned by POST /v2/uploads', type: 'value_error' }]);
      }
      return { source_tarball_path: p, image_uri: null };
    }
    if (!c.image_uri) throw new HttpValidationError([{ loc: [...loc, 'image_uri'], msg: `Field required for source ${source}`, type: 'missing' }]);
    const why = await manager.driverFor(source).unavailableReason();
    if (why) throw new HttpValidationError([{ loc: ['body', 'source'], msg: `Source ${source} cannot run here: ${why}`, type: 'value_error' }]);
    return { source_tarball_path: null, image_uri: c.image_uri };
  };

  // Open log streams follow until their client leaves: a closing server ends them (else its
  // close would wait for every follower to hang up).
  const openStreams = new Set<() => void>();
  app.addHook('preClose', async () => {
    for (const finish of [...openStreams]) finish();
  });

  // The upload body is a raw stream: handed to the route untouched, written to disk as it comes.
  app.addContentTypeParser(['application/gzip', 'application/x-gzip', 'application/octet-stream', 'application/x-tar'], (_req, payload, done) => done(null, payload));

  app.post('/v2/uploads', { schema: schemas.upload, bodyLimit: cfg.maxUploadBytes * 2 + 1024 * 1024 }, async (req, reply) => {
    const { workspaceId } = principalOf(req);
    const body = req.body as Readable | undefined;
    if (!body || typeof (body as Readable).pipe !== 'function') {
      throw new HttpValidationError([{ loc: ['body'], msg: 'Send the tar.gz as the raw body with Content-Type application/gzip', type: 'value_error' }]);
    }
    const declared = req.headers['content-length'] ? Number(req.headers['content-length']) : undefined;
    const result = await receiveUpload(body, ctx.dataDir, cfg.maxUploadBytes, cfg.tarLimits, declared);
    await store.recordUpload({ path: result.source_tarball_path, workspaceId, size: result.size, sha256: result.sha256 });
    return reply.status(201).send(result);
  });

  app.post<{ Body: CreateBody }>('/v2/deployments', { schema: schemas.create }, async (req, reply) => {
    const { workspaceId } = principalOf(req);
    const b = req.body;
    const src = await checkRevisionConfig(workspaceId, b.source, b.source_revision_config);
    const secrets = sealSecrets(b.secrets ?? [], ['body', 'secrets']);
    if (await store.nameTaken(workspaceId, b.name)) throw conflict(`A deployment named ${b.name} already exists.`);
    const id = randomUUID();
    const revId = randomUUID();
    try {
      if (src.source_tarball_path) manager.stageSource(id, revId, src.source_tarball_path);
      await store.insertDeployment(
        { id, workspaceId, name: b.name, source: b.source, deploymentType: b.source_config?.deployment_type ?? 'dev', secrets },
        { id: revId, deploymentId: id, workspaceId, source: b.source, sourceRevisionConfig: JSON.stringify(src), secrets, status: 'QUEUED' },
      );
    } catch (err) {
      rmSync(deploymentDir(ctx.dataDir, id), { recursive: true, force: true });
      if (await store.nameTaken(workspaceId, b.name)) throw conflict(`A deployment named ${b.name} already exists.`);
      throw err;
    }
    const dep = (await store.getDeploymentById(id))!;
    await manager.attach(dep);
    manager.log(id, revId, 'build', 'info', `revision ${revId} queued`);
    manager.kick(id);
    return reply.status(201).send(deploymentView((await store.getDeploymentById(id))!));
  });

  app.get<{ Querystring: { limit: number; offset: number; name_contains?: string; status?: DeploymentStatus; deployment_type?: DeploymentType } }>(
    '/v2/deployments',
    { schema: schemas.list },
    async (req) => {
      const q = req.query;
      const rows = await store.listDeployments({
        workspaceId: principalOf(req).workspaceId,
        limit: q.limit,
        offset: q.offset,
        nameContains: q.name_contains || undefined,
        status: q.status,
        deploymentType: q.deployment_type,
      });
      return { resources: rows.map(deploymentView), offset: q.offset + rows.length };
    },
  );

  app.get<{ Params: DepParams }>('/v2/deployments/:deployment_id', { schema: schemas.get }, async (req) => deploymentView(await loadDeployment(req)));

  app.patch<{ Params: DepParams; Body: PatchBody }>('/v2/deployments/:deployment_id', { schema: schemas.patch }, async (req) => {
    const dep = await loadDeployment(req);
    const b = req.body;
    const issues: ValidationIssue[] = [];
    if (b.name !== undefined && b.name !== dep.name) issues.push({ loc: ['body', 'name'], msg: 'The name of a deployment cannot be changed', type: 'value_error' });
    if (b.source !== undefined && b.source !== dep.source) issues.push({ loc: ['body', 'source'], msg: 'The source of a deployment cannot be changed', type: 'value_error' });
    const dt = b.source_config?.deployment_type;
    if (dt !== undefined && dt !== dep.deployment_type) issues.push({ loc: ['body', 'source_config', 'deployment_type'], msg: 'The deployment type cannot be changed', type: 'value_error' });
    if (issues.length) throw new HttpValidationError(issues);

    let secrets = dep.secrets;
    if (b.secrets) secrets = sealSecrets(b.secrets, ['body', 'secrets']);
    const rc = b.source_revision_config;
    const newRevision = rc && Object.values(rc).some((v) => v !== null && v !== undefined);
    let src: SourceRevisionConfig | null = null;
    if (newRevision) src = await checkRevisionConfig(dep.workspace_id, dep.source, rc!);
    // Applied whole or not at all: the source is staged first (a file system failure changes
    // nothing), then the secrets and the new revision are written in one transaction.
    const secretsChanged = secrets !== dep.secrets;
    if (src) {
      const revId = randomUUID();
      try {
        if (src.source_tarball_path) manager.stageSource(dep.id, revId, src.source_tarball_path);
        await store.addRevision(
          { id: revId, deploymentId: dep.id, workspaceId: dep.workspace_id, source: dep.source, sourceRevisionConfig: JSON.stringify(src), secrets, status: 'QUEUED' },
          secretsChanged ? { deploymentSecrets: secrets } : {},
        );
      } catch (err) {
        try {
          rmSync(revisionDir(ctx.dataDir, dep.id, revId), { recursive: true, force: true });
        } catch {
          /* nothing was staged where nothing can be */
        }
        throw err;
      }
      manager.log(dep.id, revId, 'build', 'info', `revision ${revId} queued`);
      manager.kick(dep.id);
    } else if (secretsChanged) {
      await store.updateDeployment(dep.id, { secrets });
    }
    return deploymentView((await store.getDeploymentById(dep.id))!);
  });

  app.delete<{ Params: DepParams }>('/v2/deployments/:deployment_id', { schema: schemas.delete }, async (req, reply) => {
    const dep = await loadDeployment(req);
    await manager.remove(dep.id);
    return reply.status(204).send();
  });

  app.get<{ Params: DepParams; Querystring: { limit: number; offset: number } }>('/v2/deployments/:deployment_id/revisions', { schema: schemas.revisions }, async (req) => {
    const dep = await loadDeployment(req);
    const rows = await store.listRevisions(dep.id, req.query.limit, req.query.offset);
    return { resources: rows.map((r) => revisionView(r, dep)), offset: req.query.offset + rows.length };
  });

  app.get<{ Params: DepParams & { revision_id: string } }>('/v2/deployments/:deployment_id/revisions/:revision_id', { schema: schemas.revision }, async (req) => {
    const dep = await loadDeployment(req);
    const rid = req.params.revision_id;
    const rev = UUID_RE.test(rid) ? await store.getRevision(dep.id, rid.toLowerCase()) : undefined;
    if (!rev) throw notFound(`Revision ID ${rid} not found.`);
    return revisionView(rev, dep);
  });

  const sinceOf = (raw: string | undefined): string | undefined => {
    if (raw === undefined || raw === '') return undefined;
    const s = parseSince(raw);
    if (!s) throw new HttpValidationError([{ loc: ['query', 'since'], msg: 'Expected an ISO-8601 time or a duration such as 30s, 10m, 2h, 1d', type: 'value_error' }]);
    return s;
  };

  app.get<{ Params: DepParams; Querystring: { type?: LogType; revision_id?: string; since?: string; limit: number } }>(
    '/v2/deployments/:deployment_id/logs',
    { schema: schemas.logs },
    async (req) => {
      const dep = await loadDeployment(req);
      const since = sinceOf(req.query.since);
      await manager.logs.flush();
      const logs = await manager.logs.query(dep.id, { type: req.query.type, revisionId: req.query.revision_id, since, limit: req.query.limit });
      const last = logs.at(-1);
      const next = last ? microsToIso(isoToMicros(last.timestamp) + 1) : (since ?? microsToIso(0));
      return { logs, next_since: next };
    },
  );

  app.get<{ Params: DepParams; Querystring: { type?: LogType; revision_id?: string; since?: string } }>(
    '/v2/deployments/:deployment_id/logs/stream',
    { schema: schemas.logStream },
    async (req, reply: FastifyReply) => {
      const dep = await loadDeployment(req);
      const since = sinceOf(req.query.since);
      const { type, revision_id } = req.query;
      const match = (e: LogEntry) => (!type || e.type === type) && (!revision_id || e.revision_id === revision_id);
      reply.hijack();
      const res = reply.raw;
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-accel-buffering': 'no' });
      res.flushHeaders();
      let lastTs = '';
      const write = (e: LogEntry) => {
        if (e.timestamp <= lastTs || !match(e)) return;
        lastTs = e.timestamp;
        res.write(`event: log\ndata: ${JSON.stringify(e)}\n\n`);
      };
      // Subscribe before reading the backlog, and hold live lines until it is written: no gap.
      let held: LogEntry[] | null = [];
      const unsubscribe = manager.logs.subscribe(dep.id, (e) => (held ? held.push(e) : write(e)));
      // At every heartbeat the caller's credential and the deployment are checked again: a
      // deleted key, an expired token or a deleted deployment ends the stream (an error event,
      // then the end of the response), never a stream that follows on forever.
      const stopGuard = guardStream(req, cfg.heartbeatMs, {
        beat: () => res.write(': heartbeat\n\n'),
        stillThere: () => loadDeployment(req),
        end: (detail) => {
          res.write(`event: error\ndata: ${JSON.stringify({ detail })}\n\n`);
          res.end();
        },
      });
      const end = () => {
        stopGuard();
        unsubscribe();
        openStreams.delete(finish);
      };
      const finish = () => {
        end();
        res.end();
      };
      openStreams.add(finish);
      req.raw.once('close', end);
      res.once('close', end);
      try {
        await manager.logs.flush();
        const backlog = await manager.logs.query(dep.id, { type, revisionId: revision_id, since, limit: since ? 1000 : 100 });
        backlog.forEach(write);
      } catch {
        /* the stream still follows */
      }
      const pending = held;
      held = null;
      pending.forEach(write);
    },
  );

}
