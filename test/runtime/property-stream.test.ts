/**
 * Property tests of the application runtime's `POST /runs/stream` (wire.md "Deployed application",
 * src/runtime/README.md), against a real `app serve` server over loopback sockets and a real test
 * application (fixtures/prop-app), read by a raw HTTP client with a strict SSE parser and by the
 * official SDK (`@langchain/langgraph-sdk`), both checked against a model written here:
 *
 * - a valid request (JSON written as text: deep and wide values, strings with CR, LF, CRLF, NUL,
 *   U+2028/2029, escapes JSON.stringify would not choose, `-0`, `1e-400`, duplicate keys, keys such
 *   as `__proto__`; assistant by name, by id, by upper-case id; stream_mode absent, null, a string,
 *   a list with duplicates; on_disconnect, config, metadata absent, null or objects) is answered 200,
 *   `Content-Type: text/event-stream`, `Content-Location: /runs/{run_id}`, and a stream whose every
 *   byte parses (UTF-8, one `data:` line of JSON per event, a blank line after each) into exactly
 *   the events the model computes from the request: `metadata` first, the modes' events in the
 *   assistant's order, `error` on failure, `end` last; the SDK's `runs.stream` reads the same;
 * - a refused request is the documented error shape (`422 {"detail": [{loc, msg, type}]}` with the
 *   loc of the mistake, 404/415 `{"detail": "..."}`), never a 5xx, and no refused value echoed;
 *   a body the API server would refuse as not Unicode text (a lone surrogate) is refused the same
 *   way, and so is a number no double holds (`1e400`: it would come back as `null`) and a body
 *   nested deeper than the runtime can write back (JSON_MAX_DEPTH);
 * - a client that leaves mid-stream cancels the run (`on_disconnect: cancel`, the default: the
 *   assistant's side effect stops), `continue` lets it finish; a client that stops reading is cut
 *   off once its queue is full, so the server does not buffer for it without bound.
 *
 * Explore: KEYGATE_FUZZ_SEED=random KEYGATE_FUZZ_RUNS=200 npx vitest run test/runtime/property-stream.test.ts
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@langchain/langgraph-sdk';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { loadApp, type LoadedApp } from '../../src/runtime/app.js';
import { executeRun } from '../../src/runtime/run.js';
import { startAppServer, type AppServerHandle } from '../../src/runtime/server.js';
import { JSON_MAX_DEPTH } from '../../src/validation/json.js';
import { propertyParams } from '../helpers/property.js';
import { A, astOf, canon, halfClosedRun, parseSseStrict, postRaw, stalledClient, toText, valueOf, type Ast, type RawAnswer, type SseEvent } from './property-stream-helpers.js';

const FIXTURE = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/prop-app');
const KEY = 'test-key';
const quiet = createLogger({ level: 'silent' });
const MODES = ['values', 'updates', 'messages', 'messages-tuple', 'custom'] as const;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

let app: LoadedApp;
let server: AppServerHandle;
let client: Client;
let tmp: string;
let mirrorId: string;
const extra: AppServerHandle[] = [];
/** A property's time limit: exploring (KEYGATE_FUZZ_RUNS) may take many more cases than the default. */
const PROPERTY_TIMEOUT = process.env.KEYGATE_FUZZ_RUNS ? 900_000 : 60_000;

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-prop-stream-'));
  app = await loadApp(FIXTURE);
  mirrorId = app.assistants.find((a) => a.name === 'mirror')!.id;
  server = await startAppServer({ app, host: '127.0.0.1', port: 0, apiKey: KEY, heartbeatMs: 30, abandonAfterMs: 300, logger: quiet });
  client = new Client({ apiUrl: server.url, apiKey: KEY, callerOptions: { maxRetries: 0 } });
});
afterAll(async () => {
  await server?.close(100);
  for (const s of extra) await s.close(100);
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

const post = (body: string | Buffer, headers: Record<string, string> = {}) => postRaw(server.url, '/runs/stream', body, { 'x-api-key': KEY, ...headers });
const text = (r: RawAnswer) => r.bytes.toString('utf8');

async function waitFor(cond: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`still waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
const lines = (file: string) => (existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean) : []);
let markers = 0;
const marker = (name: string) => path.join(tmp, `${name}-${++markers}.log`);

// ---------------------------------------------------------------------------------------------
// Model: the events the mirror assistant's run must produce, from the request's meaning
// ---------------------------------------------------------------------------------------------

type Json = unknown;
type Obj = Record<string, Json>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const own = (o: unknown, k: string): Json => (isObj(o) && Object.hasOwn(o, k) ? o[k] : undefined);
/** An object from entries, every key an own property (`__proto__` too), the last duplicate winning. */
const objOf = (entries: [string, Json][]): Obj => Object.fromEntries(entries);

/**
 * add_messages: a message whose string `id` is already there replaces it (the last one holding that
 * id, as the production reducer's id index has it), any other is appended.
 */
function mergeMessages(existing: Json, added: Json[]): Json[] {
  const out = Array.isArray(existing) ? [...existing] : [];
  for (const m of added) {
    const id = own(m, 'id');
    const at = typeof id === 'string' ? out.findLastIndex((x) => own(x, 'id') === id) : -1;
    if (at >= 0) out[at] = m;
    else out.push(m);
  }
  return out;
}
/** A state update: every key replaces, but a `messages` list is merged. */
function fold(state: Obj, update: Obj): Obj {
  const entries: [string, Json][] = Object.entries(state);
  for (const [k, v] of Object.entries(update)) {
    const value = k === 'messages' && Array.isArray(v) ? mergeMessages(state.messages, v) : v;
    const at = entries.findIndex(([key]) => key === k);
    if (at >= 0) entries[at] = [k, value];
    else entries.push([k, value]);
  }
  return objOf(entries);
}
function aiMessage(content: string, type: 'ai' | 'AIMessageChunk'): Obj {
  return {
    content,
    additional_kwargs: {},
    response_metadata: {},
    type,
    name: null,
    id: 'm1',
    example: false,
    tool_calls: [],
    invalid_tool_calls: [],
    usage_metadata: null,
    ...(type === 'AIMessageChunk' ? { tool_call_chunks: [] } : {}),
  };
}

/** The events a client reads from a mirror run of request `b` (a parsed body), run id `runId`. */
function model(b: Obj, runId: string): { event: string; data: Json }[] {
  const out: { event: string; data: Json }[] = [];
  const ev = (event: string, data: Json) => out.push({ event, data });
  const sm = own(b, 'stream_mode');
  const modes = new Set(sm === undefined || sm === null ? ['values'] : Array.isArray(sm) ? sm : [sm]);
  const input = (own(b, 'input') ?? {}) as Obj;
  const config = (own(b, 'config') ?? {}) as Obj;
  const metadata = (own(b, 'metadata') ?? {}) as Obj;
  const cfg = own(config, 'configurable');
  let state = objOf(Object.entries(input));
  const values = () => modes.has('values') && ev('values', state);

  ev('metadata', { run_id: runId, attempt: 1 });
  values();
  if (modes.has('updates')) ev('updates', { echo: { seen: input } });
  state = fold(state, { seen: input });
  values();
  const meta = objOf([...Object.entries(metadata), ['run_id', runId], ['assistant_id', mirrorId], ['graph_id', 'mirror'], ['langgraph_node', 'talk'], ['langgraph_step', 1]]);
  if (modes.has('messages')) ev('messages/metadata', { m1: { metadata: meta } });
  const chunks = own(cfg, 'chunks');
  let content = '';
  for (const c of Array.isArray(chunks) ? chunks : []) {
    if (typeof c !== 'string') {
      ev('error', { error: 'TypeError', message: 'message chunks must be strings' });
      ev('end', null);
      return out;
    }
    content += c;
    if (modes.has('messages')) ev('messages/partial', [aiMessage(content, 'AIMessageChunk')]);
    if (modes.has('messages-tuple')) ev('messages', [aiMessage(c, 'AIMessageChunk'), meta]);
  }
  if (modes.has('custom')) ev('custom', { config, metadata });
  const done = aiMessage(content, 'ai');
  if (modes.has('messages')) ev('messages/complete', [done]);
  if (modes.has('updates')) ev('updates', { talk: { messages: [done] } });
  state = fold(state, { messages: [done] });
  values();
  const result = own(cfg, 'result');
  if (isObj(result)) {
    state = fold(state, result);
    values();
  }
  ev('end', null);
  return out;
}

/** Checks one run's events against the model: names in order, each data equal by value. */
function expectModel(events: { event: string; data: unknown }[], body: Obj, label: string): string {
  expect(events.length, label).toBeGreaterThan(0);
  expect(events[0].event, label).toBe('metadata');
  const runId = (events[0].data as { run_id: string }).run_id;
  expect(runId, label).toMatch(UUID);
  const want = model(body, runId);
  expect(events.map((e) => e.event), label).toEqual(want.map((e) => e.event));
  for (let i = 0; i < want.length; i++) expect(canon(events[i].data), `${label}: event ${i} (${want[i].event})`).toBe(canon(want[i].data));
  return runId;
}

/** Status, headers and framing of a stream that must have succeeded; its strictly parsed events. */
function expectStream(r: RawAnswer, label: string): SseEvent[] {
  expect(r.status, `${label}: ${text(r).slice(0, 300)}`).toBe(200);
  expect(r.headers['content-type'], label).toBe('text/event-stream');
  expect(r.headers['content-encoding'], label).toBeUndefined();
  expect(r.complete, label).toBe(true);
  const { events, comments } = parseSseStrict(r.bytes);
  for (const c of comments) expect(c, label).toBe('heartbeat');
  const runId = (events[0]?.data as { run_id?: string } | undefined)?.run_id;
  expect(r.headers['content-location'], label).toBe(`/runs/${runId}`);
  return events;
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/** Characters that break naive framing or encoding, all well-formed UTF-16. */
const NASTY = ['\n', '\r', '\r\n', '\n\n', '\u0000', '\u2028', '\u2029', '\ufeff', '\u0085', '\u007f', '"', '\\', '/', '\t', 'é', '😀', '\ud83d\ude00', 'data: x', 'event: end', ': c', 'id: 9', '\\u0000', '{"a":1}'];
const str = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 10 }) },
  { weight: 3, arbitrary: fc.array(fc.oneof(fc.constantFrom(...NASTY), fc.string({ maxLength: 3 })), { maxLength: 6 }).map((a) => a.join('')) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 8 }) },
);
/** A long string (up to 200,000 characters), used once per request so bodies stay far below the limit. */
const longStr = fc.tuple(fc.integer({ min: 1000, max: 200_000 }), fc.constantFrom('x', 'ab\n', '\r\n', '€', '😀', '\u2028')).map(([n, s]) => A.str(s.repeat(Math.ceil(n / s.length))));
const strAst = fc.tuple(str, fc.array(fc.nat(), { maxLength: 3 })).map(([v, e]) => A.str(v, e));
const key = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 6 }) },
  { weight: 1, arbitrary: fc.constantFrom('__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf', '', '0', '10', 'seen', 'run_id', 'graph_id', 'a\nb', '\u2028', 'é') },
);
const NUMBERS = ['-0', '0.0', '-0.0', '1E+2', '1e2', '1e-400', '-1e-400', '5e-324', '1.7976931348623157e308', '-1.7976931348623157e308', '9007199254740991', '-9007199254740991', '0.1', '2.5E-3'];
const numAst = fc.oneof(
  fc.integer().map((n) => A.num(String(n))),
  fc.double({ noNaN: true, noDefaultInfinity: true }).map((d) => A.num(JSON.stringify(d))),
  fc.constantFrom(...NUMBERS).map(A.num),
);
const leaf = fc.oneof(fc.constant(A.null()), fc.boolean().map(A.bool), numAst, strAst);
const { value: jsonAst } = fc.letrec<{ value: Ast }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    { weight: 4, arbitrary: leaf },
    { weight: 1, arbitrary: fc.array(tie('value'), { maxLength: 4 }).map(A.arr) },
    { weight: 1, arbitrary: fc.array(fc.tuple(key, tie('value')), { maxLength: 4 }).map(A.obj) },
  ),
}));
/** Deep (up to 80 levels, arrays and objects mixed) or wide (up to 400 members) values too. */
const deepAst = fc.tuple(fc.integer({ min: 1, max: 80 }), fc.array(fc.boolean(), { minLength: 1, maxLength: 8 }), leaf).map(([n, kinds, inner]) => {
  let v = inner;
  for (let i = 0; i < n; i++) v = kinds[i % kinds.length] ? A.arr([v]) : A.obj([['k', v]]);
  return v;
});
const wideAst = fc.tuple(fc.integer({ min: 50, max: 400 }), fc.boolean(), leaf).map(([n, asObj, v]) => (asObj ? A.obj(Array.from({ length: n }, (_, i) => [`k${i}`, v] as [string, Ast])) : A.arr(Array.from({ length: n }, () => v))));
const anyAst = fc.oneof({ weight: 6, arbitrary: jsonAst }, { weight: 1, arbitrary: deepAst }, { weight: 1, arbitrary: wideAst });
const objAst = (keys: fc.Arbitrary<string>) => fc.array(fc.tuple(keys, anyAst), { maxLength: 5 }).map(A.obj);

const ROLES = ['human', 'user', 'ai', 'assistant', 'system'];
const message = fc
  .record({ role: fc.constantFrom(...ROLES), content: strAst, id: fc.option(fc.constantFrom('m1', 'x', 'm2'), { nil: undefined }), more: fc.array(fc.tuple(key.filter((k) => k !== 'role' && k !== 'content' && k !== 'id'), leaf), { maxLength: 2 }) })
  .map(({ role, content, id, more }) => A.obj([['role', A.str(role)], ['content', content], ...(id ? [['id', A.str(id)] as [string, Ast]] : []), ...more]));
const inputAst = fc.oneof(
  { weight: 1, arbitrary: fc.constant(A.null()) },
  {
    weight: 6,
    arbitrary: fc
      .tuple(fc.option(fc.array(message, { maxLength: 4 }), { nil: undefined }), fc.array(fc.tuple(key.filter((k) => k !== 'messages'), anyAst), { maxLength: 4 }), fc.option(longStr, { freq: 8, nil: undefined }))
      .map(([msgs, rest, long]) => A.obj([...(msgs ? [['messages', A.arr(msgs)] as [string, Ast]] : []), ...rest, ...(long ? [['long', long] as [string, Ast]] : [])])),
  },
);
const chunksAst = fc.array(strAst, { maxLength: 5 }).map(A.arr);
const configAst = fc.oneof(
  { weight: 1, arbitrary: fc.constant(A.null()) },
  {
    weight: 6,
    arbitrary: fc
      .tuple(
        fc.option(fc.tuple(fc.option(chunksAst, { nil: undefined }), fc.option(anyAst, { nil: undefined }), fc.array(fc.tuple(key.filter((k) => k !== 'chunks' && k !== 'result'), leaf), { maxLength: 2 })), { nil: undefined }),
        fc.array(fc.tuple(key.filter((k) => k !== 'configurable'), anyAst), { maxLength: 3 }),
      )
      .map(([c, rest]) =>
        A.obj([
          ...(c ? [['configurable', A.obj([...(c[0] ? [['chunks', c[0]] as [string, Ast]] : []), ...(c[1] ? [['result', c[1]] as [string, Ast]] : []), ...c[2]])] as [string, Ast]] : []),
          ...rest,
        ]),
      ),
  },
);
const modeAst = fc.oneof(
  fc.constantFrom(...MODES).map(A.str),
  fc.array(fc.constantFrom(...MODES), { minLength: 1, maxLength: 10 }).map((m) => A.arr(m.map((x) => A.str(x)))),
  fc.constant(A.null()),
);

/** A valid run request for `mirror`, as the entries of its body (each field present or not). */
const requestEntries = fc
  .record(
    {
      assistant_id: fc.constantFrom('name', 'id', 'ID'),
      input: inputAst,
      stream_mode: modeAst,
      config: configAst,
      metadata: fc.oneof(fc.constant(A.null()), objAst(key)),
      on_disconnect: fc.constantFrom('cancel', 'continue').map(A.str),
      thread_id: fc.constant(A.null()),
      stream_subgraphs: fc.boolean().map(A.bool),
      stream_resumable: fc.constant(A.bool(false)),
    },
    { requiredKeys: ['assistant_id'] },
  )
  .chain((r) =>
    fc.shuffledSubarray(Object.keys(r), { minLength: Object.keys(r).length }).map((order) =>
      order.map((k): [string, Ast] => {
        if (k !== 'assistant_id') return [k, (r as unknown as Record<string, Ast>)[k]];
        const how = r.assistant_id;
        return [k, A.str(how === 'name' ? 'mirror' : how === 'id' ? mirrorId : mirrorId.toUpperCase())];
      }),
    ),
  );
const WS: fc.Arbitrary<string[]> = fc.oneof(fc.constant<string[]>(['']), fc.array(fc.constantFrom('', ' ', '\n', '\r\n', '\t', '  '), { minLength: 1, maxLength: 4 }));

// ---------------------------------------------------------------------------------------------
// Valid requests: the stream is exactly the model's
// ---------------------------------------------------------------------------------------------

describe('POST /runs/stream: what a client reads is what the request means', () => {
  it('raw HTTP and a strict SSE parser read exactly the model\'s events', async () => {
    await fc.assert(
      fc.asyncProperty(requestEntries, WS, async (entries, ws) => {
        const ast = A.obj(entries);
        const body = valueOf(ast) as Obj;
        const r = await post(toText(ast, ws));
        const events = expectStream(r, 'raw');
        expectModel(events, body, 'raw');
      }),
      propertyParams(30),
    );
  }, PROPERTY_TIMEOUT);

  it('the official SDK reads the same events, and gets the run id from Content-Location', async () => {
    await fc.assert(
      fc.asyncProperty(requestEntries, async (entries) => {
        const body = valueOf(A.obj(entries)) as Obj;
        let created: { run_id: string } | undefined;
        const got: { event: string; data: unknown }[] = [];
        const stream = client.runs.stream(null, body.assistant_id as string, {
          input: body.input as Obj,
          config: (body.config ?? undefined) as Obj | undefined,
          metadata: (body.metadata ?? undefined) as Obj | undefined,
          streamMode: (body.stream_mode ?? undefined) as never,
          onDisconnect: body.on_disconnect as 'cancel' | 'continue' | undefined,
          streamSubgraphs: body.stream_subgraphs as boolean | undefined,
          onRunCreated: (m) => (created = m),
        });
        for await (const e of stream) got.push({ event: e.event, data: e.data });
        // The SDK sends what JSON.stringify makes of the request: absent and null mean the same.
        const sent = JSON.parse(JSON.stringify({ ...body, config: body.config ?? undefined, metadata: body.metadata ?? undefined })) as Obj;
        const runId = expectModel(got, sent, 'sdk');
        expect(created?.run_id).toBe(runId);
      }),
      propertyParams(15),
    );
  }, PROPERTY_TIMEOUT);

  it('POST /runs/wait (raw and the SDK\'s runs.wait) answers the final state of the same run, or its __error__', async () => {
    await fc.assert(
      fc.asyncProperty(requestEntries, async (entries) => {
        const body = valueOf(A.obj(entries)) as Obj;
        const want = model({ ...body, stream_mode: ['values'] }, 'r');
        const failed = want.find((e) => e.event === 'error');
        const final = failed ? { __error__: failed.data } : want.filter((e) => e.event === 'values').at(-1)!.data;
        const r = await postRaw(server.url, '/runs/wait', toText(A.obj(entries)), { 'x-api-key': KEY });
        expect(r.status).toBe(200);
        expect(r.headers['content-type']).toBe('application/json');
        expect(r.headers['content-location']).toMatch(/^\/runs\/[0-9a-f-]{36}$/);
        expect(canon(JSON.parse(text(r)))).toBe(canon(final));
        const sent = JSON.parse(JSON.stringify({ ...body, config: body.config ?? undefined, metadata: body.metadata ?? undefined })) as Obj;
        const sdk = client.runs.wait(null, body.assistant_id as string, { input: body.input as Obj, config: sent.config as Obj | undefined, metadata: sent.metadata as Obj | undefined, onDisconnect: body.on_disconnect as 'cancel' | undefined });
        if (failed) await expect(sdk).rejects.toThrow('TypeError: message chunks must be strings');
        else expect(canon(await sdk)).toBe(canon(final));
      }),
      propertyParams(15),
    );
  }, PROPERTY_TIMEOUT);

  it('a chunk that is not a string fails the run: error (name and message) then end, nothing after', async () => {
    const ast = A.obj([['assistant_id', A.str('mirror')], ['stream_mode', A.arr(MODES.map((m) => A.str(m)))], ['config', A.obj([['configurable', A.obj([['chunks', A.arr([A.str('a\n'), A.num('1'), A.str('b')])]])]])]]);
    const events = expectStream(await post(toText(ast)), 'chunk');
    expectModel(events, valueOf(ast) as Obj, 'chunk');
    expect(events.at(-2)).toEqual({ event: 'error', data: { error: 'TypeError', message: 'message chunks must be strings' } });
  });

  it('a state key named __proto__ (updated, returned) is a key of the state like any other', async () => {
    // Found by the property: assignment made `__proto__` the state's prototype, so the key vanished
    // from the values events while the updates event showed it.
    const ast = A.obj([
      ['assistant_id', A.str('mirror')],
      ['stream_mode', A.arr([A.str('values'), A.str('updates')])],
      ['input', A.obj([['x', A.obj([['__proto__', A.obj([['polluted', A.bool(true)]])]])]])],
      ['config', A.obj([['configurable', A.obj([['result', A.obj([['__proto__', A.obj([['b', A.num('2')]])], ['toString', A.num('1')]])]])]])],
    ]);
    const events = expectStream(await post(toText(ast)), 'proto');
    expectModel(events, valueOf(ast) as Obj, 'proto');
    const last = events.filter((e) => e.event === 'values').at(-1)!.data as Obj;
    expect(Object.hasOwn(last, '__proto__')).toBe(true);
    expect(canon(last['__proto__'])).toBe('{"b":2}');
    expect(last.toString).toBe(1);
  });

  it('-0, 1e-400 and escapes JSON.stringify would not choose come back by value', async () => {
    const ast = A.obj([
      ['assistant_id', A.str('mirror')],
      ['input', A.obj([['n', A.arr(['-0', '-0.0', '1e-400', '1E+2', '5e-324'].map(A.num))], ['s', A.str('a/b\u2028c\u0000d', [0, 1, 2, 3])]])],
    ]);
    const events = expectStream(await post(toText(ast, [' ', '\r\n', '\t'])), 'numbers');
    expectModel(events, valueOf(ast) as Obj, 'numbers');
    expect(events[1].data).toEqual({ n: [0, 0, 0, 100, 5e-324], s: 'a/b\u2028c\u0000d' });
  });
});

// ---------------------------------------------------------------------------------------------
// Refused requests
// ---------------------------------------------------------------------------------------------

/** A refused value carries this, so an answer that echoes it is caught. */
const ECHO = 'R3FUS3D';
interface Refusal {
  body: string | Buffer;
  status: number;
  /** For a 422: the issue that must be in `detail`. */
  issue?: { loc: (string | number)[]; type: string };
  /** detail must be exactly this one issue. */
  only?: boolean;
  headers?: Record<string, string>;
}

/** Places of a body where a value sits: path and node, skipping entries a later duplicate key hides. */
function places(a: Ast, at: (string | number)[] = []): { loc: (string | number)[]; node: Ast; key?: string }[] {
  const out: { loc: (string | number)[]; node: Ast; key?: string }[] = [{ loc: at, node: a }];
  if (a.t === 'arr') a.items.forEach((x, i) => out.push(...places(x, [...at, i])));
  if (a.t === 'obj') {
    a.entries.forEach(([k, x], i) => {
      if (a.entries.some(([k2], j) => j > i && k2 === k)) return;
      out.push({ loc: [...at, k], node: x, key: k }, ...places(x, [...at, k]).slice(1));
    });
  }
  return out;
}
/** The tree with the node at `loc` replaced by `f(node)`. */
function replaceAt(a: Ast, loc: (string | number)[], f: (n: Ast) => Ast): Ast {
  if (loc.length === 0) return f(a);
  const [head, ...rest] = loc;
  if (a.t === 'arr') return A.arr(a.items.map((x, i) => (i === head ? replaceAt(x, rest, f) : x)));
  if (a.t === 'obj') {
    const last = a.entries.map(([k]) => k).lastIndexOf(head as string);
    return A.obj(a.entries.map(([k, x], i) => (i === last ? [k, replaceAt(x, rest, f)] : [k, x])));
  }
  throw new Error('no such place');
}
function renameKeyAt(a: Ast, loc: (string | number)[], name: string): Ast {
  const parent = loc.slice(0, -1);
  const k = loc.at(-1) as string;
  return replaceAt(a, parent, (p) => {
    if (p.t !== 'obj') throw new Error('not an object');
    const last = p.entries.map(([x]) => x).lastIndexOf(k);
    return A.obj(p.entries.map(([x, v], i) => (i === last ? [name, v] : [x, v])));
  });
}

const LONE = fc.constantFrom('\ud800', '\udbff', '\udc00', '\udfff', '\ud83d');
const badValue = fc.oneof(fc.integer().map((n) => A.num(String(n))), fc.boolean().map(A.bool), fc.constant(A.arr([A.str(ECHO)])), fc.constant(A.obj([['x', A.str(ECHO)]])));
const KNOWN = new Set(['assistant_id', 'input', 'stream_mode', 'on_disconnect', 'config', 'metadata', 'thread_id', 'stream_subgraphs', 'stream_resumable']);

/** A generator of one value, computed only when it is picked. */
const lazy = <T>(f: () => T): fc.Arbitrary<T> => fc.constant(null).map(f);

/** A valid request made invalid in one way, with the refusal it must get. */
const refusal: fc.Arbitrary<Refusal> = fc.tuple(requestEntries, fc.nat(), fc.nat()).chain(([entries, pick, pick2]) => {
  const ast = A.obj(entries.map(([k, v]) => [k, v]));
  const set = (k: string, v: Ast | undefined): string => toText(A.obj([...entries.filter(([x]) => x !== k), ...(v ? [[k, v] as [string, Ast]] : [])]));
  const r422 = (body: string, loc: (string | number)[], type: string, only = false): Refusal => ({ body, status: 422, issue: { loc: ['body', ...loc], type }, only });
  const all = places(ast);
  const strings = all.filter((p) => p.node.t === 'str');
  const keyed = all.filter((p) => p.key !== undefined);
  return fc.oneof(
    // assistant_id: missing, not a string, empty, too long, unknown (404, by name and by id)
    lazy(() => r422(set('assistant_id', undefined), ['assistant_id'], 'missing', true)),
    badValue.map((v) => r422(set('assistant_id', v), ['assistant_id'], 'string_type', true)),
    lazy(() => r422(set('assistant_id', A.str('')), ['assistant_id'], 'string_too_short', true)),
    lazy(() => r422(set('assistant_id', A.str(ECHO.repeat(40))), ['assistant_id'], 'string_too_long', true)),
    fc.constantFrom('nobody', 'Mirror', '00000000-0000-5000-8000-000000000000', 'mirror\n', ' mirror').map((id): Refusal => ({ body: set('assistant_id', A.str(id)), status: 404 })),
    // stream_mode: an unknown mode alone or in a list, an empty list, too many, not a string or list
    fc.constantFrom('debug', 'events', 'tasks', 'checkpoints', `${ECHO}x`, 'Values', '').map((m) => r422(set('stream_mode', A.str(m)), ['stream_mode'], 'enum', true)),
    fc.tuple(fc.array(fc.constantFrom(...MODES), { maxLength: 5 }), fc.nat()).map(([ok, at]) => {
      const i = at % (ok.length + 1);
      const list = [...ok.slice(0, i).map((x) => A.str(x)), A.str(`${ECHO}y`), ...ok.slice(i).map((x) => A.str(x))];
      return r422(set('stream_mode', A.arr(list)), ['stream_mode', i], 'enum', true);
    }),
    lazy(() => r422(set('stream_mode', A.arr([])), ['stream_mode'], 'too_short', true)),
    lazy(() => r422(set('stream_mode', A.arr(Array.from({ length: 11 }, () => A.str('values')))), ['stream_mode'], 'too_long', true)),
    fc.constantFrom(A.num('1'), A.bool(true), A.obj([])).map((v) => r422(set('stream_mode', v), ['stream_mode'], 'string_type')),
    // on_disconnect: anything but cancel or continue
    fc.constantFrom('cancel ', 'Cancel', 'later', `${ECHO}z`, '').map((v) => r422(set('on_disconnect', A.str(v)), ['on_disconnect'], 'enum', true)),
    // input, config, metadata that are not objects; messages that are not messages
    fc.tuple(fc.constantFrom('input', 'config', 'metadata'), badValue.filter((v) => v.t !== 'obj')).map(([k, v]) => r422(set(k, v), [k], 'dict_type', true)),
    lazy(() => r422(set('input', A.obj([['messages', A.str(ECHO)]])), ['input', 'messages'], 'list_type', true)),
    lazy(() => r422(set('input', A.obj([['messages', A.arr([A.obj([['content', A.str('x')]])])]])), ['input', 'messages', 0, 'role'], 'missing', true)),
    lazy(() => r422(set('input', A.obj([['messages', A.arr([A.obj([['role', A.str(`${ECHO}r`)], ['content', A.str('x')]])])]])), ['input', 'messages', 0, 'role'], 'enum', true)),
    lazy(() => r422(set('input', A.obj([['messages', A.arr([A.obj([['role', A.str('user')], ['content', A.arr([])]])])]])), ['input', 'messages', 0, 'content'], 'string_type', true)),
    // fields this runtime does not take (named, never ignored), threads, resumable streams
    fc.tuple(fc.oneof(key, fc.constantFrom('command', 'checkpoint', 'checkpoint_id', 'webhook', 'multitask_strategy', 'interrupt_before', 'context', 'streamMode', 'feedback_keys')).filter((k) => !KNOWN.has(k)), leaf).map(([k, v]) => r422(set(k, v), [k], 'extra_forbidden', true)),
    fc.constantFrom(A.str(ECHO), A.num('1'), A.obj([])).map((v) => r422(set('thread_id', v), ['thread_id'], 'value_error')),
    lazy(() => r422(set('stream_resumable', A.bool(true)), ['stream_resumable'], 'value_error', true)),
    lazy(() => r422(set('stream_subgraphs', A.str(ECHO)), ['stream_subgraphs'], 'bool_type', true)),
    // a body that is not an object
    fc.constantFrom('[]', '"mirror"', '1', 'null', 'true', `["${ECHO}"]`).map((b) => r422(b, [], 'dict_type', true)),
    // not Unicode text: a lone surrogate in any string or key (as the API server refuses it)
    ...(strings.length
      ? [
          fc.tuple(LONE, fc.nat()).map(([s, at]) => {
            const p = strings[pick % strings.length];
            const v = (p.node as { v: string }).v;
            const i = at % (v.length + 1);
            return r422(toText(replaceAt(ast, p.loc, () => A.str(`${ECHO}${v.slice(0, i)}${s}${v.slice(i)}`))), p.loc, 'string_unicode', true);
          }),
        ]
      : []),
    ...(keyed.length
      ? [
          LONE.map((s) => {
            const p = keyed[pick2 % keyed.length];
            const name = `${p.key}${s}`;
            return r422(toText(renameKeyAt(ast, p.loc, name)), [...p.loc.slice(0, -1), name], 'string_unicode', true);
          }),
        ]
      : []),
    // a number no double holds: it would come back as null
    fc.constantFrom('1e400', '-1e400', '1.8e308', '-2E+308', '123e456').map((n) => {
      const p = all[1 + (pick % (all.length - 1))];
      return r422(toText(replaceAt(ast, p.loc, () => A.num(n))), p.loc, 'finite_number', true);
    }),
    // nested deeper than the runtime writes back
    fc.integer({ min: 1, max: 50 }).map((extraDepth) => {
      let v: Ast = A.str(ECHO);
      for (let i = 0; i < JSON_MAX_DEPTH + extraDepth; i++) v = i % 3 ? A.arr([v]) : A.obj([['d', v]]);
      return r422(set('input', A.obj([['deep', v]])), [], 'json_invalid', true);
    }),
  );
});

/** Bytes that are not a JSON document, or not UTF-8, or not JSON by their type. */
const brokenBody: fc.Arbitrary<Refusal> = fc.tuple(requestEntries, fc.nat(), fc.nat()).chain(([entries, cut, at]) => {
  const good = toText(A.obj([...entries, ['metadata', A.obj([['note', A.str(ECHO)]])]]));
  const bytes = Buffer.from(good);
  const i = at % bytes.length;
  const bad = (b: Buffer | string): Refusal => ({ body: b, status: 422, issue: { loc: ['body'], type: 'json_invalid' }, only: true });
  return fc.oneof(
    fc.constant(bad(good.slice(0, 1 + (cut % (good.length - 1))))),
    fc.constantFrom([0xff], [0xc3, 0x28], [0xed, 0xa0, 0x80], [0xe2, 0x82], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc0, 0xaf]).map((ins) => bad(Buffer.concat([bytes.subarray(0, i), Buffer.from(ins), bytes.subarray(i)]))),
    fc.constantFrom('}', ',', 'x', '\u0000', '"', 'NaN', 'Infinity', "'").map((s) => bad(`${good.slice(0, i)}${s}${good.slice(i)}`)).filter((r) => {
      try {
        JSON.parse(r.body as string);
        return false;
      } catch {
        return true;
      }
    }),
    fc.constant(bad(`${good}${good}`)),
    fc.constant(bad(`${good} x`)),
    fc.constantFrom('text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/jsonx').map((t): Refusal => ({ body: good, status: 415, headers: { 'content-type': t } })),
  );
});

function expectRefusal(r: RawAnswer, want: Refusal, label: string): void {
  const body = text(r);
  expect(r.status, `${label}: ${body.slice(0, 500)}`).toBe(want.status);
  expect(r.headers['content-type'], label).toBe('application/json');
  expect(body, label).not.toContain(ECHO);
  const parsed = JSON.parse(body) as { detail: unknown };
  if (want.status !== 422) {
    expect(parsed, label).toEqual({ detail: expect.any(String) });
    return;
  }
  const detail = parsed.detail as { loc: unknown[]; msg: string; type: string }[];
  expect(Array.isArray(detail) && detail.length > 0, label).toBe(true);
  for (const d of detail) {
    expect(Object.keys(d).sort(), label).toEqual(['loc', 'msg', 'type']);
    expect(d.loc[0], label).toBe('body');
    for (const l of d.loc) expect(typeof l === 'string' || typeof l === 'number', label).toBe(true);
    expect(typeof d.msg === 'string' && d.msg.length > 0 && typeof d.type === 'string', label).toBe(true);
  }
  if (want.only) expect(detail.map((d) => ({ loc: d.loc, type: d.type })), label).toEqual([want.issue]);
  else expect(detail.map((d) => ({ loc: d.loc, type: d.type })), label).toContainEqual(want.issue);
}

describe('POST /runs/stream: refusals', () => {
  it('a request wrong in one way gets the documented error naming it, never a 5xx or an echo', async () => {
    await fc.assert(
      fc.asyncProperty(refusal, async (want) => {
        const r = await post(want.body, want.headers);
        expectRefusal(r, want, `${String(want.body).slice(0, 300)}`);
      }),
      propertyParams(80),
    );
  }, PROPERTY_TIMEOUT);

  it('bytes that are not one JSON document in UTF-8 are 422 json_invalid, a body of another type 415', async () => {
    await fc.assert(
      fc.asyncProperty(brokenBody, async (want) => {
        const r = await post(want.body, want.headers);
        expectRefusal(r, want, `${String(want.body).slice(0, 300)}`);
      }),
      propertyParams(40),
    );
  }, PROPERTY_TIMEOUT);

  it('a lone surrogate is refused wherever it is (422 string_unicode at its loc), as the API server refuses it', async () => {
    // Found by the property: the runtime took `"\ud800"` and streamed it back, while the API
    // server, and the production server's JSON parser, refuse a string that is not Unicode text.
    const body = `{"assistant_id":"mirror","input":{"a":["ok","${ECHO}\\ud800"],"\\udc00k":1},"metadata":{"m":"\\udbff"}}`;
    const r = await post(body);
    expect(r.status).toBe(422);
    expect(text(r)).not.toContain(ECHO);
    expect(JSON.parse(text(r)).detail).toEqual([
      { loc: ['body', 'input', 'a', 1], msg: expect.any(String), type: 'string_unicode' },
      { loc: ['body', 'input', '\udc00k'], msg: expect.any(String), type: 'string_unicode' },
      { loc: ['body', 'metadata', 'm'], msg: expect.any(String), type: 'string_unicode' },
    ]);
    // A well-formed pair, escaped or not, is text.
    const ok = expectStream(await post('{"assistant_id":"mirror","input":{"a":"\\ud83d\\ude00😀"}}'), 'pair');
    expect(ok[1].data).toEqual({ a: '😀😀' });
  });

  it('a number too large for a double (1e400) is refused (422 finite_number), not streamed back as null', async () => {
    // Found by the property: JSON.parse made it Infinity and every event showed `null`.
    const r = await post(`{"assistant_id":"mirror","input":{"n":[1,1e400]},"config":{"x":-1e400}}`);
    expect(r.status).toBe(422);
    expect(JSON.parse(text(r)).detail).toEqual([
      { loc: ['body', 'input', 'n', 1], msg: expect.any(String), type: 'finite_number' },
      { loc: ['body', 'config', 'x'], msg: expect.any(String), type: 'finite_number' },
    ]);
  });

  it(`a body nested deeper than ${JSON_MAX_DEPTH} levels is a 422, not a 200 stream that dies without an event`, async () => {
    // Found by the property: JSON.parse took 6,000 levels, JSON.stringify of the first values
    // event overflowed the stack, and the client got a 200 and a cut connection, no event at all.
    const nest = (n: number) => `${'['.repeat(n)}1${']'.repeat(n)}`;
    const deep = await post(`{"assistant_id":"mirror","input":{"a":${nest(6000)}}}`);
    expect(deep.status).toBe(422);
    expect(JSON.parse(text(deep)).detail).toEqual([{ loc: ['body'], msg: expect.stringContaining(String(JSON_MAX_DEPTH)), type: 'json_invalid' }]);
    // The limit is exact: body (1), input (2), a (3...).
    const over = await post(`{"assistant_id":"mirror","input":{"a":${nest(JSON_MAX_DEPTH - 1)}}}`);
    expect(over.status).toBe(422);
    const atLimit = `{"assistant_id":"mirror","stream_mode":["values","updates","custom"],"input":{"a":${nest(JSON_MAX_DEPTH - 2)}},"metadata":{"b":${nest(JSON_MAX_DEPTH - 2)}}}`;
    const events = expectStream(await post(atLimit), 'at the limit');
    expectModel(events, JSON.parse(atLimit) as Obj, 'at the limit');
  });

  it('POST /assistants/search: the same body checks (deep, lone surrogate, 1e400) and a metadata filter on __proto__ matches nothing', async () => {
    // Siblings: a deep metadata filter overflowed JSON.stringify (500), and `metadata.__proto__`
    // compared against Object.prototype (`{}`), so `{"__proto__": {}}` matched every assistant.
    const search = (body: string) => postRaw(server.url, '/assistants/search', body, { 'x-api-key': KEY });
    const deep = await search(`{"metadata":{"k":${'['.repeat(6000)}${']'.repeat(6000)}}}`);
    expect(deep.status).toBe(422);
    const lone = await search('{"name":"\\ud800"}');
    expect(lone.status).toBe(422);
    expect(JSON.parse(text(lone)).detail).toEqual([{ loc: ['body', 'name'], msg: expect.any(String), type: 'string_unicode' }]);
    const big = await search('{"offset":1e400}');
    expect(big.status).toBe(422);
    const proto = await search('{"metadata":{"__proto__":{}}}');
    expect(proto.status).toBe(200);
    expect(JSON.parse(text(proto))).toEqual([]);
    const real = await search('{"metadata":{"created_by":"system"}}');
    expect(JSON.parse(text(real))).toHaveLength(app.assistants.length);
  });
});

// ---------------------------------------------------------------------------------------------
// The run itself never rejects
// ---------------------------------------------------------------------------------------------

describe('executeRun', () => {
  it('an input state that cannot be written ends the run with error then end, it does not reject', async () => {
    // Sibling of the deep body: the first values event was written outside the run's try, so a
    // state JSON.stringify refuses made executeRun reject, and the stream was cut without `end`.
    const events: [string, unknown][] = [];
    let deep: unknown = 1;
    for (let i = 0; i < 20_000; i++) deep = [deep];
    const outcome = await executeRun({
      runId: 'r',
      assistant: app.assistants.find((a) => a.name === 'mirror')!,
      request: { assistant_id: 'mirror', input: { deep }, stream_mode: ['values'], on_disconnect: 'cancel', config: {}, metadata: {} },
      signal: new AbortController().signal,
      emit: (event, data) => {
        JSON.stringify(data);
        events.push([event, data]);
      },
      fetch: globalThis.fetch,
      env: {},
      logger: quiet,
    });
    expect(outcome).toBe('error');
    expect(events.map(([e]) => e)).toEqual(['metadata', 'error', 'end']);
    expect(events[1][1]).toEqual({ error: 'RangeError', message: expect.any(String) });
  });
});

// ---------------------------------------------------------------------------------------------
// Disconnects and slow readers
// ---------------------------------------------------------------------------------------------

/** Streams a ticker run with a raw client, leaving after `after` custom events. */
function leaveAfter(body: Obj, after: number): Promise<SseEvent[]> {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL('/runs/stream', server.url), { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'x-api-key': KEY } }, (res) => {
      let buf = Buffer.alloc(0);
      res.on('data', (c: Buffer) => {
        buf = Buffer.concat([buf, c]);
        // Only whole events count: cut at the last blank line.
        const cutAt = buf.lastIndexOf('\n\n');
        if (cutAt < 0) return;
        const events = parseSseStrict(buf.subarray(0, cutAt + 2)).events;
        if (events.filter((e) => e.event === 'custom').length >= after) {
          req.destroy();
          resolve(events);
        }
      });
      res.on('end', () => resolve(parseSseStrict(buf).events));
    });
    req.on('error', (err) => (req.destroyed ? undefined : reject(err)));
    req.end(JSON.stringify(body));
  });
}

/**
 * The same over a raw socket that ends its sending side right after the request (a half-close,
 * which is not leaving), then closes for good after `after` custom events.
 */
function halfCloseThenLeave(body: Obj, after: number): Promise<{ event: string; data: unknown }[]> {
  return new Promise((resolve, reject) => {
    const text = JSON.stringify(body);
    const socket = net.connect({ port: Number(new URL(server.url).port), host: '127.0.0.1', allowHalfOpen: true }, () => {
      socket.end(`POST /runs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`);
    });
    let raw = '';
    socket.setEncoding('utf8');
    socket.on('data', (c: string) => {
      raw += c;
      // Node writes each frame as one chunk, so a frame is never split by chunk framing.
      const frames = [...raw.matchAll(/\r\nevent: (\S+)\ndata: (.*)\n\n\r\n/g)].map((m) => ({ event: m[1], data: JSON.parse(m[2]) as unknown }));
      if (frames.filter((e) => e.event === 'custom').length >= after) {
        socket.destroy();
        resolve(frames);
      }
    });
    socket.on('error', reject);
  });
}

/** One request written raw; everything the server sends until it closes the connection. */
function rawUntilClose(request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ port: Number(new URL(server.url).port), host: '127.0.0.1' }, () => socket.write(request));
    let out = '';
    socket.setEncoding('latin1');
    socket.on('data', (c: string) => (out += c));
    socket.on('close', () => resolve(out));
    socket.on('error', reject);
  });
}

describe('POST /runs/stream: the connection', () => {
  it('a request that says Connection: close (or is HTTP/1.0) gets a stream that says close, and the connection closes after end', async () => {
    // Found hunting framing siblings: the stream set `Connection: keep-alive` itself, which made
    // Node keep the connection open (keepAliveTimeout, 5 s) after `end` even when the request said
    // close (RFC 9112 9.6: the server MUST close after that response, and SHOULD say close), and
    // told an HTTP/1.0 client keep-alive on a body only the close could delimit.
    const body = JSON.stringify({ assistant_id: 'mirror', stream_mode: 'custom' });
    for (const [version, extraHeader] of [['1.1', 'Connection: close\r\n'], ['1.0', '']]) {
      const out = await rawUntilClose(`POST /runs/stream HTTP/${version}\r\nHost: 127.0.0.1\r\n${extraHeader}X-Api-Key: ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      const [head, rest] = [out.slice(0, out.indexOf('\r\n\r\n')), out.slice(out.indexOf('\r\n\r\n') + 4)];
      expect(head, version).toMatch(/^HTTP\/1\.1 200 /);
      expect(head.toLowerCase(), version).toContain('\r\nconnection: close');
      expect(head.toLowerCase(), version).not.toContain('keep-alive');
      expect(rest, version).toContain('event: end\ndata: null\n\n');
    }
    // Keep-alive stays the default for HTTP/1.1: two runs, one after the other, on one connection.
    const twice = await rawUntilClose(`POST /runs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}POST /runs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Api-Key: ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    expect(twice.match(/HTTP\/1\.1 200 /g)).toHaveLength(2);
    expect(twice.match(/event: end\n/g)).toHaveLength(2);
    expect(twice.toLowerCase()).toMatch(/connection: keep-alive[\s\S]*connection: close/);
  });
});

describe('POST /runs/stream: a client that leaves', () => {
  it('on_disconnect cancel (the default) stops the run\'s side effect; continue lets it finish (raw client, SDK signal, half-closed client)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom<'cancel' | 'continue' | undefined>('cancel', 'continue', undefined), fc.integer({ min: 1, max: 4 }), fc.constantFrom('raw', 'sdk', 'half-close'), async (mode, after, how) => {
        const file = marker('leave');
        const ticks = mode === 'continue' ? after + 4 : 100_000;
        const body: Obj = { assistant_id: 'ticker', stream_mode: 'custom', config: { configurable: { marker: file, ticks, delay_ms: 10 } }, ...(mode ? { on_disconnect: mode } : {}) };
        let seen: { event: string; data: unknown }[];
        if (how === 'raw') seen = await leaveAfter(body, after);
        else if (how === 'half-close') seen = await halfCloseThenLeave(body, after);
        else {
          const ac = new AbortController();
          seen = [];
          try {
            for await (const e of client.runs.stream(null, 'ticker', { config: body.config as Obj, streamMode: 'custom', onDisconnect: mode, signal: ac.signal })) {
              seen.push(e);
              if (seen.filter((x) => x.event === 'custom').length >= after) ac.abort();
            }
          } catch (err) {
            if (!ac.signal.aborted) throw err;
          }
        }
        expect(seen[0].event).toBe('metadata');
        expect(seen.filter((e) => e.event === 'custom').map((e) => e.data)).toEqual(Array.from({ length: after }, (_, i) => ({ i })));
        await waitFor(() => lines(file).includes('stopped'), 'the ticker to stop');
        const log = lines(file);
        if (mode === 'continue') {
          expect(log).toEqual([...Array.from({ length: ticks }, (_, i) => `tick ${i}`), 'finished', 'stopped']);
        } else {
          // Cancelled: no tick after the abort, never finished, and it stopped at once.
          const aborted = log.indexOf('aborted CancelledError');
          expect(aborted, log.join(',')).toBeGreaterThanOrEqual(after);
          expect(log.slice(aborted + 1), log.join(',')).toEqual(['stopped']);
        }
        await waitFor(() => server.activeRuns() === 0, 'the run to end');
      }),
      propertyParams(10),
    );
  }, PROPERTY_TIMEOUT);

  it('a client that ends its sending side after the request still reads the whole stream (RFC 9112 9.6)', async () => {
    // Found while hunting disconnect siblings: Node's server takes a half-close for a disconnect
    // by default (it ends the connection), so `printf ... | nc -N` got metadata and one event,
    // and the run was cancelled.
    const file = marker('half-close');
    const r = await halfClosedRun(server.url, JSON.stringify({ assistant_id: 'ticker', stream_mode: 'custom', config: { configurable: { marker: file, ticks: 5, delay_ms: 20 } } }));
    expect(r.head).toMatch(/^HTTP\/1\.1 200 /);
    expect(r.complete).toBe(true);
    const { events } = parseSseStrict(r.body);
    expect(events.map((e) => e.event)).toEqual(['metadata', 'custom', 'custom', 'custom', 'custom', 'custom', 'end']);
    expect(lines(file)).toEqual(['tick 0', 'tick 1', 'tick 2', 'tick 3', 'tick 4', 'finished', 'stopped']);
  });

  it('a client that stops reading is cut off once its queue is full; the server keeps no more for it', async () => {
    const bound = 256 * 1024;
    const s = await startAppServer({ app, host: '127.0.0.1', port: 0, heartbeatMs: 1000, maxQueuedBytes: bound, logger: quiet });
    extra.push(s);
    const size = 16 * 1024;
    const count = 4096; // 64 MiB of events if nothing stopped it
    for (const mode of ['cancel', 'continue'] as const) {
      const file = marker(`flood-${mode}`);
      const c = await stalledClient(s.url, JSON.stringify({ assistant_id: 'flood', stream_mode: 'custom', on_disconnect: mode, config: { configurable: { marker: file, count, size } } }));
      await waitFor(() => lines(file).some((l) => l.startsWith('aborted') || l === 'finished'), 'the flood to end');
      const last = lines(file).at(-1)!;
      const got = await c.drain();
      if (mode === 'cancel') {
        // Cut off, then cancelled: it produced the queue's worth, what the kernel's socket buffers
        // took, and a batch, not the 64 MiB it meant to.
        expect(last).toMatch(/^aborted at \d+$/);
        expect(Number(last.split(' ')[2]) * size).toBeLessThan(32 * 1024 * 1024);
      } else {
        expect(last).toBe('finished');
      }
      // Either way the client got a cut stream (no `end`), and far less than the run produced.
      expect(got.length).toBeLessThan((count * size) / 2);
      const cutAt = got.lastIndexOf('\n\n');
      const body = got.subarray(got.indexOf('\r\n\r\n') + 4, cutAt + 2).toString('latin1');
      expect(body).not.toContain('event: end');
      await waitFor(() => s.activeRuns() === 0, 'the flood run to end');
    }
  });
});
