import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { FastifyRequest } from 'fastify';
import { createFileExclusive } from '../secrets/envelope.js';
import { migrate, nowIso, type Db } from '../store/db.js';
import { HttpError } from './errors.js';
import { SettingError } from '../settings.js';

/** Who is calling: a user of a workspace (tenant). Every resource is scoped to `workspaceId`. */
export interface Principal {
  workspaceId: string;
  userId: string;
  /** How the caller authenticated; an API key's id when `via` is `api_key`. */
  via: 'api_key' | 'bearer' | string;
  keyId?: string;
}

declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
    /**
     * Authenticates the request's credential again (set with `principal`): true while it still
     * names the same user of the same workspace. Long-lived streams ask it at every heartbeat.
     */
    stillAuthorized?: () => Promise<boolean>;
  }
  interface FastifyContextConfig {
    /** Routes that answer without credentials (health checks, OAuth callbacks, the OpenAPI document). */
    public?: boolean;
    /** Set for routes declared `websocket: true` (src/server/app.ts): the only ones an upgrade may reach. */
    websocket?: boolean;
  }
}

/**
 * An authenticator looks at a request and returns the caller, `undefined` when its scheme is not
 * present, or throws an HttpError (401/403) when its scheme is present but wrong. They are tried in
 * order; the first that recognises the request decides. Other areas add schemes (the auth service
 * adds `Authorization: Bearer` JWTs and `X-Tenant-Id`).
 */
export type Authenticator = (req: FastifyRequest) => Promise<Principal | undefined>;

export const DEFAULT_WORKSPACE_ID = 'default';
export const API_KEY_FILE = 'api-key';

export const AUTH_MIGRATIONS = [
  `CREATE TABLE workspaces (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL);
   CREATE TABLE users (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL REFERENCES workspaces(id), name TEXT NOT NULL, created_at TEXT NOT NULL, UNIQUE (workspace_id, name));
   CREATE TABLE api_keys (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL REFERENCES workspaces(id), user_id TEXT NOT NULL REFERENCES users(id), name TEXT NOT NULL, key_hash TEXT NOT NULL UNIQUE, key_prefix TEXT NOT NULL, created_at TEXT NOT NULL, last_used_at TEXT)`,
];

/** API keys are 256-bit random strings, so a plain SHA-256 is a sufficient one-way hash. */
export function hashApiKey(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

export function generateApiKey(): string {
  return `kg_${randomBytes(32).toString('base64url')}`;
}

// The default workspace's id is always 'default' (tenant ids name it), even when `keys create`
// runs before the first `serve`.
export async function ensureWorkspace(db: Db, name: string, id: string = name === DEFAULT_WORKSPACE_ID ? DEFAULT_WORKSPACE_ID : randomUUID()): Promise<{ id: string; name: string }> {
  const existing = await db.get<{ id: string; name: string }>('SELECT id, name FROM workspaces WHERE name = ?', [name]);
  if (existing) return existing;
  await db.run('INSERT INTO workspaces (id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING', [id, name, nowIso()]);
  return (await db.get<{ id: string; name: string }>('SELECT id, name FROM workspaces WHERE name = ?', [name]))!;
}

export async function ensureUser(db: Db, workspaceId: string, name: string): Promise<{ id: string }> {
  const existing = await db.get<{ id: string }>('SELECT id FROM users WHERE workspace_id = ? AND name = ?', [workspaceId, name]);
  if (existing) return existing;
  await db.run('INSERT INTO users (id, workspace_id, name, created_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING', [randomUUID(), workspaceId, name, nowIso()]);
  return (await db.get<{ id: string }>('SELECT id FROM users WHERE workspace_id = ? AND name = ?', [workspaceId, name]))!;
}

/** Stores a key (hashed) for a user; `key` defaults to a new random one. Returns the clear key once. */
export async function createApiKey(
  db: Db,
  opts: { workspace: string; user: string; name?: string; key?: string; workspaceId?: string },
): Promise<{ key: string; id: string; workspaceId: string; userId: string }> {
  const ws = await ensureWorkspace(db, opts.workspace, opts.workspaceId);
  const user = await ensureUser(db, ws.id, opts.user);
  const key = opts.key ?? generateApiKey();
  const id = randomUUID();
  await db.run(
    'INSERT INTO api_keys (id, workspace_id, user_id, name, key_hash, key_prefix, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)',
    [id, ws.id, user.id, opts.name ?? 'default', hashApiKey(key), key.slice(0, 6), nowIso()],
  );
  return { key, id, workspaceId: ws.id, userId: user.id };
}

/**
 * First start: make sure a key exists. `KEYGATE_API_KEY` becomes the first key of the default
 * workspace; without it a random key is generated into `<data>/api-key` (mode 0600) so the quick
 * start can use it without the key ever being printed or logged.
 */
export async function bootstrapAuth(db: Db, dataDir: string, env: NodeJS.ProcessEnv): Promise<{ keyFile?: string }> {
  await migrate(db, 'auth', AUTH_MIGRATIONS);
  await ensureWorkspace(db, DEFAULT_WORKSPACE_ID, DEFAULT_WORKSPACE_ID);
  const envKey = env.KEYGATE_API_KEY?.trim();
  if (envKey) {
    if (envKey.length < 16) throw new SettingError('KEYGATE_API_KEY must be at least 16 characters');
    const known = await db.get('SELECT id FROM api_keys WHERE key_hash = ?', [hashApiKey(envKey)]);
    if (!known) await createApiKey(db, { workspace: DEFAULT_WORKSPACE_ID, user: 'admin', name: 'KEYGATE_API_KEY', key: envKey });
    return {};
  }
  const count = await db.get<{ n: number }>('SELECT COUNT(*) AS n FROM api_keys');
  const keyFile = path.join(dataDir, API_KEY_FILE);
  if (Number(count?.n ?? 0) === 0) {
    const key = generateApiKey();
    if (createFileExclusive(keyFile, key + '\n')) {
      await createApiKey(db, { workspace: DEFAULT_WORKSPACE_ID, user: 'admin', name: 'generated', key });
    }
  }
  return existsSync(keyFile) ? { keyFile } : {};
}

function headerValue(req: FastifyRequest, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** `X-Api-Key` (header names are case-insensitive, so `x-api-key` is the same header). */
export function apiKeyAuthenticator(db: Db): Authenticator {
  return async (req) => {
    const key = headerValue(req, 'x-api-key');
    if (key === undefined) return undefined;
    const row = await db.get<{ id: string; workspace_id: string; user_id: string }>(
      'SELECT id, workspace_id, user_id FROM api_keys WHERE key_hash = ?',
      [hashApiKey(key.trim())],
    );
    if (!row) throw new HttpError(401, 'Invalid API key.');
    return { workspaceId: row.workspace_id, userId: row.user_id, via: 'api_key', keyId: row.id };
  };
}

/** The `X-Tenant-Id` header, trimmed; `undefined` when absent. */
export function tenantHeader(req: FastifyRequest): string | undefined {
  return headerValue(req, 'x-tenant-id')?.trim();
}

/**
 * Runs the authenticators in order; no recognised credential at all is a 401.
 *
 * `X-Tenant-Id` selects a workspace (tenant) but is never a credential: a header anyone can type
 * must not make them a user. Alone it is a 401. Next to an API key or a bearer token it must name
 * the workspace id that credential belongs to, else 403 (a credential never reaches into another
 * tenant by naming it).
 */
export async function authenticate(req: FastifyRequest, authenticators: Authenticator[]): Promise<Principal> {
  const tenant = tenantHeader(req);
  for (const a of authenticators) {
    const principal = await a(req);
    if (principal) {
      if (tenant !== undefined && tenant !== principal.workspaceId) {
        throw new HttpError(403, 'X-Tenant-Id names a workspace the credential does not belong to.');
      }
      return principal;
    }
  }
  if (tenant !== undefined) {
    throw new HttpError(401, 'X-Tenant-Id selects a workspace but is not a credential: send it with an API key (X-Api-Key) or a bearer token (Authorization: Bearer).');
  }
  throw new HttpError(401, 'Missing credentials: send an API key in the X-Api-Key header.');
}

/**
 * Authenticates `req` and remembers how to do it again: {@link credentialStillValid} answers
 * later whether the same credential still names the same caller (a deleted API key, an expired
 * bearer token do not).
 */
export async function authenticateRequest(req: FastifyRequest, authenticators: Authenticator[]): Promise<Principal> {
  const first = await authenticate(req, authenticators);
  req.principal = first;
  req.stillAuthorized = async () => {
    try {
      const now = await authenticate(req, authenticators);
      return now.workspaceId === first.workspaceId && now.userId === first.userId;
    } catch {
      return false;
    }
  };
  return first;
}

/** Whether the credential `req` was authenticated with is still valid now (fails closed). */
export async function credentialStillValid(req: FastifyRequest): Promise<boolean> {
  return req.stillAuthorized ? req.stillAuthorized() : false;
}

/** The caller of an authenticated route (the auth hook guarantees it is set). */
export function principalOf(req: FastifyRequest): Principal {
  if (!req.principal) throw new HttpError(401, 'Missing credentials: send an API key in the X-Api-Key header.');
  return req.principal;
}
