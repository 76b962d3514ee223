import { Ajv } from 'ajv';
import addFormatsModule from 'ajv-formats';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from '../log.js';
import type { Envelope } from '../secrets/envelope.js';
import type { Db } from '../store/db.js';
import { ajvToIssues, formatLoc } from '../validation/errors.js';
import { normaliseScopes } from './pkce.js';
import { plainHttpProblems, secretProblem, upsertProvider, type ProviderInput } from './providers.js';
import { providerCreateBody } from './schemas.js';

const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (ajv: Ajv) => Ajv;

/**
 * Providers registered by the operator at start-up: `<configDir>/providers.json` (when present)
 * and `KEYGATE_PROVIDERS_FILE`. Each entry is the API's create body plus `workspace` (a workspace
 * id or name, default `default`; created when missing, the file is the operator's) and
 * `client_secret_env` (the name of an environment variable holding the secret, so the file itself
 * can be free of secrets). Entries are upserted: the file wins over edits made through the API.
 */

export const PROVIDERS_FILE = 'providers.json';

const entrySchema = {
  ...providerCreateBody,
  properties: {
    ...providerCreateBody.properties,
    workspace: { type: 'string', minLength: 1, maxLength: 200 },
    client_secret_env: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]*$' },
  },
};

const fileSchema = { type: 'array', items: entrySchema };

export class ProviderConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ProviderConfigError';
  }
}

export interface ConfiguredProvider {
  workspace: string;
  provider: ProviderInput;
}

/** Reads and validates one file (pure apart from reading it and `env`). */
export function parseProvidersFile(file: string, env: NodeJS.ProcessEnv): ConfiguredProvider[] {
  let doc: unknown;
  try {
    doc = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ProviderConfigError(`${file}: cannot read providers (${(err as NodeJS.ErrnoException).code ?? 'invalid JSON'})`);
  }
  const ajv = new Ajv({ allErrors: true, strict: false, useDefaults: true });
  addFormats(ajv);
  const validate = ajv.compile(fileSchema);
  if (!validate(doc)) {
    const issues = ajvToIssues(validate.errors);
    throw new ProviderConfigError(`${file}: ${issues.map((i) => `${formatLoc(i.loc) || '(top level)'}: ${i.msg}`).join('; ')}`);
  }
  const entries = doc as (ProviderInput & { workspace?: string; client_secret_env?: string })[];
  const seen = new Set<string>();
  return entries.map((e, i) => {
    const { workspace = 'default', client_secret_env, ...provider } = e;
    const key = `${workspace}\u0000${provider.provider_id}`;
    if (seen.has(key)) throw new ProviderConfigError(`${file}: [${i}].provider_id: '${provider.provider_id}' is listed twice for workspace '${workspace}'`);
    seen.add(key);
    if (client_secret_env !== undefined) {
      if (provider.client_secret) throw new ProviderConfigError(`${file}: [${i}]: give client_secret or client_secret_env, not both`);
      const secret = env[client_secret_env];
      if (!secret) throw new ProviderConfigError(`${file}: [${i}].client_secret_env: environment variable ${client_secret_env} is not set`);
      provider.client_secret = secret;
    }
    const problem = secretProblem(provider.token_endpoint_auth_method, Boolean(provider.client_secret));
    if (problem) throw new ProviderConfigError(`${file}: [${i}]: ${problem.msg}`);
    const insecure = plainHttpProblems(provider)[0];
    if (insecure) throw new ProviderConfigError(`${file}: [${i}].${insecure.field}: ${insecure.msg}`);
    provider.scopes = normaliseScopes(provider.scopes ?? []);
    return { workspace, provider };
  });
}

export function providerFiles(configDir: string, env: NodeJS.ProcessEnv): string[] {
  const files: string[] = [];
  const inConfig = path.join(configDir, PROVIDERS_FILE);
  if (existsSync(inConfig)) files.push(inConfig);
  const extra = env.KEYGATE_PROVIDERS_FILE?.trim();
  if (extra) {
    const resolved = path.resolve(extra);
    // A file named explicitly must exist: a typo should stop the start, not silently register nothing.
    if (!existsSync(resolved)) throw new ProviderConfigError(`KEYGATE_PROVIDERS_FILE: ${resolved} does not exist`);
    if (resolved !== path.resolve(inConfig)) files.push(resolved);
  }
  return files;
}

/** Loads every configured file and upserts its providers. */
export async function loadConfiguredProviders(
  db: Db,
  envelope: Envelope,
  logger: Logger,
  configDir: string,
  env: NodeJS.ProcessEnv,
  resolveWorkspace: (idOrName: string) => Promise<string>,
): Promise<number> {
  let count = 0;
  for (const file of providerFiles(configDir, env)) {
    const entries = parseProvidersFile(file, env);
    for (const { workspace, provider } of entries) {
      const workspaceId = await resolveWorkspace(workspace);
      await upsertProvider(db, envelope, workspaceId, provider);
      count++;
    }
    logger.info({ file, providers: entries.map((e) => e.provider.provider_id) }, 'registered OAuth providers from config');
  }
  return count;
}
