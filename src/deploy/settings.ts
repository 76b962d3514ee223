import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { CliError } from '../command-error.js';
import { DotenvError, parseDotenv } from '../runtime/dotenv.js';

export const DEFAULT_CONTROL_PLANE_URL = 'http://127.0.0.1:8080';
/** Variables that configure this tool; they are never sent to a deployment as secrets. */
export const CLI_VARIABLES = ['KEYGATE_API_KEY', 'KEYGATE_URL'] as const;

export type SettingSource = 'environment' | '.env' | 'default';

export interface DeploySettings {
  /** Absent when neither the environment nor `.env` has it (a prerequisite failure). */
  apiKey?: string;
  apiKeySource?: SettingSource;
  url: string;
  urlSource: SettingSource;
  /** The `.env` file that was read, if one exists. */
  envFile?: string;
}

/**
 * Reads a dotenv file. Parse errors name the file and line, never a value (it holds secrets).
 * A missing file is an empty map.
 */
export function readEnvFile(file: string): Map<string, string> {
  if (!existsSync(file)) return new Map();
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new CliError(`cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  try {
    return parseDotenv(text);
  } catch (err) {
    if (err instanceof DotenvError) throw new CliError(`${file}: ${err.message}`);
    throw err;
  }
}

/**
 * `KEYGATE_API_KEY` and `KEYGATE_URL`: the environment first (which is what an inline
 * `KEYGATE_API_KEY=... keygate deploy` sets), else `.env` in the project root. An empty value
 * counts as unset, so `KEYGATE_API_KEY= keygate deploy` falls back to `.env` like the shells' `${X:-}`.
 */
export function resolveSettings(projectDir: string, env: NodeJS.ProcessEnv = process.env): DeploySettings {
  const envFile = path.join(path.resolve(projectDir), '.env');
  const fromFile = readEnvFile(envFile);
  const pick = (name: string): { value?: string; source?: SettingSource } => {
    const e = env[name]?.trim();
    if (e) return { value: e, source: 'environment' };
    const f = fromFile.get(name)?.trim();
    if (f) return { value: f, source: '.env' };
    return {};
  };
  const key = pick('KEYGATE_API_KEY');
  const url = pick('KEYGATE_URL');
  return {
    apiKey: key.value,
    apiKeySource: key.source,
    url: normaliseBaseUrl(url.value ?? DEFAULT_CONTROL_PLANE_URL, url.source ?? 'default'),
    urlSource: url.source ?? 'default',
    envFile: existsSync(envFile) ? envFile : undefined,
  };
}

function normaliseBaseUrl(raw: string, source: SettingSource): string {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    // Named as given but for any user:password part (a URL that does not parse may still carry one).
    throw new CliError(`KEYGATE_URL (from ${source}) is not a URL: '${raw.replace(/\/\/[^/?#]*@/, '//[credentials]@')}'`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new CliError(`KEYGATE_URL (from ${source}) must be an http:// or https:// address`);
  if (u.username || u.password) throw new CliError(`KEYGATE_URL (from ${source}) must not carry credentials; use KEYGATE_API_KEY`);
  if (u.search || u.hash) throw new CliError(`KEYGATE_URL (from ${source}) must not have a query or fragment`);
  return u.toString().replace(/\/+$/, '');
}

/** The API key, or the prerequisite failure that explains where it is looked for. */
export function requireApiKey(s: DeploySettings, projectDir: string): string {
  if (!s.apiKey) {
    throw new CliError(
      `no API key: set KEYGATE_API_KEY in the environment (e.g. KEYGATE_API_KEY=... keygate deploy) or in ${path.join(path.resolve(projectDir), '.env')}`,
    );
  }
  return s.apiKey;
}
