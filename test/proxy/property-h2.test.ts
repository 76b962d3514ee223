/**
 * Property tests: hostile HTTP/2 requests from a client inside an intercepted tunnel, checked by
 * what a real origin received, on both upstream legs: an HTTP/2 origin, and an HTTP/1.1-only one
 * (the proxy translates h2 to HTTP/1.1; every byte that origin got is parsed strictly).
 *
 * Each case is one connection carrying 1-5 generated streams at once plus a good control stream:
 * pseudo-header variants (missing, repeated, late, unknown, :protocol, empty or odd :path, :scheme
 * http), :authority and host agreeing or not (case, trailing dot, port), connection-specific and
 * hop-by-hop fields, values with CR/LF/NUL or surrounding whitespace, upper-case names, the
 * injected fields in any spelling and count, cookies in crumbs, bodies with or without a
 * content-length that may disagree, trailers with forbidden fields, client resets. The header
 * blocks are HPACK literals written byte for byte (property-h2-helpers.ts).
 *
 * The invariants (docs: shared reference proxy.md), per stream: a refused stream (another
 * authority: 421; malformed: 400 or a stream error) sends nothing to the origin; a good one is
 * served; what reaches the origin names the tunnel's authority, the normalised path, the method
 * sent, carries each injected field once with the configured value when the rule applies (never
 * the client's, in any spelling) and no configured value otherwise, no hop-by-hop field but the
 * proxy's own framing, every other field byte for byte as sent, and the body sent (a declared
 * length: its first bytes, never more); the HTTP/1.1 origin's bytes are exactly one well-framed
 * request per forwarded stream; a stream cut before its end never completes upstream; nothing
 * returned carries a configured value; the proxy's own answers say so (Proxy-Status); the
 * connection and the other streams go on, and a good request is served after each case.
 */
import http2 from 'node:http2';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { compileConfig } from '../../src/rules/index.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { propertyParams } from '../helpers/property.js';
import { HOST, OTHER, startTestProxy, type TestProxy } from './h1/fast-helpers.js';
import {
  expectation,
  h1Problems,
  h1Recorder,
  h2Recorder,
  INJECT,
  KEY,
  rawSession,
  requestArb,
  SECRET,
  seenFor,
  send,
  toWire,
  violations,
  type GenRequest,
  type H1Recorder,
  type H2Recorder,
  type Leg,
} from './property-h2-helpers.js';

let pki: TestPki;
let px: TestProxy;
let h1: H1Recorder;
let h2: H2Recorder;
let run = 0;

beforeAll(async () => {
  pki = await createTestPki([HOST, OTHER]);
  px = await startTestProxy(pki);
  px.handle.setConfig(compileConfig({ no_proxy: [], rules: [{ name: 'repos', match_hosts: [HOST], match_paths: ['/repos/*'], headers: INJECT.map(([n, v]) => ({ name: n === 'authorization' ? 'Authorization' : 'X-Api-Key', value: v })) }] }));
  h1 = await h1Recorder(pki);
  h2 = await h2Recorder(pki);
  px.route(h1.port);
  px.route(h2.port);
});

afterAll(async () => {
  await px?.close(500);
  await h1?.close();
  await h2?.close();
  expect(px.log()).not.toContain(SECRET);
  expect(px.log()).not.toContain(KEY);
});

const portOf = (leg: Leg) => (leg === 'h1' ? h1.port : h2.port);

/** A good request (the rule applies, the client's own x-api-key replaced). */
function control(leg: Leg): GenRequest {
  return {
    method: 'GET',
    scheme: 'https',
    path: '/repos/control',
    authority: { value: `${HOST}:${portOf(leg)}`, kind: 'same' },
    host: undefined,
    extraPseudo: [],
    pseudoLate: false,
    fields: [
      { name: 'x-api-key', value: 'client-own', tag: 'inject' },
      { name: 'accept', value: '*/*', tag: 'ok' },
    ],
    body: undefined,
    contentLength: undefined,
    trailers: undefined,
    reset: false,
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * One case: the generated streams and a control stream at once on one connection, then a control
 * stream on the same connection and one on a new connection. The violations found, or none.
 */
async function runCase(leg: Leg, reqs: GenRequest[]): Promise<string[]> {
  const port = portOf(leg);
  const tunnel = `${HOST}:${port}`;
  const n = ++run;
  const fromConn = h1.conns.length;
  const fromReq = h1.requests.length;
  const all = [...reqs, control(leg)];
  const ids = all.map((_, i) => `c${n}-${i}`);
  const known = new Set(ids);
  const v: string[] = [];
  const rs = await rawSession(px.handle.port, HOST, port, px.caPem);
  try {
    const answers = await Promise.all(all.map((r, i) => send(rs, toWire(r, ids[i]))));
    // What the proxy still sends upstream after a stream closed (a cut upload) settles first.
    await sleep(50);
    for (let t = 0; t < 40 && h1.conns.slice(fromConn).some((c) => c.rest.length > 0 && !c.closed); t++) await sleep(50);
    all.forEach((r, i) => {
      const e = expectation(r);
      const found = violations(leg, r, e, answers[i], seenFor(leg, h1, h2, ids[i]), ids[i], tunnel);
      if (found.length) v.push(`stream ${i} (${e.verdict}: ${e.why.join('; ') || 'valid'}): ${found.join(' | ')}`);
    });
    for (const c of h1.conns.slice(fromConn)) if (c.rest.length > 0 && !c.closed) v.push(`HTTP/1.1 origin connection ${c.id} holds ${c.rest.length} bytes of an unfinished request: ${JSON.stringify(c.rest.toString('latin1').slice(0, 200))}`);
    if (rs.swap.error) v.push(`test client: ${rs.swap.error.message}`);
    // The connection goes on: another good stream on it.
    if (rs.gone) v.push(`the connection ended (GOAWAY ${String(rs.goawayCode)})`);
    else {
      const after = control(leg);
      const id = `c${n}-after`;
      known.add(id);
      const a = await send(rs, toWire(after, id));
      const found = violations(leg, after, expectation(after), a, seenFor(leg, h1, h2, id), id, tunnel);
      if (found.length) v.push(`control after the case: ${found.join(' | ')}`);
    }
  } finally {
    rs.close();
  }
  // And on a new connection.
  const fresh = await rawSession(px.handle.port, HOST, port, px.caPem);
  try {
    const id = `c${n}-fresh`;
    known.add(id);
    const r = control(leg);
    const a = await send(fresh, toWire(r, id));
    const found = violations(leg, r, expectation(r), a, seenFor(leg, h1, h2, id), id, tunnel);
    if (found.length) v.push(`control on a new connection: ${found.join(' | ')}`);
  } finally {
    fresh.close();
  }
  if (leg === 'h1') v.push(...h1Problems(h1, known, fromConn, fromReq));
  else if (h2.errors.length) v.push(`HTTP/2 origin errors: ${h2.errors.splice(0).join('; ')}`);
  return v;
}

for (const leg of ['h2', 'h1'] as const) {
  describe(`hostile HTTP/2 requests, ${leg === 'h1' ? 'HTTP/1.1' : 'HTTP/2'} origin`, () => {
    // 25 cases take a few seconds; the clock grows with KEYGATE_FUZZ_RUNS when exploring.
    it('property: what reaches the origin is what proxy.md allows, and only that', { timeout: 60_000 + 2_000 * (Number(process.env.KEYGATE_FUZZ_RUNS) || 25) }, async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(requestArb(HOST, portOf(leg)), { minLength: 1, maxLength: 5 }), async (reqs) => {
          const v = await runCase(leg, reqs);
          if (process.env.KEYGATE_FUZZ_TRACE) console.log(`case ${run} ${leg}: ${v.length ? v.join(' || ') : 'ok'}`);
          if (v.length) throw new Error(v.join('\n'));
        }),
        propertyParams(25),
      );
    });
  });
}

// ---- counterexamples found by the properties, as plain tests -------------------------------------

describe('regressions found by the HTTP/2 properties', () => {
  const fields = (port: number, extra: [string, string][]): [string, string][] => [[':method', 'GET'], [':scheme', 'https'], [':path', '/repos/x'], [':authority', `${HOST}:${port}`], ...extra];

  it.each(['h2', 'h1'] as const)("an Expect other than 100-continue is the proxy's 417 (Proxy-Status, a record), never Node's bare one (%s origin)", async (leg) => {
    const port = portOf(leg);
    const before = px.records.length;
    const rs = await rawSession(px.handle.port, HOST, port, px.caPem);
    try {
      const a = await send(rs, { fields: fields(port, [['expect', 'x-foo'], ['x-case-id', 'expect-417']]) });
      expect(a.status).toBe(417);
      expect(String(a.headers['proxy-status'])).toMatch(/^keygate; error=http_request_error/);
      expect(seenFor(leg, h1, h2, 'expect-417')).toEqual([]);
      await expect.poll(() => px.records.slice(before).some((r) => r.status === 417)).toBe(true);
    } finally {
      rs.close();
    }
  });

  it.each(['h2', 'h1'] as const)('a HEAD request whose client resets it mid-upload never completes at the origin (%s origin)', async (leg) => {
    const port = portOf(leg);
    const rs = await rawSession(px.handle.port, HOST, port, px.caPem);
    try {
      // The upstream connection first, so the HEAD's upstream stream opens while its body comes.
      expect((await send(rs, toWire(control(leg), `head-reset-warm-${leg}`))).status).toBe(200);
      // HEADERS without END_STREAM, three bytes of DATA, then RST_STREAM: no END_STREAM ever.
      const a = await send(rs, { fields: [[':method', 'HEAD'], [':scheme', 'https'], [':path', '/repos/x'], [':authority', `${HOST}:${port}`], ['x-case-id', `head-reset-${leg}`]], body: [Buffer.from('abc')], reset: true });
      expect(a.status).toBe(0);
      await sleep(300);
      const seen = seenFor(leg, h1, h2, `head-reset-${leg}`);
      expect(seen.filter((s) => s.complete)).toEqual([]);
    } finally {
      rs.close();
    }
  });

  it.each(['h2', 'h1'] as const)('a HEAD request whose client resets it while waiting for the origin is given up upstream, and recorded as 499 (%s origin)', async (leg) => {
    const port = portOf(leg);
    const before = px.records.length;
    const rs = await rawSession(px.handle.port, HOST, port, px.caPem);
    try {
      expect((await send(rs, toWire(control(leg), `head-wait-warm-${leg}`))).status).toBe(200);
      const id = `head-wait-${leg}`;
      const a = await send(rs, { fields: [[':method', 'HEAD'], [':scheme', 'https'], [':path', '/repos/slow'], [':authority', `${HOST}:${port}`], ['x-case-id', id]], resetAfterEndMs: 300 });
      expect(a.status).toBe(0);
      if (leg === 'h2') {
        // The upstream stream is cancelled (RST_STREAM CANCEL), not left open until the origin answers.
        await expect.poll(() => h2.streams.find((s) => s.raw.includes(id))?.closed, { timeout: 5000 }).toBe(true);
        expect(h2.streams.find((s) => s.raw.includes(id))?.rstCode).toBe(http2.constants.NGHTTP2_CANCEL);
      } else {
        // The HTTP/1.1 connection carrying it is closed by the proxy.
        await expect.poll(() => h1.conns[h1.requests.find((r) => r.head.includes(id))?.conn ?? -1]?.closed, { timeout: 5000 }).toBe(true);
      }
      await expect.poll(() => px.records.slice(before).find((r) => r.method === 'HEAD')?.status, { timeout: 5000 }).toBe(499);
    } finally {
      rs.close();
    }
  });

  it.each(['h2', 'h1'] as const)('a stream the proxy resets for a malformed trailer section, its upstream request still waiting for a connection, never completes at the origin (%s origin)', async (leg) => {
    const port = portOf(leg);
    for (let i = 0; i < 6; i++) {
      const rs = await rawSession(px.handle.port, HOST, port, px.caPem);
      try {
        const id = `bad-trailers-${leg}-${i}`;
        // A control stream beside it takes the upstream connection at hand: the other one waits for a new one.
        const [a] = await Promise.all([
          send(rs, { fields: [[':method', 'GET'], [':scheme', 'https'], [':path', '/repos'], [':authority', `${HOST}:${port}`], ['x-case-id', id]], body: [Buffer.from([0])], trailers: [[':path', '/admin']] }),
          send(rs, toWire(control(leg), `${id}-control`)),
        ]);
        expect(a.status).toBe(0);
        expect(a.rstCode).toBe(http2.constants.NGHTTP2_PROTOCOL_ERROR);
        await sleep(100);
        expect(seenFor(leg, h1, h2, id).filter((s) => s.complete)).toEqual([]);
      } finally {
        rs.close();
      }
    }
  });
});
