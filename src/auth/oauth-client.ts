import { fetch } from 'undici';

/**
 * Outbound calls to a provider: the code exchange (RFC 6749 section 4.1.3) and token revocation
 * (RFC 7009). Every error message here is ours: provider response bodies, tokens, codes and client
 * secrets are never put into one, only the HTTP status and a standard OAuth error code.
 */

export type ClientAuthMethod = 'client_secret_basic' | 'client_secret_post' | 'none';

export interface OAuthClient {
  clientId: string;
  clientSecret?: string;
  method: ClientAuthMethod;
}

export class ProviderCallError extends Error {
  constructor(
    message: string,
    readonly kind: 'status' | 'timeout' | 'unreachable' | 'invalid_response',
    readonly status?: number,
  ) {
    super(message);
    this.name = 'ProviderCallError';
  }
}

const MAX_RESPONSE_BYTES = 64 * 1024;

/** RFC 6749 section 2.3.1: client id and secret are form-encoded before Basic encoding. */
function formEncode(v: string): string {
  return new URLSearchParams({ v }).toString().slice(2);
}

/** Adds client authentication to a form body and headers, as the provider is configured. */
export function applyClientAuth(client: OAuthClient, form: URLSearchParams, headers: Record<string, string>): void {
  if (client.method === 'client_secret_basic') {
    const basic = Buffer.from(`${formEncode(client.clientId)}:${formEncode(client.clientSecret ?? '')}`, 'utf8').toString('base64');
    headers.authorization = `Basic ${basic}`;
  } else if (client.method === 'client_secret_post') {
    form.set('client_id', client.clientId);
    form.set('client_secret', client.clientSecret ?? '');
  } else {
    form.set('client_id', client.clientId);
  }
}

/** A standard OAuth error code (`invalid_grant`), safe to log; anything else is dropped. */
function oauthErrorCode(body: unknown): string | undefined {
  const code = (body as { error?: unknown } | undefined)?.error;
  return typeof code === 'string' && /^[a-z_]{1,64}$/.test(code) ? code : undefined;
}

async function readCapped(body: AsyncIterable<Uint8Array> | null): Promise<string> {
  if (!body) return '';
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > MAX_RESPONSE_BYTES) throw new ProviderCallError('the provider answered with an oversized body', 'invalid_response');
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks).toString('utf8');
}

interface PostResult {
  status: number;
  text: string;
}

/** POSTs a form, never following redirects, bounded by `timeoutMs` for the whole exchange. */
async function postForm(url: string, form: URLSearchParams, headers: Record<string, string>, timeoutMs: number, readBody: boolean): Promise<PostResult> {
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const res = await fetch(url, {
      method: 'POST',
      body: form.toString(),
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json', ...headers },
      redirect: 'manual',
      signal,
    });
    if (!readBody || res.status < 200 || res.status >= 300) {
      // The body is of no use (and may echo what we sent): read a bounded amount to find an OAuth
      // error code, then drop it.
      const text = res.headers.get('content-type')?.includes('json') ? await readCapped(res.body).catch(() => '') : (await res.body?.cancel().catch(() => undefined), '');
      return { status: res.status, text };
    }
    return { status: res.status, text: await readCapped(res.body) };
  } catch (err) {
    if (err instanceof ProviderCallError) throw err;
    const name = (err as Error).name;
    if (signal.aborted || name === 'TimeoutError' || name === 'AbortError') {
      throw new ProviderCallError(`the provider did not answer within ${Math.round(timeoutMs / 1000)} s`, 'timeout');
    }
    throw new ProviderCallError('the provider could not be reached', 'unreachable');
  }
}

function statusError(what: string, r: PostResult): ProviderCallError {
  let code: string | undefined;
  try {
    code = oauthErrorCode(JSON.parse(r.text));
  } catch {
    code = undefined;
  }
  return new ProviderCallError(`${what} answered HTTP ${r.status}${code ? ` (${code})` : ''}`, 'status', r.status);
}

export interface TokenSet {
  accessToken: string;
  refreshToken?: string;
  tokenType?: string;
  /** Seconds from now, when the provider says. */
  expiresIn?: number;
  /** Space-separated scopes the provider granted, when it says. */
  scope?: string;
}

export interface ExchangeInput {
  tokenUrl: string;
  client: OAuthClient;
  code: string;
  redirectUri: string;
  codeVerifier?: string;
  timeoutMs: number;
}

/** The longest lifetime kept (ten years): a larger one (`1e300`) is no date at all. */
export const MAX_TOKEN_LIFETIME_S = 10 * 365 * 24 * 3600;

/**
 * A token's lifetime in seconds from `expires_in` (RFC 6749 5.1), as providers send it: a number, or
 * a string of one (`"3600"`, `"3600.5"`), floored, at least 0, at most MAX_TOKEN_LIFETIME_S.
 * Absent: undefined (the token is taken not to expire, as RFC 6749 leaves it to the provider).
 * Present but not a number (`"soon"`, `true`): 0, so the token is never reused. It used to count
 * as absent: `authenticate` then answered `completed` with that token for ever, however long ago
 * it had expired at the provider. Pure.
 */
export function lifetimeOf(v: unknown): number | undefined {
  if (v === undefined || v === null) return undefined;
  const n = typeof v === 'number' ? v : typeof v === 'string' && /^\s*-?\d+(\.\d+)?\s*$/.test(v) ? Number(v) : NaN;
  if (Number.isNaN(n)) return 0;
  return Math.min(MAX_TOKEN_LIFETIME_S, Math.max(0, Math.floor(n)));
}

/** Exchanges an authorization code for tokens. */
export async function exchangeCode(input: ExchangeInput): Promise<TokenSet> {
  const form = new URLSearchParams({ grant_type: 'authorization_code', code: input.code, redirect_uri: input.redirectUri });
  if (input.codeVerifier) form.set('code_verifier', input.codeVerifier);
  const headers: Record<string, string> = {};
  applyClientAuth(input.client, form, headers);
  const r = await postForm(input.tokenUrl, form, headers, input.timeoutMs, true);
  if (r.status !== 200) throw statusError('the token endpoint', r);
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(r.text) as Record<string, unknown>;
  } catch {
    throw new ProviderCallError('the token endpoint answered with something other than JSON', 'invalid_response');
  }
  if (typeof body.access_token !== 'string' || !body.access_token) {
    throw new ProviderCallError('the token endpoint answered without an access token', 'invalid_response');
  }
  const expiresIn = lifetimeOf(body.expires_in);
  return {
    accessToken: body.access_token,
    refreshToken: typeof body.refresh_token === 'string' && body.refresh_token ? body.refresh_token : undefined,
    tokenType: typeof body.token_type === 'string' ? body.token_type : undefined,
    expiresIn,
    scope: typeof body.scope === 'string' ? body.scope : undefined,
  };
}

export interface RevokeInput {
  revocationUrl: string;
  client: OAuthClient;
  accessToken: string;
  refreshToken?: string;
  timeoutMs: number;
}

/**
 * Revokes the refresh token first (it can mint new access tokens, so it matters most), then the
 * access token, each with its `token_type_hint`. RFC 7009 answers 200 also for tokens already
 * invalid, so a retry after a partial failure is harmless. Throws on the first failure.
 */
export async function revokeTokens(input: RevokeInput): Promise<void> {
  const steps: [string, string][] = [];
  if (input.refreshToken) steps.push([input.refreshToken, 'refresh_token']);
  steps.push([input.accessToken, 'access_token']);
  for (const [token, hint] of steps) {
    const form = new URLSearchParams({ token, token_type_hint: hint });
    const headers: Record<string, string> = {};
    applyClientAuth(input.client, form, headers);
    const r = await postForm(input.revocationUrl, form, headers, input.timeoutMs, false);
    if (r.status < 200 || r.status >= 300) throw statusError(`the revocation endpoint (${hint.replace('_', ' ')})`, r);
  }
}
