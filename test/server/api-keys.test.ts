// /api/v1/api-key: a caller sees and deletes only their own keys; anyone else's key (another user
// of the workspace, another workspace) is answered like a key that does not exist; a deleted key
// stops working at once. In-process server, real HTTP client.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey } from '../../src/server/auth.js';
import { startInProcess, type InProcessServer } from './inprocess.js';

let s: InProcessServer;
beforeAll(async () => {
  s = await startInProcess();
});
afterAll(async () => {
  await s?.close();
});

async function call(key: string, method: string, p: string) {
  const res = await fetch(s.url + p, { method, headers: { 'x-api-key': key } });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined, text };
}

describe('API keys of the caller', () => {
  it('lists own keys by id and prefix only, never a key', async () => {
    const r = await call(s.key, 'GET', '/api/v1/api-key');
    expect(r.status).toBe(200);
    expect(r.body).toEqual([expect.objectContaining({ name: 'KEYGATE_API_KEY', key_prefix: s.key.slice(0, 6), current: true })]);
    expect(r.text).not.toContain(s.key);
    expect(r.text).not.toContain(s.keyB);
  });

  it("deletes own keys only: another user's or another workspace's key is a 404, and stays", async () => {
    const mine = await createApiKey(s.built.ctx.db, { workspace: 'default', user: 'admin', name: 'spare' });
    const colleague = await createApiKey(s.built.ctx.db, { workspace: 'default', user: 'carol' });
    const other = await createApiKey(s.built.ctx.db, { workspace: 'team-b', user: 'bob' });
    for (const k of [colleague, other]) {
      const r = await call(s.key, 'DELETE', `/api/v1/api-key/${k.id}`);
      expect(r.status).toBe(404);
      expect(r.body).toEqual({ detail: `API key ${k.id} not found.` });
      expect((await call(k.key, 'GET', '/api/v1/api-key')).status).toBe(200);
    }
    expect((await call(s.key, 'GET', '/api/v1/api-key')).body.map((k: { id: string }) => k.id)).toContain(mine.id);
    const del = await call(s.key, 'DELETE', `/api/v1/api-key/${mine.id}`);
    expect(del.status).toBe(204);
    expect(del.text).toBe('');
    expect(await call(mine.key, 'GET', '/api/v1/api-key')).toEqual({ status: 401, body: { detail: 'Invalid API key.' }, text: expect.any(String) });
    expect((await call(s.key, 'DELETE', `/api/v1/api-key/${mine.id}`)).status).toBe(404);
  });

  it('a malformed id is a 422 on its loc', async () => {
    const r = await call(s.key, 'DELETE', '/api/v1/api-key/not-a-uuid');
    expect(r.status).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['path', 'api_key_id']);
  });
});
