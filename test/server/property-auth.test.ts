// Property tests of the Auth Service (v2) HTTP API, the API-key routes and the server's own routes
// (wire.md, "Auth Service (v2): OAuth tokens", "Authentication"): every route, driven with
// generated hostile input through a real server on real SQLite files (in-process, every area)
// with a real HTTP client (undici). On every answer: never a 5xx, exactly the documented error
// shape (the OAuth callback's HTML pages aside), no client secret, OAuth token or API key in any
// body, header or log line, a rejected request changes nothing; another workspace's key gets what
// a missing provider or token gets; accepted writes read back as written.
import fc from 'fast-check';
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { storeToken } from '../../src/auth/tokens.js';
import { createApiKey, hashApiKey } from '../../src/server/auth.js';
import { propertyParams } from '../helpers/property.js';
import { startInProcess, type InProcessServer } from './inprocess.js';
import { checked, hostileRequest, httpClient, Known, secretTail, secretValue, type Res, type RouteSpec } from './property-helpers.js';
import { budget } from './property-helpers.js';

let s: InProcessServer;
let http: ReturnType<typeof httpClient>;
const known = new Known();
const PROV = 'fx-prov';
const fixture = { token: '', spareKey: '', authId: '', owner: { workspaceId: '', userId: '' } };
let providerFixture: Record<string, unknown>;

async function call(method: string, path: string, key: string, body?: unknown): Promise<Res> {
  return (await http.send({ method, path, headers: { 'x-api-key': key, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) }, body: body === undefined ? undefined : JSON.stringify(body) }))!;
}

function providerBody(id: string, tail = ''): Record<string, unknown> {
  const secret = secretValue('csec', tail);
  known.add(secret.core);
  return {
    provider_id: id,
    name: 'Example IdP',
    client_id: 'client-1',
    client_secret: secret.value,
    auth_url: 'https://idp.example.test/authorize',
    token_url: 'https://idp.example.test/token',
    uses_pkce: true,
    token_endpoint_auth_method: 'client_secret_basic',
    scopes: ['read', 'write'],
  };
}

async function newToken(): Promise<string> {
  const access = secretValue('acc');
  const refresh = secretValue('ref');
  known.add(access.core);
  known.add(refresh.core);
  return storeToken(s.built.ctx.db, s.built.ctx.envelope, fixture.owner, PROV, { accessToken: access.value, refreshToken: refresh.value }, ['read'], null);
}

/** Back to the fixture: A's provider, token, spare key and flow; B's provider; nothing else. */
async function restore(): Promise<void> {
  for (const [key, keep] of [[s.key, PROV], [s.keyB, 'fx-prov-b']] as const) {
    const list = (await call('GET', '/v2/auth/providers', key)).json as { provider_id: string }[];
    for (const p of list) if (p.provider_id !== keep) expect((await call('DELETE', `/v2/auth/providers/${encodeURIComponent(p.provider_id)}`, key)).status).toBe(204);
    if (!list.some((p) => p.provider_id === keep)) expect((await call('POST', '/v2/auth/providers', key, key === s.key ? providerFixture : providerBody(keep))).status).toBe(201);
  }
  const prov = (await call('GET', `/v2/auth/providers/${PROV}`, s.key)).json as Record<string, unknown>;
  const row = await s.built.ctx.db.get<{ client_secret_sealed: string | null }>("SELECT client_secret_sealed FROM oauth_providers WHERE workspace_id = 'default' AND provider_id = ?", [PROV]);
  const same =
    Object.entries(providerFixture).every(([k, v]) => k === 'client_secret' || JSON.stringify(prov[k]) === JSON.stringify(v)) &&
    prov.revocation_url === null &&
    row?.client_secret_sealed != null &&
    s.built.ctx.envelope.open(row.client_secret_sealed) === providerFixture.client_secret;
  if (!same) {
    const { provider_id: _id, ...fields } = providerFixture;
    const r = await call('PATCH', `/v2/auth/providers/${PROV}`, s.key, { ...fields, revocation_url: null });
    expect(r.status, r.text).toBe(200);
  }
  const tokens = (await call('GET', '/v2/auth/tokens', s.key)).json as { id: string; provider_account_label: string | null; is_default: boolean }[];
  for (const t of tokens) if (t.id !== fixture.token) expect((await call('DELETE', `/v2/auth/tokens/${t.id}`, s.key)).status).toBe(204);
  const mine = tokens.find((t) => t.id === fixture.token);
  if (!mine) fixture.token = await newToken();
  else if (mine.provider_account_label !== null || !mine.is_default) expect((await call('PATCH', `/v2/auth/tokens/${fixture.token}/metadata`, s.key, { provider_account_label: null, is_default: true })).status).toBe(200);
  const keys = (await call('GET', '/api/v1/api-key', s.key)).json as { id: string }[];
  if (!keys.some((k) => k.id === fixture.spareKey)) {
    const spare = await createApiKey(s.built.ctx.db, { workspace: 'default', user: 'admin', name: 'spare' });
    known.add(spare.key);
    fixture.spareKey = spare.id;
  }
}

beforeAll(async () => {
  s = await startInProcess();
  http = httpClient(s.url);
  known.add(s.key);
  known.add(s.keyB);
  const owner = await s.built.ctx.db.get<{ workspace_id: string; user_id: string }>('SELECT workspace_id, user_id FROM api_keys WHERE key_hash = ?', [hashApiKey(s.key)]);
  fixture.owner = { workspaceId: owner!.workspace_id, userId: owner!.user_id };
  providerFixture = providerBody(PROV);
  await restore();
  const flow = await call('POST', '/v2/auth/authenticate', s.key, { provider: PROV, scopes: ['other'] });
  expect(flow.status, flow.text).toBe(200);
  fixture.authId = (flow.json as { auth_id: string }).auth_id;
});

afterAll(async () => {
  await http?.close();
  await s?.close();
});

const providerCreate = fc.record({ n: fc.nat({ max: 10_000 }), tail: secretTail }).map(({ n, tail }) => providerBody(`fz-${n}`, tail));
const providerPatch = fc.record({ tail: secretTail, name: fc.constantFrom('Renamed', 'ünïcode 😀', 'x'.repeat(200)), scopes: fc.constantFrom(['a'], ['b', 'b'], ['c', 'a', 'c'], []) }).map(({ tail, name, scopes }) => {
  const secret = secretValue('csec', tail);
  known.add(secret.core);
  return { name, client_secret: secret.value, scopes };
});
const metadata = fc.record({ label: fc.constantFrom(null, 'work', 'ünïcode 😀', 'y'.repeat(200)), def: fc.boolean() }).map(({ label, def }) => ({ provider_account_label: label, is_default: def }));

/** The wait route long-polls: hostile timeouts stay short, or are refused. */
const waitQuery = fc.constantFrom('?timeout=0', '?timeout=-1', '?timeout=NaN', '?timeout=1e-9', '?timeout=0.001', '?timeout=', '?timeout=abc', '?timeout=0&timeout=0', '?timeout=-1e400', '?other=1&timeout=0');

const ROUTES: RouteSpec[] = [
  { method: 'GET', url: '/healthz' },
  { method: 'GET', url: '/readyz' },
  { method: 'GET', url: '/openapi.json' },
  { method: 'GET', url: '/api/v1/api-key' },
  { method: 'DELETE', url: '/api/v1/api-key/:api_key_id' },
  { method: 'POST', url: '/v2/auth/providers', body: () => providerCreate },
  { method: 'GET', url: '/v2/auth/providers' },
  { method: 'GET', url: '/v2/auth/providers/:provider_id' },
  { method: 'PATCH', url: '/v2/auth/providers/:provider_id', body: () => providerPatch },
  { method: 'DELETE', url: '/v2/auth/providers/:provider_id' },
  { method: 'GET', url: '/v2/auth/tokens', query: `?provider_id=${PROV}`, queryNames: ['provider_id'] },
  { method: 'PATCH', url: '/v2/auth/tokens/:token_id/metadata', body: () => metadata },
  { method: 'DELETE', url: '/v2/auth/tokens/:token_id' },
  { method: 'POST', url: '/v2/auth/authenticate', body: () => fc.record({ provider: fc.constant(PROV), scopes: fc.constantFrom(['read'], ['new-scope'], []) }) },
  { method: 'GET', url: '/v2/auth/callback/:provider_id', query: '?code=abc&state=def', queryNames: ['code', 'state', 'error', 'iss'], html: true },
  { method: 'GET', url: '/v2/auth/wait/:auth_id', query: '?timeout=0', hostileQuery: waitQuery },
];

const valid = {
  api_key_id: () => [fixture.spareKey, fixture.spareKey.toUpperCase(), randomUUID()],
  provider_id: () => [PROV, 'fx-prov-b', 'FX-PROV', 'nope'],
  token_id: () => [fixture.token, fixture.token.toUpperCase(), randomUUID()],
  auth_id: () => [fixture.authId, fixture.authId.toUpperCase(), randomUUID()],
};

describe('the route list', () => {
  it('covers every route the server registers (with the sandbox and control-plane property files)', () => {
    const other = (u: string) => u.startsWith('/api/v2/sandboxes') || u.startsWith('/api/v1/workspaces') || u.startsWith('/v2/deployments') || u.startsWith('/v2/uploads');
    const rest = s.built.routes
      .filter((r) => !other(r.url) && r.method !== 'HEAD')
      .map((r) => `${r.method} ${r.url}`)
      .sort();
    expect(rest).toEqual(ROUTES.map((r) => `${r.method} ${r.url}`).sort());
  });
});

describe('hostile input on every route', () => {
  it('never a 5xx, the documented error shape, nothing leaked, a rejected request changes nothing', async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...ROUTES).chain((r) => hostileRequest(r, () => s.key, valid).map((req) => ({ req, html: r.html }))), async ({ req, html }) => {
        await checked(s, http, known, req, { html });
        await restore();
      }),
      propertyParams(60),
    );
  }, budget(60, 400));
});

describe('what an accepted request wrote is what GET returns', () => {
  it('a registered or patched provider reads back as written (scopes normalised), the client secret stored exactly and never returned', async () => {
    await fc.assert(
      fc.asyncProperty(fc.boolean(), providerCreate, providerPatch, async (patch, created, patched) => {
        const id = patch ? PROV : (created.provider_id as string);
        const body: Record<string, unknown> = patch ? patched : created;
        const res = (await checked(s, http, known, {
          method: patch ? 'PATCH' : 'POST',
          path: patch ? `/v2/auth/providers/${PROV}` : '/v2/auth/providers',
          headers: { 'x-api-key': s.key, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        }))!;
        const secret = body.client_secret as string;
        if (res.status < 300) {
          const got = (await call('GET', `/v2/auth/providers/${id}`, s.key)).json as Record<string, unknown>;
          const { client_secret: _c, scopes, ...rest } = body;
          expect(got).toMatchObject({ ...rest, has_client_secret: true, scopes: [...new Set(scopes as string[])] });
          expect(got).not.toHaveProperty('client_secret');
          const row = await s.built.ctx.db.get<{ client_secret_sealed: string }>("SELECT client_secret_sealed FROM oauth_providers WHERE workspace_id = 'default' AND provider_id = ?", [id]);
          expect(s.built.ctx.envelope.open(row!.client_secret_sealed)).toBe(secret);
        } else {
          // Only a secret a header cannot carry is a reason to refuse it (where the server says so).
          expect(res.status, res.text).toBe(422);
          for (const i of (res.json as { detail: { loc: unknown[] }[] }).detail) expect(i.loc).toEqual(['body', 'client_secret']);
        }
        await restore();
      }),
      propertyParams(15),
    );
  }, budget(15, 400));

  it("a token's metadata reads back as written", async () => {
    await fc.assert(
      fc.asyncProperty(metadata, async (m) => {
        const res = (await checked(s, http, known, { method: 'PATCH', path: `/v2/auth/tokens/${fixture.token}/metadata`, headers: { 'x-api-key': s.key, 'content-type': 'application/json' }, body: JSON.stringify(m) }))!;
        expect(res.status, res.text).toBe(200);
        const got = ((await call('GET', '/v2/auth/tokens', s.key)).json as Record<string, unknown>[]).find((t) => t.id === fixture.token);
        expect(got).toMatchObject(m.is_default ? m : { provider_account_label: m.provider_account_label });
        await restore();
      }),
      propertyParams(10),
    );
  }, budget(10, 400));
});

describe("another workspace's key", () => {
  it("gets for workspace A's provider, token, flow and key exactly what it gets for ones that do not exist, and changes nothing", async () => {
    const withParam = ROUTES.filter((r) => r.url.includes(':') && !r.html);
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...withParam).chain((r) => fc.tuple(fc.constant(r), r.body ? r.body() : fc.constant(undefined))), async ([r, body]) => {
        const mine: Record<string, string> = { api_key_id: fixture.spareKey, provider_id: PROV, token_id: fixture.token, auth_id: fixture.authId };
        const none: Record<string, string> = { api_key_id: randomUUID(), provider_id: 'fx-nothing', token_id: randomUUID(), auth_id: randomUUID() };
        const send = async (values: Record<string, string>) => {
          const path = r.url.replace(/:([a-z_]+)/g, (_m, n: string) => values[n]) + (r.query ?? '');
          const res = (await checked(s, http, known, { method: r.method, path, headers: { 'x-api-key': s.keyB, ...(body ? { 'content-type': 'application/json' } : {}) }, body: body ? JSON.stringify(body) : undefined }))!;
          return `${res.status} ${Object.values(values).reduce((t, v) => t.split(v).join('<id>'), res.text)}`;
        };
        const theirs = await send(mine);
        const nothing = await send(none);
        expect(theirs).toBe(nothing);
        await restore();
      }),
      propertyParams(12),
    );
  }, budget(12, 400));
});
