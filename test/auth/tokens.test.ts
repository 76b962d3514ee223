// The Auth Service (v2) end to end: the real `keygate serve` binary against a real OAuth / OpenID
// authorization server (oidc-provider), on SQLite and on PostgreSQL.
import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';
import { AuthorizationServer, browse, type TestClient } from './authorization-server.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'keygate-auth-'));
  dirs.push(d);
  return d;
};

/** Every secret the tests handle: none may ever appear in keygate's output. */
const secrets = new Set<string>();
const outputs: (() => string)[] = [];
const servers: AuthorizationServer[] = [];

afterAll(async () => {
  for (const s of servers) await s.close();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

interface Res {
  status: number;
  body: any;
  text: string;
  headers: Headers;
}

async function call(base: string, method: string, p: string, opts: { key?: string; headers?: Record<string, string>; body?: unknown } = {}): Promise<Res> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.key) headers['x-api-key'] = opts.key;
  if (opts.body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`${base}${p}`, { method, headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  const text = await res.text();
  let body: unknown;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    body = undefined;
  }
  return { status: res.status, body, text, headers: res.headers };
}

function createKey(dataDir: string, workspace: string, user: string, env: NodeJS.ProcessEnv): { key: string; workspaceId: string } {
  const r = runCli(['serve', 'keys', 'create', '--workspace', workspace, '--user', user, '--data', dataDir], { env });
  if (r.status !== 0) throw new Error(`keys create failed: ${r.stderr}`);
  const key = r.stdout.trim();
  secrets.add(key);
  return { key, workspaceId: /\(([^)]+)\)\s*$/.exec(r.stderr.trim())![1] };
}

/** An endpoint another member of the workspace runs: answers 200 {} and keeps every request body and Authorization. */
async function capture(): Promise<{ url: string; seen: string[]; close: () => Promise<void> }> {
  const seen: string[] = [];
  const srv = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString('utf8')));
    req.on('end', () => {
      seen.push(`${req.url} ${req.headers.authorization ?? ''} ${body}`);
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(srv.address() as net.AddressInfo).port}`, seen, close: () => new Promise((r) => srv.close(() => r())) };
}

/**
 * A revocation endpoint of its own address that first accepts connections and never answers, can
 * then be closed (nothing listens: unreachable), and finally healed: the same address relays to
 * the authorization server's real endpoint.
 */
async function faultyEndpoint(as: AuthorizationServer): Promise<{ url: string; close: () => Promise<void>; heal: () => Promise<void> }> {
  const sockets = new Set<net.Socket>();
  let healed = false;
  const srv = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
    if (!healed) return;
    const up = net.connect(as.port, '127.0.0.1');
    up.on('error', () => s.destroy());
    s.pipe(up).pipe(s);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  const close = async () => {
    sockets.forEach((s) => s.destroy());
    if (srv.listening) await new Promise((r) => srv.close(r));
  };
  return {
    url: `http://127.0.0.1:${port}${new URL(as.revocationUrl).pathname}`,
    close,
    heal: async () => {
      healed = true;
      await new Promise<void>((r) => srv.listen(port, '127.0.0.1', r));
    },
  };
}

const TIMEOUT_MS = 1500;
const ISSUER = 'https://issuer.keygate.test';
const AUDIENCE = 'keygate-api';

interface Harness {
  server: RunningCli;
  as: AuthorizationServer;
  dataDir: string;
  alice: string;
  bob: string;
  carol: string;
  carolWorkspace: string;
  basic: TestClient;
  post: TestClient;
  jwtKey: KeyObject;
  env: NodeJS.ProcessEnv;
}

/** keygate serve + the authorization server, wired to each other. */
async function startHarness(databaseUrl: string): Promise<Harness> {
  const dataDir = tmp();
  const env: NodeJS.ProcessEnv = { DATABASE_URL: databaseUrl, KEYGATE_API_KEY: '' };
  const as = await AuthorizationServer.listen();
  servers.push(as);
  const alice = createKey(dataDir, 'default', 'alice', env).key;
  const bob = createKey(dataDir, 'default', 'bob', env).key;
  const carolKey = createKey(dataDir, 'team-b', 'carol', env);

  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const keyFile = path.join(dataDir, 'issuer.pem');
  writeFileSync(keyFile, publicKey.export({ type: 'spki', format: 'pem' }));

  const basic: TestClient = { client_id: 'kg-basic', client_secret: 'basic-secret-7f3a9c1e5b2d', token_endpoint_auth_method: 'client_secret_basic', redirect_uris: [] };
  const post: TestClient = { client_id: 'kg-post', client_secret: 'post-secret-4e8b2a6c9d1f', token_endpoint_auth_method: 'client_secret_post', redirect_uris: [] };
  secrets.add(basic.client_secret!);
  secrets.add(post.client_secret!);
  // Registered at start-up from a config file, with the secret from the environment.
  const providersFile = path.join(dataDir, 'providers.json');
  writeFileSync(
    providersFile,
    JSON.stringify([
      {
        provider_id: 'oidc-post',
        name: 'Test OP (client_secret_post)',
        client_id: post.client_id,
        client_secret_env: 'TEST_OP_POST_SECRET',
        auth_url: `${as.authUrl}?prompt=consent`,
        token_url: as.tokenUrl,
        revocation_url: as.revocationUrl,
        uses_pkce: true,
        token_endpoint_auth_method: 'client_secret_post',
        scopes: ['openid', 'offline_access'],
      },
    ]),
  );

  const server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--config-dir', dataDir], {
    env: {
      ...env,
      KEYGATE_PROVIDERS_FILE: providersFile,
      TEST_OP_POST_SECRET: post.client_secret,
      KEYGATE_JWT_ISSUER: ISSUER,
      KEYGATE_JWT_AUDIENCE: AUDIENCE,
      KEYGATE_JWT_PUBLIC_KEY_FILE: keyFile,
      KEYGATE_OAUTH_HTTP_TIMEOUT_MS: String(TIMEOUT_MS),
    },
  });
  outputs.push(() => server.output());
  const callback = (id: string) => `${server.url}/v2/auth/callback/${id}`;
  basic.redirect_uris = [callback('oidc'), callback('norevoke'), callback('badsecret'), callback('shared')];
  post.redirect_uris = [callback('oidc-post')];
  as.configure([basic, post]);

  for (const p of [
    { provider_id: 'oidc', name: 'Test OP', revocation_url: as.revocationUrl },
    { provider_id: 'norevoke', name: 'Test OP without revocation' },
    { provider_id: 'badsecret', name: 'Test OP, wrong secret', client_secret: 'wrong-secret-9a8b7c6d5e4f' },
  ]) {
    secrets.add('wrong-secret-9a8b7c6d5e4f');
    const r = await call(server.url, 'POST', '/v2/auth/providers', {
      key: alice,
      body: { client_id: basic.client_id, client_secret: basic.client_secret, ...p, auth_url: `${as.authUrl}?prompt=consent`, token_url: as.tokenUrl, scopes: ['openid', 'offline_access'] },
    });
    expect(r.status).toBe(201);
  }
  return { server, as, dataDir, alice, bob, carol: carolKey.key, carolWorkspace: carolKey.workspaceId, basic, post, jwtKey: privateKey, env };
}

/** authenticate -> browser at the provider -> callback -> wait: the stored token's id. */
async function signIn(h: Harness, key: string, provider = 'oidc', scopes?: string[]): Promise<{ tokenId: string; callbackUrl: string }> {
  const start = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key, body: { provider, ...(scopes ? { scopes } : {}) } });
  expect(start.status).toBe(200);
  expect(start.body.status).toBe('pending');
  const landed = await browse(start.body.url, `${h.server.url}/v2/auth/callback/`);
  expect(landed.status).toBe(200);
  expect(landed.body).toContain('You can close this window');
  const done = await call(h.server.url, 'GET', `/v2/auth/wait/${start.body.auth_id}?timeout=5`, { key });
  expect(done.body.status).toBe('completed');
  return { tokenId: done.body.token_id, callbackUrl: landed.callbackUrl };
}

/** The access and refresh token the provider issued last, both still active. */
async function latestTokens(h: Harness, client?: TestClient): Promise<{ access: string; refresh: string }> {
  const access = h.as.accessTokens.at(-1)!;
  const refresh = h.as.refreshTokens.at(-1)!;
  expect(access).toBeTruthy();
  expect(refresh).toBeTruthy();
  expect((await h.as.introspect(access, client)).active).toBe(true);
  expect((await h.as.introspect(refresh, client)).active).toBe(true);
  return { access, refresh };
}

function jwt(h: Harness, claims: Record<string, unknown>, opts: { key?: KeyObject; alg?: string; exp?: string | number; aud?: string; iss?: string } = {}): Promise<string> {
  const token = new SignJWT(claims)
    .setProtectedHeader({ alg: opts.alg ?? 'ES256' })
    .setIssuer(opts.iss ?? ISSUER)
    .setAudience(opts.aud ?? AUDIENCE)
    .setIssuedAt()
    .setExpirationTime(opts.exp ?? '5m')
    .sign(opts.key ?? h.jwtKey);
  return token.then((t) => {
    secrets.add(t);
    return t;
  });
}

function defineSuite(name: string, databaseUrl: () => Promise<string>, full: boolean) {
  describe(name, () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness(await databaseUrl());
    });
    afterAll(async () => {
      expect(await h.server.stop()).toBe(0);
    });

    it('runs the full code flow with PKCE and lists the token without its values', async () => {
      const { tokenId } = await signIn(h, h.alice);
      expect(tokenId).toMatch(/^[0-9a-f-]{36}$/);
      const { access, refresh } = await latestTokens(h);
      const list = await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice });
      expect(list.status).toBe(200);
      expect(list.body).toHaveLength(1);
      expect(Object.keys(list.body[0]).sort()).toEqual(['created_at', 'expires_at', 'id', 'is_default', 'provider_account_label', 'provider_id', 'scopes', 'updated_at']);
      expect(list.body[0]).toMatchObject({ id: tokenId, provider_id: 'oidc', provider_account_label: null, is_default: true });
      expect(list.body[0].scopes).toEqual(expect.arrayContaining(['openid', 'offline_access']));
      expect(Date.parse(list.body[0].expires_at)).toBeGreaterThan(Date.now());
      expect(list.text).not.toContain(access);
      expect(list.text).not.toContain(refresh);
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens?provider_id=norevoke', { key: h.alice })).body).toEqual([]);
      // The caller already holds a valid token for these scopes: no new sign-in.
      const again = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key: h.alice, body: { provider: 'oidc' } });
      expect(again.body).toEqual({ status: 'completed', token_id: tokenId });
    });

    it('deletes only for the owner: others, unknown and malformed ids are refused', async () => {
      const [mine] = (await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice })).body;
      const unknown = await call(h.server.url, 'DELETE', '/v2/auth/tokens/7d0f5a34-1c1e-4f57-9a43-0b6a1e1f0c11', { key: h.alice });
      expect(unknown.status).toBe(404);
      const byBob = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: h.bob });
      expect(byBob.status).toBe(404);
      expect(byBob.body).toEqual(unknown.body);
      const byCarol = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: h.carol });
      expect(byCarol.status).toBe(404);
      expect(byCarol.body).toEqual(unknown.body);
      const bad = await call(h.server.url, 'DELETE', '/v2/auth/tokens/not-a-uuid', { key: h.alice });
      expect(bad.status).toBe(422);
      expect(bad.body.detail[0].loc).toEqual(['path', 'token_id']);
      expect(bad.body.detail[0]).toEqual({ loc: ['path', 'token_id'], msg: expect.any(String), type: expect.any(String) });
      const anon = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`);
      expect(anon.status).toBe(401);
      expect(anon.body.detail).toEqual(expect.any(String));
      const tenantOnly = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { headers: { 'X-Tenant-Id': 'default' } });
      expect(tenantOnly.status).toBe(401);
      const mismatch = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: h.alice, headers: { 'X-Tenant-Id': h.carolWorkspace } });
      expect(mismatch.status).toBe(403);
      const wrongKey = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: 'kg_not-a-real-key-0000000000000000' });
      expect(wrongKey.status).toBe(401);
      // Nothing was revoked or deleted by any of that.
      expect(h.as.revocations).toBe(0);
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice })).body).toHaveLength(1);
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.bob })).body).toEqual([]);
      const patchByBob = await call(h.server.url, 'PATCH', `/v2/auth/tokens/${mine.id}/metadata`, { key: h.bob, body: { provider_account_label: 'x' } });
      expect(patchByBob.status).toBe(404);
    });

    it('answers 502 and keeps the token while the provider is down; a retry after it is back revokes and deletes', async () => {
      const [mine] = (await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice })).body;
      const { access, refresh } = await latestTokens(h);
      await h.as.stop();
      try {
        const down = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: h.alice });
        expect(down.status).toBe(502);
        expect(down.body.detail).toMatch(/revocation .*failed/i);
        expect(down.text).not.toContain(access);
        expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice })).body.map((t: { id: string }) => t.id)).toEqual([mine.id]);
      } finally {
        await h.as.resume();
      }
      expect((await h.as.introspect(access)).active).toBe(true);
      const ok = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: h.alice });
      expect(ok.status).toBe(204);
      expect(ok.text).toBe('');
      // Both were revoked at the provider (each one on its own: the provider's grant stays).
      expect((await h.as.introspect(access)).active).toBe(false);
      expect((await h.as.introspect(refresh)).active).toBe(false);
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice })).body).toEqual([]);
      const gone = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${mine.id}`, { key: h.alice });
      expect(gone.status).toBe(404);
    });

    it('revokes exactly once when the same token is deleted concurrently', async () => {
      const { tokenId } = await signIn(h, h.alice);
      const { access, refresh } = await latestTokens(h);
      h.as.revocations = 0;
      h.as.revocationDelayMs = 300;
      try {
        const results = await Promise.all(Array.from({ length: 6 }, () => call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice })));
        const statuses = results.map((r) => r.status);
        expect(statuses.filter((s) => s === 204)).toHaveLength(1);
        expect(statuses.every((s) => s === 204 || s === 409 || s === 404)).toBe(true);
      } finally {
        h.as.revocationDelayMs = 0;
      }
      expect(h.as.revocations).toBe(2); // one revocation: refresh token, then access token
      expect((await h.as.introspect(access)).active).toBe(false);
      expect((await h.as.introspect(refresh)).active).toBe(false);
    });

    it('accepts a bearer JWT from the configured issuer for the owner, with or without a matching X-Tenant-Id', async () => {
      const { tokenId } = await signIn(h, h.alice);
      const { access } = await latestTokens(h);
      const aliceJwt = await jwt(h, { sub: 'alice', tenant_id: 'default' });
      const bobJwt = await jwt(h, { sub: 'bob', tenant_id: 'default' });
      const byBob = await call(h.server.url, "DELETE", `/v2/auth/tokens/${tokenId}`, { headers: { authorization: `Bearer ${bobJwt}` } });
      expect(byBob.body).toEqual({ detail: "Token not found." });
      expect(byBob.status).toBe(404);
      expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { headers: { authorization: `Bearer ${aliceJwt}`, 'x-tenant-id': h.carolWorkspace } })).status).toBe(403);
      const ok = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { headers: { authorization: `Bearer ${aliceJwt}`, 'X-Tenant-Id': 'default' } });
      expect(ok.status).toBe(204);
      expect((await h.as.introspect(access)).active).toBe(false);
    });

    it('a member who repoints a shared provider gets neither its client secret, nor a sign-in under way, nor stored tokens', async () => {
      const cap = await capture();
      try {
        const created = await call(h.server.url, 'POST', '/v2/auth/providers', {
          key: h.alice,
          body: { provider_id: 'shared', name: 'Shared OP', client_id: h.basic.client_id, client_secret: h.basic.client_secret, auth_url: `${h.as.authUrl}?prompt=consent`, token_url: h.as.tokenUrl, revocation_url: h.as.revocationUrl, scopes: ['openid', 'offline_access'] },
        });
        expect(created.status).toBe(201);
        // Bob does not know the client secret: he cannot make keygate send it to his endpoints.
        for (const field of ['token_url', 'revocation_url'] as const) {
          const moved = await call(h.server.url, 'PATCH', '/v2/auth/providers/shared', { key: h.bob, body: { [field]: `${cap.url}/${field}` } });
          expect(moved.status, field).toBe(422);
          expect(moved.body.detail[0]).toMatchObject({ loc: ['body', 'client_secret'], type: 'missing' });
          expect(moved.body.detail[0].msg).toContain(field);
        }
        expect((await call(h.server.url, 'GET', '/v2/auth/providers/shared', { key: h.bob })).body).toMatchObject({ token_url: h.as.tokenUrl, revocation_url: h.as.revocationUrl });
        // Unchanged endpoints (or other fields) need no secret.
        expect((await call(h.server.url, 'PATCH', '/v2/auth/providers/shared', { key: h.bob, body: { token_url: h.as.tokenUrl, name: 'Shared OP (renamed)' } })).status).toBe(200);

        // Alice holds a token of the provider and has a sign-in on its way.
        const { tokenId } = await signIn(h, h.alice, 'shared');
        const { access, refresh } = await latestTokens(h);
        const start = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key: h.alice, body: { provider: 'shared', scopes: ['openid', 'offline_access', 'profile'] } });
        expect(start.body.status).toBe('pending');

        // A member who knows the secret repoints both endpoints at his own server.
        const repointed = await call(h.server.url, 'PATCH', '/v2/auth/providers/shared', {
          key: h.bob,
          body: { token_url: `${cap.url}/token`, revocation_url: `${cap.url}/revoke`, client_secret: h.basic.client_secret },
        });
        expect(repointed.status).toBe(200);

        // The sign-in under way completes at the token endpoint it started with...
        const landed = await browse(start.body.url, `${h.server.url}/v2/auth/callback/`);
        expect(landed.status).toBe(200);
        const done = await call(h.server.url, 'GET', `/v2/auth/wait/${start.body.auth_id}?timeout=5`, { key: h.alice });
        expect(done.body.status).toBe('completed');
        const second = await latestTokens(h);
        // ...and both of Alice's tokens are revoked where they were issued.
        for (const id of [tokenId, done.body.token_id]) expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${id}`, { key: h.alice })).status).toBe(204);
        for (const t of [access, refresh, second.access, second.refresh]) expect((await h.as.introspect(t)).active).toBe(false);
        expect(cap.seen).toEqual([]);

        // A sign-in started after the change goes where the provider now points (the members' choice).
        const later = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key: h.alice, body: { provider: 'shared' } });
        await browse(later.body.url, `${h.server.url}/v2/auth/callback/`);
        expect(cap.seen.map((l) => l.split(' ')[0])).toEqual(['/token']);
      } finally {
        await cap.close();
      }
    });

    if (!full) return;

    it('times out a revocation endpoint that never answers, and one that is unreachable: 502, token kept, retried once it is back', async () => {
      const endpoint = await faultyEndpoint(h.as);
      let tokenId = '';
      try {
        const moved = await call(h.server.url, 'PATCH', '/v2/auth/providers/oidc', { key: h.alice, body: { revocation_url: endpoint.url, client_secret: h.basic.client_secret } });
        expect(moved.status).toBe(200);
        ({ tokenId } = await signIn(h, h.alice)); // revoked where its sign-in said: the faulty endpoint
        const { access } = await latestTokens(h);
        const started = Date.now();
        const r = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice });
        const elapsed = Date.now() - started;
        expect(r.status).toBe(502);
        expect(r.body.detail).toMatch(/did not answer within/);
        expect(elapsed).toBeGreaterThanOrEqual(TIMEOUT_MS - 100);
        expect(elapsed).toBeLessThan(TIMEOUT_MS * 4);
        // Nothing listening there (closed port) is a 502 too.
        await endpoint.close();
        const r2 = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice });
        expect(r2.status).toBe(502);
        expect(r2.body.detail).toMatch(/could not be reached/);
        expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.alice })).body.map((t: { id: string }) => t.id)).toContain(tokenId);
        // Back: the retry revokes and deletes.
        await endpoint.heal();
        expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice })).status).toBe(204);
        expect((await h.as.introspect(access)).active).toBe(false);
      } finally {
        await call(h.server.url, 'PATCH', '/v2/auth/providers/oidc', { key: h.alice, body: { revocation_url: h.as.revocationUrl, client_secret: h.basic.client_secret } });
        await endpoint.close();
      }
    });

    it('deletes a token of a provider without revocation endpoint and logs the missing revocation', async () => {
      const { tokenId } = await signIn(h, h.alice, 'norevoke');
      const { access } = await latestTokens(h);
      const before = h.as.revocations;
      const r = await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice });
      expect(r.status).toBe(204);
      expect(h.as.revocations).toBe(before);
      expect((await h.as.introspect(access)).active).toBe(true); // nothing told the provider
      const line = await waitForLine(h.server, (l) => l.includes('no revocation endpoint') && l.includes(tokenId));
      expect(JSON.parse(line)).toMatchObject({ level: 40, token_id: tokenId, provider_id: 'norevoke' });
    });

    it('uses a provider registered from the config file at start-up (client_secret_post, secret from the environment)', async () => {
      const listed = await call(h.server.url, 'GET', '/v2/auth/providers/oidc-post', { key: h.alice });
      expect(listed.status).toBe(200);
      expect(listed.body).toMatchObject({ provider_id: 'oidc-post', has_client_secret: true, token_endpoint_auth_method: 'client_secret_post' });
      expect(listed.text).not.toContain(h.post.client_secret!);
      const { tokenId } = await signIn(h, h.alice, 'oidc-post');
      const { access, refresh } = await latestTokens(h, h.post);
      expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice })).status).toBe(204);
      expect((await h.as.introspect(access, h.post)).active).toBe(false);
      expect((await h.as.introspect(refresh, h.post)).active).toBe(false);
    });

    it('treats the callback state as single use and never reflects what the provider sent', async () => {
      const start = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key: h.bob, body: { provider: 'oidc', scopes: ['openid'] } });
      expect(start.body.status).toBe('pending');
      const url = new URL(start.body.url);
      expect(url.searchParams.get('code_challenge_method')).toBe('S256');
      expect(url.searchParams.get('redirect_uri')).toBe(`${h.server.url}/v2/auth/callback/oidc`);
      expect(url.searchParams.get('prompt')).toBe('consent'); // parameters of auth_url are kept
      expect((await call(h.server.url, 'GET', `/v2/auth/wait/${start.body.auth_id}?timeout=0`, { key: h.bob })).body).toEqual({ status: 'pending' });
      expect((await call(h.server.url, 'GET', `/v2/auth/wait/${start.body.auth_id}?timeout=1`, { key: h.bob })).body).toEqual({ status: 'timeout' });
      expect((await call(h.server.url, 'GET', `/v2/auth/wait/${start.body.auth_id}?timeout=0`, { key: h.alice })).body).toEqual({ status: 'not_found' });
      const landed = await browse(start.body.url, `${h.server.url}/v2/auth/callback/`);
      expect(landed.status).toBe(200);
      const replay = await fetch(landed.callbackUrl);
      expect(replay.status).toBe(400);
      const page = await replay.text();
      expect(page).not.toContain(new URL(landed.callbackUrl).searchParams.get('code')!);
      expect(replay.headers.get('cache-control')).toBe('no-store');
      const forged = await fetch(`${h.server.url}/v2/auth/callback/oidc?code=%3Cscript%3E&state=forged`);
      expect(forged.status).toBe(400);
      expect(await forged.text()).not.toContain('<script>');
      const tokens = (await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.bob })).body;
      expect(tokens).toHaveLength(1);
      expect(tokens[0].scopes).toEqual(['openid']);
      expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokens[0].id}`, { key: h.bob })).status).toBe(204);
    });

    it('reports a refused sign-in and a failed code exchange as failed', async () => {
      const refused = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key: h.alice, body: { provider: 'oidc' } });
      const state = new URL(refused.body.url).searchParams.get('state')!;
      const r = await fetch(`${h.server.url}/v2/auth/callback/oidc?error=access_denied&state=${state}`);
      expect(r.status).toBe(400);
      expect((await call(h.server.url, 'GET', `/v2/auth/wait/${refused.body.auth_id}?timeout=1`, { key: h.alice })).body).toEqual({ status: 'failed' });

      const bad = await call(h.server.url, 'POST', '/v2/auth/authenticate', { key: h.alice, body: { provider: 'badsecret' } });
      const landed = await browse(bad.body.url, `${h.server.url}/v2/auth/callback/`);
      expect(landed.status).toBe(502);
      expect((await call(h.server.url, 'GET', `/v2/auth/wait/${bad.body.auth_id}?timeout=1`, { key: h.alice })).body).toEqual({ status: 'failed' });
      await expect.poll(() => h.server.output(), { timeout: 10_000 }).toMatch(/"reason":"the token endpoint answered HTTP 401 \(invalid_client\)"/);
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens?provider_id=badsecret', { key: h.alice })).body).toEqual([]);
    });

    it('refuses bearer tokens that are not from the issuer, expired, for another audience, unsigned-by-key or tenant-less', async () => {
      const list = (token: string, headers: Record<string, string> = {}) => call(h.server.url, 'GET', '/v2/auth/tokens', { headers: { authorization: `Bearer ${token}`, ...headers } });
      const other = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
      expect((await list(await jwt(h, { sub: 'alice', tenant_id: 'default' }, { key: other }))).status).toBe(401);
      expect((await list(await jwt(h, { sub: 'alice', tenant_id: 'default' }, { exp: Math.floor(Date.now() / 1000) - 600 }))).status).toBe(401);
      expect((await list(await jwt(h, { sub: 'alice', tenant_id: 'default' }, { aud: 'someone-else' }))).status).toBe(401);
      expect((await list(await jwt(h, { sub: 'alice', tenant_id: 'default' }, { iss: 'https://evil.test' }))).status).toBe(401);
      const hs = await new SignJWT({ sub: 'alice', tenant_id: 'default' }).setProtectedHeader({ alg: 'HS256' }).setIssuer(ISSUER).setAudience(AUDIENCE).setExpirationTime('5m').sign(new TextEncoder().encode('a-shared-secret-of-32-bytes-long!!'));
      secrets.add(hs);
      expect((await list(hs)).status).toBe(401);
      expect((await list(await jwt(h, { sub: 'alice' }))).status).toBe(401);
      expect((await list(await jwt(h, { sub: 'alice', tenant_id: 'no-such-workspace' }))).status).toBe(401);
      expect((await list('not.a.jwt')).status).toBe(401);
      // A valid token for a user never seen before creates that user.
      const dave = await list(await jwt(h, { sub: 'dave', workspace_id: 'default' }));
      expect(dave.status).toBe(200);
      expect(dave.body).toEqual([]);
      // The tenant header with an API key: its own workspace passes, another is refused.
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.carol, headers: { 'X-Tenant-Id': h.carolWorkspace } })).status).toBe(200);
      expect((await call(h.server.url, 'GET', '/v2/auth/tokens', { key: h.carol, headers: { 'X-Tenant-Id': 'default' } })).status).toBe(403);
    });

    it('manages providers per workspace with a write-only client secret', async () => {
      const body = { provider_id: 'gh', name: 'GitHub', client_id: 'Iv1.abc', client_secret: 'gh-secret-0a1b2c3d4e5f', auth_url: 'https://github.com/login/oauth/authorize', token_url: 'https://github.com/login/oauth/access_token', revocation_url: null, scopes: ['repo', 'repo'] };
      secrets.add(body.client_secret);
      const created = await call(h.server.url, 'POST', '/v2/auth/providers', { key: h.carol, body });
      expect(created.status).toBe(201);
      expect(created.body).toMatchObject({ provider_id: 'gh', has_client_secret: true, uses_pkce: true, token_endpoint_auth_method: 'client_secret_basic', scopes: ['repo'], revocation_url: null });
      expect(created.text).not.toContain(body.client_secret);
      expect((await call(h.server.url, 'POST', '/v2/auth/providers', { key: h.carol, body })).status).toBe(409);
      expect((await call(h.server.url, 'GET', '/v2/auth/providers/gh', { key: h.alice })).status).toBe(404);
      expect((await call(h.server.url, 'GET', '/v2/auth/providers', { key: h.carol })).body.map((p: { provider_id: string }) => p.provider_id)).toEqual(['gh']);
      const noSecret = await call(h.server.url, 'POST', '/v2/auth/providers', { key: h.carol, body: { ...body, provider_id: 'gh2', client_secret: undefined } });
      expect(noSecret.status).toBe(422);
      expect(noSecret.body.detail[0].loc).toEqual(['body', 'client_secret']);
      const badUrl = await call(h.server.url, 'POST', '/v2/auth/providers', { key: h.carol, body: { ...body, provider_id: 'gh3', token_url: 'ftp://x' } });
      expect(badUrl.status).toBe(422);
      expect(badUrl.body.detail[0].loc).toEqual(['body', 'token_url']);
      // Plain http to anything but loopback would carry the secret, codes and tokens in clear text.
      const plain = await call(h.server.url, 'POST', '/v2/auth/providers', { key: h.carol, body: { ...body, provider_id: 'gh4', token_url: 'http://idp.example.com/token', revocation_url: 'http://idp.example.com/revoke' } });
      expect(plain.status).toBe(422);
      expect(plain.body.detail.map((d: { loc: unknown[] }) => d.loc)).toEqual([['body', 'token_url'], ['body', 'revocation_url']]);
      expect(plain.body.detail[0].msg).toMatch(/must use https/);
      const plainPatch = await call(h.server.url, 'PATCH', '/v2/auth/providers/gh', { key: h.carol, body: { auth_url: 'http://idp.example.com/authorize' } });
      expect(plainPatch.status).toBe(422);
      expect((await call(h.server.url, 'GET', '/v2/auth/providers/gh', { key: h.carol })).body.auth_url).toBe(body.auth_url);
      const patched = await call(h.server.url, 'PATCH', '/v2/auth/providers/gh', { key: h.carol, body: { token_endpoint_auth_method: 'none', client_secret: null } });
      expect(patched.status).toBe(200);
      expect(patched.body).toMatchObject({ has_client_secret: false, token_endpoint_auth_method: 'none' });
      expect((await call(h.server.url, 'PATCH', '/v2/auth/providers/gh', { key: h.carol, body: { token_endpoint_auth_method: 'client_secret_post' } })).status).toBe(422);
      expect((await call(h.server.url, 'DELETE', '/v2/auth/providers/gh', { key: h.carol })).status).toBe(204);
      expect((await call(h.server.url, 'GET', '/v2/auth/providers/gh', { key: h.carol })).status).toBe(404);
      // A provider with stored tokens cannot be removed (its tokens could no longer be revoked).
      const { tokenId } = await signIn(h, h.alice);
      expect((await call(h.server.url, 'DELETE', '/v2/auth/providers/oidc', { key: h.alice })).status).toBe(409);
      expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${tokenId}`, { key: h.alice })).status).toBe(204);
    });

    it('updates token metadata for the owner, with one default per provider', async () => {
      const first = (await signIn(h, h.alice, 'oidc', ['openid'])).tokenId;
      const second = (await signIn(h, h.alice, 'oidc', ['openid', 'offline_access'])).tokenId;
      const label = await call(h.server.url, 'PATCH', `/v2/auth/tokens/${second}/metadata`, { key: h.alice, body: { provider_account_label: 'work account', is_default: true } });
      expect(label.status).toBe(200);
      expect(label.body).toMatchObject({ id: second, provider_account_label: 'work account', is_default: true });
      const list = (await call(h.server.url, 'GET', '/v2/auth/tokens?provider_id=oidc', { key: h.alice })).body;
      expect(list.map((t: { id: string; is_default: boolean }) => [t.id, t.is_default])).toEqual([
        [first, false],
        [second, true],
      ]);
      expect((await call(h.server.url, 'PATCH', `/v2/auth/tokens/${second}/metadata`, { key: h.alice, body: { is_default: 'yes' } })).status).toBe(422);
      expect((await call(h.server.url, 'PATCH', `/v2/auth/tokens/${second}/metadata`, { key: h.alice, body: { token: 'x' } })).status).toBe(422);
      for (const id of [first, second]) expect((await call(h.server.url, 'DELETE', `/v2/auth/tokens/${id}`, { key: h.alice })).status).toBe(204);
    });

    it('describes the routes in the OpenAPI document with the three security schemes', async () => {
      const doc = (await call(h.server.url, 'GET', '/openapi.json')).body;
      const del = doc.paths['/v2/auth/tokens/{token_id}'].delete;
      expect(del.security).toEqual([{ 'API Key': [] }, { 'Tenant ID': [] }, { 'Bearer Auth': [] }]);
      expect(Object.keys(del.responses)).toEqual(expect.arrayContaining(['204', '404', '502']));
      expect(doc.paths['/v2/auth/callback/{provider_id}'].get.security).toEqual([]);
    });
  });
}

defineSuite('Auth Service on SQLite', async () => '', true);
describe.skipIf(!pgAvailable())('PostgreSQL', () => {
  defineSuite('Auth Service on PostgreSQL (DATABASE_URL)', () => freshPgDatabase(), false);
});

describe('logs of the whole run', () => {
  it('never contain a token, code, client secret, API key or JWT', () => {
    const all = outputs.map((o) => o()).join('\n');
    expect(all.length).toBeGreaterThan(0);
    const issued = servers.flatMap((s) => [...s.issued]);
    expect(issued.length).toBeGreaterThan(0);
    for (const value of [...issued, ...secrets]) expect(all.includes(value), 'a secret value appears in the server output').toBe(false);
  });
});
