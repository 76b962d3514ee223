import { lookup } from 'node:dns/promises';
import { readFileSync, unwatchFile, watchFile, type Stats } from 'node:fs';
import path from 'node:path';
import { ensureCa, type Ca } from '../certs/ca.js';
import { formatAuthority, normaliseConfiguredHost, normaliseHost, parseAuthority } from '../rules/host.js';
import { secretsFilePath } from '../secrets/file-store.js';
import type { ServerContext } from '../server/context.js';
import type { Area } from '../server/area.js';
import type { SandboxDriver } from '../sandbox/driver.js';
import { registerExecWebSocket } from './exec-ws.js';
import { DEFAULT_MAX_FILE_BYTES, registerSandboxRoutes, registerSecretRoutes } from './routes.js';
import { InProcessProxyRunner } from './runner-inprocess.js';
import type { ProxyRunner } from './runner.js';
import { openWorkspaceSecrets } from './secrets.js';
import { DEFAULT_MAX_PER_WORKSPACE, SandboxService } from './service.js';
import { SandboxStore } from './storage.js';
import { loadTemplates } from './templates.js';
import { loggableMessage } from '../server/errors.js';
import { intSetting } from '../settings.js';
import { streamHeartbeatMs } from '../server/streams.js';

export interface SandboxAreaOptions {
  /** `host:port` -> address pins for every sandbox proxy's upstream connections. */
  resolve?: ReadonlyMap<string, string>;
  /** Extra PEM CAs the proxies trust for upstream TLS. */
  upstreamCa?: string[];
  /** Replaces the default in-process runner. */
  runner?: (ctx: ServerContext, ca: Ca) => ProxyRunner;
  /** Receives the service once registered (the quick start uses it; tests too). */
  onService?: (service: SandboxService) => void;
  /** Runs the boxes; chosen (and probed) by `keygate serve --sandbox-driver` before the server is built. */
  driver?: SandboxDriver;
}

/** `KEYGATE_SANDBOX_MAX_FILE_BYTES`: the files API's per-request size limit. */
function maxFileBytes(env: NodeJS.ProcessEnv): number {
  return intSetting(env, 'KEYGATE_SANDBOX_MAX_FILE_BYTES', DEFAULT_MAX_FILE_BYTES, { min: 1, unit: 'bytes' });
}

/** `KEYGATE_SANDBOX_MAX_PER_WORKSPACE`: most sandboxes one workspace may hold. */
function maxPerWorkspace(env: NodeJS.ProcessEnv): number {
  return intSetting(env, 'KEYGATE_SANDBOX_MAX_PER_WORKSPACE', DEFAULT_MAX_PER_WORKSPACE, { min: 1 });
}

/** The operator's sandbox settings (environment variables) cannot be used: a start-up error. */
export class SandboxConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SandboxConfigError';
  }
}

/**
 * `KEYGATE_SANDBOX_PROXY_RESOLVE=HOST:PORT:ADDR[,...]` pins upstream names for every sandbox proxy,
 * in curl's --resolve form (the same as `keygate proxy --resolve`), e.g. an internal API reachable
 * only by address. Keys are normalised like the proxy normalises CONNECT targets.
 */
export function parseResolveList(value: string | undefined): Map<string, string> {
  const out = new Map<string, string>();
  for (const raw of (value ?? '').split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^([^:[\]]+):([0-9]{1,5}):(\[[0-9a-fA-F:.]+\]|[^:]+|[0-9a-fA-F:.]+)$/.exec(raw);
    if (!m) throw new SandboxConfigError(`KEYGATE_SANDBOX_PROXY_RESOLVE: '${raw}' is not HOST:PORT:ADDR`);
    try {
      const { host, port } = parseAuthority(`${m[1]}:${m[2]}`, undefined, 'configured');
      out.set(formatAuthority(host, port), normaliseConfiguredHost(m[3]));
    } catch (err) {
      throw new SandboxConfigError(`KEYGATE_SANDBOX_PROXY_RESOLVE: '${raw}': ${(err as Error).message}`);
    }
  }
  return out;
}

/** `KEYGATE_SANDBOX_PROXY_CA_FILE=/path/ca.pem[,...]`: upstream CAs for internal services. */
function readCaFiles(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((f) => {
      try {
        return readFileSync(f, 'utf8');
      } catch (err) {
        throw new SandboxConfigError(`KEYGATE_SANDBOX_PROXY_CA_FILE: cannot read ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
      }
    });
}

/** How often the embedded secrets file is checked for changes made by the CLI. */
export const SECRETS_POLL_MS = 1000;

/** The sandbox API area: `/api/v2/sandboxes/...` and `/api/v1/workspaces/current/secrets`. */
export function createSandboxArea(opts: SandboxAreaOptions = {}): Area {
  return {
    name: 'sandbox-api',
    async register(app, ctx) {
      const driver = opts.driver;
      if (!driver) throw new Error('the sandbox area needs a driver (keygate serve chooses it: --sandbox-driver)');
      const store = new SandboxStore(ctx.db);
      await store.migrate();
      const templates = loadTemplates(ctx.configDir);
      // One CA for every sandbox: boxes trust one certificate, whichever proxy they are given.
      const ca = await ensureCa(path.join(ctx.dataDir, 'ca'));
      const proxyHost = '127.0.0.1';
      const resolve = new Map([...parseResolveList(ctx.env.KEYGATE_SANDBOX_PROXY_RESOLVE), ...(opts.resolve ?? [])]);
      const upstreamCa = [...readCaFiles(ctx.env.KEYGATE_SANDBOX_PROXY_CA_FILE), ...(opts.upstreamCa ?? [])];
      const runner = opts.runner?.(ctx, ca) ?? new InProcessProxyRunner({ ca, logger: ctx.logger, host: proxyHost, resolve, upstreamCa });
      const service = new SandboxService({
        store,
        runner,
        templates,
        openSecrets: (workspaceId) => openWorkspaceSecrets({ dataDir: ctx.dataDir, db: ctx.db, env: ctx.env }, workspaceId),
        envelope: () => ctx.envelope,
        dataDir: ctx.dataDir,
        caCertPem: ca.certPem,
        proxyHost,
        driver,
        logger: ctx.logger,
        maxPerWorkspace: maxPerWorkspace(ctx.env),
      });
      opts.onService?.(service);

      registerSandboxRoutes(app, service, { maxFileBytes: maxFileBytes(ctx.env) });
      await registerExecWebSocket(app, service, { heartbeatMs: streamHeartbeatMs(ctx.env) });
      registerSecretRoutes(app, service);

      // The API answers at once; boxes read `provisioning` until the background restore has
      // brought each back (its proxy on the same port when free, its box restarted by the driver).
      app.addHook('onReady', async () => service.prepareRestore());
      app.addHook('onListen', async () => service.restoreInBackground());
      app.addHook('preClose', async () => service.close());
      // The API's own address is known only once it listens; proxies restored before then get it now.
      app.addHook('onListen', async () => {
        const url = ctx.publicUrl();
        if (!url) return;
        const { port } = new URL(url);
        for (const host of ['127.0.0.1', 'localhost', '[::1]']) service.denyToAll(`${host}:${port}`);
      });
      // keygate's own PostgreSQL is keygate too (sandbox.md, property 3): no box talks to it
      // through its proxy, by name or by any address the name has now.
      if (ctx.db.kind === 'postgres' && ctx.env.DATABASE_URL) {
        const db = databaseAuthority(ctx.env.DATABASE_URL);
        if (db) {
          service.denyToAll(formatAuthority(db.host, db.port));
          app.addHook('onReady', async () => {
            const answers = await lookup(db.host, { all: true }).catch(() => []);
            for (const a of answers) service.denyToAll(formatAuthority(a.address, db.port));
          });
        }
      }

      if (ctx.db.kind === 'sqlite') {
        // The embedded secrets file is shared with `keygate secrets set/delete`, which another
        // process runs: poll it (rename-safe, unlike fs.watch) and re-push the configurations of
        // sandboxes using secrets when it changes, so a rotation from the CLI applies too.
        const file = secretsFilePath(ctx.dataDir);
        const onChange = (cur: Stats, prev: Stats) => {
          if (cur.mtimeMs === prev.mtimeMs && cur.ino === prev.ino && cur.size === prev.size) return;
          service.secretsFileChanged().catch((err: Error) => ctx.logger.error({ err: { message: loggableMessage(err) } }, 're-applying sandbox configurations failed'));
        };
        app.addHook('onReady', async () => {
          watchFile(file, { interval: SECRETS_POLL_MS, persistent: false }, onChange);
        });
        app.addHook('preClose', async () => {
          unwatchFile(file, onChange);
        });
      }
    },
  };
}

/** The area as loadAreas() lists it; `keygate serve` and `keygate start` replace it with one that has their driver. */
export const sandboxArea: Area = createSandboxArea();

/** The TCP host and port of a `postgres://` URL (default port 5432), or null for a unix socket or a URL that does not parse. */
export function databaseAuthority(url: string): { host: string; port: number } | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return null;
  }
  if (!u.hostname || u.hostname.startsWith('%2F')) return null;
  try {
    return { host: normaliseHost(u.hostname), port: u.port ? Number(u.port) : 5432 };
  } catch {
    return null;
  }
}
