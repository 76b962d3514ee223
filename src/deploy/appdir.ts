import { existsSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { CliError } from '../command-error.js';
import { parseJsonSafely } from '../validation/json.js';

export const APP_CONFIG_FILE = 'keygate.json';

export interface AppDirInfo {
  dir: string;
  /** `name` from keygate.json, if given (informational: the deployment name comes from the directory or --name). */
  appName?: string;
  assistants: string[];
  /** Relative paths (POSIX separators) of the assistant modules keygate.json points at. */
  modules: string[];
  /** The env file keygate.json names (`"env": ".env"`), absolute; not necessarily existing. */
  envFile?: string;
}

/**
 * The light check the CLI can make without running the application: keygate.json exists, is a
 * JSON object naming at least one assistant, and each assistant module is a file inside the
 * directory. The full validation (exports, env) happens in the build on the control plane.
 */
export function checkAppDir(dir: string): AppDirInfo {
  const abs = path.resolve(dir);
  if (!existsSync(abs) || !statSync(abs).isDirectory()) throw new CliError(`application directory ${abs} does not exist or is not a directory`);
  const file = path.join(abs, APP_CONFIG_FILE);
  if (!existsSync(file)) throw new CliError(`${file} not found: an application directory needs a keygate.json naming its assistants`);
  let raw: unknown;
  try {
    raw = parseJsonSafely(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new CliError(`${file}: ${(err as Error).message}`);
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new CliError(`${file}: must be a JSON object`);
  const cfg = raw as Record<string, unknown>;
  const assistants = cfg.assistants;
  if (!assistants || typeof assistants !== 'object' || Array.isArray(assistants) || Object.keys(assistants).length === 0) {
    throw new CliError(`${file}: assistants: must name at least one assistant, e.g. {"agent": "./src/agent.js"}`);
  }
  const modules: string[] = [];
  for (const [name, spec] of Object.entries(assistants as Record<string, unknown>)) {
    if (typeof spec !== 'string' || spec.length === 0) throw new CliError(`${file}: assistants.${name}: must be a path like "./src/agent.js"`);
    // `./path/module.js:exportName`: the export part follows the last colon after the extension.
    const modulePath = spec.replace(/:[A-Za-z_$][A-Za-z0-9_$]*$/, '');
    const target = path.resolve(abs, modulePath);
    const rel = path.relative(abs, target);
    if (rel.startsWith('..') || path.isAbsolute(rel)) throw new CliError(`${file}: assistants.${name}: ${modulePath} is outside the application directory`);
    if (!existsSync(target) || !statSync(target).isFile()) throw new CliError(`${file}: assistants.${name}: ${modulePath} does not exist`);
    modules.push(rel.split(path.sep).join('/'));
  }
  let envFile: string | undefined;
  if (typeof cfg.env === 'string' && cfg.env.length > 0) envFile = path.resolve(abs, cfg.env);
  return {
    dir: abs,
    appName: typeof cfg.name === 'string' ? cfg.name : undefined,
    assistants: Object.keys(assistants),
    modules,
    envFile,
  };
}
