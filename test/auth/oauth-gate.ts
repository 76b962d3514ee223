// A loopback front for the token and revocation endpoints of the test authorization server
// (authorization-server.ts): it relays to the real endpoints and records what keygate sent and
// what it was answered, or misbehaves the way it is told to for the next request (an error status,
// non-JSON, an oversized body, missing or wrong fields, a redirect, silence, a cut connection,
// nothing listening). The browser part of a sign-in goes to the authorization server directly.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { AuthorizationServer } from './authorization-server.js';
import { listenAgain, takeOffline } from '../helpers/relisten.js';

/** How the token endpoint answers the next code exchange. */
export const TOKEN_FAULTS = [
  'status-500', // a server error with an OAuth error body
  'invalid-grant', // 400 {"error":"invalid_grant"}
  'non-json', // 200 with HTML
  'huge', // 200 with a JSON body far over keygate's cap
  'no-access-token', // 200 JSON without access_token
  'json-null', // 200 `null`
  'json-array', // 200 `[]`
  'redirect', // 307 to the real token endpoint
  'cut', // the connection is destroyed without an answer
  'refused', // nothing listens
  'slow', // no answer within keygate's timeout
] as const;
/** Token endpoint answers that are a success, possibly reshaped. */
export const TOKEN_OKS = ['pass', 'no-expiry', 'short-expiry', 'no-scope', 'no-refresh', 'bearer-case', 'wrong-token-type', 'huge-expiry', 'decimal-expiry', 'garbage-expiry'] as const;
export type TokenMode = (typeof TOKEN_FAULTS)[number] | (typeof TOKEN_OKS)[number];

/** How the revocation endpoint answers one request. */
export const REVOKE_FAULTS = ['status-500', 'status-503', 'unsupported', 'redirect', 'cut', 'refused', 'slow'] as const;
export type RevokeMode = 'pass' | 'junk-200' | 'empty-204' | (typeof REVOKE_FAULTS)[number];

export interface Seen {
  path: string;
  authorization: string | undefined;
  form: URLSearchParams;
  /** The relayed answer of the real endpoint (status and parsed JSON), when relayed. */
  status?: number;
  json?: Record<string, unknown>;
}

export class OAuthGate {
  readonly tokenRequests: Seen[] = [];
  readonly revokeRequests: Seen[] = [];
  /** Every value that passed through that keygate must never show (codes, verifiers, tokens, secrets). */
  readonly values = new Set<string>();
  tokenMode: TokenMode = 'pass';
  /** One mode per revocation request, in order; 'pass' when empty. */
  revokeModes: RevokeMode[] = [];
  /** Runs once the real token endpoint has issued tokens, before keygate gets them (then cleared). */
  onTokensIssued: (() => Promise<void>) | null = null;
  private server: http.Server;
  private hanging = new Set<http.ServerResponse>();

  private constructor(
    server: http.Server,
    readonly port: number,
    private readonly as: AuthorizationServer,
    readonly timeoutMs: number,
  ) {
    this.server = server;
  }

  static async listen(as: AuthorizationServer, timeoutMs: number): Promise<OAuthGate> {
    const server = http.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const gate = new OAuthGate(server, (server.address() as AddressInfo).port, as, timeoutMs);
    server.on('request', (req, res) =>
      gate.handle(req, res).catch(() => {
        if (!res.headersSent) res.writeHead(599).end();
        else res.destroy();
      }),
    );
    return gate;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }
  get tokenUrl(): string {
    return `${this.url}/token`;
  }
  get revocationUrl(): string {
    return `${this.url}/revoke`;
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks).toString('utf8');
    const form = new URLSearchParams(body);
    for (const [k, v] of form) if (k !== 'grant_type' && k !== 'token_type_hint' && k !== 'redirect_uri' && k !== 'client_id') this.values.add(v);
    const seen: Seen = { path: req.url ?? '', authorization: req.headers.authorization, form };
    const isToken = req.url === '/token';
    const mode: string = isToken ? this.tokenMode : (this.revokeModes.shift() ?? 'pass');
    if (isToken) this.tokenRequests.push(seen);
    else this.revokeRequests.push(seen);
    const json = (status: number, v: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(typeof v === 'string' ? v : JSON.stringify(v));
    switch (mode) {
      case 'status-500':
        return void json(500, { error: 'server_error' });
      case 'status-503':
        return void res.writeHead(503, { 'content-type': 'text/html' }).end('<h1>down</h1>');
      case 'invalid-grant':
        return void json(400, { error: 'invalid_grant', error_description: `code ${form.get('code')} is not valid` });
      case 'unsupported':
        return void json(400, { error: 'unsupported_token_type' });
      case 'non-json':
        return void res.writeHead(200, { 'content-type': 'text/html' }).end('<html>sign in</html>');
      case 'huge':
        return void json(200, { access_token: 'h'.repeat(200_000), token_type: 'Bearer' });
      case 'no-access-token':
        return void json(200, { token_type: 'Bearer', expires_in: 3600 });
      case 'json-null':
        return void json(200, 'null');
      case 'json-array':
        return void json(200, '[]');
      case 'junk-200':
        return void res.writeHead(200, { 'content-type': 'application/json' }).end('{not json at all');
      case 'empty-204':
        return void res.writeHead(204).end();
      case 'redirect':
        return void res.writeHead(307, { location: `${this.as.issuer}${isToken ? '/token' : '/token/revocation'}` }).end();
      case 'cut':
        return void req.socket.destroy();
      case 'slow': {
        // Answers nothing until keygate gives up (its timeout) and closes the connection.
        this.hanging.add(res);
        res.on('close', () => this.hanging.delete(res));
        return;
      }
      case 'refused':
        // Set up by `refuse()` before the call: this is only reached if something slipped through.
        return void req.socket.destroy();
    }
    // Relay to the real endpoint, then reshape a success as asked.
    const target = `${this.as.issuer}${isToken ? '/token' : '/token/revocation'}`;
    const up = await fetch(target, { method: 'POST', headers: { 'content-type': req.headers['content-type'] ?? 'application/x-www-form-urlencoded', ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}) }, body });
    const text = await up.text();
    seen.status = up.status;
    let parsed: Record<string, unknown> | undefined;
    try {
      parsed = text ? (JSON.parse(text) as Record<string, unknown>) : undefined;
    } catch {
      parsed = undefined;
    }
    if (parsed) {
      for (const k of ['access_token', 'refresh_token', 'id_token']) if (typeof parsed[k] === 'string') this.values.add(parsed[k] as string);
      if (isToken && up.status === 200) {
        if (mode === 'no-expiry') delete parsed.expires_in;
        if (mode === 'short-expiry') parsed.expires_in = 30;
        if (mode === 'no-scope') delete parsed.scope;
        if (mode === 'no-refresh') delete parsed.refresh_token;
        if (mode === 'bearer-case') parsed.token_type = 'bEaReR';
        if (mode === 'wrong-token-type') parsed.token_type = 'mac';
        if (mode === 'huge-expiry') parsed.expires_in = 1e300;
        if (mode === 'decimal-expiry') parsed.expires_in = '3600.5';
        if (mode === 'garbage-expiry') parsed.expires_in = 'soon';
      }
      seen.json = parsed;
      if (isToken && up.status === 200 && this.onTokensIssued) {
        const hook = this.onTokensIssued;
        this.onTokensIssued = null;
        await hook();
      }
      return void json(up.status, parsed);
    }
    res.writeHead(up.status, { 'content-type': up.headers.get('content-type') ?? 'text/plain' }).end(text);
  }

  /** Nothing listens on the gate's port until `resume` (connection refused). */
  async refuse(): Promise<void> {
    await takeOffline(this.server);
  }

  async resume(): Promise<void> {
    await listenAgain(this.server, this.port);
  }

  async close(): Promise<void> {
    for (const r of this.hanging) r.destroy();
    if (this.server.listening) await this.refuse();
  }
}

