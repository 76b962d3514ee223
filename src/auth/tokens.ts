import { randomUUID } from 'node:crypto';
import type { Envelope } from '../secrets/envelope.js';
import { nowIso, type Db } from '../store/db.js';
import { coversScopes } from './pkce.js';
import type { TokenSet } from './oauth-client.js';

/** The token store: one row per stored OAuth token, owned by one user of one workspace. */

export interface TokenRow {
  id: string;
  workspace_id: string;
  user_id: string;
  provider_id: string;
  access_token_sealed: string;
  refresh_token_sealed: string | null;
  token_type: string | null;
  scopes: string;
  expires_at: string | null;
  provider_account_label: string | null;
  is_default: number;
  deleting_at: string | null;
  /** Where the token is revoked (endpoints_bound 1): the provider's when its sign-in started. */
  revocation_url: string | null;
  endpoints_bound: number;
  created_at: string;
  updated_at: string;
}

export interface TokenRecord {
  id: string;
  provider_id: string;
  provider_account_label: string | null;
  scopes: string[];
  expires_at: string | null;
  is_default: boolean;
  created_at: string;
  updated_at: string;
}

/** The public view: never the token values. */
export function toTokenRecord(row: TokenRow): TokenRecord {
  return {
    id: row.id,
    provider_id: row.provider_id,
    provider_account_label: row.provider_account_label,
    scopes: JSON.parse(row.scopes) as string[],
    expires_at: row.expires_at,
    is_default: Boolean(Number(row.is_default)),
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

export interface Owner {
  workspaceId: string;
  userId: string;
}

export async function listTokens(db: Db, owner: Owner, providerId?: string): Promise<TokenRow[]> {
  const params: unknown[] = [owner.workspaceId, owner.userId];
  let sql = 'SELECT * FROM oauth_tokens WHERE workspace_id = ? AND user_id = ?';
  if (providerId !== undefined) {
    sql += ' AND provider_id = ?';
    params.push(providerId);
  }
  return db.all<TokenRow>(`${sql} ORDER BY created_at, id`, params);
}

/** The caller's token, or undefined for unknown ids and other people's tokens alike. */
export async function getOwnedToken(db: Db, owner: Owner, id: string): Promise<TokenRow | undefined> {
  return db.get<TokenRow>('SELECT * FROM oauth_tokens WHERE id = ? AND workspace_id = ? AND user_id = ?', [id.toLowerCase(), owner.workspaceId, owner.userId]);
}

/** Seconds of validity a token must have left to be handed out again instead of a new sign-in. */
const REUSE_MARGIN_MS = 60_000;

/** A stored, unexpired token of the caller for the provider covering `scopes` (the default first). */
export async function findReusableToken(db: Db, owner: Owner, providerId: string, scopes: string[]): Promise<TokenRow | undefined> {
  const rows = await db.all<TokenRow>(
    'SELECT * FROM oauth_tokens WHERE workspace_id = ? AND user_id = ? AND provider_id = ? AND deleting_at IS NULL ORDER BY is_default DESC, created_at DESC',
    [owner.workspaceId, owner.userId, providerId],
  );
  const soon = new Date(Date.now() + REUSE_MARGIN_MS).toISOString();
  return rows.find((r) => (r.expires_at === null || r.expires_at > soon) && coversScopes(JSON.parse(r.scopes) as string[], scopes));
}

/**
 * Locks one workspace's provider row until the transaction ends, and says whether it exists. It
 * serialises, on PostgreSQL (READ COMMITTED), what would otherwise interleave: two changes of the
 * default flag among the provider's tokens (each saw no other default and set its own; the
 * unique index oauth_tokens_one_default backs the rule up), and a token stored while the provider
 * is deleted (the deletion counted no token, then met the new token's foreign key: a 500). SQLite
 * runs one transaction at a time already.
 */
export async function lockProvider(tx: Db, workspaceId: string, providerId: string): Promise<boolean> {
  const row = await tx.get(`SELECT provider_id FROM oauth_providers WHERE workspace_id = ? AND provider_id = ?${tx.kind === 'postgres' ? ' FOR UPDATE' : ''}`, [workspaceId, providerId]);
  return row !== undefined;
}

/** A token could not be stored: its provider was deleted while the provider issued it. */
export class ProviderGoneError extends Error {
  constructor() {
    super('the provider was deleted during the sign-in');
    this.name = 'ProviderGoneError';
  }
}

/** Stores a new token; the user's first token for a provider becomes the default. ProviderGoneError when the provider is gone. */
export async function storeToken(db: Db, envelope: Envelope, owner: Owner, providerId: string, set: TokenSet, scopes: string[], revocationUrl: string | null): Promise<string> {
  const id = randomUUID();
  const now = nowIso();
  const expiresAt = set.expiresIn !== undefined ? new Date(Date.now() + set.expiresIn * 1000).toISOString() : null;
  await db.tx(async (tx) => {
    if (!(await lockProvider(tx, owner.workspaceId, providerId))) throw new ProviderGoneError();
    const hasDefault = await tx.get('SELECT id FROM oauth_tokens WHERE workspace_id = ? AND user_id = ? AND provider_id = ? AND is_default = 1', [owner.workspaceId, owner.userId, providerId]);
    await tx.run(
      `INSERT INTO oauth_tokens (id, workspace_id, user_id, provider_id, access_token_sealed, refresh_token_sealed, token_type, scopes, expires_at, provider_account_label, is_default, deleting_at, revocation_url, endpoints_bound, created_at, updated_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, ?, 1, ?, ?)`,
      [id, owner.workspaceId, owner.userId, providerId, envelope.seal(set.accessToken), set.refreshToken ? envelope.seal(set.refreshToken) : null, set.tokenType ?? null, JSON.stringify(scopes), expiresAt, !hasDefault, revocationUrl, now, now],
    );
  });
  return id;
}

export interface MetadataPatch {
  provider_account_label?: string | null;
  is_default?: boolean;
}

/** Updates label / default flag of the caller's token; at most one default per user and provider. */
export async function updateMetadata(db: Db, owner: Owner, id: string, patch: MetadataPatch): Promise<TokenRow | undefined> {
  return db.tx(async (tx) => {
    const row = await getOwnedToken(tx, owner, id);
    if (!row) return undefined;
    const now = nowIso();
    if (patch.is_default === true) {
      await lockProvider(tx, owner.workspaceId, row.provider_id);
      await tx.run('UPDATE oauth_tokens SET is_default = 0, updated_at = ? WHERE workspace_id = ? AND user_id = ? AND provider_id = ? AND is_default = 1 AND id <> ?', [now, owner.workspaceId, owner.userId, row.provider_id, row.id]);
    }
    const sets: string[] = ['updated_at = ?'];
    const params: unknown[] = [now];
    if (patch.provider_account_label !== undefined) {
      sets.push('provider_account_label = ?');
      params.push(patch.provider_account_label);
    }
    if (patch.is_default !== undefined) {
      sets.push('is_default = ?');
      params.push(patch.is_default);
    }
    await tx.run(`UPDATE oauth_tokens SET ${sets.join(', ')} WHERE id = ?`, [...params, row.id]);
    return getOwnedToken(tx, owner, row.id);
  });
}

export type ClaimResult = { claimed: true; row: TokenRow; claim: string } | { claimed: false; reason: 'not_found' | 'busy' };

/**
 * Claims the caller's token for deletion so that concurrent deletes revoke it once: a single
 * conditional UPDATE (atomic on SQLite and PostgreSQL) wins for exactly one caller. A claim older
 * than `staleMs` is considered abandoned (its process died mid-way) and can be taken over.
 */
export async function claimForDeletion(db: Db, owner: Owner, id: string, staleMs: number): Promise<ClaimResult> {
  const claim = `${nowIso()}#${randomUUID()}`;
  const staleBefore = new Date(Date.now() - staleMs).toISOString();
  const r = await db.run(
    'UPDATE oauth_tokens SET deleting_at = ? WHERE id = ? AND workspace_id = ? AND user_id = ? AND (deleting_at IS NULL OR deleting_at < ?)',
    [claim, id.toLowerCase(), owner.workspaceId, owner.userId, staleBefore],
  );
  if (r.changes === 1) {
    const row = await getOwnedToken(db, owner, id);
    if (row && row.deleting_at === claim) return { claimed: true, row, claim };
  }
  return { claimed: false, reason: (await getOwnedToken(db, owner, id)) ? 'busy' : 'not_found' };
}

/** Gives a claim back after a failed revocation, so the next delete can try again. */
export async function releaseClaim(db: Db, id: string, claim: string): Promise<void> {
  await db.run('UPDATE oauth_tokens SET deleting_at = NULL WHERE id = ? AND deleting_at = ?', [id, claim]);
}

/** Deletes the row only while it still holds our claim. */
export async function deleteClaimed(db: Db, id: string, claim: string): Promise<boolean> {
  return (await db.run('DELETE FROM oauth_tokens WHERE id = ? AND deleting_at = ?', [id, claim])).changes === 1;
}
