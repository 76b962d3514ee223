// A real OAuth 2.0 / OpenID authorization server (oidc-provider 9) on 127.0.0.1:0 for the Auth
// Service tests: code flow with PKCE, refresh tokens, RFC 7009 revocation and RFC 7662
// introspection. Sign-in is automatic (one test account, consent granted in the interaction), so
// the tests drive it with plain HTTP like a browser would.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Provider from 'oidc-provider';
import { listenAgain, takeOffline } from '../helpers/relisten.js';

export interface TestClient {
  client_id: string;
  client_secret?: string;
  token_endpoint_auth_method: 'client_secret_basic' | 'client_secret_post' | 'none';
  redirect_uris: string[];
  /** false: the server lets this client sign in without PKCE (a keygate provider with uses_pkce false). */
  pkce?: false;
}

export class AuthorizationServer {
  readonly issuer: string;
  /** Every token value and code the server issued, to prove none of them leaks into logs. */
  readonly issued = new Set<string>();
  /** The values by kind, in issue order. */
  readonly accessTokens: string[] = [];
  readonly refreshTokens: string[] = [];
  /** Revocation requests received (each token type counts once). */
  revocations = 0;
  /** Delay before the revocation endpoint is handled, to make concurrent deletes overlap. */
  revocationDelayMs = 0;
  private provider: any;
  private server: http.Server;
  private clients: TestClient[] = [];

  private constructor(server: http.Server, readonly port: number) {
    this.server = server;
    this.issuer = `http://127.0.0.1:${port}`;
  }

  /** Listens first (so the issuer URL is known), then `configure` installs the provider. */
  static async listen(): Promise<AuthorizationServer> {
    const server = http.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const as = new AuthorizationServer(server, (server.address() as AddressInfo).port);
    server.on('request', (req, res) => as.handle(req, res));
    return as;
  }

  get authUrl() {
    return `${this.issuer}/auth`;
  }
  get tokenUrl() {
    return `${this.issuer}/token`;
  }
  get revocationUrl() {
    return `${this.issuer}/token/revocation`;
  }

  configure(clients: TestClient[]): void {
    this.clients = clients;
    const provider = new Provider(this.issuer, {
      clients: clients.map(({ pkce: _pkce, ...c }) => ({ ...c, grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'] })),
      features: { devInteractions: { enabled: false }, revocation: { enabled: true }, introspection: { enabled: true } },
      interactions: { url: (_ctx: unknown, interaction: { uid: string }) => `/interaction/${interaction.uid}` },
      findAccount: async (_ctx: unknown, id: string) => ({ accountId: id, claims: async () => ({ sub: id }) }),
      // Refresh tokens for every code grant of a client allowed to use them.
      issueRefreshToken: async (_ctx: unknown, client: any) => client.grantTypeAllowed('refresh_token'),
      // Revoking one token must not take the others with it: the tests check that keygate revokes
      // the refresh token AND the access token itself.
      revokeGrantPolicy: () => false,
      pkce: { required: (_ctx: unknown, client: { clientId: string }) => clients.find((c) => c.client_id === client.clientId)?.pkce !== false },
      cookies: { keys: ['test-cookie-key-0123456789abcdef'] },
      ttl: { AccessToken: 3600, AuthorizationCode: 60, RefreshToken: 86400, Interaction: 600, Session: 3600, Grant: 86400 },
    });
    provider.on('access_token.saved', (t: { jti: string }) => (this.issued.add(t.jti), this.accessTokens.push(t.jti)));
    provider.on('refresh_token.saved', (t: { jti: string }) => (this.issued.add(t.jti), this.refreshTokens.push(t.jti)));
    provider.on('authorization_code.saved', (t: { jti: string }) => this.issued.add(t.jti));
    provider.on('server_error', (_ctx: unknown, err: Error) => console.error('oidc-provider server_error', err));
    this.provider = provider;
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    try {
      if (!this.provider) {
        res.statusCode = 503;
        return void res.end();
      }
      if (req.url?.startsWith('/interaction/')) {
        const details = await this.provider.interactionDetails(req, res);
        const accountId = 'test-user';
        const grant = new this.provider.Grant({ accountId, clientId: details.params.client_id });
        grant.addOIDCScope(String(details.params.scope ?? 'openid'));
        const grantId = await grant.save();
        return await this.provider.interactionFinished(req, res, { login: { accountId }, consent: { grantId } }, { mergeWithLastSubmission: false });
      }
      if (req.url?.startsWith('/token/revocation')) {
        this.revocations++;
        if (this.revocationDelayMs) await new Promise((r) => setTimeout(r, this.revocationDelayMs));
      }
      this.provider.callback()(req, res);
    } catch (err) {
      res.statusCode = 500;
      res.end(String((err as Error).message));
    }
  }

  /** RFC 7662 introspection as the given client. */
  async introspect(token: string, client: TestClient = this.clients[0]): Promise<{ active: boolean; token_type?: string }> {
    const res = await fetch(`${this.issuer}/token/introspection`, {
      method: 'POST',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        ...(client.token_endpoint_auth_method === 'client_secret_basic' ? { authorization: `Basic ${Buffer.from(`${client.client_id}:${client.client_secret}`).toString('base64')}` } : {}),
      },
      body: new URLSearchParams(client.token_endpoint_auth_method === 'client_secret_post' ? { token, client_id: client.client_id, client_secret: client.client_secret! } : { token }).toString(),
    });
    if (res.status !== 200) throw new Error(`introspection answered ${res.status}`);
    return (await res.json()) as { active: boolean };
  }

  /** Takes the server off the network (connections cut), keeping its state for `resume`. */
  async stop(): Promise<void> {
    await takeOffline(this.server);
  }

  /** Listens again on the same port (the issuer URL is part of every token and client). */
  async resume(): Promise<void> {
    await listenAgain(this.server, this.port);
  }

  async close(): Promise<void> {
    if (this.server.listening) await this.stop();
  }
}

/**
 * Plays the browser: follows the provider's redirects with a cookie jar until the provider sends
 * it to `callbackPrefix` (authorizeAt), then opens that callback URL (without the provider's cookies).
 */
export async function browse(url: string, callbackPrefix: string): Promise<{ callbackUrl: string; status: number; body: string }> {
  const callbackUrl = (await authorizeAt(url, callbackPrefix)).toString();
  const res = await fetch(callbackUrl, { redirect: 'manual' });
  return { callbackUrl, status: res.status, body: await res.text() };
}

/**
 * Plays the browser at the authorization server: follows its redirects with a cookie jar until it
 * sends the browser to `callbackPrefix`, and returns that URL without opening it (the test opens
 * it, as it was or altered).
 */
export async function authorizeAt(url: string, callbackPrefix: string): Promise<URL> {
  const jar = new Map<string, string>();
  let next = url;
  for (let hop = 0; hop < 20; hop++) {
    if (next.startsWith(callbackPrefix)) return new URL(next);
    const cookie = [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
    const res = await fetch(next, { redirect: 'manual', headers: cookie ? { cookie } : {} });
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(';');
      const i = pair.indexOf('=');
      jar.set(pair.slice(0, i).trim(), pair.slice(i + 1).trim());
    }
    const location = res.headers.get('location');
    await res.arrayBuffer();
    if (!location) throw new Error(`the authorization server stopped at ${res.status} without a redirect`);
    next = new URL(location, next).toString();
  }
  throw new Error('too many redirects');
}
