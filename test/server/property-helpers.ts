// Shared by the property tests of the HTTP APIs (test/server/property-*.test.ts): hostile input
// generators (fast-check), a real HTTP client (undici, the path sent byte for byte), and the
// invariants of wire.md checked on every answer: never a 5xx, exactly the documented error shape,
// no stored secret / opaque value / token / credential in any body, header or log line, and a
// rejected request changes nothing (the state read before and after is identical).
import fc from 'fast-check';
import { Client } from 'undici';
import { expect } from 'vitest';
import { openWorkspaceSecrets } from '../../src/sandbox-api/secrets.js';
import type { InProcessServer } from './inprocess.js';

export interface Req {
  method: string;
  path: string;
  headers?: Record<string, string | string[]>;
  body?: string | Buffer;
}

export interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: unknown;
}

/** One connection pool per server; paths go out exactly as given (no URL normalisation of `..`). */
export function httpClient(url: string): { send(r: Req): Promise<Res | undefined>; close(): Promise<void> } {
  const client = new Client(url, { pipelining: 0, keepAliveTimeout: 1000 });
  return {
    async send(r) {
      let res;
      try {
        res = await client.request({ method: r.method as 'GET', path: r.path, headers: r.headers, body: r.body });
      } catch (err) {
        // undici itself refuses some inputs (a header value with CR/LF, a path with a space):
        // nothing reached the server.
        if ((err as { code?: string }).code === 'UND_ERR_INVALID_ARG') return undefined;
        throw err;
      }
      // A stream (the deployment log follower) never ends by itself: its head is the answer.
      if (String(res.headers['content-type'] ?? '').startsWith('text/event-stream')) {
        res.body.destroy();
        return { status: res.statusCode, headers: res.headers, text: '', json: undefined };
      }
      const text = await res.body.text();
      let json: unknown;
      try {
        json = text ? JSON.parse(text) : undefined;
      } catch {
        json = undefined;
      }
      return { status: res.statusCode, headers: res.headers, text, json };
    },
    close: () => client.close(),
  };
}

// ---------------------------------------------------------------------------------------------
// Values the tests store and the server must never show again.

let counter = 0;
/**
 * A secret-like value with a distinctive core (`core`), so that it is recognised in any text it
 * might leak into, whatever escaping the rest of the value gets. `tail` adds hostile characters.
 */
export function secretValue(kind: string, tail = ''): { value: string; core: string } {
  const core = `${kind}Z${(++counter).toString(36)}Q${Math.random().toString(36).slice(2, 12)}`;
  return { value: core + tail, core };
}

/** Tails for secret values: what a header may carry and what it may not. */
export const secretTail = fc.constantFrom('', '-tail', '=', ' middle ok', 'é', 'ü€', '\t', '\u0000', '\r\n', ' ', '\ud800', '😀', '"quoted"', '\\', '{X}');

/** A Set of cores the server must never echo; a core is found in raw, JSON-escaped or URL-encoded text. */
export class Known {
  readonly cores = new Set<string>();
  add(core: string): string {
    this.cores.add(core);
    return core;
  }
  leaksIn(text: string): string[] {
    return [...this.cores].filter((c) => text.includes(c));
  }
}

// ---------------------------------------------------------------------------------------------
// Hostile values.

export const nastyStrings = [
  '',
  ' ',
  '\u0000',
  'a\u0000b',
  '..',
  '../..',
  '/',
  '%2F',
  '%00',
  '\ud800',
  '\udfff',
  '😀',
  'ǅİß',
  '\u202e',
  '\r\n',
  '\n',
  'NaN',
  'Infinity',
  '-Infinity',
  '1e400',
  '-1',
  '-0',
  '0x10',
  'true',
  'null',
  '{}',
  '[]',
  '{KEY}',
  'Bearer {NOPE}',
  '__proto__',
  'constructor',
  "' OR 1=1 --",
  '<script>',
  'a'.repeat(64),
  'b'.repeat(254),
] as const;

export const hostileString: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...nastyStrings) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 24 }) },
  { weight: 1, arbitrary: fc.string({ unit: 'grapheme', maxLength: 12 }) },
  { weight: 1, arbitrary: fc.integer({ min: 200, max: 140_000 }).map((n) => 'x'.repeat(n)) },
);

export const hostileNumber: fc.Arbitrary<number> = fc.oneof(
  fc.constantFrom(0, -0, -1, 1, 1.5, -1.5, 1e308, -1e308, 5e-324, 2 ** 31, 2 ** 32, 2 ** 53 + 2, -(2 ** 53) - 2, Number.MAX_SAFE_INTEGER, 31_536_001, 86_401),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
);

const hostileScalar: fc.Arbitrary<unknown> = fc.oneof(fc.constant(null), fc.boolean(), hostileNumber, hostileString);

export const hostileValue: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 6, arbitrary: hostileScalar },
  { weight: 1, arbitrary: fc.array(hostileScalar, { maxLength: 3 }) },
  { weight: 1, arbitrary: fc.dictionary(hostileString, hostileScalar, { maxKeys: 3 }) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 2000 }).map((n) => nest(n)) },
);

function nest(depth: number): unknown {
  let v: unknown = 'deep';
  for (let i = 0; i < depth; i++) v = i % 2 ? [v] : { a: v };
  return v;
}

type Path = (string | number)[];

/** Every place inside a JSON value (objects' keys and arrays' indexes), the root included. */
function places(v: unknown, at: Path = [], out: Path[] = []): Path[] {
  out.push(at);
  if (Array.isArray(v)) v.forEach((x, i) => places(x, [...at, i], out));
  else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) places(x, [...at, k], out);
  return out;
}

function getAt(v: unknown, p: Path): unknown {
  return p.reduce<unknown>((acc, k) => (acc as Record<string | number, unknown>)[k], v);
}

function setAt(root: unknown, p: Path, value: unknown, remove = false): unknown {
  if (p.length === 0) return value;
  const copy = structuredClone(root);
  const parent = getAt(copy, p.slice(0, -1)) as Record<string | number, unknown>;
  const last = p[p.length - 1];
  if (remove) {
    if (Array.isArray(parent)) parent.splice(last as number, 1);
    else delete parent[last];
  } else parent[last] = value;
  return copy;
}

export interface Mutation {
  what: string;
  body: unknown;
}

/** A valid body changed in one place: a wrong value, a field removed or added, a wrapper. */
export function mutate(valid: unknown): fc.Arbitrary<Mutation> {
  const all = places(valid);
  const objects = all.filter((p) => {
    const v = getAt(valid, p);
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  });
  return fc.tuple(fc.nat(), fc.nat(), hostileValue, hostileString, fc.nat({ max: 5 })).map(([i, j, value, key, op]) => {
    const p = all[i % all.length];
    switch (op) {
      case 0:
        return { what: `replace ${JSON.stringify(p)}`, body: setAt(valid, p, value) };
      case 1:
        return p.length ? { what: `remove ${JSON.stringify(p)}`, body: setAt(valid, p, undefined, true) } : { what: 'root replaced', body: value };
      case 2: {
        const o = objects.length ? objects[j % objects.length] : [];
        const target = getAt(valid, o);
        if (!target || typeof target !== 'object' || Array.isArray(target)) return { what: 'root replaced', body: value };
        return { what: `extra ${JSON.stringify(key)} at ${JSON.stringify(o)}`, body: setAt(valid, [...o, key], value) };
      }
      case 3:
        return { what: `wrap ${JSON.stringify(p)} in an array`, body: setAt(valid, p, [getAt(valid, p)]) };
      case 4:
        return { what: `object at ${JSON.stringify(p)} as its values`, body: setAt(valid, p, Object.values((getAt(valid, p) as object) ?? {})) };
      default:
        return { what: 'unchanged', body: valid };
    }
  });
}

export interface RawBody {
  what: string;
  contentType?: string;
  body?: string | Buffer;
}

/** Bytes that are not the JSON they claim to be, or JSON under another name. */
export function rawBodies(valid: unknown): fc.Arbitrary<RawBody> {
  const text = JSON.stringify(valid);
  const json = 'application/json';
  const dup = (v: unknown) => {
    if (!valid || typeof valid !== 'object' || Array.isArray(valid)) return text;
    const first = Object.keys(valid)[0];
    return first === undefined ? text : `${text.slice(0, -1)},${JSON.stringify(first)}:${JSON.stringify(v)}}`;
  };
  return fc.oneof(
    fc.constantFrom<RawBody>(
      { what: 'empty with JSON type', contentType: json, body: '' },
      { what: 'no body, JSON type', contentType: json },
      { what: 'not JSON', contentType: json, body: 'this is not json' },
      { what: 'truncated JSON', contentType: json, body: text.slice(0, Math.max(1, text.length >> 1)) },
      { what: 'trailing garbage', contentType: json, body: text + '}' },
      { what: 'JSON as text/plain', contentType: 'text/plain', body: text },
      { what: 'JSON without a type', body: text },
      { what: 'JSON as a form', contentType: 'application/x-www-form-urlencoded', body: text },
      { what: 'JSON with a charset', contentType: 'application/json; charset=latin1', body: text },
      { what: 'JSON with a BOM', contentType: json, body: '\ufeff' + text },
      { what: 'invalid UTF-8', contentType: json, body: Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}')]) },
      { what: 'prototype poisoning', contentType: json, body: `{"__proto__":{"polluted":1},"constructor":{"prototype":{"x":1}}}` },
      { what: 'deep nesting', contentType: json, body: '['.repeat(100_000) + ']'.repeat(100_000) },
      { what: 'deep objects', contentType: json, body: '{"a":'.repeat(50_000) + '1' + '}'.repeat(50_000) },
      { what: 'over the body limit', contentType: json, body: `{"x":"${'y'.repeat(1024 * 1024 + 10)}"}` },
      { what: 'a bare string', contentType: json, body: '"hello"' },
      { what: 'null', contentType: json, body: 'null' },
      { what: 'NaN', contentType: json, body: 'NaN' },
      { what: 'a huge number', contentType: json, body: '1' + '0'.repeat(400) },
    ),
    hostileValue.map((v) => ({ what: 'duplicate key', contentType: json, body: dup(v) })),
  );
}

/** A body for a JSON route: valid, mutated, or raw hostile bytes. */
export function hostileBody(valid: unknown): fc.Arbitrary<RawBody> {
  return fc.oneof(
    { weight: 1, arbitrary: fc.constant<RawBody>({ what: 'valid', contentType: 'application/json', body: JSON.stringify(valid) }) },
    { weight: 5, arbitrary: mutate(valid).map((m) => ({ what: m.what, contentType: 'application/json', body: m.body === undefined ? '' : JSON.stringify(m.body) })) },
    { weight: 2, arbitrary: rawBodies(valid) },
  );
}

/**
 * Percent-encoding of any string: a lone surrogate (which encodeURIComponent refuses) goes out as
 * the bytes UTF-8 would never make of it (ED A0 80), so the server meets invalid UTF-8 too.
 */
export function encodeAny(s: string): string {
  return s.split(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/).map(encodeURIComponent).join('%ED%A0%80');
}

/** A path segment: hostile text, encoded in several ways (raw bytes where the client allows). */
export const hostileSegment: fc.Arbitrary<string> = fc.oneof(
  hostileString.map((s) => encodeAny(s.slice(0, 20_000))),
  fc.constantFrom('..', '.', '%2e%2e', '..%2F..%2Fetc%2Fpasswd', '%2F', 'a%2Fb', '%00', '%ff', '%zz', '%', '%E2%80%AE', 'UPPER', 'a b'.replace(' ', '%20'), '~', '*', ';x=1', 'a?b', 'x'.repeat(300)),
);

/** Query strings: out of range, repeated, non-numeric, unknown parameters. */
export function hostileQuery(names: string[]): fc.Arbitrary<string> {
  const value = fc.oneof(
    fc.constantFrom('0', '-1', '1', '20', '100', '101', '1e3', '1e400', '-1e400', 'NaN', 'Infinity', '1.5', '0x10', '', '%205', '+5', 'true', 'null', '9007199254740993', '99999999999999999999', '%00', '%ff', 'a%2Fb'),
    hostileString.map((s) => encodeAny(s.slice(0, 2000))),
  );
  const pair = fc.tuple(fc.oneof(fc.constantFrom(...names, 'unknown', '__proto__', 'limit[]', 'offset[0]'), fc.constant('x')), value);
  return fc.array(pair, { maxLength: 4 }).map((ps) => (ps.length ? '?' + ps.map(([k, v]) => `${k}=${v}`).join('&') : ''));
}

// ---------------------------------------------------------------------------------------------
// Invariants.

const LOC0 = new Set(['body', 'path', 'query', 'header']);

/** The answer's problems against wire.md: a 5xx, or an error body not exactly of the documented shape. */
export function shapeProblems(req: Req, res: Res, opts: { html?: boolean } = {}): string[] {
  const out: string[] = [];
  if (res.status >= 500) out.push(`status ${res.status}`);
  if (res.status < 400 || req.method === 'HEAD') return out;
  if (opts.html && String(res.headers['content-type'] ?? '').startsWith('text/html')) return out;
  const b = res.json as { detail?: unknown } | undefined;
  if (!b || typeof b !== 'object' || Array.isArray(b) || Object.keys(b).join() !== 'detail') return [...out, `body not {"detail":...}: ${res.text.slice(0, 300)}`];
  if (!String(res.headers['content-type'] ?? '').startsWith('application/json')) out.push(`error content-type ${String(res.headers['content-type'])}`);
  if (res.status === 422) {
    if (!Array.isArray(b.detail) || b.detail.length === 0) return [...out, `422 detail not a non-empty list: ${res.text.slice(0, 300)}`];
    for (const item of b.detail as Record<string, unknown>[]) {
      const keys = item && typeof item === 'object' ? Object.keys(item).sort().join() : '';
      if (keys !== 'loc,msg,type') out.push(`422 item keys ${keys}`);
      const loc = item?.loc;
      if (!Array.isArray(loc) || loc.length === 0 || !LOC0.has(loc[0] as string)) out.push(`422 loc ${JSON.stringify(loc)}`);
      else if (!loc.every((x) => typeof x === 'string' || (typeof x === 'number' && Number.isInteger(x)))) out.push(`422 loc items ${JSON.stringify(loc)}`);
      if (typeof item?.msg !== 'string' || typeof item?.type !== 'string') out.push(`422 msg/type ${JSON.stringify(item)}`);
    }
  } else if (typeof b.detail !== 'string' || b.detail.length === 0) out.push(`detail not a sentence: ${res.text.slice(0, 300)}`);
  return out;
}

/** Every core of `known` found in the answer (body or any header). */
export function leakProblems(res: Res, known: Known): string[] {
  const heads = JSON.stringify(res.headers);
  return [...known.leaksIn(res.text).map((c) => `body shows ${c}`), ...known.leaksIn(heads).map((c) => `header shows ${c}`)];
}

/** The log lines written since `from` that hold a known core. */
export function logLeaks(s: InProcessServer, from: number, known: Known): string[] {
  return s.lines.slice(from).flatMap((l) => known.leaksIn(l).map((c) => `log line shows ${c}: ${l.slice(0, 300)}`));
}

/** Log lines at error level or above since `from` (a client's input is never the server's error). */
export function errorLines(s: InProcessServer, from: number): string[] {
  return s.lines.slice(from).filter((l) => {
    try {
      return (JSON.parse(l) as { level?: number }).level! >= 50;
    } catch {
      return false;
    }
  });
}

/** A workspace's secrets, values opened, read from where the server keeps them. */
export async function workspaceSecrets(s: InProcessServer, workspaceId: string): Promise<Record<string, string>> {
  const store = await openWorkspaceSecrets({ dataDir: s.dataDir, db: s.built.ctx.db, env: s.built.ctx.env }, workspaceId);
  return Object.fromEntries(await store.snapshot());
}

/** Rows of a table, with the columns that move on their own (statuses, clocks) left out. */
async function rows(s: InProcessServer, table: string, drop: string[] = []): Promise<unknown[]> {
  const all = await s.built.ctx.db.all<Record<string, unknown>>(`SELECT * FROM ${table}`);
  return all
    .map((r) => Object.fromEntries(Object.entries(r).filter(([k]) => !drop.includes(k))))
    .sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : 1));
}

/**
 * Everything a request could change, read twice: through the API with each workspace's key (every
 * listing) and in the database (every row, workspace secrets opened). Columns that background
 * work moves (a box's status, a build's progress, clocks of use) are left out.
 */
export async function snapshot(s: InProcessServer, send: (r: Req) => Promise<Res | undefined>): Promise<string> {
  const lists: Record<string, unknown> = {};
  for (const [who, key] of [['a', s.key], ['b', s.keyB]] as const) {
    for (const p of ['/api/v2/sandboxes/boxes?limit=100', '/api/v1/workspaces/current/secrets', '/v2/deployments?limit=100', '/v2/auth/providers', '/v2/auth/tokens', '/api/v1/api-key']) {
      const r = await send({ method: 'GET', path: p, headers: { 'x-api-key': key } });
      lists[`${who} ${p}`] = stable(r?.json);
    }
  }
  const secrets: Record<string, Record<string, string>> = {};
  for (const w of await s.built.ctx.db.all<{ id: string }>('SELECT id FROM workspaces ORDER BY id')) secrets[w.id] = await workspaceSecrets(s, w.id);
  const db = {
    workspaces: await rows(s, 'workspaces'),
    users: await rows(s, 'users'),
    api_keys: await rows(s, 'api_keys', ['last_used_at']),
    workspace_secrets: secrets,
    sandboxes: await rows(s, 'sandboxes', ['status', 'status_reason', 'updated_at', 'last_active_at']),
    cp_deployments: await rows(s, 'cp_deployments', ['status', 'active_revision_id', 'front_port', 'updated_at']),
    cp_revisions: await rows(s, 'cp_revisions', ['status', 'status_message', 'replaced_by', 'updated_at']),
    cp_uploads: await rows(s, 'cp_uploads'),
    oauth_providers: await rows(s, 'oauth_providers'),
    oauth_auth_flows: await rows(s, 'oauth_auth_flows', ['status', 'token_id', 'updated_at']),
    oauth_tokens: await rows(s, 'oauth_tokens', ['deleting_at']),
  };
  return JSON.stringify({ lists, db }, null, 1);
}

const VOLATILE = new Set(['status', 'status_reason', 'updated_at', 'last_active_at', 'last_used_at', 'active_revision_id', 'url', 'custom_url', 'proxy']);
function stable(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(stable);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).filter(([k]) => !VOLATILE.has(k)).map(([k, x]) => [k, stable(x)]));
  return v;
}

/** How a request is described in a failure: bounded, so a 1 MiB body does not flood the report. */
export function describe(r: Req): string {
  const body = r.body === undefined ? '' : Buffer.isBuffer(r.body) ? `<${r.body.length} bytes>` : r.body.length > 300 ? `${r.body.slice(0, 300)}... (${r.body.length})` : r.body;
  const path = r.path.length > 300 ? `${r.path.slice(0, 300)}... (${r.path.length})` : r.path;
  return `${r.method} ${path} ${JSON.stringify(r.headers ?? {}).slice(0, 300)} ${body}`;
}

/**
 * Sends `req` and checks every invariant; returns the answer (undefined when the client refused to
 * send it). A rejected request (4xx) must leave `snapshot` unchanged.
 */
export async function checked(
  s: InProcessServer,
  http: { send(r: Req): Promise<Res | undefined> },
  known: Known,
  req: Req,
  opts: { html?: boolean; unchangedOnReject?: boolean } = {},
): Promise<Res | undefined> {
  const from = s.lines.length;
  const before = opts.unchangedOnReject === false ? '' : await snapshot(s, http.send);
  const started = Date.now();
  const res = await http.send(req);
  // KEYGATE_FUZZ_TRACE=ms: print the requests slower than that (exploration aid, no assertion).
  const trace = Number(process.env.KEYGATE_FUZZ_TRACE);
  if (trace > 0 && Date.now() - started > trace) console.log(`slow (${Date.now() - started} ms): ${describe(req)} -> ${res?.status}`);
  if (!res) return undefined;
  const problems = [...shapeProblems(req, res, opts), ...leakProblems(res, known), ...logLeaks(s, from, known), ...errorLines(s, from).map((l) => `error logged: ${l.slice(0, 400)}`)];
  if (res.status >= 400 && opts.unchangedOnReject !== false) {
    const after = await snapshot(s, http.send);
    if (after !== before) problems.push(`a rejected request (${res.status}) changed the state:\n${firstDiff(before, after)}`);
  }
  expect(problems, `${describe(req)}\n -> ${res.status} ${res.text.slice(0, 500)}`).toEqual([]);
  return res;
}

function firstDiff(a: string, b: string): string {
  const x = a.split('\n');
  const y = b.split('\n');
  for (let i = 0; i < Math.max(x.length, y.length); i++) if (x[i] !== y[i]) return `line ${i}: before ${x[i]?.slice(0, 300)} | after ${y[i]?.slice(0, 300)}`;
  return '(no line differs)';
}

/** X-Api-Key spelled in any case: header names are case-insensitive. */
export const apiKeyHeaderName = fc.constantFrom('x-api-key', 'X-Api-Key', 'X-API-KEY', 'x-ApI-kEy');

/** A route of an area with what a valid request to it carries. */
export interface RouteSpec {
  method: string;
  url: string;
  /** A valid query string (with its `?`), and the parameter names hostile queries use. */
  query?: string;
  queryNames?: string[];
  /** Hostile query strings of its own (a long poll must not be asked to wait long). */
  hostileQuery?: fc.Arbitrary<string>;
  /** A valid JSON body (fresh secret values registered with the Known set as generated). */
  body?: () => fc.Arbitrary<unknown>;
  /** A raw-bytes route (uploads, files): the valid body and its type. */
  raw?: { contentType: string; body: () => string | Buffer };
  /** An HTML page may answer it (the OAuth callback). */
  html?: boolean;
}

/**
 * A request for `r` with workspace A's key (in any header-name case): the valid path (`valid`
 * gives each parameter's valid values, read when the case runs), query and body, each possibly
 * replaced by hostile ones.
 */
export function hostileRequest(r: RouteSpec, key: () => string, valid: Record<string, () => string[]>): fc.Arbitrary<Req> {
  const body: fc.Arbitrary<{ contentType?: string; body?: string | Buffer }> = r.body
    ? r.body().chain((v) => hostileBody(v))
    : r.raw
      ? fc.oneof(fc.constant({ contentType: r.raw.contentType, body: r.raw.body() }), fc.constant({}), fc.constant({ contentType: 'application/json', body: '{"a":1}' }), fc.constant({ contentType: r.raw.contentType, body: 'not what it says' }))
      : fc.oneof({ weight: 4, arbitrary: fc.constant({}) }, { weight: 1, arbitrary: fc.constant({ contentType: 'application/json', body: '{"unexpected":true}' }) }, { weight: 1, arbitrary: fc.constant({ contentType: 'application/json', body: 'not json' }) });
  const names = [...r.url.matchAll(/:([A-Za-z_]+)/g)].map((m) => m[1]);
  const segment = (n: string) => fc.oneof({ weight: 3, arbitrary: fc.nat().map((i) => ({ valid: n, i })) }, { weight: 2, arbitrary: hostileSegment.map((h) => ({ hostile: h })) });
  const params = fc.tuple(...names.map(segment));
  const query = fc.oneof({ weight: 2, arbitrary: fc.constant(r.query ?? '') }, { weight: 1, arbitrary: r.hostileQuery ?? hostileQuery(r.queryNames ?? ['limit', 'offset']) });
  return fc.record({ body, params, query, keyName: apiKeyHeaderName }).map(({ body, params, query, keyName }) => {
    const headers: Record<string, string> = { [keyName]: key() };
    if (body.contentType) headers['content-type'] = body.contentType;
    let i = 0;
    const path = r.url.replace(/:([A-Za-z_]+)/g, () => {
      const p = params[i++] as { valid?: string; i?: number; hostile?: string };
      if (p.hostile !== undefined) return p.hostile;
      const values = valid[p.valid!]?.() ?? [];
      return values.length ? encodeURIComponent(values[p.i! % values.length]) : 'none';
    });
    return { method: r.method, path: path + query, headers, body: body.body };
  });
}

/**
 * The test timeout for a property of `runs` cases at about `msPerCase` each (loaded machine),
 * scaled like the case count when KEYGATE_FUZZ_RUNS asks for more: an exploration run must not be
 * cut by the timeout while its cases still run (and restore the fixture under the next test).
 */
export function budget(runs: number, msPerCase: number): number {
  const env = Number(process.env.KEYGATE_FUZZ_RUNS);
  // The committed case counts run well under the suite's 60 s; exploration gets what it needs
  // (random cases meet the 1 MiB bodies and 100 000-deep nestings far more often).
  if (!(Number.isInteger(env) && env > 0)) return 60_000;
  return Math.max(60_000, env * Math.max(msPerCase, 2000) + 20_000);
}
