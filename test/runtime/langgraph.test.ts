// The stateless LangGraph routes of the application server, in-process over real sockets, with
// plain fetch: exact shapes, filters, paging, validation, and /runs/wait's cancellation and
// heartbeats. The official SDK against a control-plane deployment: test/control-plane/langgraph-sdk.test.ts.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { loadApp, type LoadedApp } from '../../src/runtime/app.js';
import { startAppServer, type AppServerHandle } from '../../src/runtime/server.js';

const FIXTURE = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/app');
const quiet = createLogger({ level: 'silent' });
const KEY = 'test-key';

let app: LoadedApp;
let server: AppServerHandle;
let tmp: string;

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-langgraph-'));
  app = await loadApp(FIXTURE);
  server = await startAppServer({ app, host: '127.0.0.1', port: 0, apiKey: KEY, heartbeatMs: 150, abandonAfterMs: 300, logger: quiet });
});
afterAll(async () => {
  await server?.close(100);
  rmSync(tmp, { recursive: true, force: true });
});

async function post(p: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(new URL(p, server.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, body: text.trim() ? JSON.parse(text) : undefined };
}
const idOf = (name: string) => app.assistants.find((a) => a.name === name)!.id;
const lines = (file: string) => (existsSync(file) ? readFileSync(file, 'utf8').trim().split('\n').filter(Boolean) : []);
async function waitFor(cond: () => boolean, timeoutMs = 5000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('POST /assistants/search', () => {
  it('the SDK default query: every assistant (up to limit 10) as Assistant objects', async () => {
    const r = await post('/assistants/search', { limit: 10, offset: 0 });
    expect(r.status).toBe(200);
    expect(r.body).toHaveLength(7);
    expect(r.headers.get('x-pagination-next')).toBeNull();
    const echo = r.body.find((a: { name: string }) => a.name === 'echo');
    expect(echo).toMatchObject({ assistant_id: idOf('echo'), graph_id: 'echo', config: {}, metadata: { created_by: 'system' }, version: 1 });
    // Same created_at for all: default order falls back to assistant_id, descending.
    const ids = r.body.map((a: { assistant_id: string }) => a.assistant_id);
    expect(ids).toEqual([...ids].sort().reverse());
  });

  it('filters by graph_id (exact), name (case-insensitive substring) and metadata (exact)', async () => {
    expect((await post('/assistants/search', { graph_id: 'echo' })).body.map((a: { name: string }) => a.name)).toEqual(['echo']);
    expect((await post('/assistants/search', { graph_id: 'ech' })).body).toEqual([]);
    expect((await post('/assistants/search', { name: 'TURN', sort_by: 'name', sort_order: 'asc' })).body.map((a: { name: string }) => a.name)).toEqual(['returner']);
    expect((await post('/assistants/search', { metadata: { created_by: 'system' } })).body).toHaveLength(7);
    expect((await post('/assistants/search', { metadata: { created_by: 'someone' } })).body).toEqual([]);
  });

  it('sorts, pages with X-Pagination-Next, and selects fields', async () => {
    const all = ['counter', 'echo', 'envcheck', 'returner', 'silent', 'stubborn', 'thrower'];
    const p1 = await post('/assistants/search', { sort_by: 'name', sort_order: 'asc', limit: 3, offset: 0, select: ['name', 'assistant_id'] });
    expect(p1.body).toEqual(all.slice(0, 3).map((name) => ({ name, assistant_id: idOf(name) })));
    expect(p1.headers.get('x-pagination-next')).toBe('3');
    const p3 = await post('/assistants/search', { sort_by: 'name', sort_order: 'desc', limit: 3, offset: 6, select: ['name'] });
    expect(p3.body).toEqual([{ name: 'counter' }]);
    expect(p3.headers.get('x-pagination-next')).toBeNull();
  });

  it('an empty request is an empty query; bad fields are 422 with loc', async () => {
    const none = await fetch(new URL('/assistants/search', server.url), { method: 'POST', headers: { 'x-api-key': KEY, 'content-type': 'application/json' } });
    expect(none.status).toBe(200);
    expect(await none.json()).toHaveLength(7);
    const cases: [unknown, (string | number)[]][] = [
      [{ limit: 0 }, ['body', 'limit']],
      [{ sort_by: 'colour' }, ['body', 'sort_by']],
      [{ select: ['name', 'secret'] }, ['body', 'select', 1]],
      [{ graphId: 'echo' }, ['body', 'graphId']],
    ];
    for (const [body, loc] of cases) {
      const r = await post('/assistants/search', body);
      expect(r.status, JSON.stringify(body)).toBe(422);
      expect(r.body.detail[0].loc, JSON.stringify(body)).toEqual(loc);
    }
    expect((await post('/assistants/search', {}, { 'x-api-key': 'nope' })).status).toBe(401);
  });
});

describe('GET /assistants/{id}/graph', () => {
  it('start -> the assistant -> end, by name or id; 404 for an unknown one', async () => {
    const r = await fetch(new URL(`/assistants/${idOf('echo')}/graph`, server.url), { headers: { 'x-api-key': KEY } });
    expect(r.status).toBe(200);
    const g = (await r.json()) as { nodes: { id: string }[]; edges: unknown[] };
    expect(g.nodes.map((n: { id: string }) => n.id)).toEqual(['__start__', 'echo', '__end__']);
    expect(g.edges).toEqual([
      { source: '__start__', target: 'echo' },
      { source: 'echo', target: '__end__' },
    ]);
    const byName = await fetch(new URL('/assistants/echo/graph?xray=true', server.url), { headers: { 'x-api-key': KEY } });
    expect(await byName.json()).toEqual(g);
    expect((await fetch(new URL('/assistants/nobody/graph', server.url), { headers: { 'x-api-key': KEY } })).status).toBe(404);
  });
});

describe('POST /runs/wait', () => {
  it('answers the final state, with Content-Location naming the run', async () => {
    const r = await post('/runs/wait', { assistant_id: 'echo', input: { messages: [{ role: 'user', content: 'hi' }] } });
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toBe('application/json');
    expect(r.headers.get('content-location')).toMatch(/^\/runs\/[0-9a-f-]{36}$/);
    expect(r.body).toEqual({
      messages: [{ role: 'user', content: 'hi' }, expect.objectContaining({ content: 'a b c', type: 'ai', id: 'msg-1' })],
      phase: 'prepared',
    });
  });

  it('a failed run answers {"__error__": {error, message}} and no stack', async () => {
    const r = await post('/runs/wait', { assistant_id: 'thrower', input: {} });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ __error__: { error: 'QuotaError', message: 'quota exhausted for this run' } });
    expect(r.text).not.toMatch(/assistants\.js|\n\s+at /);
  });

  it('keeps a silent run alive with whitespace, then the JSON', async () => {
    const r = await post('/runs/wait', { assistant_id: 'silent', config: { configurable: { ms: 700 } } });
    expect(r.status).toBe(200);
    expect(r.text).toMatch(/^\n{2,}\{/);
    expect(r.body).toEqual({});
  });

  it('validation and unknown assistants are refused before the run starts', async () => {
    expect((await post('/runs/wait', { assistant_id: 'nobody' })).status).toBe(404);
    const r = await post('/runs/wait', { assistant_id: 'echo', thread_id: 'abc' });
    expect(r.status).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['body', 'thread_id']);
    expect((await post('/runs/wait', undefined)).body.detail[0]).toMatchObject({ loc: ['body'], type: 'missing' });
  });

  it('a client disconnect cancels the run', async () => {
    const file = path.join(tmp, 'wait-cancel.log');
    await new Promise<void>((resolve, reject) => {
      const req = http.request(new URL('/runs/wait', server.url), { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY }, agent: false }, (res) => {
        expect(res.statusCode).toBe(200);
        res.resume();
        // Leave once the assistant is producing.
        waitFor(() => lines(file).length >= 2).then(() => {
          req.destroy();
          resolve();
        }, reject);
      });
      req.on('error', () => undefined);
      req.end(JSON.stringify({ assistant_id: 'counter', config: { configurable: { marker: file, delay_ms: 50 } } }));
    });
    await waitFor(() => lines(file).includes('aborted CancelledError'));
    await waitFor(() => server.activeRuns() === 0);
    expect(lines(file)).not.toContain('finished');
  });
});
