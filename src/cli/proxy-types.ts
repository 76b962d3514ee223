/**
 * The shapes `keygate proxy` (proxy.ts) and its `--workers` supervisor (proxy-cluster.ts) share.
 * In a module of their own so that neither of the two imports the other: proxy.ts loads
 * proxy-cluster.ts lazily and hands it its start and stop functions.
 */
import type { parseAdminListen, SidecarControl } from '../admin/sidecar.js';
import type { Ca } from '../certs/ca.js';
import type { ProxyConfig } from '../config/schema.js';
import type { Logger } from '../log.js';
import type { ProxyHandle } from '../proxy/server.js';
import type { ProxyLimits } from '../proxy/limits.js';
import type { CompiledConfig } from '../rules/compile.js';
import type { Envelope } from '../secrets/envelope.js';
import type { SecretStore } from '../secrets/store.js';

export interface ProxyCliOptions {
  config: string;
  listen: { host: string; port: number };
  certs: string;
  secrets?: string;
  resolve: Map<string, string>;
  upstreamCa: string[];
  graceMs: number;
  data?: string;
  secretsDir?: string;
  workspace?: string;
  admin?: ReturnType<typeof parseAdminListen>;
  watch: boolean;
  /** --limit flags (the rest keep their defaults). */
  limits?: Partial<ProxyLimits>;
  /** --workers: processes sharing the port (1 or absent: today's single process). */
  workers?: number;
}

export interface RunningProxy {
  handle: ProxyHandle;
  ca: Ca;
  logger: Logger;
  /** Holder, metrics, admin listener and reloader (SIGHUP, file changes). */
  control: SidecarControl;
}

export interface PreparedStart {
  store: SecretStore;
  envelope: () => Envelope;
  initial: { config: ProxyConfig; compiled: CompiledConfig };
  ca: Ca;
  upstreamCa: string[];
}
