import { compileCandidate, validateCandidate } from '../config/prepare.js';
import { referencedSecretKeys } from '../config/resolve.js';
import type { ProxyConfig } from '../config/schema.js';
import type { Logger } from '../log.js';
import type { CompiledConfig } from '../rules/compile.js';
import type { Envelope } from '../secrets/envelope.js';
import { isSecretKey } from '../secrets/keys.js';
import { opaqueOpener, redactProxyConfig } from '../secrets/opaque.js';
import type { SecretStore } from '../secrets/types.js';
import { ValidationFailure, type ValidationIssue } from '../validation/errors.js';
import type { ProxyMetrics } from './metrics.js';
import { loggableMessage } from '../server/errors.js';

/**
 * The proxy's configuration lifecycle: every candidate (pushed on the admin API, re-read on
 * SIGHUP or a file change) is validated, resolved against its secrets and compiled BEFORE the
 * proxy sees it; only a configuration that passed all three replaces the one in force, with one
 * atomic `setConfig` (requests already started keep the snapshot they took). Anything wrong
 * leaves the old configuration in force and is reported with exact locations.
 */

/** A configuration could not be applied for a reason other than its content (e.g. the secret store is unreadable). */
export class ConfigApplyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigApplyError';
  }
}

export interface AppliedConfig {
  generation: number;
  /** The configuration as an API may show it: templates, plaintext, opaque values omitted. */
  proxy_config: ProxyConfig;
  applied_at: string;
  source: string;
}

export interface ConfigHolderOptions {
  proxy: { setConfig(config: CompiledConfig): void };
  /** The proxy's own secret store, for `{KEY}` templates when a push brings no secrets. */
  store?: SecretStore;
  /** Opens sealed opaque values; called only when a configuration holds one. */
  envelope?: () => Envelope;
  metrics?: ProxyMetrics;
  logger?: Logger;
}

export interface ApplyOptions {
  /** Where it came from, for logs, metrics and GET /config: `push`, `sighup`, `file`, `startup`. */
  source: string;
  /** Values for `{KEY}` templates; when absent the store resolves them. */
  secrets?: ReadonlyMap<string, string>;
  /** Prefix for issue locations (`['body']`, `['body','proxy_config']`). */
  locPrefix?: (string | number)[];
}

export class ConfigHolder {
  private applied: AppliedConfig | undefined;
  /** Last applied configuration and its pushed secrets, for re-applying. */
  private last: { config: ProxyConfig; secrets?: ReadonlyMap<string, string> } | undefined;
  private generationCounter = 0;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly opts: ConfigHolderOptions) {}

  get generation(): number {
    return this.applied?.generation ?? 0;
  }

  current(): AppliedConfig | undefined {
    return this.applied;
  }

  /**
   * Validates, resolves and compiles without applying. Throws ValidationFailure (content) or
   * ConfigApplyError (the secret store failed).
   */
  async prepare(candidate: unknown, opts: ApplyOptions): Promise<{ config: ProxyConfig; compiled: CompiledConfig }> {
    const prefix = opts.locPrefix ?? [];
    const config = validateCandidate(candidate, prefix);
    let secrets = opts.secrets;
    if (!secrets && referencedSecretKeys(config).length > 0) {
      if (!this.opts.store) secrets = new Map();
      else {
        try {
          secrets = await this.opts.store.snapshot();
        } catch (err) {
          // Store errors name files and keys, never values.
          throw new ConfigApplyError(`cannot read the secret store (${this.opts.store.description}): ${loggableMessage(err)}`);
        }
      }
    }
    // The key is loaded only for a sealed value: a proxy without any never touches the data directory.
    const envelopeOf = this.opts.envelope;
    const compiled = compileCandidate(config, (key) => secrets?.get(key), envelopeOf ? { openOpaque: (stored) => opaqueOpener(envelopeOf())(stored) } : {}, prefix);
    return { config, compiled };
  }

  /** Prepares and, if good, swaps the proxy's configuration. Applies are serialised: generations follow swap order. */
  apply(candidate: unknown, opts: ApplyOptions): Promise<AppliedConfig> {
    const run = async () => {
      let prepared;
      try {
        prepared = await this.prepare(candidate, opts);
      } catch (err) {
        this.opts.metrics?.recordApply(opts.source, 'rejected');
        this.opts.logger?.warn(
          { source: opts.source, issues: err instanceof ValidationFailure ? err.issues.map((i) => ({ loc: i.loc, msg: i.msg })) : undefined, reason: err instanceof ValidationFailure ? undefined : (err as Error).message },
          'configuration rejected; the previous one stays in force',
        );
        throw err;
      }
      return this.install(prepared.config, prepared.compiled, opts);
    };
    const result = this.queue.then(run, run);
    this.queue = result.catch(() => undefined);
    return result;
  }

  /** Records a configuration the caller already compiled and gave to the proxy (start-up). */
  markApplied(config: ProxyConfig, compiled: CompiledConfig, opts: ApplyOptions): AppliedConfig {
    return this.install(config, compiled, opts, false);
  }

  /**
   * Re-applies the last configuration with fresh secrets from the store (a secret rotated, no
   * config file to re-read). Pushed secrets stay what they were.
   */
  reapply(source: string): Promise<AppliedConfig> {
    if (!this.last) return Promise.reject(new ConfigApplyError('no configuration has been applied yet'));
    return this.apply(this.last.config, { source, secrets: this.last.secrets });
  }

  private install(config: ProxyConfig, compiled: CompiledConfig, opts: ApplyOptions, swap = true): AppliedConfig {
    if (swap) this.opts.proxy.setConfig(compiled);
    // Kept as given (opaque values in clear, like the resolved configuration the proxy holds):
    // memory only, never returned or logged.
    this.last = { config: structuredClone(config), secrets: opts.secrets };
    const applied: AppliedConfig = {
      generation: ++this.generationCounter,
      proxy_config: redactProxyConfig(config),
      applied_at: new Date().toISOString(),
      source: opts.source,
    };
    this.applied = applied;
    this.opts.metrics?.recordApply(opts.source, 'applied', applied.generation);
    this.opts.logger?.info({ source: opts.source, generation: applied.generation, rules: compiled.rules.length }, 'configuration applied');
    return applied;
  }
}

/**
 * Splits a `PUT /config` body: either a proxy_config object, or
 * `{"proxy_config": {...}, "secrets": {"KEY": "value"}}`. Issues are located under `body`.
 *
 * A secret's name is a map key, so its issue's `loc` names it (as FastAPI locates a dict entry):
 * names are not secret (the APIs list them; messages about templates name them), and only the
 * caller sees its own request's names (this answer is not logged). Values never appear: an issue
 * about one says what is wrong with it at its `loc`, never what it is.
 */
export function parseConfigPush(body: unknown): { config: unknown; secrets?: Map<string, string>; locPrefix: (string | number)[] } {
  if (!body || typeof body !== 'object' || Array.isArray(body)) {
    throw new ValidationFailure([{ loc: ['body'], msg: 'Input should be a valid dictionary', type: 'dict_type' }]);
  }
  const b = body as Record<string, unknown>;
  if (!Object.prototype.hasOwnProperty.call(b, 'proxy_config')) return { config: body, locPrefix: ['body'] };
  const issues: ValidationIssue[] = [];
  for (const k of Object.keys(b)) {
    if (k !== 'proxy_config' && k !== 'secrets') issues.push({ loc: ['body', k], msg: 'Extra inputs are not permitted', type: 'extra_forbidden' });
  }
  let secrets: Map<string, string> | undefined;
  if (b.secrets !== undefined) {
    if (!b.secrets || typeof b.secrets !== 'object' || Array.isArray(b.secrets)) {
      issues.push({ loc: ['body', 'secrets'], msg: 'Input should be a valid dictionary of secret names to string values', type: 'dict_type' });
    } else {
      secrets = new Map();
      for (const [k, v] of Object.entries(b.secrets as Record<string, unknown>)) {
        if (!isSecretKey(k)) issues.push({ loc: ['body', 'secrets', k.slice(0, 140)], msg: 'Invalid secret name: letters, digits and _, not starting with a digit, at most 128 characters', type: 'value_error' });
        else if (typeof v !== 'string') issues.push({ loc: ['body', 'secrets', k], msg: 'Input should be a valid string', type: 'string_type' });
        else secrets.set(k, v);
      }
    }
  }
  if (issues.length) throw new ValidationFailure(issues);
  return { config: b.proxy_config, secrets, locPrefix: ['body', 'proxy_config'] };
}
