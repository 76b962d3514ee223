import type { ProxyConfig } from '../config/schema.js';
import type { Logger } from '../log.js';
import type { CompiledConfig } from '../rules/compile.js';
import type { Envelope } from '../secrets/envelope.js';
import type { SecretStore } from '../secrets/types.js';
import { ConfigHolder } from './config-holder.js';
import { ProxyMetrics } from './metrics.js';
import { Reloader } from './reload.js';
import { startAdmin, type AdminHandle, type AdminListen } from './server.js';

/**
 * Everything `keygate proxy` runs beside the data path: the configuration holder, metrics, the
 * admin listener and the reloader, wired to one proxy. Kept out of the CLI module so that an
 * embedding (tests, the sandbox API) gets the same behaviour.
 */

/** `--admin HOST:PORT`, `[v6]:PORT` or `unix:/path`. */
export function parseAdminListen(raw: string): AdminListen {
  if (raw.startsWith('unix:')) {
    const p = raw.slice(5);
    if (!p.startsWith('/') && !p.startsWith('.')) throw new Error(`--admin unix: needs a path (got '${raw}')`);
    return { path: p };
  }
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s[\]]+)):(\d{1,5})$/.exec(raw);
  if (!m || Number(m[3]) > 65535) throw new Error(`--admin must be HOST:PORT or unix:/path (got '${raw}')`);
  return { host: m[1] ?? m[2], port: Number(m[3]) };
}

export interface SidecarControlOptions {
  proxy: { setConfig(c: CompiledConfig): void; events: import('node:events').EventEmitter; denyTarget?(authority: string): void; port?: number; caExpiry?(): { daysLeft: number } };
  /** The configuration the proxy was started with. */
  initial: { config: ProxyConfig; compiled: CompiledConfig };
  /** Re-read on SIGHUP and when it changes. */
  configFile?: string;
  store?: SecretStore;
  envelope?: () => Envelope;
  /** Admin listener address and its token (both or neither). */
  admin?: { listen: AdminListen; token: string };
  /** Extra paths whose change triggers a reload (the secret source). */
  watch?: string[];
  /** Watch files at all (SIGHUP works either way). */
  watchFiles?: boolean;
  logger: Logger;
}

export interface SidecarControl {
  holder: ConfigHolder;
  metrics: ProxyMetrics;
  admin?: AdminHandle;
  reloader: Reloader;
  close(): Promise<void>;
}

export async function startSidecarControl(opts: SidecarControlOptions): Promise<SidecarControl> {
  const metrics = new ProxyMetrics();
  const detach = metrics.attach(opts.proxy.events, opts.proxy.caExpiry);
  const holder = new ConfigHolder({ proxy: opts.proxy, store: opts.store, envelope: opts.envelope, metrics, logger: opts.logger });
  holder.markApplied(opts.initial.config, opts.initial.compiled, { source: 'startup' });
  let admin: AdminHandle | undefined;
  if (opts.admin) {
    if ('port' in opts.admin.listen && opts.proxy.port !== undefined && opts.admin.listen.port === opts.proxy.port && opts.admin.listen.port !== 0) {
      throw new Error('the admin listener must not share the proxy port');
    }
    admin = await startAdmin({ listen: opts.admin.listen, token: opts.admin.token, holder, metrics, proxy: opts.proxy, logger: opts.logger });
  }
  const watch = opts.watchFiles === false ? [] : [...(opts.configFile ? [opts.configFile] : []), ...(opts.watch ?? [])];
  const reloader = new Reloader({ holder, configFile: opts.configFile, watch, logger: opts.logger });
  reloader.start({ sighup: true });
  return {
    holder,
    metrics,
    admin,
    reloader,
    async close() {
      await reloader.stop();
      await admin?.close();
      detach();
    },
  };
}
