import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { nowIso, type Db } from '../store/db.js';
import { hashState } from './pkce.js';

/**
 * Pending authorization-code flows. A flow is found by the hash of its `state`, is used at most
 * once (pending -> exchanging -> completed | failed, each step a conditional UPDATE) and expires
 * after FLOW_TTL_MS.
 */

export const FLOW_TTL_MS = 10 * 60_000;

export type FlowStatus = 'pending' | 'exchanging' | 'completed' | 'failed';

export interface FlowRow {
  auth_id: string;
  state_hash: string;
  verifier_sealed: string | null;
  workspace_id: string;
  user_id: string;
  provider_id: string;
  scopes: string;
  redirect_uri: string;
  status: FlowStatus;
  token_id: string | null;
  /** The provider's endpoints when the flow started (endpoints_bound 1); see endpoints.ts. */
  token_url: string | null;
  revocation_url: string | null;
  endpoints_bound: number;
  created_at: string;
  expires_at: string;
  updated_at: string;
}

export interface NewFlow {
  workspaceId: string;
  userId: string;
  providerId: string;
  scopes: string[];
  redirectUri: string;
  verifierSealed: string | null;
  state: string;
  /** Where this flow's code is exchanged and its token later revoked. */
  endpoints: { tokenUrl: string; revocationUrl: string | null };
}

export async function createFlow(db: Db, f: NewFlow): Promise<string> {
  const authId = randomUUID();
  const now = new Date();
  // Old flows are of no use once they cannot complete; keep a day for `wait` callers, then forget.
  await db.run('DELETE FROM oauth_auth_flows WHERE expires_at < ?', [new Date(now.getTime() - 24 * 3600_000).toISOString()]);
  await db.run(
    `INSERT INTO oauth_auth_flows (auth_id, state_hash, verifier_sealed, workspace_id, user_id, provider_id, scopes, redirect_uri, status, token_id, token_url, revocation_url, endpoints_bound, created_at, expires_at, updated_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, ?, ?, 1, ?, ?, ?)`,
    [authId, hashState(f.state), f.verifierSealed, f.workspaceId, f.userId, f.providerId, JSON.stringify(f.scopes), f.redirectUri, f.endpoints.tokenUrl, f.endpoints.revocationUrl, now.toISOString(), new Date(now.getTime() + FLOW_TTL_MS).toISOString(), now.toISOString()],
  );
  return authId;
}

/**
 * Takes the pending, unexpired flow `state` belongs to (for this provider) for the code exchange.
 * Only one caller can: a replayed or raced callback finds nothing.
 */
export async function claimFlow(db: Db, state: string, providerId: string): Promise<FlowRow | undefined> {
  const hash = hashState(state);
  const now = nowIso();
  const r = await db.run("UPDATE oauth_auth_flows SET status = 'exchanging', updated_at = ? WHERE state_hash = ? AND provider_id = ? AND status = 'pending' AND expires_at > ?", [now, hash, providerId, now]);
  if (r.changes !== 1) return undefined;
  return db.get<FlowRow>('SELECT * FROM oauth_auth_flows WHERE state_hash = ?', [hash]);
}

/** Ends a flow; the verifier is dropped either way (it is single use). */
export async function finishFlow(db: Db, authId: string, outcome: { tokenId: string } | 'failed'): Promise<void> {
  if (outcome === 'failed') {
    await db.run("UPDATE oauth_auth_flows SET status = 'failed', verifier_sealed = NULL, updated_at = ? WHERE auth_id = ?", [nowIso(), authId]);
  } else {
    await db.run("UPDATE oauth_auth_flows SET status = 'completed', token_id = ?, verifier_sealed = NULL, updated_at = ? WHERE auth_id = ?", [outcome.tokenId, nowIso(), authId]);
  }
}

export async function getOwnedFlow(db: Db, authId: string, workspaceId: string, userId: string): Promise<FlowRow | undefined> {
  return db.get<FlowRow>('SELECT * FROM oauth_auth_flows WHERE auth_id = ? AND workspace_id = ? AND user_id = ?', [authId, workspaceId, userId]);
}

/**
 * Wakes `wait` long-polls when a flow of this process finishes. Flows finished by another
 * instance (shared PostgreSQL) are still seen: waiters re-read the row at least every second.
 */
export class FlowWaiters {
  private readonly events = new EventEmitter();
  private closed = false;

  constructor() {
    this.events.setMaxListeners(0);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  notify(authId: string): void {
    this.events.emit(authId);
  }

  /** Resolves on a notification for `authId`, after `ms`, on `signal` abort or on close. */
  wait(authId: string, ms: number, signal?: AbortSignal): Promise<void> {
    if (this.closed || signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.events.off(authId, done);
        this.events.off('\u0000close', done);
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.events.on(authId, done);
      this.events.on('\u0000close', done);
      signal?.addEventListener('abort', done);
    });
  }

  close(): void {
    this.closed = true;
    this.events.emit('\u0000close');
  }
}
