/**
 * A push that changes the egress policy while a request waits for its upstream connection: the
 * request was planned under the old policy, but its connection must not come from it. The first
 * request of a tunnel waits for the connection opened at CONNECT (Upstream.prewarm), a later one
 * for a new connection when the origin closed the last; if the policy changes before that
 * connection is up, the dial is made again under the new policy (Upstream.dialWith): refused
 * where that denies the origin. Both HTTP/1.1 exchanges (the
 * fast path and the Node path with undici), a real origin behind a TCP gate that holds the dial
 * across the change. (HTTP/2 clients' requests: test/proxy/h2-upstream.test.ts.)
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tcpGate } from '../helpers/gate.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { compileConfig } from '../../src/rules/index.js';
import { startOrigin } from '../helpers/origin.js';
import { HOST, INJECTED, lengthResponse, OTHER, Reader, request, startScriptedOrigin, startTestProxy, WS_HEADERS, type ScriptedOrigin, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
let origin: ScriptedOrigin;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  origin = await startScriptedOrigin(pki, (req, s) => {
    // `/close`: the origin ends the connection after its answer, so the next request needs a new one.
    if (req.path === '/close') s.end(lengthResponse('ok /close', ['Connection: close']));
    // `/stream`: an answer that goes on (a server-sent event stream): one chunk, then nothing.
    else if (req.path === '/stream') s.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n7\r\nevent 1\r\n');
    else s.write(lengthResponse(`ok ${req.path}`));
  });
});
afterAll(async () => {
  await origin?.close();
});

const config = (access_control: Record<string, unknown>) => compileConfig({ no_proxy: [], access_control, rules: [{ name: 'fast', match_hosts: [HOST, OTHER], headers: [{ name: 'X-Key', value: INJECTED }] }] });

const gate = () => tcpGate(origin.port);

describe.each([
  ['the fast path', true],
  ['the Node path (undici)', false],
] as const)('%s: the egress policy changes while the first request waits for its connection', (_name, fastPath) => {
  let px: TestProxy;
  beforeAll(async () => {
    px = await startTestProxy(pki, { fastPath });
  });
  afterAll(async () => {
    await px?.close(200);
    expect(px?.log() ?? '').not.toContain(INJECTED);
  });

  it.each([
    ['denies the origin now: 403, nothing reaches it', 'deny', 403],
    ['still allows it: served', 'allow', 200],
  ] as const)('the new policy %s', async (_what, policy, status) => {
    const g = await gate();
    px.route(g.port);
    const before = origin.requests.length;
    const keep = px.handle.getConfig();
    try {
      // The connection opened at CONNECT is held at the gate; the request waits for it.
      g.shut();
      const t = await px.connect(g.port);
      const r = new Reader(t);
      t.write(request('GET', `/${policy}`, `${HOST}:${g.port}`));
      await new Promise((res) => setTimeout(res, 150));
      px.handle.setConfig(config(policy === 'deny' ? { deny_ports: [g.port] } : { deny_hosts: ['denied.example'] }));
      g.open();
      const resp = await r.next();
      expect(resp.status).toBe(status);
      if (status === 403) {
        expect(resp.head).toMatch(/proxy-status: keygate; error=http_request_denied/i);
        expect(origin.requests.length).toBe(before);
      } else expect(resp.body.toString()).toBe(`ok /${policy}`);
      t.destroy();
    } finally {
      g.open();
      px.handle.setConfig(keep);
      g.close();
    }
  });

  it('an answer still streaming when the new policy denies its origin is cut, never ended as complete', async () => {
    const g = await gate();
    px.route(g.port);
    const keep = px.handle.getConfig();
    try {
      const t = await px.connect(g.port);
      let got = '';
      const first = new Promise<void>((resolve) =>
        t.on('data', (d: Buffer) => {
          got += d.toString('latin1');
          if (got.includes('event 1')) resolve();
        }),
      );
      const closed = new Promise<void>((r) => t.once('close', () => r()));
      t.write(request('GET', '/stream', `${HOST}:${g.port}`));
      await first;
      px.handle.setConfig(config({ deny_ports: [g.port] }));
      await closed;
      expect(got).toMatch(/^HTTP\/1\.1 200 /);
      // No last chunk: the client sees a broken answer.
      expect(got).not.toContain('0\r\n\r\n');
      expect(px.records.find((r) => r.path === '/stream')?.error).toBeDefined();
    } finally {
      px.handle.setConfig(keep);
      g.close();
    }
  });

  it('a later request dialling a new connection (the origin closed the last one): refused when the policy denies the origin now', async () => {
    const g = await gate();
    px.route(g.port);
    const keep = px.handle.getConfig();
    try {
      const t = await px.connect(g.port);
      const r = new Reader(t);
      const first = await r.exchange(request('GET', '/close', `${HOST}:${g.port}`));
      expect(first.status).toBe(200);
      const before = origin.requests.length;
      g.shut();
      t.write(request('GET', '/later', `${HOST}:${g.port}`));
      await new Promise((res) => setTimeout(res, 150));
      px.handle.setConfig(config({ deny_ports: [g.port] }));
      g.open();
      const resp = await r.next();
      expect(resp.status).toBe(403);
      expect(origin.requests.length).toBe(before);
      t.destroy();
    } finally {
      g.open();
      px.handle.setConfig(keep);
      g.close();
    }
  });
});

describe.each([
  ['the fast path', true],
  ['the Node path', false],
] as const)('%s: a WebSocket spliced to its origin when the egress policy changes', (_name, fastPath) => {
  // Once spliced, the proxy relays frames it does not read, for as long as both ends keep the
  // connection: a new policy that denies the origin applies to it only by ending it.
  it('is ended when the new policy denies its origin, and its record says why', async () => {
    const ws = await startOrigin(pki);
    const px = await startTestProxy(pki, { fastPath });
    px.route(ws.port);
    try {
      const t = await px.connect(ws.port);
      const switched = new Promise<string>((resolve) => {
        let got = '';
        t.on('data', (d: Buffer) => {
          got += d.toString('latin1');
          // The switch, then the origin's first message (its view of the handshake).
          if (got.includes('\r\n\r\n') && got.includes(INJECTED)) resolve(got);
        });
      });
      t.write(request('GET', '/ws', `${HOST}:${ws.port}`, WS_HEADERS));
      expect(await switched).toMatch(/^HTTP\/1\.1 101 /);
      const closed = new Promise<void>((r) => t.once('close', () => r()));
      px.handle.setConfig(config({ deny_ports: [ws.port] }));
      await closed;
      const rec = px.records.find((r) => r.path === '/ws');
      expect(rec?.status).toBe(101);
      expect(rec?.error).toBe('closed: the egress policy now refuses this destination');
      expect(px.log()).toMatch(/"type":"egress_denied".*"kind":"port_denied"/);
    } finally {
      await px.close(200);
      expect(px.log()).not.toContain(INJECTED);
      await ws.close();
    }
  });
});
