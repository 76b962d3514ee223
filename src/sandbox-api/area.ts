import { readFileSync } from 'node:fs';
import path from 'node:path';
import { ensureCa, type Ca } from '../certs/ca.js';
import type { ServerContext } from '../server/context.js';
import type { Area } from '../server/plugins.js';
import { registerSandboxRoutes, registerSecretRoutes } from './routes.js';
import { InProcessProxyRunner } from './runner-inprocess.js';
import type { ProxyRunner } from './runner.js';
import { openWorkspaceSecrets } from './secrets.js';
import { SandboxService } from './service.js';
import { SandboxStore } from './storage.js';
import { loadTemplates } from './templates.js';

export interface SandboxAreaOptions {
  /** `host:port` -> address pins for every sandbox proxy's upstream connections. */
  resolve?: ReadonlyMap<string, string>;
  /** Extra PEM CAs the proxies trust for upstream TLS. */
  upstreamCa?: string[];
  /** Replaces the default in-process runner. */
  runner?: (ctx: ServerContext, ca: Ca) => ProxyRunner;
  /** Receives the service once registered (the quick start uses it; tests too). */
  onService?: (service: SandboxService) => void;
}

/**
 * `KEYGATE_SANDBOX_PROXY_RESOLVE=host:port=address[,...]` pins upstream names (curl's --resolve),
 * e.g. an internal API reachable only by address.
 */
export function parseResolveList(value: string | undefined): Map<string, string> {
  const out = new Map<string, string>();
  for (const raw of (value ?? '').split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^(.+:\d{1,5})=(\S+)$/.exec(raw);
    if (!m) throw new Error(`KEYGATE_SANDBOX_PROXY_RESOLVE: '${raw}' is not host:port=address`);
    out.set(m[1].toLowerCase(), m[2].replace(/^\[(.*)\]$/, '$1'));
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
        throw new Error(`KEYGATE_SANDBOX_PROXY_CA_FILE: cannot read ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
      }
    });
}

/** The sandbox API area: `/api/v2/sandboxes/...` and `/api/v1/workspaces/current/secrets`. */
export function createSandboxArea(opts: SandboxAreaOptions = {}): Area {
  return {
    name: 'sandbox-api',
    async register(app, ctx) {
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
        logger: ctx.logger,
      });
      opts.onService?.(service);

      registerSandboxRoutes(app, service);
      registerSecretRoutes(app, service);

      // Before the server listens, every sandbox has its proxy back (same port when it is free).
      app.addHook('onReady', async () => service.restoreAll());
      app.addHook('preClose', async () => service.close());
    },
  };
}

export const sandboxArea: Area = createSandboxArea();
