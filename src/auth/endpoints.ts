/**
 * Where the Auth Service sends what it holds (pure). Any member of a workspace may change a
 * shared provider, so what one member stored must not follow the provider to wherever another
 * member points it:
 * - a sign-in's code (and PKCE verifier) is exchanged at the token_url the provider had when that
 *   sign-in started, and the token it yields is revoked at the revocation_url of that moment;
 * - the stored client_secret goes to a token_url or revocation_url other than the ones it was
 *   given for only when the change gives the secret again (whoever knows it may point it anywhere;
 *   whoever does not cannot make keygate send it to them).
 * Rows from before the binding (endpoints_bound 0) use the provider's endpoints as they are.
 */

export interface ProviderEndpoints {
  token_url: string;
  revocation_url: string | null;
  client_secret_sealed: string | null;
}

interface Bound {
  endpoints_bound: number;
  revocation_url: string | null;
}

/** The code exchange of `flow` goes here. */
export function flowTokenUrl(flow: Bound & { token_url: string | null }, provider: ProviderEndpoints): string {
  return Number(flow.endpoints_bound) && flow.token_url ? flow.token_url : provider.token_url;
}

/**
 * The revocation endpoint of a flow (then of its token): the one bound to it, or the provider's
 * current one when that is on the same origin (a provider that moved its endpoint to another path
 * of its own host still gets its tokens back; another host, whoever set it, does not). An unbound
 * row (from before the binding) uses the provider's.
 */
export function boundRevocationUrl(row: Bound, provider: ProviderEndpoints): string | null {
  if (!Number(row.endpoints_bound)) return provider.revocation_url;
  if (row.revocation_url && provider.revocation_url && sameOrigin(row.revocation_url, provider.revocation_url)) return provider.revocation_url;
  return row.revocation_url;
}

function sameOrigin(a: string, b: string): boolean {
  try {
    return new URL(a).origin === new URL(b).origin;
  } catch {
    return false;
  }
}

/**
 * A change of a provider that would send its stored client secret to a new token_url or
 * revocation_url without giving the secret again: the message for 422 at body.client_secret.
 */
export function secretRebindProblem(current: ProviderEndpoints, patch: { token_url?: string; revocation_url?: string | null; client_secret?: string | null }): string | undefined {
  if (current.client_secret_sealed === null || patch.client_secret !== undefined) return undefined;
  const moved = (['token_url', 'revocation_url'] as const).filter((f) => patch[f] !== undefined && (patch[f] ?? null) !== (current[f] ?? null));
  if (moved.length === 0) return undefined;
  return `changing ${moved.join(' and ')} would send the stored client_secret to a new place: give client_secret again (or null where the method allows none)`;
}
