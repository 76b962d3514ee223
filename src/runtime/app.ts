import { existsSync, readFileSync, realpathSync, statSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Ajv } from 'ajv';
import { ajvToIssues, formatLoc, type ValidationIssue } from '../validation/errors.js';
import type { Assistant } from './assistant.js';
import { DotenvError, parseDotenv } from './dotenv.js';
import { assistantId } from './ids.js';
import { parseJsonSafely } from '../validation/json.js';

export const APP_CONFIG_FILE = 'keygate.json';

const APP_NAME_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;
const ASSISTANT_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const EXPORT_NAME_RE = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/** keygate.json as written by the app author. */
export interface AppConfig {
  name?: string;
  description?: string;
  /** assistant name -> `./path/to/module.js` or `./path/to/module.js:exportName` */
  assistants: Record<string, string>;
  /** An env file (relative to the app directory) or variables given inline. */
  env?: string | Record<string, string>;
}

/** JSON Schema of keygate.json (names are checked separately for messages that name the key). */
export const appConfigSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['assistants'],
  properties: {
    $schema: { type: 'string' },
    name: { type: 'string', minLength: 1, maxLength: 63 },
    description: { type: 'string', maxLength: 2000 },
    assistants: {
      type: 'object',
      minProperties: 1,
      maxProperties: 100,
      additionalProperties: { type: 'string', minLength: 1, maxLength: 1024 },
    },
    env: {
      anyOf: [
        { type: 'string', minLength: 1, maxLength: 1024 },
        { type: 'object', maxProperties: 1000, additionalProperties: { type: 'string', maxLength: 65536 } },
      ],
    },
  },
} as const;

const ajv = new Ajv({ allErrors: true, strict: true });
const validateConfig = ajv.compile(appConfigSchema);

/** keygate.json (or an assistant module, or the env file) is unusable. The message names file and field. */
export class AppConfigError extends Error {
  constructor(
    readonly file: string,
    readonly issues: ValidationIssue[],
  ) {
    super(issues.map((i) => `${file}: ${i.loc.length ? formatLoc(i.loc) + ': ' : ''}${i.msg}`).join('\n'));
    this.name = 'AppConfigError';
  }
}

export interface LoadedAssistant {
  id: string;
  name: string;
  description: string | null;
  /** `./src/agent.js` or `./src/agent.js:export` as written in keygate.json. */
  source: string;
  assistant: Assistant;
}

export interface LoadedApp {
  name: string;
  description: string | null;
  dir: string;
  configFile: string;
  assistants: LoadedAssistant[];
  /** Names of the variables taken from `env` (values never kept here). */
  envApplied: string[];
  /** Non-fatal findings (e.g. the env file named in keygate.json does not exist). */
  warnings: string[];
}

export interface LoadAppOptions {
  /** The environment the app's `env` is applied to (default `process.env`); set variables win. */
  targetEnv?: NodeJS.ProcessEnv;
}

/**
 * Reads and validates `<dir>/keygate.json`, applies its `env`, imports every assistant module and
 * checks its export. The env is applied before the imports: modules may read variables at load.
 */
export async function loadApp(dir: string, opts: LoadAppOptions = {}): Promise<LoadedApp> {
  const targetEnv = opts.targetEnv ?? process.env;
  const appDir = path.resolve(dir);
  const configFile = path.join(appDir, APP_CONFIG_FILE);
  const fail = (loc: (string | number)[], msg: string, type = 'value_error'): never => {
    throw new AppConfigError(configFile, [{ loc, msg, type }]);
  };

  if (!existsSync(appDir) || !statSync(appDir).isDirectory()) {
    throw new AppConfigError(appDir, [{ loc: [], msg: 'application directory does not exist', type: 'missing' }]);
  }
  if (!existsSync(configFile)) fail([], 'file not found (an application needs a keygate.json)', 'missing');

  let raw: unknown;
  try {
    raw = parseJsonSafely(readFileSync(configFile, 'utf8'));
  } catch (err) {
    fail([], (err as Error).message, 'json_invalid');
  }
  if (!validateConfig(raw)) throw new AppConfigError(configFile, ajvToIssues(validateConfig.errors));
  const config = raw as AppConfig;

  const issues: ValidationIssue[] = [];
  if (config.name !== undefined && !APP_NAME_RE.test(config.name)) {
    issues.push({ loc: ['name'], msg: 'must be lowercase letters, digits, "-" or "_" (at most 63), starting with a letter or digit', type: 'string_pattern_mismatch' });
  }
  for (const name of Object.keys(config.assistants)) {
    if (!ASSISTANT_NAME_RE.test(name)) {
      issues.push({ loc: ['assistants', name], msg: 'assistant name must be letters, digits, "-" or "_" (at most 64), starting with a letter or digit', type: 'string_pattern_mismatch' });
    }
  }
  if (config.env && typeof config.env === 'object') {
    for (const key of Object.keys(config.env)) {
      if (!ENV_NAME_RE.test(key)) issues.push({ loc: ['env', key], msg: 'not a valid environment variable name', type: 'string_pattern_mismatch' });
    }
  }
  if (issues.length) throw new AppConfigError(configFile, issues);

  const name = config.name ?? defaultAppName(appDir);
  const warnings: string[] = [];
  const envApplied = applyEnv(config, appDir, configFile, targetEnv, warnings);

  const realAppDir = realpathSync(appDir);
  const assistants: LoadedAssistant[] = [];
  for (const [assistantName, source] of Object.entries(config.assistants)) {
    const loc = ['assistants', assistantName];
    const { file, exportName } = splitSource(source);
    if (exportName !== undefined && !EXPORT_NAME_RE.test(exportName)) fail(loc, `"${exportName}" is not a valid export name`);
    if (path.isAbsolute(file)) fail(loc, 'module path must be relative to the application directory');
    const abs = path.resolve(appDir, file);
    if (!existsSync(abs) || !statSync(abs).isFile()) fail(loc, `module ${file} does not exist`, 'missing');
    const real = realpathSync(abs);
    if (!real.startsWith(realAppDir + path.sep)) fail(loc, `module ${file} is outside the application directory`);

    let mod: Record<string, unknown>;
    try {
      mod = (await import(pathToFileURL(real).href)) as Record<string, unknown>;
    } catch (err) {
      const e = err as Error;
      fail(loc, `cannot load module ${file}: ${e?.name ?? 'Error'}: ${firstLine(e?.message)}`, 'import_error');
      throw err; // unreachable: fail() throws
    }
    const picked = exportName !== undefined ? mod[exportName] : (mod.default ?? mod.assistant);
    const what = exportName !== undefined ? `export "${exportName}"` : 'default export (or export "assistant")';
    const problem = assistantProblem(picked);
    if (problem) fail(loc, `module ${file}: ${what} ${problem}`, 'assistant_invalid');
    const assistant = picked as Assistant;
    assistants.push({
      id: assistantId(name, assistantName),
      name: assistantName,
      description: typeof assistant.description === 'string' ? assistant.description : null,
      source,
      assistant,
    });
  }

  return { name, description: config.description ?? null, dir: appDir, configFile, assistants, envApplied, warnings };
}

/** Finds an assistant by name or by id (ids compared case-insensitively, as UUIDs are). */
export function findAssistant(app: LoadedApp, idOrName: string): LoadedAssistant | undefined {
  const lower = idOrName.toLowerCase();
  return app.assistants.find((a) => a.name === idOrName) ?? app.assistants.find((a) => a.id === lower);
}

function assistantProblem(value: unknown): string | null {
  if (value === undefined) return 'is missing';
  if (value === null || typeof value !== 'object') return 'must be an object { description?, run(input, ctx) }';
  const v = value as Record<string, unknown>;
  if (typeof v.run !== 'function') return 'has no run(input, ctx) function';
  if (v.description !== undefined && typeof v.description !== 'string') return 'has a description that is not a string';
  return null;
}

function splitSource(source: string): { file: string; exportName?: string } {
  // A colon after the last path separator separates the export name (Windows drive letters aside).
  const slash = source.lastIndexOf('/');
  const colon = source.lastIndexOf(':');
  if (colon > slash && colon > 1) return { file: source.slice(0, colon), exportName: source.slice(colon + 1) };
  return { file: source };
}

function applyEnv(config: AppConfig, appDir: string, configFile: string, targetEnv: NodeJS.ProcessEnv, warnings: string[]): string[] {
  if (config.env === undefined) return [];
  let vars: Map<string, string>;
  if (typeof config.env === 'string') {
    const envFile = path.resolve(appDir, config.env);
    if (!existsSync(envFile)) {
      // A deployment gets its secrets as environment variables and usually ships no env file.
      warnings.push(`${configFile}: env: file ${config.env} not found; continuing with the process environment`);
      return [];
    }
    try {
      vars = parseDotenv(readFileSync(envFile, 'utf8'));
    } catch (err) {
      if (err instanceof DotenvError) {
        throw new AppConfigError(configFile, [{ loc: ['env'], msg: `${config.env}: ${err.message}`, type: 'value_error' }]);
      }
      throw new AppConfigError(configFile, [{ loc: ['env'], msg: `cannot read ${config.env}: ${(err as Error).message}`, type: 'value_error' }]);
    }
  } else {
    vars = new Map(Object.entries(config.env));
  }
  const applied: string[] = [];
  for (const [key, value] of vars) {
    if (targetEnv[key] !== undefined) continue;
    targetEnv[key] = value;
    applied.push(key);
  }
  return applied;
}

function defaultAppName(dir: string): string {
  const n = path
    .basename(dir)
    .toLowerCase()
    .replace(/[^a-z0-9_-]+/g, '-')
    .replace(/^[-_]+|-+$/g, '')
    .slice(0, 63);
  return n || 'app';
}

function firstLine(s: string | undefined): string {
  return (s ?? '').split('\n')[0].slice(0, 500);
}
