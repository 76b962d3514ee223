import { readFileSync } from 'node:fs';
import { ValidationFailure, formatLoc, type ValidationIssue } from '../validation/errors.js';
import { compileConfig, type CompiledConfig } from '../rules/compile.js';
import { validateProxyConfig, type ProxyConfig } from './schema.js';
import { resolveProxyConfig, type ResolveOptions } from './resolve.js';
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
  const issues = validateProxyConfig(value);
  if (issues.length) throw new ConfigFileError(describe(file, issues), issues);
  return value as ProxyConfig;
}

/** Reads a `{ "KEY": "value" }` secrets file. Error messages never include values. */
export function readSecretsFile(file: string): Map<string, string> {
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new ConfigFileError(`cannot read secrets file ${file}: ${code ?? 'not valid JSON'}`);
  }
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    throw new ConfigFileError(`secrets file ${file} must be a JSON object of "KEY": "value"`);
  }
  const out = new Map<string, string>();
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') throw new ConfigFileError(`secrets file ${file}: the value of '${k}' must be a string`);
    out.set(k, v);
  }
  return out;
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
    return { config, compiled: compileConfig(resolveProxyConfig(config, lookup, opts)) };
  } catch (err) {
    if (err instanceof ValidationFailure) throw new ConfigFileError(describe(file, err.issues), err.issues);
    throw err;
  }
}
