// Property tests of the control plane's HTTP API (wire.md, "Control plane: deployments"): every
// route, driven with generated hostile input through a real server on real SQLite files
// (in-process, every area) with a real HTTP client (undici). On every answer: never a 5xx,
// exactly the documented error shape, no deployment secret value or key in any body, header or log
// line, a rejected request changes nothing; another workspace's key gets what a missing
// deployment gets; and an accepted create or patch reads back as written (secret names listed,
// values stored exactly, never returned).
import fc from 'fast-check';
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { propertyParams } from '../helpers/property.js';
import { cleanupTmp, echoVariant, packDir } from '../control-plane/helpers.js';
import { startInProcess, type InProcessServer } from './inprocess.js';
import { checked, hostileQuery, hostileRequest, httpClient, Known, secretTail, secretValue, type Res, type RouteSpec } from './property-helpers.js';
import { budget } from './property-helpers.js';

let s: InProcessServer;
let http: ReturnType<typeof httpClient>;
const known = new Known();
let upload: string;
let uploadB: string;
let tgz: Buffer;
const fixture = { dep: '', rev: '', depB: '' };
const DEP = 'fx-dep';

async function call(method: string, path: string, key: string, body?: unknown): Promise<Res> {
  return (await http.send({ method, path, headers: { 'x-api-key': key, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) }, body: body === undefined ? undefined : JSON.stringify(body) }))!;
}

function depSecrets(tail = ''): { name: string; value: string }[] {
  const v = secretValue('dsv', tail);
  known.add(v.core);
  return [{ name: 'DEP_SECRET', value: v.value }];
}

async function createFixture(key: string, name: string): Promise<{ id: string; rev: string }> {
  const r = await call('POST', '/v2/deployments', key, { name, source: 'internal_source', source_revision_config: { source_tarball_path: key === s.key ? upload : uploadB }, secrets: depSecrets() });
  expect(r.status, r.text).toBe(201);
  const body = r.json as { id: string; latest_revision_id: string };
  return { id: body.id, rev: body.latest_revision_id };
}

/** Back to the fixture: A's deployment fx-dep and B's fx-dep-b, no other deployment. */
async function restore(): Promise<void> {
  for (const [key, keep] of [[s.key, DEP], [s.keyB, 'fx-dep-b']] as const) {
    const list = (await call('GET', '/v2/deployments?limit=100', key)).json as { resources: { id: string; name: string }[] };
    for (const d of list.resources) if (d.name !== keep) expect((await call('DELETE', `/v2/deployments/${d.id}`, key)).status).toBe(204);
    if (!list.resources.some((d) => d.name === keep)) {
      const made = await createFixture(key, keep);
      if (key === s.key) Object.assign(fixture, { dep: made.id, rev: made.rev });
      else fixture.depB = made.id;
    }
  }
}

beforeAll(async () => {
  s = await startInProcess();
  http = httpClient(s.url);
  known.add(s.key);
  known.add(s.keyB);
  // A build that fails at once (its keygate.json does not parse): no app process to wait for.
  tgz = await packDir(echoVariant({ 'keygate.json': '{ not json' }));
  const up = async (key: string) => {
    const r = await http.send({ method: 'POST', path: '/v2/uploads', headers: { 'x-api-key': key, 'content-type': 'application/gzip' }, body: tgz });
    expect(r!.status, r!.text).toBe(201);
    return (r!.json as { source_tarball_path: string }).source_tarball_path;
  };
  upload = await up(s.key);
  uploadB = await up(s.keyB);
  await restore();
});

afterAll(async () => {
  await http?.close();
  await s?.close();
  cleanupTmp();
});

const createBody = fc.record({ n: fc.nat({ max: 10_000 }), tail: secretTail, type: fc.constantFrom('dev', 'prod') }).map(({ n, tail, type }) => ({
  name: `fz-${n}`,
  source: 'internal_source',
  source_config: { deployment_type: type },
  source_revision_config: { source_tarball_path: upload },
  secrets: depSecrets(tail),
}));
const patchBody = fc.record({ tail: secretTail, rev: fc.boolean() }).map(({ tail, rev }) => ({
  ...(rev ? { source_revision_config: { source_tarball_path: upload } } : {}),
  secrets: depSecrets(tail),
}));

const ROUTES: RouteSpec[] = [
  { method: 'POST', url: '/v2/uploads', raw: { contentType: 'application/gzip', body: () => tgz } },
  { method: 'POST', url: '/v2/deployments', body: () => createBody },
  { method: 'GET', url: '/v2/deployments', query: '?limit=20&offset=0', queryNames: ['limit', 'offset', 'name_contains', 'status', 'deployment_type'] },
  { method: 'GET', url: '/v2/deployments/:deployment_id' },
  { method: 'PATCH', url: '/v2/deployments/:deployment_id', body: () => patchBody },
  { method: 'DELETE', url: '/v2/deployments/:deployment_id' },
  { method: 'GET', url: '/v2/deployments/:deployment_id/revisions', query: '?limit=5', queryNames: ['limit', 'offset'] },
  { method: 'GET', url: '/v2/deployments/:deployment_id/revisions/:revision_id' },
  { method: 'GET', url: '/v2/deployments/:deployment_id/logs', query: '?limit=10', queryNames: ['type', 'revision_id', 'since', 'limit'] },
  { method: 'GET', url: '/v2/deployments/:deployment_id/logs/stream', query: '?type=build', queryNames: ['type', 'revision_id', 'since'] },
];

const valid = {
  deployment_id: () => [fixture.dep, fixture.dep.toUpperCase(), fixture.depB, randomUUID()],
  revision_id: () => [fixture.rev, fixture.rev.toUpperCase(), randomUUID()],
};

describe('the route list', () => {
  it('covers every route the control plane registers', () => {
    const mine = s.built.routes
      .filter((r) => r.url.startsWith('/v2/deployments') || r.url.startsWith('/v2/uploads'))
      .filter((r) => r.method !== 'HEAD')
      .map((r) => `${r.method} ${r.url}`)
      .sort();
    expect(mine).toEqual(ROUTES.map((r) => `${r.method} ${r.url}`).sort());
  });
});

describe('hostile input on every route', () => {
  it('never a 5xx, the documented error shape, nothing leaked, a rejected request changes nothing', async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...ROUTES).chain((r) => hostileRequest(r, () => s.key, valid)), async (req) => {
        await checked(s, http, known, req);
        await restore();
      }),
      propertyParams(50),
    );
  }, budget(50, 400));

  it('list queries: out of range, repeated and non-numeric parameters are a 422 at query, never a 5xx', async () => {
    await fc.assert(
      fc.asyncProperty(hostileQuery(['limit', 'offset', 'name_contains', 'status', 'deployment_type']), async (q) => {
        const res = await checked(s, http, known, { method: 'GET', path: `/v2/deployments${q}`, headers: { 'x-api-key': s.key } });
        if (!res) return;
        expect([200, 422], res.text).toContain(res.status);
        if (res.status === 200) {
          const body = res.json as { resources: { name: string }[]; offset: number };
          expect(body.resources.every((d) => d.name === DEP)).toBe(true);
          expect(Number.isSafeInteger(body.offset)).toBe(true);
        } else for (const i of (res.json as { detail: { loc: string[] }[] }).detail) expect(i.loc[0]).toBe('query');
      }),
      propertyParams(30),
    );
  }, budget(30, 400));
});

describe('what an accepted request wrote is what GET returns', () => {
  it('a created or patched deployment: its fields and secret names read back, values stored exactly and never returned', async () => {
    await fc.assert(
      fc.asyncProperty(fc.boolean(), createBody, patchBody, async (patch, created, patched) => {
        const body = patch ? patched : created;
        const req = patch
          ? { method: 'PATCH', path: `/v2/deployments/${fixture.dep}`, headers: { 'x-api-key': s.key, 'content-type': 'application/json' }, body: JSON.stringify(patched) }
          : { method: 'POST', path: '/v2/deployments', headers: { 'x-api-key': s.key, 'content-type': 'application/json' }, body: JSON.stringify(created) };
        const before = (await call('GET', `/v2/deployments/${fixture.dep}`, s.key)).json as { latest_revision_id: string };
        const res = (await checked(s, http, known, req))!;
        const secrets = body.secrets;
        if (res.status < 300) {
          const id = (res.json as { id: string }).id;
          const got = (await call('GET', `/v2/deployments/${id}`, s.key)).json as Record<string, unknown>;
          expect(got.secrets).toEqual(secrets.map((x) => ({ name: x.name })));
          if (!patch) expect(got).toMatchObject({ name: created.name, source: 'internal_source', source_config: { deployment_type: created.source_config.deployment_type } });
          const newRevision = !patch || 'source_revision_config' in patched;
          if (patch) expect(got.latest_revision_id === before.latest_revision_id).toBe(!newRevision);
          const row = await s.built.ctx.db.get<{ secrets: string }>('SELECT secrets FROM cp_deployments WHERE id = ?', [id]);
          const sealed = JSON.parse(row!.secrets) as Record<string, string>;
          expect(Object.fromEntries(Object.entries(sealed).map(([k, v]) => [k, s.built.ctx.envelope.open(v)]))).toEqual(Object.fromEntries(secrets.map((x) => [x.name, x.value])));
        } else {
          // Only a value no environment can carry (a NUL) or that is not Unicode text (a lone
          // surrogate) is refused, at its place.
          expect(res.status, res.text).toBe(422);
          expect((res.json as { detail: { loc: unknown[] }[] }).detail.map((i) => i.loc)).toEqual([['body', 'secrets', 0, 'value']]);
          expect(secrets[0].value).toMatch(/\u0000|[\ud800-\udfff]/);
        }
        await restore();
      }),
      propertyParams(12),
    );
  }, budget(12, 400));
});

describe("another workspace's key", () => {
  it("gets for workspace A's deployment and revision exactly what it gets for ones that do not exist, and changes nothing", async () => {
    const withId = ROUTES.filter((r) => r.url.includes(':deployment_id') && !r.url.endsWith('/stream'));
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...withId).chain((r) => fc.tuple(fc.constant(r), r.body ? r.body() : fc.constant(undefined))), async ([r, body]) => {
        const send = async (dep: string, rev: string) => {
          const path = r.url.replace(':deployment_id', dep).replace(':revision_id', rev) + (r.query ?? '');
          const res = (await checked(s, http, known, { method: r.method, path, headers: { 'x-api-key': s.keyB, ...(body ? { 'content-type': 'application/json' } : {}) }, body: body ? JSON.stringify(body) : undefined }))!;
          return `${res.status} ${res.text.split(dep).join('<d>').split(rev).join('<r>')}`;
        };
        const theirs = await send(fixture.dep, fixture.rev);
        const none = await send(randomUUID(), randomUUID());
        expect(theirs).toBe(none);
        expect(theirs.startsWith('404 ') || theirs.startsWith('422 '), theirs).toBe(true);
        await restore();
      }),
      propertyParams(12),
    );
  }, budget(12, 400));
});
