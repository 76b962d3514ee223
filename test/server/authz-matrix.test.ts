// Every route the server registers, enumerated from the server itself (BuiltServer.routes), is
// checked: no credential, a wrong key, a tenant header alone, a bearer token the server cannot
// accept: 401 {"detail": "..."}. A key of another workspace reaching for this workspace's resources
// gets exactly what it gets for resources that do not exist (404, no existence leak), changes
// nothing, and lists nothing of them. A route added without authentication, or public without
// being listed here, fails this test. In-process server, every area, real HTTP requests.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { storeToken } from '../../src/auth/tokens.js';
import { hashApiKey } from '../../src/server/auth.js';
import type { RouteInfo } from '../../src/server/app.js';
import { api as cpApi, cleanupTmp, echoVariant, packDir } from '../control-plane/helpers.js';
import { startInProcess, type InProcessServer } from './inprocess.js';

/** The routes that answer without credentials, and why. Anything else public is a failure. */
const PUBLIC = new Set([
  'GET /healthz', // liveness
  'HEAD /healthz',
  'GET /readyz', // readiness
  'HEAD /readyz',
  'GET /openapi.json', // the API description
  'HEAD /openapi.json',
  'GET /v2/auth/callback/:provider_id', // the OAuth redirect: its state is the credential
  'HEAD /v2/auth/callback/:provider_id',
]);

/** What a request to a route needs besides its path to get past validation to the lookup. */
const INPUT: Record<string, { query?: string; body?: unknown; raw?: string }> = {
  'POST /v2/deployments': { body: { name: 'mx-b-new', source: 'internal_source', source_revision_config: { source_tarball_path: 'uploads/none.tar.gz' } } },
  'PATCH /v2/deployments/:deployment_id': { body: {} },
  'PATCH /api/v2/sandboxes/boxes/:name': { body: { idle_ttl_seconds: 600 } },
  'POST /api/v2/sandboxes/boxes/:name/execute': { body: { command: 'true' } },
  'GET /api/v2/sandboxes/boxes/:name/files': { query: 'path=/workspace/x' },
  'HEAD /api/v2/sandboxes/boxes/:name/files': { query: 'path=/workspace/x' },
  'PUT /api/v2/sandboxes/boxes/:name/files': { query: 'path=/workspace/x', raw: 'x' },
  'PATCH /v2/auth/providers/:provider_id': { body: { name: 'renamed' } },
  'PATCH /v2/auth/tokens/:token_id/metadata': { body: { is_default: true } },
  'GET /v2/auth/wait/:auth_id': { query: 'timeout=0' },
  'HEAD /v2/auth/wait/:auth_id': { query: 'timeout=0' },
};

/**
 * Routes whose answer for another's (or no) resource is documented as something else than a 404:
 * the OAuth wait answers 200 {"status":"not_found"} (wire.md). It must still be the same answer.
 */
const NOT_404 = new Set(['GET /v2/auth/wait/:auth_id', 'HEAD /v2/auth/wait/:auth_id']);

let s: InProcessServer;
/** Workspace A's resources, by path parameter name; and values naming nothing. */
let mine: Record<string, string>;
const none: Record<string, string> = {
  deployment_id: randomUUID(),
  revision_id: randomUUID(),
  name: 'mx-nothing-here',
  provider_id: 'mx-nothing-prov',
  token_id: randomUUID(),
  auth_id: randomUUID(),
  api_key_id: randomUUID(),
};

beforeAll(async () => {
  s = await startInProcess();
  const a = cpApi(s.url, s.key);
  const up = await a.upload(await packDir(echoVariant({ 'keygate.json': '{ not json' })));
  const dep = await a.call('POST', '/v2/deployments', { name: 'mx-dep-a', source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
  expect(dep.status, dep.text).toBe(201);
  const box = await a.call('POST', '/api/v2/sandboxes/boxes', { template_name: 'host', name: 'mx-box-a' });
  expect(box.status, box.text).toBe(201);
  const prov = await a.call('POST', '/v2/auth/providers', { provider_id: 'mx-prov-a', name: 'p', client_id: 'c', client_secret: 's', auth_url: 'https://idp.example.test/a', token_url: 'https://idp.example.test/t' });
  expect(prov.status, prov.text).toBe(201);
  const flow = await a.call('POST', '/v2/auth/authenticate', { provider: 'mx-prov-a' });
  expect(flow.status, flow.text).toBe(200);
  const owner = await s.built.ctx.db.get<{ workspace_id: string; user_id: string; id: string }>('SELECT id, workspace_id, user_id FROM api_keys WHERE key_hash = ?', [hashApiKey(s.key)]);
  const tokenId = await storeToken(s.built.ctx.db, s.built.ctx.envelope, { workspaceId: owner!.workspace_id, userId: owner!.user_id }, 'mx-prov-a', { accessToken: 'mx-access-token-value' }, [], null);
  mine = {
    deployment_id: dep.body.id,
    revision_id: dep.body.latest_revision_id,
    name: 'mx-box-a',
    provider_id: 'mx-prov-a',
    token_id: tokenId,
    auth_id: flow.body.auth_id,
    api_key_id: owner!.id,
  };
});
afterAll(async () => {
  await s?.close();
  cleanupTmp();
});

const key = (r: RouteInfo) => `${r.method} ${r.url}`;

function pathOf(r: RouteInfo, values: Record<string, string>): string {
  const p = r.url.replace(/:([A-Za-z_]+)/g, (_m, n: string) => {
    if (!(n in values)) throw new Error(`${key(r)}: no value for :${n} (add it to the matrix)`);
    return encodeURIComponent(values[n]);
  });
  const q = INPUT[key(r)]?.query;
  return q ? `${p}?${q}` : p;
}

async function send(r: RouteInfo, values: Record<string, string>, headers: Record<string, string>): Promise<{ status: number; text: string }> {
  const input = INPUT[key(r)] ?? {};
  const h: Record<string, string> = { ...headers };
  let body: string | undefined;
  if (input.body !== undefined) {
    h['content-type'] = 'application/json';
    body = JSON.stringify(input.body);
  } else if (input.raw !== undefined) {
    h['content-type'] = 'application/octet-stream';
    body = input.raw;
  }
  const res = await fetch(s.url + pathOf(r, values), { method: r.method, headers: h, body });
  return { status: res.status, text: await res.text() };
}

const protectedRoutes = () => s.built.routes.filter((r) => !r.public);

describe('the route list', () => {
  it('is taken from the server and covers every area', () => {
    const urls = s.built.routes.map((r) => r.url);
    for (const prefix of ['/v2/deployments', '/v2/uploads', '/api/v2/sandboxes/boxes', '/api/v1/workspaces/current/secrets', '/v2/auth/providers', '/v2/auth/tokens', '/api/v1/api-key']) {
      expect(urls.some((u) => u.startsWith(prefix)), prefix).toBe(true);
    }
    expect(s.built.routes.some((r) => r.websocket)).toBe(true);
  });

  it('has no public route but the listed ones', () => {
    expect(s.built.routes.filter((r) => r.public).map(key).sort()).toEqual([...PUBLIC].sort());
  });
});

describe('every protected route refuses a request without a valid credential', () => {
  const cases: [string, Record<string, string>, string][] = [
    ['no credential', {}, 'Missing credentials'],
    ['a wrong API key', { 'x-api-key': 'kg_wrong_' + 'z'.repeat(30) }, 'Invalid API key.'],
    ['an empty API key', { 'x-api-key': '' }, 'Invalid API key.'],
    ['X-Tenant-Id alone', { 'x-tenant-id': 'default' }, 'X-Tenant-Id'],
    ['a bearer token the server cannot verify', { authorization: 'Bearer abc.def.ghi' }, 'Bearer'],
  ];
  it.each(cases)('%s: 401 {detail} on every route', async (_what, headers, says) => {
    const wrong: string[] = [];
    for (const r of protectedRoutes()) {
      const res = await send(r, mine, headers);
      if (res.status !== 401) wrong.push(`${key(r)} -> ${res.status} ${res.text.slice(0, 200)}`);
      else if (r.method !== 'HEAD') {
        const body = JSON.parse(res.text);
        if (typeof body.detail !== 'string' || !body.detail.includes(says) || Object.keys(body).length !== 1) wrong.push(`${key(r)} -> body ${res.text}`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it("a valid key naming another workspace with X-Tenant-Id: 403 on every route", async () => {
    const wrong: string[] = [];
    for (const r of protectedRoutes()) {
      const res = await send(r, mine, { 'x-api-key': s.keyB, 'x-tenant-id': 'default' });
      if (res.status !== 403) wrong.push(`${key(r)} -> ${res.status}`);
    }
    expect(wrong).toEqual([]);
  });
});

describe("another workspace's key", () => {
  /** The answer with every parameter value replaced by a placeholder: what is left must not differ. */
  const normalise = (text: string, values: Record<string, string>) =>
    Object.values(values).reduce((t, v) => t.split(v).join('<id>').split(v.toLowerCase()).join('<id>'), text);

  it("gets, for this workspace's resources, exactly the answer for resources that do not exist (404), on every route with a resource", async () => {
    const wrong: string[] = [];
    for (const r of protectedRoutes().filter((x) => x.url.includes(':'))) {
      const theirs = await send(r, mine, { 'x-api-key': s.keyB });
      const nothing = await send(r, none, { 'x-api-key': s.keyB });
      const a = `${theirs.status} ${normalise(theirs.text, mine)}`;
      const b = `${nothing.status} ${normalise(nothing.text, none)}`;
      if (a !== b) wrong.push(`${key(r)}: another's -> ${a.slice(0, 200)} | none -> ${b.slice(0, 200)}`);
      else if (!NOT_404.has(key(r)) && theirs.status !== 404) wrong.push(`${key(r)} -> ${a.slice(0, 200)} (expected 404)`);
    }
    expect(wrong).toEqual([]);
  });

  it("lists nothing of this workspace's on any route without a resource", async () => {
    const wrong: string[] = [];
    for (const r of protectedRoutes().filter((x) => !x.url.includes(':') && x.method === 'GET')) {
      const res = await send(r, mine, { 'x-api-key': s.keyB });
      for (const v of Object.values(mine)) if (res.text.includes(v)) wrong.push(`${key(r)} shows ${v}`);
    }
    expect(wrong).toEqual([]);
  });

  it("changed nothing of this workspace's", async () => {
    const a = cpApi(s.url, s.key);
    expect((await a.call('GET', `/v2/deployments/${mine.deployment_id}`)).body).toMatchObject({ name: 'mx-dep-a' });
    expect((await a.call('GET', `/api/v2/sandboxes/boxes/${mine.name}`)).status).toBe(200);
    expect((await a.call('GET', `/v2/auth/providers/${mine.provider_id}`)).body).toMatchObject({ name: 'p' });
    expect((await a.call('GET', '/v2/auth/tokens')).body.map((t: { id: string }) => t.id)).toContain(mine.token_id);
    expect((await a.call('GET', '/api/v1/api-key')).body.map((k: { id: string }) => k.id)).toContain(mine.api_key_id);
  });
});
