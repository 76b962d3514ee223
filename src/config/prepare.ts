import { compileConfig, type CompiledConfig } from '../rules/compile.js';
import { ValidationFailure, type ValidationIssue } from '../validation/errors.js';
import { resolveProxyConfig, type ResolveOptions } from './resolve.js';
import { validateProxyConfig, type ProxyConfig } from './schema.js';

/**
 * The one path from a candidate proxy_config to what the proxy runs: validate, resolve, compile.
 * Every source of configuration (a file at start-up or reload, an admin push) takes it, so a
 * configuration is judged the same way wherever it comes from. Problems are one
 * ValidationFailure with every issue located under `locPrefix`; a pattern that validation let
 * through and compilation refuses is the content's fault too, reported the same way.
 *
 * Validation comes first on its own (`validateCandidate`) because a caller may need the valid
 * configuration to know which secrets to fetch before resolving (`compileCandidate`).
 */

const prefixed = (issues: ValidationIssue[], prefix: (string | number)[]) => (prefix.length ? issues.map((i) => ({ ...i, loc: [...prefix, ...i.loc] })) : issues);

/** Validates a candidate against the schema; throws ValidationFailure (locations under `locPrefix`). */
export function validateCandidate(candidate: unknown, locPrefix: (string | number)[] = []): ProxyConfig {
  const issues = validateProxyConfig(candidate);
  if (issues.length) throw new ValidationFailure(prefixed(issues, locPrefix));
  return candidate as ProxyConfig;
}

/** Resolves a validated configuration against its secrets and compiles it; throws ValidationFailure. */
export function compileCandidate(config: ProxyConfig, lookup: (key: string) => string | undefined, opts: ResolveOptions = {}, locPrefix: (string | number)[] = []): CompiledConfig {
  try {
    return compileConfig(resolveProxyConfig(config, lookup, opts));
  } catch (err) {
    if (err instanceof ValidationFailure) throw new ValidationFailure(prefixed(err.issues, locPrefix));
    throw new ValidationFailure([{ loc: locPrefix, msg: `Configuration cannot be compiled: ${(err as Error).message}`, type: 'value_error' }]);
  }
}

/** Validate, resolve and compile in one call. */
export function prepareProxyConfig(candidate: unknown, lookup: (key: string) => string | undefined, opts: ResolveOptions = {}, locPrefix: (string | number)[] = []): { config: ProxyConfig; compiled: CompiledConfig } {
  const config = validateCandidate(candidate, locPrefix);
  return { config, compiled: compileCandidate(config, lookup, opts, locPrefix) };
}
