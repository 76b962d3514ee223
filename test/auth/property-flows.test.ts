// Property tests of the Auth Service (v2) OAuth flow and token store (wire.md, "Auth Service (v2):
// OAuth tokens"; src/auth/README.md): generated sequences of sign-ins, callbacks (valid, replayed,
// swapped between flows, users and workspaces, forged, garbled, percent-encoded, refused by the
// provider, after the flow expired, concurrent), waits, lists, default changes and deletions,
// driven through the real API server (in-process, real SQLite, real HTTP) and a real local
// authorization server (oidc-provider) behind a gate that relays its token and revocation
// endpoints or misbehaves on demand (oauth-gate.ts). Each answer is checked against a model of
// what the store must hold and what each caller must read; what the provider received is checked
// too (code, PKCE verifier, client authentication, revocation order); no token, code, verifier,
// client secret or API key may appear in any answer or log line.
import fc from 'fast-check';
import { createHash, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { authArea } from '../../src/auth/area.js';
import { createLogger } from '../../src/log.js';
import { createApiKey } from '../../src/server/auth.js';
import { buildServer, type BuiltServer } from '../../src/server/app.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';
import { propertyParams } from '../helpers/property.js';
import { budget } from '../server/property-helpers.js';
import { AuthorizationServer, authorizeAt, type TestClient } from './authorization-server.js';
import { OAuthGate, REVOKE_FAULTS, TOKEN_FAULTS, TOKEN_OKS, type RevokeMode, type TokenMode } from './oauth-gate.js';

const TIMEOUT_MS = 1000;
const DEFAULT_SCOPES = ['openid', 'offline_access'];

// ---------------------------------------------------------------------------------------------
// The world: keygate (auth area only), the authorization server, the gate in front of it.

interface World {
  built: BuiltServer;
  url: string;
  dataDir: string;
  lines: string[];
  as: AuthorizationServer;
  gate: OAuthGate;
  keys: Record<UserName, string>;
  workspaceIds: Record<UserName, string>;
  clients: Record<string, TestClient>;
}

type UserName = 'admin' | 'alice' | 'bob';
const USERS: UserName[] = ['admin', 'alice', 'bob'];
// admin and alice share the default workspace; bob is alone in team-b.

interface ProviderSpec {
  id: string;
  client: 'basic' | 'post' | 'pub' | 'nopkce';
  pkce: boolean;
  revocation: boolean;
}
const PROVIDERS: ProviderSpec[] = [
  { id: 'p-basic', client: 'basic', pkce: true, revocation: true },
  { id: 'p-post', client: 'post', pkce: true, revocation: true },
  { id: 'p-none', client: 'pub', pkce: true, revocation: true },
  { id: 'p-nopkce', client: 'nopkce', pkce: false, revocation: true },
  { id: 'p-norevoke', client: 'basic', pkce: true, revocation: false },
];
const provider = (id: string) => PROVIDERS.find((p) => p.id === id)!;

let w: World;

async function startWorld(databaseUrl = ''): Promise<World> {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'kg-oauth-prop-'));
  const lines: string[] = [];
  const logger = createLogger({ destination: { write: (l: string) => void lines.push(l) } });
  const adminKey = 'kg_oauthprop_admin_' + 'k'.repeat(24);
  const built = await buildServer({ dataDir, logger, env: { KEYGATE_API_KEY: adminKey, DATABASE_URL: databaseUrl, KEYGATE_OAUTH_HTTP_TIMEOUT_MS: String(TIMEOUT_MS) }, areas: [authArea] });
  const url = await built.listen('127.0.0.1', 0);
  const alice = await createApiKey(built.ctx.db, { workspace: 'default', user: 'alice' });
  const bob = await createApiKey(built.ctx.db, { workspace: 'team-b', user: 'bob' });
  const as = await AuthorizationServer.listen();
  const gate = await OAuthGate.listen(as, TIMEOUT_MS);
  const cb = (id: string) => `${url}/v2/auth/callback/${id}`;
  const clients: Record<string, TestClient> = {
    basic: { client_id: 'kg-basic', client_secret: 'basic-secret-Zb1x9Qk2', token_endpoint_auth_method: 'client_secret_basic', redirect_uris: [cb('p-basic'), cb('p-norevoke'), cb('p-tmp')] },
    post: { client_id: 'kg-post', client_secret: 'post-secret-Zp7y3Rw8', token_endpoint_auth_method: 'client_secret_post', redirect_uris: [cb('p-post')] },
    pub: { client_id: 'kg-pub', token_endpoint_auth_method: 'none', redirect_uris: [cb('p-none')] },
    nopkce: { client_id: 'kg-nopkce', client_secret: 'nopkce-secret-Zn4v6Tm1', token_endpoint_auth_method: 'client_secret_basic', redirect_uris: [cb('p-nopkce')], pkce: false },
  };
  as.configure(Object.values(clients));
  const world: World = { built, url, dataDir, lines, as, gate, keys: { admin: adminKey, alice: alice.key, bob: bob.key }, workspaceIds: { admin: 'default', alice: alice.workspaceId, bob: bob.workspaceId }, clients };
  for (const user of ['admin', 'bob'] as const) {
    for (const p of PROVIDERS) {
      const c = clients[p.client];
      const r = await api(world, user, 'POST', '/v2/auth/providers', {
        provider_id: p.id,
        name: p.id,
        client_id: c.client_id,
        ...(c.client_secret ? { client_secret: c.client_secret } : {}),
        auth_url: `${as.authUrl}?prompt=consent`,
        token_url: gate.tokenUrl,
        revocation_url: p.revocation ? gate.revocationUrl : null,
        uses_pkce: p.pkce,
        token_endpoint_auth_method: c.token_endpoint_auth_method,
        scopes: DEFAULT_SCOPES,
      });
      expect(r.status, r.text).toBe(201);
    }
  }
  return world;
}

interface Res {
  status: number;
  text: string;
  json: any;
  headers: Headers;
}

async function send(url: string, init: RequestInit = {}): Promise<Res> {
  const res = await fetch(url, { redirect: 'manual', ...init });
  const text = await res.text();
  let json: unknown;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  const r = { status: res.status, text, json, headers: res.headers };
  checkNoLeak(r);
  return r;
}

async function api(world: World, user: UserName, method: string, p: string, body?: unknown): Promise<Res> {
  return send(`${world.url}${p}`, {
    method,
    headers: { 'x-api-key': world.keys[user], ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

/** Every value that must never come back: what the provider issued or was sent, client secrets, API keys. */
function secrets(): string[] {
  if (!w) return [];
  return [...w.as.issued, ...w.gate.values, ...Object.values(w.clients).flatMap((c) => (c.client_secret ? [c.client_secret] : [])), ...Object.values(w.keys)].filter((v) => v.length >= 8);
}

function checkNoLeak(r: Res): void {
  const where = `${[...r.headers].map(([k, v]) => `${k}: ${v}`).join('\n')}\n\n${r.text}`;
  for (const v of secrets()) expect(where.includes(v) || where.includes(encodeURIComponent(v)), `a secret value in an answer (HTTP ${r.status})`).toBe(false);
}

function checkLogs(extra: string[] = []): void {
  const all = w.lines.join('');
  for (const v of [...secrets(), ...extra]) expect(all.includes(v) || all.includes(encodeURIComponent(v)), 'a secret value in the server log').toBe(false);
}

// ---------------------------------------------------------------------------------------------
// The model.

interface MFlow {
  authId: string;
  user: UserName;
  provider: string;
  state: string;
  url: URL;
  scopes: string[];
  status: 'pending' | 'completed' | 'failed';
  expired: boolean;
  /** Purged (expired more than a day ago, then a sign-in was started). */
  gone: boolean;
  /** Older than a day: the next sign-in that records a flow purges it. */
  ancient: boolean;
  tokenId?: string;
  /** The last code the provider issued for this flow. */
  code?: string;
}

interface MCode {
  flow: MFlow;
  used: boolean;
}

interface MToken {
  id: string;
  user: UserName;
  provider: string;
  scopes: string[];
  /** ms since the epoch, or null. */
  expiresAt: number | null;
  isDefault: boolean;
  access: string;
  refresh?: string;
  order: number;
}

class Model {
  flows: MFlow[] = [];
  codes = new Map<string, MCode>();
  tokens: MToken[] = [];
  private order = 0;

  owned(user: UserName, providerId?: string): MToken[] {
    return this.tokens.filter((t) => t.user === user && (providerId === undefined || t.provider === providerId));
  }

  /** Same owner: same user name in the same workspace. */
  sameOwner(a: UserName, b: UserName): boolean {
    return a === b;
  }

  reusable(user: UserName, providerId: string, scopes: string[]): MToken | undefined {
    const soon = Date.now() + 60_000;
    return this.owned(user, providerId)
      .filter((t) => (t.expiresAt === null || t.expiresAt > soon + 5_000) && scopes.every((s) => t.scopes.includes(s)))
      .sort((a, b) => Number(b.isDefault) - Number(a.isDefault) || b.order - a.order)[0];
  }

  /** A token whose reuse is undecidable by the clock (expiry too close to the 60 s margin). */
  borderline(user: UserName, providerId: string): boolean {
    const soon = Date.now() + 60_000;
    return this.owned(user, providerId).some((t) => t.expiresAt !== null && Math.abs(t.expiresAt - soon) < 5_000);
  }

  store(t: Omit<MToken, 'isDefault' | 'order'>): MToken {
    const isDefault = !this.owned(t.user, t.provider).some((x) => x.isDefault);
    const token = { ...t, isDefault, order: ++this.order };
    this.tokens.push(token);
    return token;
  }
}

let m: Model;
/** How often each kind of outcome was reached (printed with KEYGATE_FUZZ_STATS=1). */
const stats = new Map<string, number>();
const count = (k: string) => stats.set(k, (stats.get(k) ?? 0) + 1);

// ---------------------------------------------------------------------------------------------
// Operations.

const scopeChoice = fc.constantFrom<string[]>([], ['openid'], ['openid', 'offline_access'], ['offline_access', 'openid', 'openid']);

type CallbackVariant = 'valid' | 'bad-code' | 'long-code' | 'long-state' | 'swap' | 'forged' | 'garbled' | 'percent' | 'error' | 'no-code' | 'wrong-path' | 'double-state' | 'concurrent' | 'waited';

type Op =
  | { k: 'authenticate'; u: number; p: number; scopes: string[] }
  | { k: 'signin'; u: number; p: number; scopes: string[]; mode: TokenMode }
  | { k: 'visit'; f: number }
  | { k: 'callback'; f: number; g: number; variant: CallbackVariant; mode: TokenMode; garble: number }
  | { k: 'wait'; u: number; f: number; timeout: number; unknown: boolean }
  | { k: 'list'; u: number; p: number; filter: 'none' | 'provider' | 'unknown' }
  | { k: 'default'; u: number; t: number; value: boolean; upper: boolean }
  | { k: 'delete'; u: number; t: number; missing: boolean; upper: boolean; modes: RevokeMode[]; refused: boolean }
  | { k: 'expire'; f: number; ancient: boolean };

const tokenMode: fc.Arbitrary<TokenMode> = fc.oneof(
  { weight: 6, arbitrary: fc.constant<TokenMode>('pass') },
  { weight: 3, arbitrary: fc.constantFrom<TokenMode>(...TOKEN_OKS) },
  { weight: 3, arbitrary: fc.constantFrom<TokenMode>(...TOKEN_FAULTS.filter((f) => f !== 'slow')) },
  { weight: 1, arbitrary: fc.constant<TokenMode>('slow') },
);
const revokeMode: fc.Arbitrary<RevokeMode> = fc.oneof(
  { weight: 6, arbitrary: fc.constant<RevokeMode>('pass') },
  { weight: 1, arbitrary: fc.constantFrom<RevokeMode>('junk-200', 'empty-204') },
  { weight: 3, arbitrary: fc.constantFrom<RevokeMode>(...REVOKE_FAULTS.filter((f) => f !== 'slow' && f !== 'refused')) },
  { weight: 1, arbitrary: fc.constant<RevokeMode>('slow') },
);

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ k: fc.constant('authenticate' as const), u: fc.nat(), p: fc.nat(), scopes: scopeChoice }) },
  { weight: 5, arbitrary: fc.record({ k: fc.constant('signin' as const), u: fc.nat(), p: fc.nat(), scopes: scopeChoice, mode: fc.oneof({ weight: 4, arbitrary: fc.constantFrom<TokenMode>(...TOKEN_OKS) }, { weight: 1, arbitrary: tokenMode }) }) },
  { weight: 2, arbitrary: fc.record({ k: fc.constant('visit' as const), f: fc.nat() }) },
  {
    weight: 7,
    arbitrary: fc.record({
      k: fc.constant('callback' as const),
      f: fc.nat(),
      g: fc.nat(),
      variant: fc.oneof(
        { weight: 6, arbitrary: fc.constant<CallbackVariant>('valid') },
        { weight: 4, arbitrary: fc.constantFrom<CallbackVariant>('bad-code', 'long-code', 'long-state', 'swap', 'forged', 'garbled', 'percent', 'error', 'no-code', 'wrong-path', 'double-state', 'concurrent', 'waited') },
      ),
      mode: tokenMode,
      garble: fc.nat(),
    }),
  },
  { weight: 3, arbitrary: fc.record({ k: fc.constant('wait' as const), u: fc.nat(), f: fc.nat(), timeout: fc.constantFrom(0, 0, 0, 0.2), unknown: fc.constantFrom(false, false, false, false, true) }) },
  { weight: 3, arbitrary: fc.record({ k: fc.constant('list' as const), u: fc.nat(), p: fc.nat(), filter: fc.constantFrom('none' as const, 'provider' as const, 'unknown' as const) }) },
  { weight: 1, arbitrary: fc.record({ k: fc.constant('default' as const), u: fc.nat(), t: fc.nat(), value: fc.boolean(), upper: fc.boolean() }) },
  {
    weight: 4,
    arbitrary: fc.record({
      k: fc.constant('delete' as const),
      u: fc.nat(),
      t: fc.nat(),
      missing: fc.constantFrom(false, false, false, true),
      upper: fc.constantFrom(false, false, true),
      modes: fc.array(revokeMode, { minLength: 1, maxLength: 2 }),
      refused: fc.constantFrom(false, false, false, false, false, true),
    }),
  },
  { weight: 1, arbitrary: fc.record({ k: fc.constant('expire' as const), f: fc.nat(), ancient: fc.boolean() }) },
);

const pick = <T>(xs: T[], i: number): T | undefined => (xs.length ? xs[i % xs.length] : undefined);
const callbackPrefix = () => `${w.url}/v2/auth/callback/`;

/** The provider issues a code for the flow (the browser signs in); the callback URL is not opened. */
async function visit(f: MFlow): Promise<string> {
  const landed = await authorizeAt(f.url.toString(), callbackPrefix());
  expect(landed.pathname).toBe(`/v2/auth/callback/${f.provider}`);
  expect(landed.searchParams.get('state')).toBe(f.state);
  const code = landed.searchParams.get('code');
  expect(code).toBeTruthy();
  f.code = code!;
  m.codes.set(code!, { flow: f, used: false });
  return code!;
}

function checkClientAuth(seen: { authorization?: string; form: URLSearchParams }, p: ProviderSpec): void {
  const c = w.clients[p.client];
  if (c.token_endpoint_auth_method === 'client_secret_basic') {
    expect(seen.authorization).toBe(`Basic ${Buffer.from(`${c.client_id}:${c.client_secret}`).toString('base64')}`);
    expect(seen.form.has('client_secret')).toBe(false);
  } else {
    expect(seen.authorization).toBeUndefined();
    expect(seen.form.get('client_id')).toBe(c.client_id);
    if (c.token_endpoint_auth_method === 'client_secret_post') expect(seen.form.get('client_secret')).toBe(c.client_secret);
    else expect(seen.form.has('client_secret')).toBe(false);
  }
}

function expectPage(r: Res, status: number): void {
  expect(r.status, r.text).toBe(status);
  expect(r.headers.get('content-type')).toMatch(/^text\/html/);
  expect(r.headers.get('cache-control')).toBe('no-store');
}

async function runAuthenticate(o: Extract<Op, { k: 'authenticate' }>): Promise<void> {
  const user = USERS[o.u % USERS.length];
  const p = PROVIDERS[o.p % PROVIDERS.length];
  const normalised = [...new Set(o.scopes)];
  const scopes = normalised.length ? normalised : DEFAULT_SCOPES;
  if (m.borderline(user, p.id)) return;
  const expected = m.reusable(user, p.id, scopes);
  const r = await api(w, user, 'POST', '/v2/auth/authenticate', { provider: p.id, scopes: o.scopes });
  expect(r.status, r.text).toBe(200);
  if (expected) {
    expect(r.json).toEqual({ status: 'completed', token_id: expected.id });
    return;
  }
  expect(r.json).toEqual({ status: 'pending', url: expect.any(String), auth_id: expect.stringMatching(/^[0-9a-f-]{36}$/) });
  const url = new URL(r.json.url);
  expect(`${url.origin}${url.pathname}`).toBe(w.as.authUrl);
  expect(url.searchParams.get('prompt')).toBe('consent');
  expect(url.searchParams.get('response_type')).toBe('code');
  expect(url.searchParams.get('client_id')).toBe(w.clients[p.client].client_id);
  expect(url.searchParams.get('redirect_uri')).toBe(`${w.url}/v2/auth/callback/${p.id}`);
  expect(url.searchParams.get('scope')).toBe(scopes.join(' '));
  const state = url.searchParams.get('state')!;
  expect(state).toMatch(/^[A-Za-z0-9_-]{43}$/);
  expect(m.flows.some((f) => f.state === state)).toBe(false);
  if (p.pkce) {
    expect(url.searchParams.get('code_challenge_method')).toBe('S256');
    expect(url.searchParams.get('code_challenge')).toMatch(/^[A-Za-z0-9_-]{43}$/);
  } else {
    expect(url.searchParams.has('code_challenge')).toBe(false);
  }
  // Recording a flow purges flows that expired more than a day ago.
  for (const f of m.flows) if (f.ancient) f.gone = true;
  m.flows.push({ authId: r.json.auth_id, user, provider: p.id, state, url, scopes, status: 'pending', expired: false, gone: false, ancient: false });
}

/** What a callback must do, from the model; then the same for the store. */
function outcome(f: MFlow | undefined, pathProvider: string, code: string | undefined, error: boolean, mode: TokenMode): 'unknown' | 'refused' | 'stored' | 'exchange-failed' {
  if (!f || f.gone || f.status !== 'pending' || f.expired || f.provider !== pathProvider) return 'unknown';
  if (error || !code) return 'refused';
  if ((TOKEN_FAULTS as readonly string[]).includes(mode)) return 'exchange-failed';
  const c = m.codes.get(code);
  if (!c || c.used) return 'exchange-failed';
  const from = c.flow;
  const p = provider(f.provider);
  const q = provider(from.provider);
  // The code must be for the same client and redirect URI; with PKCE, for this very flow.
  if (p.client !== q.client || from.provider !== f.provider) return 'exchange-failed';
  if (p.pkce && from !== f) return 'exchange-failed';
  return 'stored';
}

const RELAYED: TokenMode[] = [...TOKEN_OKS];

/** The lifetime keygate must give a token the provider answered with `expires_in` (oauth-client.ts lifetimeOf). */
function modelLifetime(mode: TokenMode, answered: unknown): number | undefined {
  if (mode === 'no-expiry') return undefined;
  if (mode === 'huge-expiry') return 10 * 365 * 24 * 3600; // at most ten years
  if (mode === 'decimal-expiry') return 3600; // "3600.5", floored
  if (mode === 'garbage-expiry') return 0; // "soon": never reused
  return answered as number | undefined;
}

async function runCallback(o: Extract<Op, { k: 'callback' }>): Promise<void> {
  const f = pick(m.flows, o.f);
  if (!f) return;
  let state: string | undefined = f.state;
  let code: string | undefined;
  let pathProvider = f.provider;
  let error = false;
  let query: string;
  let target: MFlow | undefined = f;
  const needCode = async (x: MFlow) => x.code ?? (await visit(x));
  switch (o.variant) {
    case 'swap': {
      const g = pick(m.flows.filter((x) => x !== f), o.g);
      if (!g) return;
      code = await needCode(g);
      break;
    }
    case 'forged':
      state = randomUUID().replace(/-/g, '') + 'AbCdEfGhIjK';
      target = undefined;
      code = await needCode(f);
      break;
    case 'garbled': {
      code = await needCode(f);
      const i = o.garble % f.state.length;
      const ch = f.state[i];
      const variants = [f.state + 'x', f.state.slice(1), f.state.slice(0, i) + (ch === 'A' ? 'B' : 'A') + f.state.slice(i + 1), ` ${f.state}`, f.state.toLowerCase() === f.state ? f.state.toUpperCase() : f.state.toLowerCase(), `${f.state}\u0000`];
      state = variants[o.garble % variants.length];
      if (state === f.state) return;
      target = undefined;
      break;
    }
    case 'error':
      error = true;
      break;
    case 'bad-code': {
      const good = await needCode(f);
      const i = o.garble % good.length;
      code = [good + 'x', good.slice(1), good.slice(0, i) + (good[i] === 'A' ? 'B' : 'A') + good.slice(i + 1), good.toUpperCase() === good ? good.toLowerCase() : good.toUpperCase()][o.garble % 4];
      if (code === good) return;
      break;
    }
    case 'long-code':
      code = (await needCode(f)) + 'c'.repeat(5000);
      break;
    case 'long-state':
      code = await needCode(f);
      state = f.state + 's'.repeat(600);
      break;
    case 'no-code':
      break;
    case 'wrong-path': {
      code = await needCode(f);
      const others = PROVIDERS.filter((p) => p.id !== f.provider);
      pathProvider = others[o.g % others.length].id;
      break;
    }
    default:
      code = await needCode(f);
  }
  if (o.variant === 'percent') {
    query = `code=${[...code!].map((c) => '%' + c.charCodeAt(0).toString(16).padStart(2, '0')).join('')}&state=${[...state].map((c) => '%' + c.charCodeAt(0).toString(16).padStart(2, '0').toUpperCase()).join('')}`;
  } else if (o.variant === 'double-state') {
    query = `code=${encodeURIComponent(code!)}&state=${encodeURIComponent(state)}&state=${encodeURIComponent(state)}`;
  } else if (error) {
    query = `error=access_denied&error_description=${encodeURIComponent('the user said no <b>')}&state=${encodeURIComponent(state)}`;
  } else {
    query = `${code !== undefined ? `code=${encodeURIComponent(code)}&` : ''}state=${encodeURIComponent(state)}`;
  }
  const url = `${w.url}/v2/auth/callback/${pathProvider}?${query}`;
  // Refused by the route's schema before the handler runs: nothing changes.
  const invalid = o.variant === 'double-state' || o.variant === 'long-code' || o.variant === 'long-state';
  const expected = invalid ? 'unknown' : outcome(target, pathProvider, code, error, o.mode);
  // The provider takes the code (single use) when it is relayed and would have been good.
  const consumes = expected !== 'unknown' && RELAYED.includes(o.mode) && outcome(target, pathProvider, code, error, 'pass') === 'stored';

  w.gate.tokenMode = o.mode;
  const tokenCalls = w.gate.tokenRequests.length;
  if (o.mode === 'refused') await w.gate.refuse();
  let r: Res;
  let waited: Res | undefined;
  try {
    if (o.variant === 'concurrent') {
      const all = await Promise.all([send(url), send(url), send(url)]);
      // Exactly one took the flow; the others found it used.
      const taking = all.filter((x) => x.status !== 400);
      expect(taking.length, all.map((x) => x.status).join()).toBe(expected === 'unknown' ? 0 : expected === 'refused' ? 0 : 1);
      r = taking[0] ?? all[0];
      if (expected === 'refused') expect(all.filter((x) => x.status === 400)).toHaveLength(3);
    } else if (o.variant === 'waited' && expected !== 'unknown') {
      // The owner is already waiting when the provider sends the browser back: the wait wakes up.
      const pending = api(w, f.user, 'GET', `/v2/auth/wait/${f.authId}?timeout=30`);
      await new Promise((res) => setTimeout(res, 50));
      r = await send(url);
      waited = await pending;
    } else {
      r = await send(url);
    }
  } finally {
    w.gate.tokenMode = 'pass';
    await w.gate.resume();
  }
  const sent = w.gate.tokenRequests.slice(tokenCalls);
  count(`callback ${o.variant} ${o.mode} -> ${expected}`);
  expect(r.text).not.toContain(state);
  if (code) expect(r.text).not.toContain(code);
  expect(r.text).not.toContain('<b>');

  if (expected === 'unknown') {
    expect(r.status, r.text).toBeGreaterThanOrEqual(400);
    expect(r.status, r.text).toBeLessThan(500);
    if (!invalid) expectPage(r, 400);
    expect(sent).toEqual([]);
    return;
  }
  // The flow was taken: `target` is f.
  if (expected === 'refused') {
    expectPage(r, 400);
    expect(sent).toEqual([]);
    f.status = 'failed';
  } else {
    const p = provider(f.provider);
    // The exchange went to the token endpoint the flow started with, with this flow's verifier.
    if (o.mode !== 'refused') {
      expect(sent).toHaveLength(1);
      const req = sent[0];
      expect(req.form.get('grant_type')).toBe('authorization_code');
      expect(req.form.get('code')).toBe(code);
      expect(req.form.get('redirect_uri')).toBe(`${w.url}/v2/auth/callback/${f.provider}`);
      if (p.pkce) {
        const verifier = req.form.get('code_verifier')!;
        expect(verifier).toMatch(/^[A-Za-z0-9_-]{43,128}$/);
        expect(createHash('sha256').update(verifier).digest('base64url')).toBe(f.url.searchParams.get('code_challenge'));
      } else expect(req.form.has('code_verifier')).toBe(false);
      checkClientAuth(req, p);
    } else expect(sent).toEqual([]);
    if (consumes) m.codes.get(code!)!.used = true;
    if (expected === 'stored') {
      expectPage(r, 200);
      const answer = sent[0].json!;
      expect(sent[0].status).toBe(200);
      const tokens = (await api(w, f.user, 'GET', `/v2/auth/tokens?provider_id=${f.provider}`)).json as { id: string }[];
      const known = new Set(m.tokens.map((t) => t.id));
      const fresh = tokens.filter((t) => !known.has(t.id));
      expect(fresh).toHaveLength(1);
      const granted = typeof answer.scope === 'string' ? [...new Set((answer.scope as string).split(' ').filter(Boolean))] : f.scopes;
      const expiresIn = modelLifetime(o.mode, answer.expires_in);
      const t = m.store({
        id: fresh[0].id,
        user: f.user,
        provider: f.provider,
        scopes: granted,
        expiresAt: expiresIn === undefined ? null : Date.now() + expiresIn * 1000,
        access: answer.access_token as string,
        refresh: typeof answer.refresh_token === 'string' ? (answer.refresh_token as string) : undefined,
      });
      f.status = 'completed';
      f.tokenId = t.id;
    } else {
      expectPage(r, 502);
      f.status = 'failed';
    }
  }
  if (waited) {
    expect(waited.status).toBe(200);
    expect(waited.json).toEqual(f.status === 'completed' ? { status: 'completed', token_id: f.tokenId } : { status: 'failed' });
  }
  // The flow's state reads the same for its owner afterwards.
  await runWait({ k: 'wait', u: USERS.indexOf(f.user), f: m.flows.indexOf(f), timeout: 0, unknown: false });
}

async function runWait(o: Extract<Op, { k: 'wait' }>): Promise<void> {
  const user = USERS[o.u % USERS.length];
  const f = o.unknown ? undefined : pick(m.flows, o.f);
  const authId = f ? f.authId : randomUUID();
  const r = await api(w, user, 'GET', `/v2/auth/wait/${authId}?timeout=${o.timeout}`);
  expect(r.status, r.text).toBe(200);
  let expected: unknown;
  if (!f || f.user !== user || f.gone) expected = { status: 'not_found' };
  else if (f.status === 'completed') expected = { status: 'completed', token_id: f.tokenId };
  else if (f.status === 'failed') expected = { status: 'failed' };
  else if (f.expired) expected = { status: 'not_found' };
  else expected = { status: o.timeout > 0 ? 'timeout' : 'pending' };
  count(`wait ${(expected as { status: string }).status}`);
  expect(r.json, `wait by ${user} on ${f ? `${f.user}'s ${f.status} flow` : 'an unknown flow'}`).toEqual(expected);
}

async function runList(o: Extract<Op, { k: 'list' }>): Promise<void> {
  const user = USERS[o.u % USERS.length];
  const p = PROVIDERS[o.p % PROVIDERS.length].id;
  const q = o.filter === 'none' ? '' : `?provider_id=${o.filter === 'provider' ? p : 'p-unknown'}`;
  const r = await api(w, user, 'GET', `/v2/auth/tokens${q}`);
  expect(r.status, r.text).toBe(200);
  const expected = o.filter === 'none' ? m.owned(user) : o.filter === 'provider' ? m.owned(user, p) : [];
  const got = r.json as Record<string, any>[];
  expect(got.map((t) => t.id).sort()).toEqual(expected.map((t) => t.id).sort());
  for (const t of expected) {
    const rec = got.find((x) => x.id === t.id)!;
    expect(Object.keys(rec).sort()).toEqual(['created_at', 'expires_at', 'id', 'is_default', 'provider_account_label', 'provider_id', 'scopes', 'updated_at']);
    expect(rec).toMatchObject({ provider_id: t.provider, provider_account_label: null, is_default: t.isDefault });
    expect([...rec.scopes].sort()).toEqual([...t.scopes].sort());
    if (t.expiresAt === null) expect(rec.expires_at).toBeNull();
    else expect(Math.abs(Date.parse(rec.expires_at) - t.expiresAt)).toBeLessThan(15_000);
  }
  for (let i = 1; i < got.length; i++) expect(got[i - 1].created_at <= got[i].created_at).toBe(true);
  // At most one default per provider.
  const defaults = got.filter((t) => t.is_default).map((t) => t.provider_id);
  expect(new Set(defaults).size).toBe(defaults.length);
}

async function runDefault(o: Extract<Op, { k: 'default' }>): Promise<void> {
  const user = USERS[o.u % USERS.length];
  const t = pick(m.tokens, o.t);
  if (!t) return;
  const r = await api(w, user, 'PATCH', `/v2/auth/tokens/${o.upper ? t.id.toUpperCase() : t.id}/metadata`, { is_default: o.value });
  if (t.user !== user) {
    expect(r.status, r.text).toBe(404);
    expect(r.json).toEqual({ detail: 'Token not found.' });
    return;
  }
  expect(r.status, r.text).toBe(200);
  if (o.value) for (const x of m.owned(user, t.provider)) x.isDefault = false;
  t.isDefault = o.value;
  expect(r.json).toMatchObject({ id: t.id, is_default: o.value });
}

async function runDelete(o: Extract<Op, { k: 'delete' }>): Promise<void> {
  const user = USERS[o.u % USERS.length];
  const t = o.missing ? undefined : pick(m.tokens, o.t);
  if (!t && !o.missing) return;
  const id = t ? (o.upper ? t.id.toUpperCase() : t.id) : randomUUID();
  const revokes = w.gate.revokeRequests.length;
  const lines = w.lines.length;
  w.gate.revokeModes = [...o.modes];
  if (o.refused) await w.gate.refuse();
  let r: Res;
  try {
    r = await api(w, user, 'DELETE', `/v2/auth/tokens/${id}`);
  } finally {
    w.gate.revokeModes = [];
    await w.gate.resume();
  }
  const seen = w.gate.revokeRequests.slice(revokes);
  count(`delete ${!t ? 'missing' : t.user !== user ? 'other' : provider(t.provider).revocation ? `revoke ${o.refused ? 'refused' : o.modes.join('+') || 'pass'}` : 'norevoke'} -> ${r.status}`);
  if (!t || t.user !== user) {
    // Someone else's or missing: the same 404, nothing revoked.
    expect(r.status, r.text).toBe(404);
    expect(r.json).toEqual({ detail: 'Token not found.' });
    expect(seen).toEqual([]);
    return;
  }
  const p = provider(t.provider);
  if (!p.revocation) {
    expect(r.status, r.text).toBe(204);
    expect(r.text).toBe('');
    expect(seen).toEqual([]);
    await expect.poll(() => w.lines.slice(lines).some((l) => l.includes('no revocation endpoint') && l.includes(t.id)), { timeout: 5000 }).toBe(true);
    m.tokens = m.tokens.filter((x) => x !== t);
    return;
  }
  // Revocation: the refresh token first, then the access token; the first failure stops it.
  const steps: [string, string][] = [...(t.refresh ? [[t.refresh, 'refresh_token'] as [string, string]] : []), [t.access, 'access_token']];
  const modes = [...o.modes];
  let failedAt = -1;
  if (o.refused) failedAt = 0;
  else
    for (let i = 0; i < steps.length; i++) {
      const mode = modes[i] ?? 'pass';
      if (mode !== 'pass' && mode !== 'junk-200' && mode !== 'empty-204') {
        failedAt = i;
        break;
      }
    }
  const reached = o.refused ? 0 : failedAt === -1 ? steps.length : failedAt + 1;
  expect(seen.map((s) => [s.form.get('token'), s.form.get('token_type_hint')])).toEqual(steps.slice(0, reached));
  for (const s of seen) checkClientAuth(s, p);
  if (failedAt === -1) {
    expect(r.status, r.text).toBe(204);
    expect(r.text).toBe('');
    expect(r.headers.get('content-type')).toBeNull();
    m.tokens = m.tokens.filter((x) => x !== t);
    for (const s of seen) if (s.status !== undefined) expect(s.status).toBe(200);
  } else {
    expect(r.status, r.text).toBe(502);
    expect(r.json).toEqual({ detail: expect.stringMatching(/^Revocation at provider 'p-[a-z]+' failed: .*The token was kept; retry the deletion\.$/) });
  }
  const listed = ((await api(w, user, 'GET', `/v2/auth/tokens?provider_id=${t.provider}`)).json as { id: string }[]).map((x) => x.id);
  expect(listed.includes(t.id)).toBe(failedAt !== -1);
}

async function runExpire(o: Extract<Op, { k: 'expire' }>): Promise<void> {
  const f = pick(m.flows, o.f);
  if (!f || f.gone) return;
  const when = new Date(Date.now() - (o.ancient ? 25 * 3600_000 : 60_000)).toISOString();
  await w.built.ctx.db.run('UPDATE oauth_auth_flows SET expires_at = ? WHERE auth_id = ?', [when, f.authId]);
  f.expired = true;
  f.ancient = o.ancient;
}

async function runOp(o: Op): Promise<void> {
  switch (o.k) {
    case 'authenticate':
      return runAuthenticate(o);
    case 'signin': {
      // A whole sign-in: start, the browser at the provider, back to the callback.
      const before = m.flows.length;
      await runAuthenticate({ k: 'authenticate', u: o.u, p: o.p, scopes: o.scopes });
      if (m.flows.length > before) await runCallback({ k: 'callback', f: m.flows.length - 1, g: 0, variant: 'valid', mode: o.mode, garble: 0 });
      return;
    }
    case 'visit': {
      const f = pick(m.flows, o.f);
      if (f) await visit(f);
      return;
    }
    case 'callback':
      return runCallback(o);
    case 'wait':
      return runWait(o);
    case 'list':
      return runList(o);
    case 'default':
      return runDefault(o);
    case 'delete':
      return runDelete(o);
    case 'expire':
      return runExpire(o);
  }
}

/** Back to an empty store: no tokens, no flows. */
async function reset(): Promise<void> {
  await w.built.ctx.db.run('DELETE FROM oauth_tokens');
  await w.built.ctx.db.run('DELETE FROM oauth_auth_flows');
  m = new Model();
}

/** What the store holds is what the model says (read behind the API's back). */
async function checkStore(): Promise<void> {
  const rows = await w.built.ctx.db.all<{ id: string; user_id: string; workspace_id: string; provider_id: string; access_token_sealed: string; refresh_token_sealed: string | null; is_default: number; deleting_at: string | null }>('SELECT * FROM oauth_tokens');
  expect(rows.map((r) => r.id).sort()).toEqual(m.tokens.map((t) => t.id).sort());
  for (const row of rows) {
    const t = m.tokens.find((x) => x.id === row.id)!;
    expect(row.provider_id).toBe(t.provider);
    expect(row.workspace_id).toBe(w.workspaceIds[t.user]);
    expect(row.deleting_at).toBeNull();
    expect(Boolean(Number(row.is_default))).toBe(t.isDefault);
    expect(row.access_token_sealed).not.toContain(t.access);
    expect(w.built.ctx.envelope.open(row.access_token_sealed)).toBe(t.access);
    expect(row.refresh_token_sealed === null ? undefined : w.built.ctx.envelope.open(row.refresh_token_sealed)).toBe(t.refresh);
  }
  const flows = await w.built.ctx.db.all<{ auth_id: string; status: string; verifier_sealed: string | null }>('SELECT auth_id, status, verifier_sealed FROM oauth_auth_flows');
  for (const f of m.flows) {
    const row = flows.find((x) => x.auth_id === f.authId);
    if (f.gone) {
      expect(row).toBeUndefined();
      continue;
    }
    expect(row?.status, `flow of ${f.user}`).toBe(f.status);
    // The verifier is single use: dropped once the flow ends.
    if (f.status !== 'pending') expect(row!.verifier_sealed).toBeNull();
  }
}

function defineSuite(name: string, databaseUrl: () => Promise<string>, runs: number, full: boolean) {
  describe(name, () => {
    beforeAll(async () => {
      w = await startWorld(await databaseUrl());
    }, 60_000);

    afterAll(async () => {
      if (process.env.KEYGATE_FUZZ_STATS) console.log([...stats].sort().map(([k, v]) => `${v}\t${k}`).join('\n'));
      await w?.gate.close();
      await w?.as.close();
      await w?.built.close();
      if (w) rmSync(w.dataDir, { recursive: true, force: true });
    });

    beforeEach(async () => {
      await reset();
    });

    it('every answer, the store and what the provider received agree with the model; nothing secret leaks', async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(op, { minLength: 4, maxLength: 20 }), async (ops) => {
          await reset();
          for (const o of ops) await runOp(o);
          await checkStore();
          checkLogs(m.flows.map((f) => f.state));
        }),
        propertyParams(runs),
      );
    }, budget(runs, 3000));

    it.skipIf(!full)('every way the token endpoint can misbehave fails the sign-in closed: 502 page, failed, nothing stored', async () => {
      for (const [i, mode] of TOKEN_FAULTS.entries()) {
        // Every client authentication and user in turn.
        const before = m.flows.length;
        await runAuthenticate({ k: 'authenticate', u: i % 3, p: i % 4, scopes: ['openid'] });
        expect(m.flows.length, mode).toBe(before + 1);
        await runCallback({ k: 'callback', f: before, g: 0, variant: 'valid', mode, garble: 0 });
        expect(m.flows[before].status, mode).toBe('failed');
      }
      await checkStore();
      expect(m.tokens).toEqual([]);
      checkLogs(m.flows.map((f) => f.state));
    });

    it.skipIf(!full)('expires_in as providers send it: a decimal string is read, an absurd number capped, one that is not a number never reused', async () => {
      for (const [i, mode] of (['decimal-expiry', 'huge-expiry', 'garbage-expiry'] as const).entries()) {
        await runOp({ k: 'signin', u: i, p: 0, scopes: ['openid'], mode });
        expect(m.tokens.at(-1)?.expiresAt, `${mode}: stored with an expiry`).toEqual(expect.any(Number));
        // Asked again: the model says whether that token is reused (the garbage one: never).
        await runAuthenticate({ k: 'authenticate', u: i, p: 0, scopes: ['openid'] });
      }
      await checkStore();
      checkLogs(m.flows.map((f) => f.state));
    });

    it.skipIf(!full)('every way the revocation endpoint can fail is a 502 with the token kept; the retry revokes and deletes', async () => {
      const modes: { modes: RevokeMode[]; refused: boolean }[] = [
        ...REVOKE_FAULTS.filter((f) => f !== 'refused').map((f) => ({ modes: [f], refused: false })),
        ...REVOKE_FAULTS.filter((f) => f !== 'refused' && f !== 'slow').map((f) => ({ modes: ['pass', f] as RevokeMode[], refused: false })),
        { modes: [], refused: true },
      ];
      for (const [i, { modes: ms, refused }] of modes.entries()) {
        const p = i % 4; // p-basic, p-post, p-none, p-nopkce: every client authentication
        const u = i % 3;
        await runOp({ k: 'signin', u, p, scopes: [], mode: 'pass' });
        const t = m.tokens.at(-1)!;
        expect(t.refresh, 'the provider issued a refresh token').toBeTruthy();
        await runDelete({ k: 'delete', u, t: m.tokens.indexOf(t), missing: false, upper: false, modes: ms, refused });
        expect(m.tokens, `${refused ? 'refused' : ms.join('+')}: kept`).toContain(t);
        await runDelete({ k: 'delete', u, t: m.tokens.indexOf(t), missing: false, upper: i % 2 === 0, modes: [], refused: false });
        expect(m.tokens).not.toContain(t);
      }
      // RFC 7009: the body of a 2xx answer is ignored; the token is revoked and deleted.
      for (const ok of ['junk-200', 'empty-204'] as const) {
        await runOp({ k: 'signin', u: 0, p: 0, scopes: [], mode: 'pass' });
        const t = m.tokens.at(-1)!;
        await runDelete({ k: 'delete', u: 0, t: m.tokens.indexOf(t), missing: false, upper: false, modes: [ok, ok], refused: false });
        expect(m.tokens).not.toContain(t);
      }
      await checkStore();
      checkLogs(m.flows.map((f) => f.state));
    });

    it('callbacks of several sign-ins of one user and provider at once store one token each and one default', async () => {
      for (const user of ['admin', 'bob'] as const) {
        const flows: MFlow[] = [];
        for (let i = 0; i < 4; i++) {
          await runAuthenticate({ k: 'authenticate', u: USERS.indexOf(user), p: 0, scopes: [`openid`, ...(i % 2 ? ['offline_access'] : [])] });
          flows.push(m.flows.at(-1)!);
        }
        const urls = await Promise.all(flows.map(async (f) => `${w.url}/v2/auth/callback/${f.provider}?code=${encodeURIComponent(await visit(f))}&state=${encodeURIComponent(f.state)}`));
        const answers = await Promise.all(urls.map((u) => send(u)));
        expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200]);
        const list = (await api(w, user, 'GET', '/v2/auth/tokens?provider_id=p-basic')).json as { id: string; is_default: boolean }[];
        expect(list).toHaveLength(4);
        expect(list.filter((t) => t.is_default), 'exactly one default').toHaveLength(1);
      }
    });

    it('setting the default on several tokens at once leaves exactly one default', async () => {
      const flows: MFlow[] = [];
      for (let i = 0; i < 4; i++) {
        await runAuthenticate({ k: 'authenticate', u: 0, p: 0, scopes: ['openid'] });
        flows.push(m.flows.at(-1)!);
      }
      const ids: string[] = [];
      for (const f of flows) {
        const r = await send(`${w.url}/v2/auth/callback/${f.provider}?code=${encodeURIComponent(await visit(f))}&state=${encodeURIComponent(f.state)}`);
        expect(r.status).toBe(200);
        ids.push(((await api(w, 'admin', 'GET', `/v2/auth/wait/${f.authId}?timeout=0`)).json as { token_id: string }).token_id);
      }
      expect(ids).toHaveLength(4);
      for (let round = 0; round < 5; round++) {
        const answers = await Promise.all(ids.map((id) => api(w, 'admin', 'PATCH', `/v2/auth/tokens/${id}/metadata`, { is_default: true })));
        expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200]);
        const list = (await api(w, 'admin', 'GET', '/v2/auth/tokens?provider_id=p-basic')).json as { is_default: boolean }[];
        expect(list.filter((t) => t.is_default), 'exactly one default').toHaveLength(1);
      }
    });

    // The deletion counted no token while the exchange was under way (the flow claimed, the
    // provider answering) and answered 204; the sign-in's token could then not be stored (the
    // foreign key), and the tokens the provider had just issued stayed live there, held by no one.
    it('a provider deleted while the provider issues a sign-in its tokens: no token is stored, and the issued ones are revoked', async () => {
      const c = w.clients.basic;
      const created = await api(w, 'admin', 'POST', '/v2/auth/providers', {
        provider_id: 'p-tmp', name: 'p-tmp', client_id: c.client_id, client_secret: c.client_secret,
        auth_url: `${w.as.authUrl}?prompt=consent`, token_url: w.gate.tokenUrl, revocation_url: w.gate.revocationUrl, scopes: DEFAULT_SCOPES,
      });
      expect(created.status, created.text).toBe(201);
      const r = await api(w, 'admin', 'POST', '/v2/auth/authenticate', { provider: 'p-tmp', scopes: ['openid', 'offline_access'] });
      expect(r.json.status).toBe('pending');
      const landed = await authorizeAt(r.json.url, callbackPrefix());
      let deleted: Res | undefined;
      w.gate.onTokensIssued = async () => {
        deleted = await api(w, 'admin', 'DELETE', '/v2/auth/providers/p-tmp');
      };
      const revokesBefore = w.gate.revokeRequests.length;
      const cb = await send(landed.toString());
      expect(deleted?.status, deleted?.text).toBe(204);
      expect(cb.status, cb.text).toBe(502);
      const issued = w.gate.tokenRequests.at(-1)!.json!;
      expect(typeof issued.access_token).toBe('string');
      expect(typeof issued.refresh_token).toBe('string');
      const all = (await api(w, 'admin', 'GET', '/v2/auth/tokens')).json as { provider_id: string }[];
      expect(all.filter((t) => t.provider_id === 'p-tmp')).toEqual([]);
      const revoked = w.gate.revokeRequests.slice(revokesBefore).map((q) => q.form.get('token'));
      expect(revoked).toEqual([issued.refresh_token, issued.access_token]);
      expect(w.gate.revokeRequests.slice(revokesBefore).every((q) => q.status === 200)).toBe(true);
      const waited = await api(w, 'admin', 'GET', `/v2/auth/wait/${r.json.auth_id}?timeout=0`);
      expect(waited.json.status).toBe('not_found'); // its flow went with the provider
    });

    it('a provider deleted while its sign-ins complete: the deletion is 204 or 409, never a 5xx, and no token outlives its provider', async () => {
      const c = w.clients.basic;
      for (let round = 0; round < 3; round++) {
        const created = await api(w, 'admin', 'POST', '/v2/auth/providers', {
          provider_id: 'p-tmp', name: 'p-tmp', client_id: c.client_id, client_secret: c.client_secret,
          auth_url: `${w.as.authUrl}?prompt=consent`, token_url: w.gate.tokenUrl, revocation_url: w.gate.revocationUrl, scopes: DEFAULT_SCOPES,
        });
        expect(created.status, created.text).toBe(201);
        const urls: string[] = [];
        for (let i = 0; i < 3; i++) {
          const r = await api(w, 'admin', 'POST', '/v2/auth/authenticate', { provider: 'p-tmp', scopes: ['openid'] });
          expect(r.json.status).toBe('pending');
          const landed = await authorizeAt(r.json.url, callbackPrefix());
          urls.push(landed.toString());
        }
        const [del, ...callbacks] = await Promise.all([api(w, 'admin', 'DELETE', '/v2/auth/providers/p-tmp'), ...urls.map((u) => send(u))]);
        expect([204, 409], del.text).toContain(del.status);
        for (const cb of callbacks) expect([200, 400, 502], cb.text).toContain(cb.status);
        const tokens = (await api(w, 'admin', 'GET', '/v2/auth/tokens?provider_id=p-tmp')).json as { id: string }[];
        if (del.status === 204) expect(tokens).toEqual([]);
        else expect(tokens.length).toBeGreaterThan(0);
        for (const t of tokens) expect((await api(w, 'admin', 'DELETE', `/v2/auth/tokens/${t.id}`)).status).toBe(204);
        const again = await api(w, 'admin', 'DELETE', '/v2/auth/providers/p-tmp');
        expect([204, 404]).toContain(again.status);
      }
    });
  });
}

defineSuite('OAuth flows on SQLite', async () => '', 15, true);
describe.skipIf(!pgAvailable())('PostgreSQL', () => {
  defineSuite('OAuth flows on PostgreSQL (DATABASE_URL)', () => freshPgDatabase(), 4, false);
});

