import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';
import { api, cleanupTmp, echoVariant, packDir, rawTarGz, tmpDir, waitRevision, type Api } from './helpers.js';

const KEY = 'kg_test_control_plane_key_0001';
afterAll(cleanupTmp);

async function startServe(dataDir: string, env: Record<string, string> = {}): Promise<RunningCli> {
  return startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_MAX_UPLOAD_BYTES: '200000', DOCKER_HOST: 'unix:///nonexistent/docker.sock', ...env } });
}

/** A source whose build fails at once (no process is started): cheap fodder for CRUD tests. */
const brokenDir = () => echoVariant({ 'keygate.json': '{ this is not json' });

async function createBroken(a: Api, name: string, extra: Record<string, unknown> = {}) {
  const up = await a.upload(await packDir(brokenDir()));
  expect(up.status).toBe(201);
  const res = await a.call('POST', '/v2/deployments', { name, source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path }, ...extra });
  expect(res.status, res.text).toBe(201);
  return res.body;
}

function crudSuite(label: string, databaseUrl: () => Promise<string>) {
  describe(`control plane CRUD on ${label}`, () => {
    let server: RunningCli;
    let a: Api;
    let b: Api;
    let dataDir: string;
    beforeAll(async () => {
      dataDir = tmpDir();
      const url = await databaseUrl();
      server = await startServe(dataDir, { DATABASE_URL: url });
      a = api(server.url, KEY);
      const made = runCli(['serve', 'keys', 'create', '--workspace', 'team-b', '--user', 'bob', '--data', dataDir], { env: { DATABASE_URL: url } });
      expect(made.status, made.stderr).toBe(0);
      b = api(server.url, made.stdout.trim());
    });
    afterAll(async () => {
      expect(await server.stop()).toBe(0);
    });

    it('creates, gets, lists, patches and deletes; names are unique per workspace', async () => {
      const d = await createBroken(a, 'crud-one', { source_config: { deployment_type: 'prod' }, secrets: [{ name: 'TOKEN', value: 'crud-secret-value-1' }] });
      expect(d).toMatchObject({ name: 'crud-one', source: 'internal_source', status: 'READY', active_revision_id: null, secrets: [{ name: 'TOKEN' }] });
      expect(d.source_config).toEqual({ deployment_type: 'prod', custom_url: d.url });
      expect(d.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(d.id).toMatch(/^[0-9a-f-]{36}$/);
      expect(JSON.stringify(d)).not.toContain('crud-secret-value-1');

      const got = await a.call('GET', `/v2/deployments/${d.id}`);
      expect(got.status).toBe(200);
      expect(got.body.latest_revision_id).toBe(d.latest_revision_id);

      const dup = await createBroken(a, 'crud-two');
      const again = await a.call('POST', '/v2/deployments', { name: 'crud-two', source: 'internal_source', source_revision_config: { source_tarball_path: (await a.upload(await packDir(brokenDir()))).body.source_tarball_path } });
      expect(again.status).toBe(409);
      expect(again.body).toEqual({ detail: 'A deployment named crud-two already exists.' });
      // Another workspace may use the same name.
      const other = await createBroken(b, 'crud-two');
      expect(other.id).not.toBe(dup.id);

      const up = await a.upload(await packDir(brokenDir()));
      const patched = await a.call('PATCH', `/v2/deployments/${d.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path }, secrets: [{ name: 'OTHER', value: 'x' }] });
      expect(patched.status).toBe(200);
      expect(patched.body.latest_revision_id).not.toBe(d.latest_revision_id);
      expect(patched.body.secrets).toEqual([{ name: 'OTHER' }]);
      const revs = await a.call('GET', `/v2/deployments/${d.id}/revisions`);
      expect(revs.body.resources.map((r: { id: string }) => r.id)).toEqual([patched.body.latest_revision_id, d.latest_revision_id]);
      expect(revs.body.offset).toBe(2);
      const noop = await a.call('PATCH', `/v2/deployments/${d.id}`, { source_revision_config: { source_tarball_path: null } });
      expect(noop.body.latest_revision_id).toBe(patched.body.latest_revision_id);

      expect((await a.call('DELETE', `/v2/deployments/${d.id}`)).status).toBe(204);
      expect((await a.call('GET', `/v2/deployments/${d.id}`)).status).toBe(404);
      expect((await a.call('DELETE', `/v2/deployments/${d.id}`)).status).toBe(404);
      expect(existsSync(path.join(dataDir, 'deployments', d.id))).toBe(false);
    });

    it('keeps workspaces apart', async () => {
      const mine = await createBroken(a, 'iso-a');
      for (const [m, p] of [
        ['GET', `/v2/deployments/${mine.id}`],
        ['PATCH', `/v2/deployments/${mine.id}`],
        ['DELETE', `/v2/deployments/${mine.id}`],
        ['GET', `/v2/deployments/${mine.id}/revisions`],
        ['GET', `/v2/deployments/${mine.id}/revisions/${mine.latest_revision_id}`],
        ['GET', `/v2/deployments/${mine.id}/logs`],
      ]) {
        const r = await b.call(m, p, m === 'PATCH' ? {} : undefined);
        expect(r.status, `${m} ${p}`).toBe(404);
        expect(r.body).toEqual({ detail: `Deployment ID ${mine.id} not found.` });
      }
      const listed = await b.call('GET', '/v2/deployments?limit=100');
      expect(listed.body.resources.map((x: { id: string }) => x.id)).not.toContain(mine.id);
      // An upload belongs to the workspace that made it.
      const up = await a.upload(await packDir(brokenDir()));
      const stolen = await b.call('POST', '/v2/deployments', { name: 'thief', source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
      expect(stolen.status).toBe(422);
      expect(stolen.body.detail[0].loc).toEqual(['body', 'source_revision_config', 'source_tarball_path']);
    });
  });
}

crudSuite('SQLite', async () => '');
describe.skipIf(!pgAvailable())('on PostgreSQL', () => crudSuite('PostgreSQL', freshPgDatabase));

describe('control plane API details (SQLite)', () => {
  let server: RunningCli;
  let a: Api;
  let dataDir: string;
  beforeAll(async () => {
    dataDir = tmpDir();
    server = await startServe(dataDir);
    a = api(server.url, KEY);
  });
  afterAll(async () => {
    expect(await server.stop()).toBe(0);
  });

  it('uploads stream to the data directory with size and sha256', async () => {
    const tgz = await packDir(echoVariant());
    const up = await a.upload(tgz, 'application/octet-stream');
    expect(up.status).toBe(201);
    expect(up.body.source_tarball_path).toMatch(/^uploads\/[0-9a-f-]{36}\.tar\.gz$/);
    expect(up.body.size).toBe(tgz.length);
    expect(up.body.sha256).toBe(createHash('sha256').update(tgz).digest('hex'));
    expect(readFileSync(path.join(dataDir, up.body.source_tarball_path)).equals(tgz)).toBe(true);
  });

  it('refuses unsafe or invalid archives with a clear 422 and keeps nothing', async () => {
    const kj = { path: 'keygate.json', body: '{"assistants":{"a":"./a.js"}}' };
    const cases: [Buffer, string][] = [
      [rawTarGz([kj, { path: '/etc/cron.d/evil', body: 'x' }]), 'absolute path'],
      [rawTarGz([kj, { path: '../../evil', body: 'x' }]), '".."'],
      [rawTarGz([kj, { path: 'l', type: 'SymbolicLink', linkpath: '../../../etc/passwd' }]), 'outside the application directory'],
      [rawTarGz([kj, { path: 'h', type: 'Link', linkpath: '/etc/passwd' }]), 'hard link'],
      [rawTarGz([{ path: 'x.js', body: '1' }]), 'no keygate.json'],
      [Buffer.from('just text, not gzip'), 'not a gzip file'],
    ];
    for (const [body, msg] of cases) {
      const r = await a.upload(body);
      expect(r.status, msg).toBe(422);
      expect(r.body.detail[0].loc).toEqual(['body']);
      expect(r.body.detail[0].msg).toContain(msg);
    }
    const left = existsSync(path.join(dataDir, 'uploads')) ? (await import('node:fs')).readdirSync(path.join(dataDir, 'uploads')) : [];
    expect(left.length).toBeLessThanOrEqual(1); // only the good upload of the previous test
  });

  it('refuses oversize uploads with 413, declared or streamed', async () => {
    const big = Buffer.alloc(300_000, 1);
    const r = await a.upload(big);
    expect(r.status).toBe(413);
    expect(r.body.detail).toContain('200000 bytes');
    const chunked = await fetch(`${server.url}/v2/uploads`, {
      method: 'POST',
      headers: { 'x-api-key': KEY, 'content-type': 'application/gzip' },
      body: new ReadableStream({
        start(c) {
          for (let i = 0; i < 5; i++) c.enqueue(new Uint8Array(60_000));
          c.close();
        },
      }),
      duplex: 'half',
    } as RequestInit);
    expect(chunked.status).toBe(413);
    const wrongType = await fetch(`${server.url}/v2/uploads`, { method: 'POST', headers: { 'x-api-key': KEY, 'content-type': 'text/plain' }, body: 'x' });
    expect(wrongType.status).toBe(422);
    expect(((await wrongType.json()) as { detail: { msg: string }[] }).detail[0].msg).toContain('application/gzip');
    const noKey = await fetch(`${server.url}/v2/uploads`, { method: 'POST', headers: { 'content-type': 'application/gzip' }, body: 'x' });
    expect(noKey.status).toBe(401);
  });

  it('answers 422 with exact locs', async () => {
    const up = (await a.upload(await packDir(brokenDir()))).body.source_tarball_path;
    const base = { name: 'v-ok', source: 'internal_source', source_revision_config: { source_tarball_path: up } };
    const cases: [unknown, (string | number)[]][] = [
      [{ ...base, name: 'Bad_Name' }, ['body', 'name']],
      [{ ...base, name: 'x'.repeat(64) }, ['body', 'name']],
      [{ ...base, source: 'ftp' }, ['body', 'source']],
      [{ ...base, source_config: { deployment_type: 'staging' } }, ['body', 'source_config', 'deployment_type']],
      [{ name: 'v-ok', source: 'internal_source' }, ['body', 'source_revision_config']],
      [{ ...base, source_revision_config: {} }, ['body', 'source_revision_config', 'source_tarball_path']],
      [{ ...base, source_revision_config: { source_tarball_path: 'uploads/../../etc/passwd' } }, ['body', 'source_revision_config', 'source_tarball_path']],
      [{ ...base, secrets: [{ name: 'A', value: '1' }, { name: 'A', value: '2' }] }, ['body', 'secrets', 1, 'name']],
      [{ ...base, secrets: [{ name: 'KEYGATE_API_KEY', value: '1' }] }, ['body', 'secrets', 0, 'name']],
      [{ ...base, secrets: [{ name: '1BAD', value: '1' }] }, ['body', 'secrets', 0, 'name']],
      [{ ...base, extra: true }, ['body', 'extra']],
      [{ name: 'v-docker', source: 'external_docker', source_revision_config: { image_uri: 'nginx:latest' } }, ['body', 'source']],
      [{ name: 'v-docker', source: 'external_docker', source_revision_config: {} }, ['body', 'source_revision_config', 'image_uri']],
    ];
    for (const [body, loc] of cases) {
      const r = await a.call('POST', '/v2/deployments', body);
      expect(r.status, JSON.stringify(body)).toBe(422);
      expect(r.body.detail.map((d: { loc: unknown }) => d.loc), JSON.stringify(body)).toContainEqual(loc);
    }
    const docker = await a.call('POST', '/v2/deployments', cases[11][0]);
    expect(docker.body.detail[0].msg).toMatch(/no container engine answers/);

    const d = await createBroken(a, 'v-patch');
    for (const [body, loc] of [
      [{ name: 'renamed' }, ['body', 'name']],
      [{ source_config: { deployment_type: 'prod' } }, ['body', 'source_config', 'deployment_type']],
      [{ source: 'external_docker' }, ['body', 'source']],
    ] as [unknown, string[]][]) {
      const r = await a.call('PATCH', `/v2/deployments/${d.id}`, body);
      expect(r.status).toBe(422);
      expect(r.body.detail[0].loc).toEqual(loc);
    }
    expect((await a.call('PATCH', `/v2/deployments/${d.id}`, { name: 'v-patch' })).status).toBe(200);
    for (const q of ['limit=0', 'limit=101', 'limit=abc']) {
      const r = await a.call('GET', `/v2/deployments?${q}`);
      expect(r.status).toBe(422);
      expect(r.body.detail[0].loc).toEqual(['query', 'limit']);
    }
    const bad = await a.call('GET', `/v2/deployments/${d.id}/logs?since=yesterday`);
    expect(bad.status).toBe(422);
    expect(bad.body.detail[0].loc).toEqual(['query', 'since']);
  });

  it('answers 404 for unknown and malformed ids', async () => {
    const unknown = '00000000-0000-4000-8000-000000000000';
    expect(await a.call('GET', `/v2/deployments/${unknown}`)).toMatchObject({ status: 404, body: { detail: `Deployment ID ${unknown} not found.` } });
    expect(await a.call('GET', '/v2/deployments/not-a-uuid')).toMatchObject({ status: 404, body: { detail: 'Deployment ID not-a-uuid not found.' } });
    const d = await createBroken(a, 'nf');
    expect(await a.call('GET', `/v2/deployments/${d.id}/revisions/${unknown}`)).toMatchObject({ status: 404, body: { detail: `Revision ID ${unknown} not found.` } });
    expect((await a.call('PATCH', `/v2/deployments/${unknown}`, {})).status).toBe(404);
  });

  it('lists newest first with filters and pagination', async () => {
    const made = [];
    for (const [n, t] of [['page-a', 'dev'], ['page-b', 'prod'], ['page-c', 'dev'], ['other-d', 'dev']]) made.push(await createBroken(a, n, { source_config: { deployment_type: t } }));
    const all = await a.call('GET', '/v2/deployments?name_contains=page-&limit=100');
    expect(all.body.resources.map((d: { name: string }) => d.name)).toEqual(['page-c', 'page-b', 'page-a']);
    const p1 = await a.call('GET', '/v2/deployments?name_contains=page&limit=2&offset=0');
    const p2 = await a.call('GET', `/v2/deployments?name_contains=page&limit=2&offset=${p1.body.offset}`);
    expect(p1.body.offset).toBe(2);
    expect([...p1.body.resources, ...p2.body.resources].map((d: { name: string }) => d.name)).toEqual(['page-c', 'page-b', 'page-a']);
    expect(p2.body.offset).toBe(3);
    const prod = await a.call('GET', '/v2/deployments?deployment_type=prod&limit=100');
    expect(prod.body.resources.map((d: { name: string }) => d.name)).toEqual(['page-b']);
    expect((await a.call('GET', '/v2/deployments?status=READY&name_contains=other')).body.resources).toHaveLength(1);
    expect((await a.call('GET', '/v2/deployments?status=UNUSED')).body.resources).toHaveLength(0);
    expect((await a.call('GET', '/v2/deployments?name_contains=%25')).body.resources).toHaveLength(0);
  });

  it('ends a broken source in BUILD_FAILED with the reason in the build log, served by the logs API', async () => {
    const d = await createBroken(a, 'logs-broken');
    const rev = await waitRevision(a, d.id, d.latest_revision_id);
    expect(rev.status).toBe('BUILD_FAILED');
    expect(rev.status_message).toContain('keygate.json: invalid JSON');
    const logs = await a.call('GET', `/v2/deployments/${d.id}/logs?type=build`);
    expect(logs.status).toBe(200);
    expect(logs.body.logs.map((l: { message: string }) => l.message).join('\n')).toContain('keygate.json: invalid JSON');
    expect(logs.body.logs.every((l: { type: string; revision_id: string }) => l.type === 'build' && l.revision_id === d.latest_revision_id)).toBe(true);
    // Pagination by next_since: two lines at a time reach the same lines, without repeats.
    const seen: string[] = [];
    let since = '1970-01-01T00:00:00Z';
    for (let i = 0; i < 50; i++) {
      const page = await a.call('GET', `/v2/deployments/${d.id}/logs?type=build&limit=2&since=${encodeURIComponent(since)}`);
      if (page.body.logs.length === 0) break;
      seen.push(...page.body.logs.map((l: { timestamp: string }) => l.timestamp));
      since = page.body.next_since;
    }
    expect(seen).toEqual(logs.body.logs.map((l: { timestamp: string }) => l.timestamp));
    expect((await a.call('GET', `/v2/deployments/${d.id}/logs?type=deploy`)).body.logs).toEqual([]);
    expect((await a.call('GET', `/v2/deployments/${d.id}/logs?since=1m`)).body.logs.length).toBeGreaterThan(0);
    expect((await a.call('GET', `/v2/deployments/${d.id}/logs?limit=1001`)).status).toBe(422);
  });

  it('follows logs as server-sent events with the lines of a new revision', async () => {
    const d = await createBroken(a, 'logs-stream');
    await waitRevision(a, d.id, d.latest_revision_id);
    const ac = new AbortController();
    const res = await fetch(`${server.url}/v2/deployments/${d.id}/logs/stream?type=build&since=1970-01-01T00:00:00Z`, { headers: { 'x-api-key': KEY }, signal: ac.signal });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const reader = res.body!.getReader();
    let text = '';
    const readUntil = async (needle: string) => {
      const deadline = Date.now() + 20_000;
      while (!text.includes(needle) && Date.now() < deadline) {
        const { value, done } = await reader.read();
        if (done) break;
        text += Buffer.from(value).toString('utf8');
      }
      return text.includes(needle);
    };
    expect(await readUntil('keygate.json: invalid JSON')).toBe(true);
    expect(text).toMatch(/^event: log\ndata: \{/m);
    // A new revision's lines arrive live.
    const up = await a.upload(await packDir(brokenDir()));
    const p = await a.call('PATCH', `/v2/deployments/${d.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    expect(await readUntil(`build of revision ${p.body.latest_revision_id} started`)).toBe(true);
    ac.abort();
    const events = text.split('\n\n').filter((e) => e.startsWith('event: log'));
    const stamps = events.map((e) => JSON.parse(e.split('data: ')[1]).timestamp);
    expect([...stamps].sort()).toEqual(stamps);
    expect(new Set(stamps).size).toBe(stamps.length);
  });

  it('describes its routes in the OpenAPI document', async () => {
    const doc = (await a.call('GET', '/openapi.json')).body;
    for (const p of ['/v2/uploads', '/v2/deployments', '/v2/deployments/{deployment_id}', '/v2/deployments/{deployment_id}/revisions/{revision_id}', '/v2/deployments/{deployment_id}/logs']) {
      expect(doc.paths[p], p).toBeDefined();
    }
    expect(Object.keys(doc.paths['/v2/deployments/{deployment_id}']).sort()).toEqual(['delete', 'get', 'patch']);
  });

  it('never returns or stores a secret value in clear', async () => {
    const value = 'sv-' + 'z9'.repeat(12);
    const d = await createBroken(a, 'secret-store', { secrets: [{ name: 'API_TOKEN', value }] });
    await waitRevision(a, d.id, d.latest_revision_id);
    for (const p of [`/v2/deployments/${d.id}`, '/v2/deployments?limit=100', `/v2/deployments/${d.id}/revisions`, `/v2/deployments/${d.id}/logs?limit=1000`]) {
      expect((await a.call('GET', p)).text).not.toContain(value);
    }
    await new Promise((r) => setTimeout(r, 300));
    for (const f of ['keygate.db', 'keygate.db-wal']) {
      const file = path.join(dataDir, f);
      if (existsSync(file)) expect(readFileSync(file).includes(Buffer.from(value))).toBe(false);
    }
    expect(server.output()).not.toContain(value);
  });
});

void writeFileSync;
