import { existsSync, readFileSync } from '../builtins/fs.js';
import { createLogger, type Logger } from '../log.js';
import { ensureCa, type Ca } from '../certs/ca.js';
import { availableParallelism } from 'node:os';
import path from 'node:path';
import { parseAdminListen, startSidecarControl, type SidecarControl } from '../admin/sidecar.js';
import { resolveAdminToken } from '../admin/server.js';
import { ConfigFileError, readProxyConfigFile } from '../config/load.js';
import type { ProxyConfig } from '../config/schema.js';
import { ConfigApplyError, ConfigHolder } from '../admin/config-holder.js';
import { EnvelopeError } from '../secrets/envelope.js';
import { loadKeyring } from '../secrets/keyring.js';
import { secretsFilePath } from '../secrets/file-store.js';
import { openSecretStore, ReadOnlyStoreError, SecretStoreError, type SecretStore } from '../secrets/store.js';
import { formatLoc, ValidationFailure } from '../validation/errors.js';
import { resolveDataDir } from './data-dir.js';
import type { CompiledConfig } from '../rules/compile.js';
import { formatAuthority, normaliseConfiguredHost, parseAuthority } from '../rules/host.js';
import { startProxy, type ProxyHandle } from '../proxy/server.js';
import { LIMIT_KEYS, parseLimitFlag, type ProxyLimits } from '../proxy/limits.js';
import { parseCliArgs } from './args.js';
import { listenFailure, parseListen } from './listen.js';
import type { PreparedStart, ProxyCliOptions, RunningProxy } from './proxy-types.js';
import { CliError } from './errors.js';
import { untilShutdown } from './shutdown.js';
import { releaseOptimizer } from './v8-flags.js';
import { serverReady } from '../proxy/idle-gc.js';

const USAGE = `usage: keygate proxy --config FILE [--listen HOST:PORT] [--certs DIR] [--secrets FILE]
                     [--resolve HOST:PORT:ADDR]... [--upstream-ca FILE]... [--grace SECONDS]
                     [--data DIR] [--secrets-dir DIR] [--workspace ID]
                     [--admin HOST:PORT | --admin unix:/path] [--no-watch] [--limit KEY=VALUE]...
                     [--workers N|auto]

  --config FILE        proxy_config JSON ({"rules": [...], "no_proxy": [...]})
  --listen HOST:PORT   proxy address (default 127.0.0.1:3128; port 0 picks a free one)
  --certs DIR          CA directory: ca.pem, ca-key.pem (created on first run; default ./certs)
  --secrets FILE       JSON object {"KEY": "value"} resolving {KEY} templates
  --secrets-dir DIR    one file per key (a Kubernetes secret volume) resolving {KEY} templates
  --data DIR           data directory: without --secrets/--secrets-dir, {KEY} templates resolve from
                       its encrypted store (keygate secrets set); opaque values sealed with its master
                       key are decrypted; the generated admin token lives here (default:
                       KEYGATE_DATA_DIR, else ./data)
  --workspace ID       workspace of the data directory's store (default: default)
  --admin ADDR         admin listener (HOST:PORT or unix:/path, never the proxy port): PUT/GET /config,
                       /healthz, /readyz, /metrics; Authorization: Bearer <KEYGATE_ADMIN_TOKEN, else
                       the token generated into <data>/admin.token>
  --no-watch           do not re-read the config and secrets when they change (SIGHUP still does)
  --resolve H:P:ADDR   dial ADDR for host H port P (like curl --resolve); repeatable
  --upstream-ca FILE   extra CA (PEM) trusted for upstream TLS; repeatable
  --grace SECONDS      on SIGTERM/SIGINT, time in-flight requests get to finish (default 10)
  --limit KEY=VALUE    a size, count or timeout (docs/hardening.md); repeatable. Keys:
                       ${Object.keys(LIMIT_KEYS).join(', ')}
  --workers N|auto     worker processes sharing the listening port (default 1: one process; auto: one
                       per CPU). Each worker is a complete proxy with these flags; a crashed worker is
                       replaced. Not with --admin for now (each worker has its own config and metrics)`;

/** `HOST:PORT:ADDR` (ADDR may be a bracketed IPv6 address) -> map key `host:port`, address. */
export function parseResolve(raw: string): [string, string] {
  const m = /^([^:[\]]+):([0-9]{1,5}):(\[[0-9a-fA-F:.]+\]|[^:]+|[0-9a-fA-F:.]+)$/.exec(raw);
  if (!m) throw new CliError(`--resolve must be HOST:PORT:ADDR (got '${raw}')`, 2);
  try {
    const { host, port } = parseAuthority(`${m[1]}:${m[2]}`, undefined, 'configured');
    return [formatAuthority(host, port), normaliseConfiguredHost(m[3])];
  } catch (err) {
    throw new CliError(`--resolve '${raw}': ${(err as Error).message}`, 2);
  }
}

function parseAdmin(raw: string | undefined): ProxyCliOptions['admin'] {
  if (raw === undefined) return undefined;
  try {
    return parseAdminListen(raw);
  } catch (err) {
    throw new CliError((err as Error).message, 2);
  }
}

/** Upper bound for --workers: far beyond any core count, low enough that a typo cannot fork-bomb the host. */
export const MAX_WORKERS = 256;

/** `--workers N|auto` -> a process count (auto: os.availableParallelism()). */
export function parseWorkers(raw: string): number {
  if (raw === 'auto') return Math.min(Math.max(availableParallelism(), 1), MAX_WORKERS);
  if (!/^[0-9]+$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_WORKERS) {
    throw new CliError(`--workers must be a whole number from 1 to ${MAX_WORKERS}, or auto (got '${raw}')`, 2);
  }
  return Number(raw);
}

// ---- --limit (hardening: sizes, counts, timeouts) ----
/** `--limit KEY=VALUE`, repeatable; a later flag for the same key wins. */
export function parseLimitFlags(raw: string[]): Partial<ProxyLimits> {
  const out: Partial<ProxyLimits> = {};
  for (const r of raw) {
    try {
      const [field, value] = parseLimitFlag(r);
      out[field] = value;
    } catch (err) {
      throw new CliError((err as Error).message, 2);
    }
  }
  return out;
}

export function parseProxyArgs(argv: string[]): ProxyCliOptions | 'help' {
  const { values } = parseCliArgs(
    {
      args: argv,
      options: {
        config: { type: 'string' },
        listen: { type: 'string', default: '127.0.0.1:3128' },
        certs: { type: 'string', default: './certs' },
        secrets: { type: 'string' },
        resolve: { type: 'string', multiple: true, default: [] },
        'upstream-ca': { type: 'string', multiple: true, default: [] },
        grace: { type: 'string', default: '10' },
        data: { type: 'string' },
        'secrets-dir': { type: 'string' },
        workspace: { type: 'string' },
        admin: { type: 'string' },
        'no-watch': { type: 'boolean', default: false },
        limit: { type: 'string', multiple: true, default: [] },
        workers: { type: 'string', default: '1' },
        help: { type: 'boolean', short: 'h' },
      },
      allowPositionals: false,
    },
    USAGE,
  );
  if (values.help) return 'help';
  if (!values.config) throw new CliError(`--config FILE is required\n${USAGE}`, 2);
  const grace = Number(values.grace);
  if (!Number.isFinite(grace) || grace < 0) throw new CliError('--grace must be a number of seconds', 2);
  const workers = parseWorkers(values.workers!);
  // The admin API holds one configuration generation, one set of metrics and one health state per
  // process; with several workers it would answer for whichever worker it reached. Refused for
  // 'auto' too, so that a command line does not work on one machine and fail on a bigger one.
  if (values.admin !== undefined && (workers > 1 || values.workers === 'auto')) {
    throw new CliError('--admin needs --workers 1 for now (each worker process would hold its own configuration, metrics and health)', 2);
  }
  return {
    config: values.config,
    listen: parseListen(values.listen!),
    certs: values.certs!,
    secrets: values.secrets,
    resolve: new Map(values.resolve!.map(parseResolve)),
    upstreamCa: values['upstream-ca']!,
    graceMs: grace * 1000,
    data: values.data,
    secretsDir: values['secrets-dir'],
    workspace: values.workspace,
    admin: parseAdmin(values.admin),
    watch: !values['no-watch'],
    limits: parseLimitFlags(values.limit!),
    workers,
  };
}

/** The data directory as given (`--data`, KEYGATE_DATA_DIR, ./data), created only when used. */
function dataDirOf(opts: ProxyCliOptions): string {
  return path.resolve(opts.data ?? process.env.KEYGATE_DATA_DIR ?? 'data');
}

/**
 * Where `{KEY}` values come from: `--secrets FILE`, `--secrets-dir DIR` (or KEYGATE_SECRETS_FILE /
 * KEYGATE_SECRETS_DIR), else the data directory's encrypted store. Opened on first use, so a
 * configuration without templates never touches the data directory.
 */
export function proxySecretStore(opts: ProxyCliOptions): SecretStore {
  let opened: Promise<SecretStore> | undefined;
  const open = () =>
    (opened ??= openSecretStore({
      dataDir: opts.secrets || opts.secretsDir ? dataDirOf(opts) : resolveDataDir(opts.data),
      secretsFile: opts.secrets,
      secretsDir: opts.secretsDir,
      workspaceId: opts.workspace,
    }));
  const describe = opts.secrets ? `JSON file ${path.resolve(opts.secrets)}` : opts.secretsDir ? `directory ${path.resolve(opts.secretsDir)}` : process.env.KEYGATE_SECRETS_FILE ? `JSON file ${path.resolve(process.env.KEYGATE_SECRETS_FILE)}` : process.env.KEYGATE_SECRETS_DIR ? `directory ${path.resolve(process.env.KEYGATE_SECRETS_DIR)}` : `encrypted file ${secretsFilePath(dataDirOf(opts))}`;
  return {
    description: describe,
    writable: false,
    get: async (k) => (await open()).get(k),
    list: async () => (await open()).list(),
    snapshot: async () => (await open()).snapshot(),
    // The proxy only reads; secrets are managed with `keygate secrets` or where they come from.
    set: async () => {
      throw new ReadOnlyStoreError(describe);
    },
    delete: async () => {
      throw new ReadOnlyStoreError(describe);
    },
  };
}

/** What to watch for secret changes (the file or directory the store reads). */
function secretSourcePaths(opts: ProxyCliOptions): string[] {
  if (opts.secrets) return [opts.secrets];
  if (opts.secretsDir) return [opts.secretsDir];
  if (process.env.KEYGATE_SECRETS_FILE) return [process.env.KEYGATE_SECRETS_FILE];
  if (process.env.KEYGATE_SECRETS_DIR) return [process.env.KEYGATE_SECRETS_DIR];
  // The data directory's store: watched only when the directory exists (a proxy without
  // templates never creates it).
  return existsSync(dataDirOf(opts)) ? [secretsFilePath(dataDirOf(opts))] : [];
}

/** Reads, validates, resolves and compiles the configuration file (start-up; reloads go through the holder the same way). */
export async function loadAndCompile(opts: ProxyCliOptions, holder: ConfigHolder): Promise<{ config: ProxyConfig; compiled: CompiledConfig }> {
  const config = readProxyConfigFile(opts.config);
  try {
    return await holder.prepare(config, { source: 'startup' });
  } catch (err) {
    if (err instanceof ValidationFailure) {
      throw new ConfigFileError(`invalid proxy configuration ${opts.config}:\n${err.issues.map((i) => `  ${i.loc.length ? formatLoc(i.loc) : '(root)'}: ${i.msg}`).join('\n')}`, err.issues);
    }
    throw err;
  }
}

/**
 * Everything start-up checks before listening: the configuration (validated, secrets resolved,
 * compiled), the CA (created on first run) and the --upstream-ca files. Each failure is a one-line
 * CliError naming files, keys and locations, never a value. `keygate proxy --workers N` runs it in
 * the primary before forking, so a bad configuration fails once, and workers never race to create the CA.
 */
export async function prepareStart(opts: ProxyCliOptions): Promise<PreparedStart> {
  const store = proxySecretStore(opts);
  // Opaque values sealed by keygate (a config file it wrote) open with the data directory's key.
  const envelope = () => loadKeyring(resolveDataDir(opts.data)).envelope;
  const checker = new ConfigHolder({ proxy: { setConfig: () => undefined }, store, envelope });
  let initial: { config: ProxyConfig; compiled: CompiledConfig };
  try {
    initial = await loadAndCompile(opts, checker);
  } catch (err) {
    if (err instanceof ConfigFileError || err instanceof ConfigApplyError || err instanceof SecretStoreError || err instanceof EnvelopeError) throw new CliError(err.message);
    throw err;
  }
  let ca: Ca;
  try {
    ca = await ensureCa(opts.certs);
  } catch (err) {
    throw new CliError(`certificate authority in ${opts.certs}: ${(err as Error).message}`);
  }
  const upstreamCa = opts.upstreamCa.map((f) => {
    try {
      return readFileSync(f, 'utf8');
    } catch (err) {
      throw new CliError(`cannot read --upstream-ca ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  });
  return { store, envelope, initial, ca, upstreamCa };
}

/** Starts the sidecar from parsed options (the part `run` and future hooks share). */
export async function startFromOptions(opts: ProxyCliOptions, logger: Logger = createLogger({ name: 'keygate-proxy' })): Promise<RunningProxy> {
  const { store, envelope, initial, ca, upstreamCa } = await prepareStart(opts);
  const compiled = initial.compiled;
  let handle: ProxyHandle;
  try {
    handle = await startProxy({ listen: opts.listen, ca, config: compiled, logger, resolve: opts.resolve, upstreamCa, limits: opts.limits });
  } catch (err) {
    throw listenFailure(opts.listen.host, opts.listen.port, err);
  }
  let control: SidecarControl;
  try {
    const admin = opts.admin ? { listen: opts.admin, token: resolveAdminToken(dataDirOf(opts)).token } : undefined;
    control = await startSidecarControl({
      proxy: handle,
      initial,
      configFile: opts.config,
      store,
      envelope,
      admin,
      watch: secretSourcePaths(opts),
      watchFiles: opts.watch,
      logger,
    });
  } catch (err) {
    await handle.close(0);
    throw new CliError(`admin listener: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  if (control.admin) {
    const tokenSource = process.env.KEYGATE_ADMIN_TOKEN?.trim() ? 'KEYGATE_ADMIN_TOKEN' : path.join(dataDirOf(opts), 'admin.token');
    logger.info({ admin: control.admin.url, token_from: tokenSource }, `admin listener on ${control.admin.url}`);
  }
  // Started: the optimizing compiler is for the requests from here on (v8-flags.ts).
  releaseOptimizer();
  serverReady(); // started: start-up's garbage and bytecode go once it is quiet (idle-gc.ts)
  return { handle, ca, logger, control };
}

/** Stops accepting, lets requests in flight finish within --grace, stops the control side. */
export async function stopRunning(running: RunningProxy, opts: ProxyCliOptions, signal: string): Promise<void> {
  const { handle, logger } = running;
  logger.info({ signal, grace_ms: opts.graceMs }, 'shutting down: no new connections, waiting for requests in flight');
  await running.control.close();
  await handle.close(opts.graceMs);
  logger.info('stopped');
}

export async function run(argv: string[]): Promise<number> {
  const opts = parseProxyArgs(argv);
  if (opts === 'help') {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  // Loaded only when used: a single-process sidecar (the default) never loads node:cluster. Workers
  // run with the primary's arguments, so they take this branch too.
  if ((opts.workers ?? 1) > 1) {
    const cluster = await import('./proxy-cluster.js');
    if (cluster.isWorkerProcess()) return cluster.runWorker(opts, { start: startFromOptions, stop: stopRunning });
    return cluster.runPrimary(opts, opts.workers ?? 1, prepareStart);
  }
  const signal = untilShutdown((sig) => process.stderr.write(`keygate proxy: ${sig} again: still draining (a second Ctrl-C exits now)\n`));
  const running = await startFromOptions(opts);
  const { handle, logger, ca } = running;
  const rules = handle.getConfig().rules.map((r) => r.name);
  logger.info({ url: handle.url, ca: ca.certPath, rules }, `listening on ${formatAuthority(handle.host, handle.port)}`);
  logger.flush(); // what supervisors and scripts wait for: not held back by the log batching
  await stopRunning(running, opts, await signal);
  return 0;
}
