import { createHash, randomBytes } from 'node:crypto';

/** Pure helpers of the authorization-code flow (RFC 6749 section 4.1, RFC 7636). */

/** 32 random bytes: a 43-character verifier (RFC 7636 allows 43..128 of [A-Za-z0-9-._~]). */
export function newVerifier(): string {
  return randomBytes(32).toString('base64url');
}

export function s256Challenge(verifier: string): string {
  return createHash('sha256').update(verifier, 'ascii').digest('base64url');
}

/** The `state` parameter: unguessable, single use; only its hash is stored. */
export function newState(): string {
  return randomBytes(32).toString('base64url');
}

export function hashState(state: string): string {
  return createHash('sha256').update(state, 'utf8').digest('hex');
}

export interface AuthorizeUrlInput {
  authUrl: string;
  clientId: string;
  redirectUri: string;
  scopes: string[];
  state: string;
  /** S256 challenge; omitted for providers that do not use PKCE. */
  codeChallenge?: string;
}

/** The provider's authorization URL with our parameters added to any it already carries. */
export function authorizeUrl(input: AuthorizeUrlInput): string {
  const url = new URL(input.authUrl);
  url.searchParams.set('response_type', 'code');
  url.searchParams.set('client_id', input.clientId);
  url.searchParams.set('redirect_uri', input.redirectUri);
  if (input.scopes.length) url.searchParams.set('scope', input.scopes.join(' '));
  url.searchParams.set('state', input.state);
  if (input.codeChallenge) {
    url.searchParams.set('code_challenge', input.codeChallenge);
    url.searchParams.set('code_challenge_method', 'S256');
  }
  return url.toString();
}

/** Every requested scope is granted by the token (scopes compare exactly, order ignored). */
export function coversScopes(granted: string[], requested: string[]): boolean {
  const have = new Set(granted);
  return requested.every((s) => have.has(s));
}

/** Normalises a scope list: trimmed, non-empty, unique, in first-seen order. */
export function normaliseScopes(scopes: string[]): string[] {
  return [...new Set(scopes.map((s) => s.trim()).filter(Boolean))];
}

export const UUID_PATTERN = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
