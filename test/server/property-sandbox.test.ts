// Property tests of the sandbox API and the workspace secrets API (wire.md, sandbox.md): every
// route, driven with generated hostile input (mutated bodies, raw bytes, path segments, query
// strings, credential headers) through a real server on real SQLite files (in-process, every
// area, `none` driver) with a real HTTP client (undici). On every answer: never a 5xx, exactly the
// documented error shape, no stored secret, opaque value or key in any body, header or log line,
// a rejected request changes nothing, another workspace's key gets what a missing resource gets;
// and what an accepted request wrote is what GET returns (proxy_config as wire.md returns it,
// secret names listed, values stored exactly).
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { propertyParams } from '../helpers/property.js';
import { startInProcess, type InProcessServer } from './inprocess.js';
import {
  apiKeyHeaderName,
  checked,
  hostileBody,
  hostileQuery,
  hostileSegment,
  httpClient,
  Known,
  secretTail,
  secretValue,
  type Req,
  type Res,
  workspaceSecrets,
} from './property-helpers.js';
import { budget } from './property-helpers.js';

let s: InProcessServer;
let http: ReturnType<typeof httpClient>;
const known = new Known();
/** Workspace A's secrets as the fixture sets them. */
const fixtureSecrets: Record<string, string> = {};
let fixtureBox: Record<string, unknown>;
const BOX = 'fx-box';
const BOX_B = 'fx-box-b';

const A = () => ({ 'x-api-key': s.key });
const B = () => ({ 'x-api-key': s.keyB });
const json = (_body: unknown) => ({ 'content-type': 'application/json' });

async function call(method: string, path: string, headers: Record<string, string>, body?: unknown): Promise<Res> {
  const res = await http.send({ method, path, headers: { ...headers, ...(body !== undefined ? json(body) : {}) }, body: body === undefined ? undefined : JSON.stringify(body) });
  return res!;
}

function proxyConfig(opaque: string) {
  return {
    rules: [
      {
        name: 'gh',
        match_hosts: ['api.example.test', '*.example.test'],
        match_paths: ['/v1/*'],
        headers: [
          { name: 'authorization', type: 'workspace_secret', value: 'Bearer {GH_TOKEN}' },
          { name: 'x-opaque', type: 'opaque', value: opaque },
          { name: 'x-plain', type: 'plaintext', value: 'visible-plain' },
        ],
      },
    ],
    no_proxy: ['localhost'],
  };
}

/** Back to the fixture: A's secrets and box as set up, nothing else of A's or B's boxes. */
async function restore(): Promise<void> {
  for (const [who, h] of [['a', A()], ['b', B()]] as const) {
    const boxes = (await call('GET', '/api/v2/sandboxes/boxes?limit=100', h)).json as { resources: { name: string }[] };
    for (const b of boxes.resources) if (b.name !== (who === 'a' ? BOX : BOX_B)) await call('DELETE', `/api/v2/sandboxes/boxes/${b.name}`, h);
    const names = ((await call('GET', '/api/v1/workspaces/current/secrets', h)).json as { key: string }[]).map((x) => x.key);
    const extra = names.filter((n) => who === 'b' || !(n in fixtureSecrets));
    if (extra.length) expect((await call('POST', '/api/v1/workspaces/current/secrets?force=true', h, extra.map((key) => ({ key, value: null })))).status).toBe(200);
  }
  const now = await workspaceSecrets(s, 'default');
  const same = JSON.stringify(Object.entries(now).sort()) === JSON.stringify(Object.entries(fixtureSecrets).sort());
  if (!same) {
    const r = await call('POST', '/api/v1/workspaces/current/secrets', A(), Object.entries(fixtureSecrets).map(([key, value]) => ({ key, value })));
    expect(r.status, r.text).toBe(200);
  }
  const box = await call('GET', `/api/v2/sandboxes/boxes/${BOX}`, A());
  if (box.status === 404) expect((await call('POST', '/api/v2/sandboxes/boxes', A(), fixtureBox)).status).toBe(201);
  else if (JSON.stringify((box.json as { idle_ttl_seconds: number }).idle_ttl_seconds) !== '600' || (box.json as { status: string }).status === 'stopped') {
    await call('DELETE', `/api/v2/sandboxes/boxes/${BOX}`, A());
    expect((await call('POST', '/api/v2/sandboxes/boxes', A(), fixtureBox)).status).toBe(201);
  }
  if ((await call('GET', `/api/v2/sandboxes/boxes/${BOX_B}`, B())).status === 404) {
    expect((await call('POST', '/api/v2/sandboxes/boxes', B(), { template_name: 'host', name: BOX_B })).status).toBe(201);
  }
}

beforeAll(async () => {
  s = await startInProcess();
  http = httpClient(s.url);
  known.add(s.key);
  known.add(s.keyB);
  const gh = secretValue('ghs');
  const other = secretValue('oth');
  known.add(gh.core);
  known.add(other.core);
  fixtureSecrets.GH_TOKEN = gh.value;
  fixtureSecrets.OTHER_SECRET = other.value;
  const opaque = secretValue('opq');
  known.add(opaque.core);
  fixtureBox = { template_name: 'host', name: BOX, wait_for_ready: true, proxy_config: proxyConfig(opaque.value) };
  const bSecret = secretValue('bsec');
  known.add(bSecret.core);
  expect((await call('POST', '/api/v1/workspaces/current/secrets', B(), [{ key: 'GH_TOKEN', value: bSecret.value }])).status).toBe(200);
  await restore();
});

afterAll(async () => {
  await http?.close();
  await s?.close();
});

/** The routes of these two areas, each with a valid body, query and path for workspace A. */
interface Route {
  method: string;
  url: string;
  query?: string;
  body?: () => fc.Arbitrary<unknown>;
  raw?: boolean;
}

/** A valid create body with a new name and fresh secret values (the opaque one is known). */
const createBody = fc.record({ n: fc.nat({ max: 10_000 }), tail: secretTail, ttl: fc.integer({ min: 0, max: 31_536_000 }) }).map(({ n, tail, ttl }) => {
  const opaque = secretValue('opq', tail);
  known.add(opaque.core);
  return { template_name: 'host', name: `fz-${n}`, wait_for_ready: true, proxy_config: proxyConfig(opaque.value), idle_ttl_seconds: ttl };
});
const patchBody = fc.record({ tail: secretTail, ttl: fc.integer({ min: 0, max: 31_536_000 }) }).map(({ tail, ttl }) => {
  const opaque = secretValue('opq', tail);
  known.add(opaque.core);
  return { proxy_config: proxyConfig(opaque.value), idle_ttl_seconds: ttl };
});
const secretsBody = fc.record({ tail: secretTail, n: fc.nat({ max: 50 }), del: fc.boolean() }).map(({ tail, n, del }) => {
  const v = secretValue('wsv', tail);
  known.add(v.core);
  return [{ key: `FZ_${n}`, value: v.value }, ...(del ? [{ key: 'OTHER_SECRET', value: null }] : [])];
});

const ROUTES: Route[] = [
  { method: 'GET', url: '/api/v2/sandboxes/templates' },
  { method: 'POST', url: '/api/v2/sandboxes/boxes', body: () => createBody },
  { method: 'GET', url: '/api/v2/sandboxes/boxes', query: '?limit=20&offset=0' },
  { method: 'GET', url: '/api/v2/sandboxes/boxes/:name' },
  { method: 'PATCH', url: '/api/v2/sandboxes/boxes/:name', body: () => patchBody },
  { method: 'DELETE', url: '/api/v2/sandboxes/boxes/:name' },
  { method: 'POST', url: '/api/v2/sandboxes/boxes/:name/stop' },
  { method: 'POST', url: '/api/v2/sandboxes/boxes/:name/start' },
  {
    method: 'POST',
    url: '/api/v2/sandboxes/boxes/:name/execute',
    body: () => fc.record({ command: fc.oneof(fc.constant('echo hi'), fc.constant(['echo', 'hi'])), timeout_seconds: fc.constantFrom(1, 5), env: fc.constant({ A: 'b' }), cwd: fc.constant('/workspace') }),
  },
  { method: 'GET', url: '/api/v2/sandboxes/boxes/:name/execute/ws' },
  { method: 'GET', url: '/api/v2/sandboxes/boxes/:name/files', query: '?path=/workspace/x.txt' },
  { method: 'PUT', url: '/api/v2/sandboxes/boxes/:name/files', query: '?path=/workspace/x.txt', raw: true },
  { method: 'GET', url: '/api/v1/workspaces/current/secrets' },
  { method: 'POST', url: '/api/v1/workspaces/current/secrets', query: '?force=false', body: () => secretsBody },
];

describe('the route list', () => {
  it('covers every route the sandbox and secrets areas register', () => {
    const mine = s.built.routes
      .filter((r) => r.url.startsWith('/api/v2/sandboxes') || r.url.startsWith('/api/v1/workspaces'))
      .filter((r) => r.method !== 'HEAD')
      .map((r) => `${r.method} ${r.url}`)
      .sort();
    expect(mine).toEqual(ROUTES.map((r) => `${r.method} ${r.url}`).sort());
  });
});

const route = fc.constantFrom(...ROUTES);

/** A request for `r`: the valid path, query and body, each possibly replaced by hostile ones. */
function requestFor(r: Route): fc.Arbitrary<Req> {
  const body: fc.Arbitrary<{ contentType?: string; body?: string | Buffer }> = r.body
    ? r.body().chain((valid) => hostileBody(valid))
    : r.raw
      ? fc.oneof(fc.constant({ contentType: 'application/octet-stream', body: 'file bytes' }), fc.constant({}), fc.constant({ contentType: 'application/json', body: '{"a":1}' }))
      : fc.oneof({ weight: 4, arbitrary: fc.constant({}) }, { weight: 1, arbitrary: fc.constant({ contentType: 'application/json', body: '{"unexpected":true}' }) }, { weight: 1, arbitrary: fc.constant({ contentType: 'application/json', body: 'not json' }) });
  const name = fc.oneof({ weight: 3, arbitrary: fc.constant(BOX) }, { weight: 1, arbitrary: fc.constant(BOX_B) }, { weight: 3, arbitrary: hostileSegment });
  const names = r.url.includes('files') ? ['path'] : r.url.endsWith('/secrets') ? ['force'] : ['limit', 'offset'];
  const query = fc.oneof({ weight: 2, arbitrary: fc.constant(r.query ?? '') }, { weight: 1, arbitrary: hostileQuery(names) });
  return fc.record({ body, name, query, keyName: apiKeyHeaderName }).map(({ body, name, query, keyName }) => {
    const headers: Record<string, string> = { [keyName]: s.key };
    if (body.contentType) headers['content-type'] = body.contentType;
    return { method: r.method, path: r.url.replace(':name', name) + query, headers, body: body.body };
  });
}

describe('hostile input on every route', () => {
  it('never a 5xx, the documented error shape, nothing leaked, a rejected request changes nothing', async () => {
    await fc.assert(
      fc.asyncProperty(route.chain(requestFor), async (req) => {
        await checked(s, http, known, req);
        await restore();
      }),
      propertyParams(35),
    );
  }, budget(35, 400));
});

/** proxy_config as wire.md returns it: plaintext as stored, workspace_secret as its template, opaque without value. */
function redacted(config: unknown): unknown {
  const c = structuredClone(config) as { rules?: { headers?: { type: string; value?: string }[] }[] };
  for (const rule of c.rules ?? []) for (const h of rule.headers ?? []) if (h.type === 'opaque') delete h.value;
  return c;
}

describe('what an accepted request wrote is what GET returns', () => {
  it('a created or patched box: proxy_config and idle_ttl_seconds read back as written (opaque omitted)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.boolean(), createBody, patchBody, async (patch, created, patched) => {
        const res = patch
          ? await checked(s, http, known, { method: 'PATCH', path: `/api/v2/sandboxes/boxes/${BOX}`, headers: { ...A(), 'content-type': 'application/json' }, body: JSON.stringify(patched) })
          : await checked(s, http, known, { method: 'POST', path: '/api/v2/sandboxes/boxes', headers: { ...A(), 'content-type': 'application/json' }, body: JSON.stringify(created) });
        const sent = patch ? patched : created;
        const name = patch ? BOX : created.name;
        if (res!.status < 300) {
          const got = (await call('GET', `/api/v2/sandboxes/boxes/${name}`, A())).json as Record<string, unknown>;
          expect(got.proxy_config).toEqual(redacted(sent.proxy_config));
          expect(got.idle_ttl_seconds).toBe(sent.idle_ttl_seconds);
          expect((res!.json as Record<string, unknown>).proxy_config).toEqual(redacted(sent.proxy_config));
          const listed = ((await call('GET', '/api/v2/sandboxes/boxes?limit=100', A())).json as { resources: { name: string; proxy_config: unknown }[] }).resources.find((b) => b.name === name);
          expect(listed?.proxy_config).toEqual(redacted(sent.proxy_config));
        } else {
          // The fixture's secrets are header-safe and the names new: only a value a header cannot
          // carry (CR, LF, NUL, edge whitespace) is a reason to refuse, at that header's value.
          expect(res!.status, res!.text).toBe(422);
          for (const i of (res!.json as { detail: { loc: unknown[] }[] }).detail) expect(i.loc.slice(0, 2)).toEqual(['body', 'proxy_config']);
        }
        await restore();
      }),
      propertyParams(12),
    );
  }, budget(12, 400));

  it('secrets: the listing is the names written, and each value is stored exactly as sent', async () => {
    const entry = fc.record({ key: fc.constantFrom('FZ_A', 'FZ_B', 'fz_c', '_FZ', 'FZ_' + 'L'.repeat(125)), tail: secretTail, del: fc.boolean() });
    await fc.assert(
      fc.asyncProperty(fc.uniqueArray(entry, { selector: (e) => e.key, maxLength: 4 }), async (entries) => {
        const before = ((await call('GET', '/api/v1/workspaces/current/secrets', A())).json as { key: string }[]).map((x) => x.key);
        const body = entries.map((e) => {
          if (e.del) return { key: e.key, value: null };
          const v = secretValue('wsv', e.tail);
          known.add(v.core);
          return { key: e.key, value: v.value };
        });
        const res = await checked(s, http, known, { method: 'POST', path: '/api/v1/workspaces/current/secrets', headers: { ...A(), 'content-type': 'application/json' }, body: JSON.stringify(body) });
        const after = ((await call('GET', '/api/v1/workspaces/current/secrets', A())).json as { key: string }[]).map((x) => x.key);
        if (res!.status === 200) {
          const expected = new Set(before);
          for (const e of body) e.value === null ? expected.delete(e.key) : expected.add(e.key);
          expect(after).toEqual([...expected].sort());
          expect((res!.json as { key: string }[]).map((x) => x.key)).toEqual(after);
          for (const e of body) {
            if (e.value === null) continue;
            expect((await workspaceSecrets(s, 'default'))[e.key], `value of ${e.key}`).toBe(e.value);
          }
        } else {
          expect(res!.status, res!.text).toBe(422);
          expect(after).toEqual(before);
        }
        await restore();
      }),
      propertyParams(15),
    );
  }, budget(15, 400));
});

describe('credentials', () => {
  const variants = fc.record({
    keyName: apiKeyHeaderName,
    key: fc.constantFrom('a', 'a-padded', 'a-upper', 'b', 'wrong', 'empty', 'none', 'both'),
    tenant: fc.constantFrom(undefined, 'default', 'team-b', 'DEFAULT', ' default ', 'nope', ''),
    bearer: fc.boolean(),
  });

  it('every key and tenant header combination gets the documented answer, on every route', async () => {
    const wrong = secretValue('kg_wrong');
    known.add(wrong.core);
    await fc.assert(
      fc.asyncProperty(route, variants, async (r, v) => {
        const headers: Record<string, string | string[]> = {};
        const key = { a: s.key, 'a-padded': ` ${s.key} `, 'a-upper': s.key.toUpperCase(), b: s.keyB, wrong: wrong.value, empty: '', none: undefined, both: [s.key, s.keyB] }[v.key];
        if (key !== undefined) headers[v.keyName] = key;
        if (v.tenant !== undefined) headers['x-tenant-id'] = v.tenant;
        if (v.bearer) headers.authorization = 'Bearer not.a.jwt';
        const req = { method: r.method, path: r.url.replace(':name', 'fx-nothing') + (r.query ?? ''), headers };
        const res = (await checked(s, http, known, req))!;
        // Who the credential names (if anyone), then whether X-Tenant-Id agrees: team-b's id is a
        // UUID, so no tenant header value names it here.
        const principal = v.key === 'a' || v.key === 'a-padded' ? 'default' : v.key === 'b' ? 'team-b' : undefined;
        const ok = principal !== undefined && (v.tenant === undefined || (principal === 'default' && v.tenant.trim() === 'default'));
        const expected = principal === undefined ? 401 : ok ? undefined : 403;
        if (expected !== undefined) expect(res.status, `${JSON.stringify(v)} ${res.text}`).toBe(expected);
        else expect([401, 403], `${JSON.stringify(v)} ${res.text}`).not.toContain(res.status);
      }),
      propertyParams(25),
    );
  }, budget(25, 400));
});

describe("another workspace's key", () => {
  it("gets for workspace A's box exactly what it gets for a box that does not exist, and changes nothing", async () => {
    const named = ROUTES.filter((r) => r.url.includes(':name'));
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...named).chain((r) => fc.tuple(fc.constant(r), r.body ? r.body() : fc.constant(undefined))), async ([r, body]) => {
        const req = (name: string): Req => ({
          method: r.method,
          path: r.url.replace(':name', name) + (r.query ?? ''),
          headers: { ...B(), ...(body !== undefined ? { 'content-type': 'application/json' } : r.raw ? { 'content-type': 'application/octet-stream' } : {}) },
          body: body !== undefined ? JSON.stringify(body) : r.raw ? 'bytes' : undefined,
        });
        const theirs = (await checked(s, http, known, req(BOX)))!;
        const none = (await checked(s, http, known, req('fx-nothing')))!;
        expect(`${theirs.status} ${theirs.text.split(BOX).join('<n>')}`).toBe(`${none.status} ${none.text.split('fx-nothing').join('<n>')}`);
        expect([404, 422]).toContain(theirs.status);
        await restore();
      }),
      propertyParams(12),
    );
  }, budget(12, 400));
});

// Counterexamples the properties found, kept as plain tests.
describe('regressions', () => {
  it('a plain GET (no upgrade) of the streaming execute route answers 426 in the wire shape, not an empty 404', async () => {
    const res = await call('GET', `/api/v2/sandboxes/boxes/${BOX}/execute/ws`, A());
    expect(res.status).toBe(426);
    expect(res.json).toEqual({ detail: expect.stringContaining('WebSocket') });
    expect(res.headers.upgrade).toBe('websocket');
    // An unknown box (or another workspace's) is still the 404 of every route, in the wire shape.
    for (const [name, h] of [['fx-nothing', A()], [BOX, B()]] as const) {
      const gone = await call('GET', `/api/v2/sandboxes/boxes/${name}/execute/ws`, h);
      expect(gone.status).toBe(404);
      expect(gone.json).toEqual({ detail: expect.any(String) });
    }
  });

  it('a string that is not valid Unicode (a lone surrogate) is refused with 422 at its loc, on every JSON route, and nothing is stored altered', async () => {
    const before = await workspaceSecrets(s, 'default');
    const lone = 'ok\ud800';
    const cases: [string, string, unknown, (string | number)[]][] = [
      ['POST', '/api/v1/workspaces/current/secrets', [{ key: 'FZ_LONE', value: lone }], ['body', 0, 'value']],
      ['POST', '/api/v2/sandboxes/boxes', { template_name: 'host', name: 'fz-lone', proxy_config: { rules: [{ name: lone, match_hosts: ['a.test'] }] } }, ['body', 'proxy_config', 'rules', 0, 'name']],
      ['POST', '/v2/auth/providers', { provider_id: 'fz-lone', name: lone, client_id: 'c', client_secret: 's', auth_url: 'https://idp.example.test/a', token_url: 'https://idp.example.test/t' }, ['body', 'name']],
      ['POST', '/v2/deployments', { name: 'fz-lone', source: 'internal_source', source_revision_config: { source_tarball_path: 'uploads/x.tar.gz' }, secrets: [{ name: 'S', value: lone }] }, ['body', 'secrets', 0, 'value']],
      ['POST', '/v2/auth/authenticate', { provider: 'p', scopes: [`s${'\udc00'}`] }, ['body', 'scopes', 0]],
    ];
    for (const [method, path, body, loc] of cases) {
      const res = await call(method, path, A(), body);
      expect(res.status, `${path}: ${res.text}`).toBe(422);
      expect((res.json as { detail: { loc: unknown[]; type: string }[] }).detail, path).toEqual([{ loc, msg: expect.any(String), type: 'string_unicode' }]);
    }
    expect(await workspaceSecrets(s, 'default')).toEqual(before);
    expect((await call('GET', '/api/v2/sandboxes/boxes/fz-lone', A())).status).toBe(404);
    expect((await call('GET', '/v2/auth/providers/fz-lone', A())).status).toBe(404);
  });
});
