import { readFileSync } from '../builtins/fs.js';
import { ValidationFailure, formatLoc, type ValidationIssue } from '../validation/errors.js';
import type { CompiledConfig } from '../rules/compile.js';
import type { ProxyConfig } from './schema.js';
import type { ResolveOptions } from './resolve.js';
import { compileCandidate, validateCandidate } from './prepare.js';
import { jsonErrorLocation } from '../validation/json.js';

/** A configuration file that cannot be used; `message` names the file, JSON path and reason. */
export class ConfigFileError extends Error {
  constructor(
    message: string,
    readonly issues: ValidationIssue[] = [],
  ) {
    super(message);
    this.name = 'ConfigFileError';
  }
}

function describe(file: string, issues: ValidationIssue[]): string {
  const lines = issues.map((i) => `  ${i.loc.length ? formatLoc(i.loc) : '(root)'}: ${i.msg}`);
  return `invalid proxy configuration ${file}:\n${lines.join('\n')}`;
}

/** Reads and validates a proxy_config JSON file (no secrets involved yet). */
export function readProxyConfigFile(file: string): ProxyConfig {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigFileError(`cannot read proxy configuration ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new ConfigFileError(`proxy configuration ${file} is not valid JSON (${jsonErrorLocation(text, err)})`);
  }
  try {
    return validateCandidate(value);
  } catch (err) {
    if (err instanceof ValidationFailure) throw new ConfigFileError(describe(file, err.issues), err.issues);
    throw err;
  }
}

/**
 * Reads, validates, resolves and compiles a configuration file: what `keygate proxy` does at
 * start-up and on reload. Throws ConfigFileError with every problem listed.
 */
export function loadProxyConfigFile(
  file: string,
  lookup: (key: string) => string | undefined,
  opts: ResolveOptions = {},
): { config: ProxyConfig; compiled: CompiledConfig } {
  const config = readProxyConfigFile(file);
  try {
    return { config, compiled: compileCandidate(config, lookup, opts) };
  } catch (err) {
    if (err instanceof ValidationFailure) throw new ConfigFileError(describe(file, err.issues), err.issues);
    throw err;
  }
}
