import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createLogger, type Logger } from '../log.js';
import { ensureCa, type Ca } from '../certs/ca.js';
import { ConfigFileError, loadProxyConfigFile, readSecretsFile } from '../config/load.js';
import type { CompiledConfig } from '../rules/compile.js';
import { formatAuthority, normaliseHost, parseAuthority } from '../rules/host.js';
import { startProxy, type ProxyHandle } from '../proxy/server.js';
import { CliError } from './errors.js';

const USAGE = `usage: keygate proxy --config FILE [--listen HOST:PORT] [--certs DIR] [--secrets FILE]
                     [--resolve HOST:PORT:ADDR]... [--upstream-ca FILE]... [--grace SECONDS]

  --config FILE        proxy_config JSON ({"rules": [...], "no_proxy": [...]})
  --listen HOST:PORT   proxy address (default 127.0.0.1:8080; port 0 picks a free one)
  --certs DIR          CA directory: ca.pem, ca-key.pem (created on first run; default ./certs)
  --secrets FILE       JSON object {"KEY": "value"} resolving {KEY} templates
  --resolve H:P:ADDR   dial ADDR for host H port P (like curl --resolve); repeatable
  --upstream-ca FILE   extra CA (PEM) trusted for upstream TLS; repeatable
  --grace SECONDS      on SIGTERM/SIGINT, time in-flight requests get to finish (default 10)`;

export interface ProxyCliOptions {
  config: string;
  listen: { host: string; port: number };
  certs: string;
  secrets?: string;
  resolve: Map<string, string>;
  upstreamCa: string[];
  graceMs: number;
}

function parseListen(raw: string): { host: string; port: number } {
  const m = /^(\[[^\]]+\]|[^:]+):([0-9]{1,5})$/.exec(raw);
  if (!m || Number(m[2]) > 65535) throw new CliError(`--listen must be HOST:PORT (got '${raw}')`, 2);
  return { host: m[1].replace(/^\[|\]$/g, ''), port: Number(m[2]) };
}

/** `HOST:PORT:ADDR` (ADDR may be a bracketed IPv6 address) -> map key `host:port`, address. */
export function parseResolve(raw: string): [string, string] {
  const m = /^([^:[\]]+):([0-9]{1,5}):(\[[0-9a-fA-F:.]+\]|[^:]+|[0-9a-fA-F:.]+)$/.exec(raw);
  if (!m) throw new CliError(`--resolve must be HOST:PORT:ADDR (got '${raw}')`, 2);
  try {
    const { host, port } = parseAuthority(`${m[1]}:${m[2]}`, undefined);
    return [formatAuthority(host, port), normaliseHost(m[3])];
  } catch (err) {
    throw new CliError(`--resolve '${raw}': ${(err as Error).message}`, 2);
  }
}

export function parseProxyArgs(argv: string[]): ProxyCliOptions | 'help' {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        config: { type: 'string' },
        listen: { type: 'string', default: '127.0.0.1:8080' },
        certs: { type: 'string', default: './certs' },
        secrets: { type: 'string' },
        resolve: { type: 'string', multiple: true, default: [] },
        'upstream-ca': { type: 'string', multiple: true, default: [] },
        grace: { type: 'string', default: '10' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (err) {
    throw new CliError(`${(err as Error).message}\n${USAGE}`, 2);
  }
  if (values.help) return 'help';
  if (!values.config) throw new CliError(`--config FILE is required\n${USAGE}`, 2);
  const grace = Number(values.grace);
  if (!Number.isFinite(grace) || grace < 0) throw new CliError('--grace must be a number of seconds', 2);
  return {
    config: values.config,
    listen: parseListen(values.listen!),
    certs: values.certs!,
    secrets: values.secrets,
    resolve: new Map(values.resolve!.map(parseResolve)),
    upstreamCa: values['upstream-ca']!,
    graceMs: grace * 1000,
  };
}

/** Where `{KEY}` values come from. The secrets engineer adds the data-directory store here. */
export function secretLookup(opts: ProxyCliOptions): (key: string) => string | undefined {
  if (!opts.secrets) return () => undefined;
  const secrets = readSecretsFile(opts.secrets);
  return (key) => secrets.get(key);
}

/** Reads, validates, resolves and compiles the configuration: start-up and every reload. */
export function loadAndCompile(opts: ProxyCliOptions): CompiledConfig {
  return loadProxyConfigFile(opts.config, secretLookup(opts)).compiled;
}

export interface RunningProxy {
  handle: ProxyHandle;
  ca: Ca;
  logger: Logger;
  /** Re-reads configuration and secrets and swaps them in; throws (old config kept) if invalid. */
  reload(): void;
}

/** Starts the sidecar from parsed options (the part `run` and future hooks share). */
export async function startFromOptions(opts: ProxyCliOptions, logger: Logger = createLogger({ name: 'keygate-proxy' })): Promise<RunningProxy> {
  let compiled: CompiledConfig;
  try {
    compiled = loadAndCompile(opts);
  } catch (err) {
    if (err instanceof ConfigFileError) throw new CliError(err.message);
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
  let handle: ProxyHandle;
  try {
    handle = await startProxy({ listen: opts.listen, ca, config: compiled, logger, resolve: opts.resolve, upstreamCa });
  } catch (err) {
    throw new CliError(`cannot listen on ${formatAuthority(opts.listen.host, opts.listen.port)}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  return {
    handle,
    ca,
    logger,
    reload() {
      handle.setConfig(loadAndCompile(opts));
    },
  };
}

/** Resolves on the first SIGTERM or SIGINT. */
function shutdownSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const on = (sig: NodeJS.Signals) => {
      process.off('SIGTERM', on);
      process.off('SIGINT', on);
      resolve(sig);
    };
    process.on('SIGTERM', on);
    process.on('SIGINT', on);
  });
}

export async function run(argv: string[]): Promise<number> {
  const opts = parseProxyArgs(argv);
  if (opts === 'help') {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  const signal = shutdownSignal();
  const running = await startFromOptions(opts);
  const { handle, logger, ca } = running;
  const rules = handle.getConfig().rules.map((r) => r.name);
  logger.info({ url: handle.url, ca: ca.certPath, rules }, `listening on ${formatAuthority(handle.host, handle.port)}`);
  const sig = await signal;
  logger.info({ signal: sig, grace_ms: opts.graceMs }, 'shutting down: no new connections, waiting for requests in flight');
  await handle.close(opts.graceMs);
  logger.info('stopped');
  return 0;
}
