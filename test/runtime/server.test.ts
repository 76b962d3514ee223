// The application server in-process, over real sockets: event order per stream mode, streaming,
// cancellation, errors, validation, auth, heartbeats, shutdown.
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { makeRedactor } from '../../src/secrets/redact.js';
import { loadApp, type LoadedApp } from '../../src/runtime/app.js';
import { startAppServer, type AppServerHandle } from '../../src/runtime/server.js';
import { rawExchange } from '../helpers/connect.js';
import { getJson, names, streamRun, type ReceivedEvent } from './sse-client.js';

const FIXTURE = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/app');
const quiet = createLogger({ level: 'silent' });
const USER = { messages: [{ role: 'user', content: 'hi' }] };

let app: LoadedApp;
let server: AppServerHandle;
let tmp: string;
const extraServers: AppServerHandle[] = [];

function marker(name: string): string {
  return path.join(tmp, `${name}-${Math.random().toString(36).slice(2)}.log`);
}
function lines(file: string): string[] {
  return existsSync(file) ? readFileSync(file, 'utf8').trim().split('\n').filter(Boolean) : [];
}
async function waitFor(cond: () => boolean, timeoutMs = 5000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}
const data = (events: ReceivedEvent[], name: string) => events.filter((e) => e.event === name).map((e) => e.data);

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-runtime-'));
  process.env.FIXTURE_OVERRIDDEN = 'from the environment';
  app = await loadApp(FIXTURE);
  server = await startAppServer({ app, host: '127.0.0.1', port: 0, apiKey: 'test-key', heartbeatMs: 200, abandonAfterMs: 300, logger: quiet });
});

afterAll(async () => {
  await server?.close(100);
  for (const s of extraServers) await s.close(100);
  rmSync(tmp, { recursive: true, force: true });
});

describe('POST /runs/stream: event order per stream mode', () => {
  it('defaults to values, with the SSE headers and Content-Location naming the run', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER });
    expect(r.status).toBe(200);
    expect(r.headers['content-type']).toBe('text/event-stream');
    expect(r.headers['cache-control']).toBe('no-cache');
    expect(r.headers['x-accel-buffering']).toBe('no');
    expect(r.headers['content-encoding']).toBeUndefined();
    expect(names(r)).toEqual(['metadata', 'values', 'values', 'values', 'end']);
    const meta = r.events[0].data as { run_id: string; attempt: number };
    expect(meta).toEqual({ run_id: expect.stringMatching(/^[0-9a-f-]{36}$/), attempt: 1 });
    expect(r.headers['content-location']).toBe(`/runs/${meta.run_id}`);
    expect(r.events[1].data).toEqual(USER);
    expect(r.events[2].data).toEqual({ ...USER, phase: 'prepared' });
    const final = r.events[3].data as { messages: { content: string; type?: string; id?: string }[] };
    expect(final.messages).toHaveLength(2);
    expect(final.messages[1]).toMatchObject({ content: 'a b c', type: 'ai', id: 'msg-1' });
    expect(r.events[4].data).toBeNull();
    expect(r.body).toMatch(/^event: metadata\ndata: \{/);
  });

  it('updates: one event per step, keyed by node', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER, stream_mode: 'updates' });
    expect(names(r)).toEqual(['metadata', 'updates', 'updates', 'end']);
    expect(r.events[1].data).toEqual({ prepare: { phase: 'prepared' } });
    expect(r.events[2].data).toEqual({ agent: { messages: [expect.objectContaining({ content: 'a b c', type: 'ai' })] } });
  });

  it('messages: metadata, accumulated partials, complete', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER, stream_mode: ['messages'], metadata: { user: 'u1' } });
    expect(names(r)).toEqual(['metadata', 'messages/metadata', 'messages/partial', 'messages/partial', 'messages/partial', 'messages/complete', 'end']);
    const runId = (r.events[0].data as { run_id: string }).run_id;
    expect(r.events[1].data).toEqual({ 'msg-1': { metadata: expect.objectContaining({ langgraph_node: 'agent', run_id: runId, user: 'u1' }) } });
    expect(data(r.events, 'messages/partial').map((d) => (d as { content: string }[])[0].content)).toEqual(['a ', 'a b ', 'a b c']);
    expect((data(r.events, 'messages/partial')[0] as object[])[0]).toMatchObject({ type: 'AIMessageChunk', id: 'msg-1' });
    expect(data(r.events, 'messages/complete')[0]).toEqual([expect.objectContaining({ content: 'a b c', type: 'ai', id: 'msg-1' })]);
  });

  it('messages-tuple: event "messages" with [chunk, metadata] per token', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER, stream_mode: 'messages-tuple' });
    expect(names(r)).toEqual(['metadata', 'messages', 'messages', 'messages', 'end']);
    const tuples = data(r.events, 'messages') as [{ content: string; type: string; id: string }, { langgraph_node: string }][];
    expect(tuples.map(([chunk]) => chunk.content)).toEqual(['a ', 'b ', 'c']);
    for (const [chunk, meta] of tuples) {
      expect(chunk).toMatchObject({ type: 'AIMessageChunk', id: 'msg-1' });
      expect(meta).toMatchObject({ langgraph_node: 'agent' });
    }
  });

  it('custom: the data as given', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER, stream_mode: 'custom' });
    expect(names(r)).toEqual(['metadata', 'custom', 'end']);
    expect(r.events[1].data).toEqual({ note: 'custom data' });
  });

  it('two modes at once interleave in production order', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER, stream_mode: ['updates', 'messages-tuple'] });
    expect(names(r)).toEqual(['metadata', 'updates', 'messages', 'messages', 'messages', 'updates', 'end']);
  });

  it('every mode at once', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', input: USER, stream_mode: ['values', 'updates', 'messages', 'messages-tuple', 'custom'] });
    expect(names(r)).toEqual([
      'metadata', 'values',
      'updates', 'values',
      'messages/metadata',
      'messages/partial', 'messages', 'messages/partial', 'messages', 'messages/partial', 'messages',
      'custom', 'messages/complete',
      'updates', 'values',
      'end',
    ]);
  });

  it('a returned state is folded in and shown as the last values', async () => {
    const r = await streamRun(server.url, { assistant_id: 'returner', input: USER });
    expect(names(r)).toEqual(['metadata', 'values', 'values', 'end']);
    expect(r.events[2].data).toEqual({ answer: 42, messages: [USER.messages[0], { role: 'ai', content: 'got 1', id: 'r1' }] });
  });

  it('the assistant sees the env file, and variables already set win', async () => {
    const r = await streamRun(server.url, { assistant_id: 'envcheck', stream_mode: 'custom' });
    expect(r.events[1].data).toEqual({ greeting: 'hello from the env file', overridden: 'from the environment', api_key_visible: false });
  });
});

describe('streaming, cancellation, errors', () => {
  it('the first token arrives while the run is still producing', async () => {
    const file = marker('first');
    let linesAtFirstToken: string[] | undefined;
    const r = await streamRun(
      server.url,
      { assistant_id: 'counter', stream_mode: 'messages-tuple', config: { configurable: { marker: file, tokens: 5, delay_ms: 150 } } },
      {
        onEvent: (e) => {
          if (e.event === 'messages' && !linesAtFirstToken) linesAtFirstToken = lines(file);
        },
      },
    );
    expect(names(r)).toEqual(['metadata', 'messages', 'messages', 'messages', 'messages', 'messages', 'end']);
    // Causal proof: when the client had the first token, the assistant had produced only that one.
    expect(linesAtFirstToken).toEqual(['token 0']);
    // And by the clock: the first token came well before the end (4 pauses of 150 ms after it).
    const first = r.events[1].at;
    const end = r.events[r.events.length - 1].at;
    expect(end - first).toBeGreaterThanOrEqual(450);
    expect(first - r.started).toBeLessThan(end - r.started - 450);
  });

  it('a client disconnect cancels the run (on_disconnect: cancel, the default)', async () => {
    const file = marker('cancel');
    await streamRun(
      server.url,
      { assistant_id: 'counter', stream_mode: 'messages-tuple', config: { configurable: { marker: file, delay_ms: 50 } } },
      { onEvent: (e, all) => e.event === 'messages' && all.filter((x) => x.event === 'messages').length === 2 },
    );
    await waitFor(() => lines(file).includes('aborted CancelledError'));
    const produced = lines(file).filter((l) => l.startsWith('token')).length;
    await new Promise((r) => setTimeout(r, 400));
    // It stopped producing: at most the token in flight when the signal fired, nothing after.
    expect(lines(file).filter((l) => l.startsWith('token')).length).toBe(produced);
    expect(produced).toBeLessThan(10);
    expect(lines(file)).not.toContain('finished');
    await waitFor(() => server.activeRuns() === 0);
  });

  it('on_disconnect: continue lets the run finish after the client left', async () => {
    const file = marker('continue');
    await streamRun(
      server.url,
      { assistant_id: 'counter', on_disconnect: 'continue', stream_mode: 'messages-tuple', config: { configurable: { marker: file, tokens: 8, delay_ms: 30 } } },
      { onEvent: (e) => e.event === 'messages' },
    );
    await waitFor(() => lines(file).includes('finished'));
    expect(lines(file).filter((l) => l.startsWith('token'))).toHaveLength(8);
    expect(lines(file).some((l) => l.startsWith('aborted'))).toBe(false);
    await waitFor(() => server.activeRuns() === 0);
  });

  it('an assistant that ignores its signal is left behind after a bounded time', async () => {
    const file = marker('stubborn');
    await streamRun(server.url, { assistant_id: 'stubborn', stream_mode: 'custom', config: { configurable: { marker: file, tokens: 30 } } }, { onEvent: (e) => e.event === 'custom' });
    // abandonAfterMs is 300: the run is over for the server long before the assistant stops.
    await waitFor(() => server.activeRuns() === 0, 2000);
    expect(lines(file)).not.toContain('finished');
  });

  it('an assistant that throws produces error (name and message, no stack) then end', async () => {
    const r = await streamRun(server.url, { assistant_id: 'thrower', stream_mode: ['updates', 'values'] });
    expect(names(r)).toEqual(['metadata', 'values', 'updates', 'values', 'error', 'end']);
    expect(data(r.events, 'error')[0]).toEqual({ error: 'QuotaError', message: 'quota exhausted for this run' });
    expect(r.body).not.toMatch(/assistants\.js|at async|\n\s+at /);
  });

  it('removes the secret values it was given from error events, /runs/wait errors and its log lines, not from data events', async () => {
    // Quotes and a backslash: the JSON-escaped form is what appears on the wire.
    const secret = 'sek-"ret"\\-' + 'v3'.repeat(10);
    const redact = makeRedactor([secret]);
    const logged: string[] = [];
    const logger = createLogger({ redact, destination: { write: (l: string) => void logged.push(l) } });
    const s = await startAppServer({ app, host: '127.0.0.1', port: 0, apiKey: 'test-key', heartbeatMs: 200, logger, redact });
    extraServers.push(s);
    const long = 'x'.repeat(3990);
    const failed = await streamRun(s.url, { assistant_id: 'thrower', config: { configurable: { message: `${long}refused ${secret}` } } });
    const err = data(failed.events, 'error')[0] as { error: string; message: string };
    // Redacted before the message is cut to its limit: no prefix of the secret survives the cut.
    expect(err.message).toBe(`${long}refused [redacted]`.slice(0, 4000));
    expect(err.message).not.toContain('sek-');
    // Data events are the app's own output, left as they are: an app may show a value it was
    // given on purpose (the deploy tests' echo agent prefixes its replies with a secret).
    const echoed = await streamRun(s.url, { assistant_id: 'echo', stream_mode: ['values'], config: { configurable: { text: `key ${secret} end` } } });
    expect(JSON.stringify(data(echoed.events, 'values').at(-1))).toContain(JSON.stringify(secret).slice(1, -1));
    const waited = await fetch(`${s.url}/runs/wait`, { method: 'POST', headers: { 'x-api-key': 'test-key', 'content-type': 'application/json' }, body: JSON.stringify({ assistant_id: 'thrower', input: {}, config: { configurable: { message: `no ${secret}` } } }) });
    const waitBody = await waited.text();
    expect(JSON.parse(waitBody)).toEqual({ __error__: { error: 'QuotaError', message: 'no [redacted]' } });
    const logText = logged.join('');
    expect(logText).toContain('run failed');
    expect(logText).toContain('failing: no [redacted]');
    for (const seen of [failed.body, waitBody, logText]) {
      expect(seen).not.toContain('v3'.repeat(10));
      expect(seen).not.toContain('sek-');
    }
  });

  it('sends heartbeat comments while the run is silent', async () => {
    const r = await streamRun(server.url, { assistant_id: 'silent', stream_mode: 'custom', config: { configurable: { ms: 900 } } });
    expect(names(r)).toEqual(['metadata', 'custom', 'end']);
    const beats = r.comments.filter((c) => c.text.trim() === 'heartbeat');
    expect(beats.length).toBeGreaterThanOrEqual(2);
    expect(r.body).toContain('\n\n: heartbeat\n\n');
    // Never silent for much longer than the interval (200 ms in this server).
    const times = [r.events[0].at, ...beats.map((b) => b.at), r.events[1].at];
    for (let i = 1; i < times.length; i++) expect(times[i] - times[i - 1]).toBeLessThan(600);
  });

  it('never compresses, even when the client offers gzip', async () => {
    const r = await streamRun(server.url, { assistant_id: 'echo', stream_mode: 'custom' }, { headers: { 'accept-encoding': 'gzip, deflate, br' } });
    expect(r.headers['content-encoding']).toBeUndefined();
    expect(names(r)).toEqual(['metadata', 'custom', 'end']);
  });
});

describe('requests that are refused', () => {
  it('422 with exact loc on bad bodies', async () => {
    const cases: [unknown, (string | number)[], string][] = [
      [{}, ['body', 'assistant_id'], 'missing'],
      [{ assistant_id: 'echo', stream_mode: 'debug' }, ['body', 'stream_mode'], 'enum'],
      [{ assistant_id: 'echo', stream_mode: ['updates', 'nope'] }, ['body', 'stream_mode', 1], 'enum'],
      [{ assistant_id: 'echo', input: { messages: [{ role: 'user', content: 1 }] } }, ['body', 'input', 'messages', 0, 'content'], 'string_type'],
      [{ assistant_id: 'echo', on_disconnect: 'later' }, ['body', 'on_disconnect'], 'enum'],
      [{ assistant_id: 'echo', thread_id: 'abc' }, ['body', 'thread_id'], 'value_error'],
      [{ assistant_id: 'echo', streammode: 'values' }, ['body', 'streammode'], 'extra_forbidden'],
    ];
    for (const [body, loc, type] of cases) {
      const r = await streamRun(server.url, body);
      expect(r.status, JSON.stringify(body)).toBe(422);
      expect(r.headers['content-type']).toBe('application/json');
      const detail = JSON.parse(r.body).detail;
      expect(detail, JSON.stringify(body)).toEqual([{ loc, msg: expect.any(String), type }]);
    }
  });

  it('422 on invalid JSON and an empty body; 415 on a non-JSON content type', async () => {
    const bad = await streamRun(server.url, null, { rawBody: '{"assistant_id": ' });
    expect(bad.status).toBe(422);
    expect(JSON.parse(bad.body).detail[0]).toMatchObject({ loc: ['body'], type: 'json_invalid' });
    const empty = await streamRun(server.url, null, { rawBody: '' });
    expect(empty.status).toBe(422);
    expect(JSON.parse(empty.body).detail[0]).toMatchObject({ loc: ['body'], type: 'missing' });
    const form = await streamRun(server.url, null, { rawBody: 'a=b', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    expect(form.status).toBe(415);
    expect(JSON.parse(form.body)).toEqual({ detail: expect.any(String) });
  });

  it('a body-less POST is never parsed whatever its Content-Type: 422 missing, not 415', async () => {
    for (const type of ['application/json', 'text/plain']) {
      const res = await fetch(new URL('/runs/stream', server.url), { method: 'POST', headers: { 'x-api-key': 'test-key', 'content-type': type } });
      expect(res.status, type).toBe(422);
      expect(((await res.json()) as { detail: unknown[] }).detail[0], type).toMatchObject({ loc: ['body'], type: 'missing' });
    }
  });

  it("Node's parser refusals come out as JSON: 431 for huge headers, 414 for a huge URL, 400 for a malformed request", async () => {
    const send = (bytes: string) =>
      new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect(Number(new URL(server.url).port), '127.0.0.1', () => resolve(s));
        s.once('error', reject);
      }).then((s) => rawExchange(s, bytes));
    const headers = await send(`POST /runs/stream HTTP/1.1\r\nHost: t\r\nX-Api-Key: test-key\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(headers.status).toBe(431);
    expect(JSON.parse(headers.body)).toEqual({ detail: expect.any(String) });
    const url = await send(`GET /assistants/${'a'.repeat(20_000)} HTTP/1.1\r\nHost: t\r\n\r\n`);
    expect(url.status).toBe(414);
    expect(JSON.parse(url.body)).toEqual({ detail: expect.any(String) });
    const malformed = await send('GET /ok HTTP/1.1\r\nHost: t\r\nBad Header Line\r\n\r\n');
    expect(malformed.status).toBe(400);
    expect(malformed.headers['content-type']).toBe('application/json');
    expect(JSON.parse(malformed.body)).toEqual({ detail: 'Malformed HTTP request.' });
  });

  it('413 on a body over the limit', async () => {
    const small = await startAppServer({ app, host: '127.0.0.1', port: 0, maxBodyBytes: 1024, logger: quiet });
    extraServers.push(small);
    const r = await streamRun(small.url, { assistant_id: 'echo', input: { messages: [{ role: 'user', content: 'x'.repeat(5000) }] } });
    expect(r.status).toBe(413);
    expect(JSON.parse(r.body)).toEqual({ detail: 'Request body too large (limit 1024 bytes).' });
  });

  it('404 for an unknown assistant, by name and by id; an id works like the name', async () => {
    const byName = await streamRun(server.url, { assistant_id: 'nobody' });
    expect(byName.status).toBe(404);
    expect(JSON.parse(byName.body)).toEqual({ detail: "Assistant 'nobody' not found." });
    const byId = await streamRun(server.url, { assistant_id: '00000000-0000-5000-8000-000000000000' });
    expect(byId.status).toBe(404);
    expect(JSON.parse(byId.body).detail).toEqual(expect.any(String));

    const echo = app.assistants.find((a) => a.name === 'echo')!;
    const ok = await streamRun(server.url, { assistant_id: echo.id.toUpperCase(), stream_mode: 'custom' });
    expect(ok.status).toBe(200);
    expect(names(ok)).toEqual(['metadata', 'custom', 'end']);
  });

  it('401 without or with a wrong key; the header name is case-insensitive; /ok stays open', async () => {
    const none = await streamRun(server.url, { assistant_id: 'echo' }, { headers: { 'x-api-key': '' } });
    expect(none.status).toBe(401);
    expect(JSON.parse(none.body)).toEqual({ detail: expect.any(String) });
    const wrong = await streamRun(server.url, { assistant_id: 'echo' }, { headers: { 'x-api-key': 'test-keyX' } });
    expect(wrong.status).toBe(401);
    expect(wrong.body).not.toContain('test-key');

    // Raw request to control the header's spelling on the wire.
    const upper = await new Promise<number>((resolve, reject) => {
      const req = http.request(new URL('/assistants', server.url), { headers: { 'X-API-KEY': 'test-key' } }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      req.end();
    });
    expect(upper).toBe(200);

    expect((await getJson(server.url, '/assistants', {})).status).toBe(401);
    expect((await getJson(server.url, '/assistants', { 'X-Api-Key': 'wrong' })).status).toBe(401);
    expect(await getJson(server.url, '/ok', {})).toMatchObject({ status: 200, body: { ok: true } });
  });

  it('404 for unknown paths, 405 for a wrong method', async () => {
    expect(await getJson(server.url, '/threads')).toMatchObject({ status: 404, body: { detail: 'Not Found' } });
    const get = await getJson(server.url, '/runs/stream');
    expect(get.status).toBe(405);
    expect(get.headers.get('allow')).toBe('POST');
  });
});

describe('GET /assistants', () => {
  it('lists id, name and description', async () => {
    const r = await getJson(server.url, '/assistants');
    expect(r.status).toBe(200);
    expect(r.body.map((a: { name: string }) => a.name)).toEqual(['echo', 'counter', 'thrower', 'silent', 'stubborn', 'returner', 'envcheck']);
    const echo = app.assistants.find((a) => a.name === 'echo')!;
    // The production API's Assistant object, plus keygate's `id` and `app`.
    expect(r.body[0]).toEqual({
      assistant_id: echo.id,
      graph_id: 'echo',
      config: {},
      context: {},
      metadata: { created_by: 'system' },
      name: 'echo',
      description: 'echo for tests',
      created_at: statSync(path.join(FIXTURE, 'keygate.json')).mtime.toISOString(),
      updated_at: r.body[0].created_at,
      version: 1,
      id: echo.id,
      app: 'fixture',
    });
    expect(await getJson(server.url, `/assistants/${echo.id}`)).toMatchObject({ status: 200, body: { name: 'echo' } });
    expect(await getJson(server.url, '/assistants/echo')).toMatchObject({ status: 200, body: { id: echo.id } });
    expect((await getJson(server.url, '/assistants/nope')).status).toBe(404);
  });
});

describe('shutdown', () => {
  it('lets a running run finish within the grace period', async () => {
    const s = await startAppServer({ app, host: '127.0.0.1', port: 0, logger: quiet });
    const file = marker('graceful');
    const run = streamRun(s.url, { assistant_id: 'counter', stream_mode: 'custom', config: { configurable: { marker: file, tokens: 6, delay_ms: 50 } } });
    await waitFor(() => lines(file).length > 0);
    await s.close(5000);
    const r = await run;
    expect(names(r)).toEqual(['metadata', 'end']);
    expect(lines(file)).toContain('finished');
    expect((await fetch(`${s.url}/ok`).catch((e: Error) => e)) instanceof Error).toBe(true);
  });

  it('cancels what is still running when the grace period is over', async () => {
    const s = await startAppServer({ app, host: '127.0.0.1', port: 0, logger: quiet, abandonAfterMs: 300 });
    const file = marker('shutdown');
    const run = streamRun(s.url, { assistant_id: 'counter', stream_mode: 'custom', config: { configurable: { marker: file, delay_ms: 50 } } });
    await waitFor(() => lines(file).length > 0);
    const t0 = Date.now();
    await s.close(200);
    expect(Date.now() - t0).toBeLessThan(3000);
    const r = await run;
    expect(names(r)).toEqual(['metadata', 'error', 'end']);
    expect(r.events[1].data).toEqual({ error: 'CancelledError', message: 'The application is shutting down.' });
    expect(lines(file)).toContain('aborted CancelledError');
    expect(lines(file)).not.toContain('finished');
  });
});
