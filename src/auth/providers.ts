import type { Envelope } from '../secrets/envelope.js';
import { nowIso, type Db } from '../store/db.js';
import type { ClientAuthMethod, OAuthClient } from './oauth-client.js';

/** The provider registry: one row per (workspace, provider_id). */

export interface ProviderRow {
  workspace_id: string;
  provider_id: string;
  name: string;
  client_id: string;
  client_secret_sealed: string | null;
  auth_url: string;
  token_url: string;
  revocation_url: string | null;
  uses_pkce: number;
  token_endpoint_auth_method: ClientAuthMethod;
  scopes: string;
  source: string;
  created_at: string;
  updated_at: string;
}

/** Fields as the API and the config file give them (`client_secret` in clear, about to be sealed). */
export interface ProviderInput {
  provider_id: string;
  name: string;
  client_id: string;
  client_secret?: string | null;
  auth_url: string;
  token_url: string;
  revocation_url?: string | null;
  uses_pkce: boolean;
  token_endpoint_auth_method: ClientAuthMethod;
  scopes?: string[];
}

export interface ProviderRecord {
  provider_id: string;
  name: string;
  client_id: string;
  has_client_secret: boolean;
  auth_url: string;
  token_url: string;
  revocation_url: string | null;
  uses_pkce: boolean;
  token_endpoint_auth_method: ClientAuthMethod;
  scopes: string[];
  created_at: string;
  updated_at: string;
}

export function toRecord(row: ProviderRow): ProviderRecord {
  return {
    provider_id: row.provider_id,
    name: row.name,
    client_id: row.client_id,
    has_client_secret: row.client_secret_sealed !== null,
    auth_url: row.auth_url,
    token_url: row.token_url,
    revocation_url: row.revocation_url,
    uses_pkce: Boolean(Number(row.uses_pkce)),
    token_endpoint_auth_method: row.token_endpoint_auth_method,
    scopes: JSON.parse(row.scopes) as string[],
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

/** The client credentials to call the provider with (the secret opened only here, for the call). */
export function clientOf(row: ProviderRow, envelope: Envelope): OAuthClient {
  return {
    clientId: row.client_id,
    clientSecret: row.client_secret_sealed ? envelope.open(row.client_secret_sealed) : undefined,
    method: row.token_endpoint_auth_method,
  };
}

/**
 * A confidential client without a secret cannot authenticate, and a secret on a public client
 * would never be used: both are configuration mistakes worth refusing up front.
 */
export function secretProblem(method: ClientAuthMethod, hasSecret: boolean): { msg: string; type: 'missing' | 'value_error' } | undefined {
  if (method !== 'none' && !hasSecret) return { msg: `token_endpoint_auth_method ${method} needs a client_secret`, type: 'missing' };
  if (method === 'none' && hasSecret) {
    return { msg: 'a public client (token_endpoint_auth_method none) sends no client_secret: leave it out (client_secret null clears a stored one)', type: 'value_error' };
  }
  return undefined;
}

/** The provider's endpoints, by the field that names them. */
export const ENDPOINT_FIELDS = ['auth_url', 'token_url', 'revocation_url'] as const;

/**
 * Endpoints that would carry credentials in clear text: the client secret, authorization codes
 * and tokens go to the token and revocation endpoints, the user's sign-in to the authorization
 * endpoint, and RFC 6749 (3.1, 3.2) requires TLS for all of them. Plain `http://` is accepted only
 * for a loopback address (a provider on the same machine, as in development and tests).
 */
export function plainHttpProblems(p: Partial<Record<(typeof ENDPOINT_FIELDS)[number], string | null>>): { field: (typeof ENDPOINT_FIELDS)[number]; msg: string }[] {
  const out: { field: (typeof ENDPOINT_FIELDS)[number]; msg: string }[] = [];
  for (const field of ENDPOINT_FIELDS) {
    const value = p[field];
    if (typeof value !== 'string' || !/^http:/i.test(value)) continue;
    let host = '';
    try {
      host = new URL(value).hostname.toLowerCase().replace(/^\[|\]$/g, '');
    } catch {
      // Not a URL at all: the schema's format check says so.
      continue;
    }
    const loopback = host === 'localhost' || host.endsWith('.localhost') || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
    if (!loopback) out.push({ field, msg: `${field} must use https: OAuth sends credentials to it (plain http only for a loopback address)` });
  }
  return out;
}

export async function getProvider(db: Db, workspaceId: string, providerId: string): Promise<ProviderRow | undefined> {
  return db.get<ProviderRow>('SELECT * FROM oauth_providers WHERE workspace_id = ? AND provider_id = ?', [workspaceId, providerId]);
}

export async function listProviders(db: Db, workspaceId: string): Promise<ProviderRow[]> {
  return db.all<ProviderRow>('SELECT * FROM oauth_providers WHERE workspace_id = ? ORDER BY provider_id', [workspaceId]);
}

/** Inserts a provider; false when the id is taken in the workspace. */
export async function insertProvider(db: Db, envelope: Envelope, workspaceId: string, p: ProviderInput, source: 'api' | 'config'): Promise<boolean> {
  const now = nowIso();
  const r = await db.run(
    `INSERT INTO oauth_providers (workspace_id, provider_id, name, client_id, client_secret_sealed, auth_url, token_url, revocation_url, uses_pkce, token_endpoint_auth_method, scopes, source, created_at, updated_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (workspace_id, provider_id) DO NOTHING`,
    [workspaceId, p.provider_id, p.name, p.client_id, p.client_secret ? envelope.seal(p.client_secret) : null, p.auth_url, p.token_url, p.revocation_url ?? null, p.uses_pkce, p.token_endpoint_auth_method, JSON.stringify(p.scopes ?? []), source, now, now],
  );
  return r.changes === 1;
}

/** Start-up registration from config: the file is the truth for the fields it names. */
export async function upsertProvider(db: Db, envelope: Envelope, workspaceId: string, p: ProviderInput): Promise<void> {
  const now = nowIso();
  await db.run(
    `INSERT INTO oauth_providers (workspace_id, provider_id, name, client_id, client_secret_sealed, auth_url, token_url, revocation_url, uses_pkce, token_endpoint_auth_method, scopes, source, created_at, updated_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'config', ?, ?)
     ON CONFLICT (workspace_id, provider_id) DO UPDATE SET name = excluded.name, client_id = excluded.client_id,
       client_secret_sealed = excluded.client_secret_sealed, auth_url = excluded.auth_url, token_url = excluded.token_url,
       revocation_url = excluded.revocation_url, uses_pkce = excluded.uses_pkce,
       token_endpoint_auth_method = excluded.token_endpoint_auth_method, scopes = excluded.scopes, source = 'config',
       updated_at = excluded.updated_at`,
    [workspaceId, p.provider_id, p.name, p.client_id, p.client_secret ? envelope.seal(p.client_secret) : null, p.auth_url, p.token_url, p.revocation_url ?? null, p.uses_pkce, p.token_endpoint_auth_method, JSON.stringify(p.scopes ?? []), now, now],
  );
}

const PATCHABLE = ['name', 'client_id', 'auth_url', 'token_url', 'revocation_url', 'uses_pkce', 'token_endpoint_auth_method'] as const;

/** Applies a partial update; returns the new row, or undefined when the provider does not exist. */
export async function patchProvider(db: Db, envelope: Envelope, workspaceId: string, providerId: string, patch: Partial<ProviderInput>): Promise<ProviderRow | undefined> {
  const sets: string[] = [];
  const params: unknown[] = [];
  for (const field of PATCHABLE) {
    if (patch[field] !== undefined) {
      sets.push(`${field} = ?`);
      params.push(patch[field]);
    }
  }
  if (patch.scopes !== undefined) {
    sets.push('scopes = ?');
    params.push(JSON.stringify(patch.scopes));
  }
  if (patch.client_secret !== undefined) {
    sets.push('client_secret_sealed = ?');
    params.push(patch.client_secret === null ? null : envelope.seal(patch.client_secret));
  }
  sets.push('updated_at = ?');
  params.push(nowIso());
  const r = await db.run(`UPDATE oauth_providers SET ${sets.join(', ')} WHERE workspace_id = ? AND provider_id = ?`, [...params, workspaceId, providerId]);
  if (r.changes === 0) return undefined;
  return getProvider(db, workspaceId, providerId);
}
