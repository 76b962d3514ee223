/**
 * keygate's own HTTP/2 upstream client (src/proxy/h2/upstream.ts), which carries HTTP/2 clients'
 * requests to HTTP/2 origins: streams multiplexed on one session, the peer's
 * SETTINGS_MAX_CONCURRENT_STREAMS respected, a new session after GOAWAY, repeated answer fields
 * kept, and a client leaving (mid-answer or mid-upload) resetting the upstream stream with
 * RST_STREAM (CANCEL mid-answer; INTERNAL_ERROR mid-upload, the body left open), never ending it as complete. Real node:http2 origins on loopback with the
 * test CA, real HTTP/2 clients through the proxy.
 */
import http2, { type ClientHttp2Session, type ServerHttp2Stream } from 'node:http2';
import type net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { h2Request, h2Through } from './h2-helpers.js';
import { compileConfig } from '../../src/rules/index.js';
import { tcpGate } from '../helpers/gate.js';
import { HOST, INJECTED, OTHER, startTestProxy, type TestProxy } from './h1/fast-helpers.js';
import { pumpChunks } from '../helpers/pump.js';

let pki: TestPki;
let px: TestProxy;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  px = await startTestProxy(pki);
});
afterAll(async () => {
  await px?.close();
});

interface Origin {
  port: number;
  sessions: number;
  /** Settles when the first session to the origin closes. */
  sessionClosed: Promise<void>;
  close(): void;
}

async function h2Origin(serve: (s: ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => void, settings: http2.Settings = {}): Promise<Origin> {
  const server = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem, allowHTTP1: false, settings });
  let closed!: () => void;
  const o: Origin = { port: 0, sessions: 0, sessionClosed: new Promise<void>((r) => (closed = r)), close: () => void server.close() };
  server.on('session', (sess) => {
    o.sessions++;
    sess.on('error', () => undefined);
    sess.on('close', () => closed());
  });
  server.on('stream', (s, h) => {
    s.on('error', () => undefined);
    serve(s, h);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  o.port = (server.address() as net.AddressInfo).port;
  px.route(o.port);
  return o;
}

const session = (o: Origin): Promise<ClientHttp2Session> => h2Through(px.handle.port, HOST, o.port, px.caPem);
const get = (s: ClientHttp2Session, o: Origin, path = '/') => h2Request(s, { ':path': path, ':authority': `${HOST}:${o.port}` });

describe('HTTP/2 upstream: sessions', () => {
  it('streams share one session; the rule header is injected on each', async () => {
    const seen: string[] = [];
    const o = await h2Origin((s, h) => {
      seen.push(String(h['x-key']));
      s.respond({ ':status': 200 });
      s.end('ok');
    });
    const c = await session(o);
    try {
      const answers = await Promise.all(Array.from({ length: 8 }, () => get(c, o)));
      expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200));
      expect(seen).toEqual(Array(8).fill(INJECTED));
      expect(o.sessions).toBe(1);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it("the peer's SETTINGS_MAX_CONCURRENT_STREAMS is respected: every request is served, none refused", async () => {
    let open = 0;
    let most = 0;
    const o = await h2Origin(
      (s) => {
        open++;
        most = Math.max(most, open);
        s.on('close', () => open--);
        s.respond({ ':status': 200 });
        setTimeout(() => s.end('ok'), 30);
      },
      { maxConcurrentStreams: 1 },
    );
    const c = await session(o);
    try {
      // One first, so the proxy has the origin's SETTINGS before the burst.
      expect((await get(c, o)).status).toBe(200);
      const answers = await Promise.all(Array.from({ length: 6 }, () => get(c, o)));
      expect(answers.map((a) => `${a.status} ${a.body}`), JSON.stringify(answers.map((a) => [a.status, a.body.slice(0, 120), a.rstCode]))).toEqual(Array(6).fill('200 ok'));
      // Never two streams on one session at the origin (a second session may carry one).
      expect(most).toBeLessThanOrEqual(o.sessions);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('after a GOAWAY the next request goes on a new session', async () => {
    const o = await h2Origin((s) => {
      s.respond({ ':status': 200 });
      // GOAWAY before the answer's END_STREAM: the proxy has it before the client can ask again.
      s.session?.goaway(http2.constants.NGHTTP2_NO_ERROR, s.id);
      s.end('ok');
    });
    const c = await session(o);
    try {
      expect((await get(c, o)).status).toBe(200);
      expect((await get(c, o)).status).toBe(200);
      expect(o.sessions).toBe(2);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('repeated answer fields reach the client, each value', async () => {
    const o = await h2Origin((s) => {
      s.respond({ ':status': 200, 'x-a': ['1', '2'], 'set-cookie': ['a=1', 'b=2'] });
      s.end();
    });
    const c = await session(o);
    try {
      const a = await get(c, o);
      expect(a.status).toBe(200);
      expect(a.headers['x-a']).toBe('1, 2');
      expect(a.headers['set-cookie']).toEqual(['a=1', 'b=2']);
    } finally {
      c.destroy();
      o.close();
    }
  });
});

describe('HTTP/2 upstream: the egress policy changes', () => {
  const config = (access_control: Record<string, unknown>) => compileConfig({ no_proxy: [], access_control, rules: [{ name: 'fast', match_hosts: [HOST, OTHER], headers: [{ name: 'X-Key', value: INJECTED }] }] });

  /**
   * An origin behind a gate: a TCP relay that passes connections through until `shut`, then
   * holds new ones until `open`, so the proxy's dial of another session waits.
   */
  async function gatedOrigin(): Promise<{ o: Origin; port: number; shut(): void; open(): void; close(): void }> {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const o = await h2Origin(
      (s, h) => {
        s.respond({ ':status': 200 });
        if (h[':path'] === '/hold') void held.then(() => s.end('held'));
        else s.end(`ok ${String(h['x-key'])}`);
      },
      { maxConcurrentStreams: 1 },
    );
    const gate = await tcpGate(o.port);
    px.route(gate.port);
    return {
      o,
      port: gate.port,
      shut: () => gate.shut(),
      open: () => {
        gate.open();
        release();
      },
      close: () => {
        gate.close();
        o.close();
      },
    };
  }

  it.each([
    ['still allows the origin: it is served (not a 502 for a pool closed under it)', { deny_hosts: ['denied.example'] }, 200],
    ['denies the origin now: it is refused (403), never sent', 'port', 403],
  ] as const)('a request waiting for a session is dialled again when the new policy %s', async (_name, policy, status) => {
    const g = await gatedOrigin();
    const at = { ...g.o, port: g.port };
    const c = await session(at);
    const before = px.handle.getConfig();
    try {
      // The origin's SETTINGS first, so the proxy knows one stream is all a session takes.
      expect((await get(c, at, '/warm')).status).toBe(200);
      const first = get(c, at, '/hold');
      await new Promise((r) => setTimeout(r, 100));
      g.shut();
      // No room on the session: the proxy dials a second one, which the gate holds.
      const waiting = get(c, at, '/next');
      await new Promise((r) => setTimeout(r, 100));
      px.handle.setConfig(config(policy === 'port' ? { deny_ports: [g.port] } : policy));
      setTimeout(() => g.open(), 100);
      const next = await waiting;
      expect(next.status, next.body).toBe(status);
      if (status === 200) expect(next.body).toBe(`ok ${INJECTED}`);
      else expect(String(next.headers['proxy-status'])).toContain('http_request_denied');
      // The stream opened before the change finishes on its session where the new policy allows
      // the origin, and is cut where it denies it.
      const held = await first;
      if (status === 200) expect(held.body).toBe('held');
      else expect(held.rstCode).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
    } finally {
      g.open();
      px.handle.setConfig(before);
      c.destroy();
      g.close();
    }
  });
});

describe('HTTP/2 upstream: a stream under way when the egress policy denies its origin', () => {
  it('is cut (RST_STREAM INTERNAL_ERROR to the client), not left to run under the old policy', async () => {
    const o = await h2Origin((s) => {
      s.respond({ ':status': 200 });
      s.write('event 1');
      // ... and nothing more: a long stream (gRPC, server-sent events).
    });
    const c = await session(o);
    const keep = px.handle.getConfig();
    try {
      const req = c.request({ ':path': '/stream', ':authority': `${HOST}:${o.port}` });
      req.on('error', () => undefined);
      await new Promise<void>((resolve) => req.once('data', () => resolve()));
      const closed = new Promise<number>((r) => req.once('close', () => r(req.rstCode ?? 0)));
      px.handle.setConfig(compileConfig({ no_proxy: [], access_control: { deny_ports: [o.port] }, rules: [{ name: 'fast', match_hosts: [HOST, OTHER], headers: [{ name: 'X-Key', value: INJECTED }] }] }));
      expect(await closed).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
    } finally {
      px.handle.setConfig(keep);
      c.destroy();
      o.close();
    }
  });
});

describe('HTTP/2 upstream: the client going away cancels the upstream stream', () => {
  it('mid-answer: the origin sees RST_STREAM(CANCEL)', async () => {
    let closed!: (code: number) => void;
    const originClosed = new Promise<number>((r) => (closed = r));
    const o = await h2Origin((s) => {
      s.on('close', () => closed(s.rstCode ?? -1));
      s.respond({ ':status': 200 });
      pumpChunks(s, Buffer.alloc(16 * 1024, 'x'));
    });
    const c = await session(o);
    try {
      const req = c.request({ ':path': '/big', ':authority': `${HOST}:${o.port}` });
      req.on('error', () => undefined);
      await new Promise<void>((resolve) => {
        let got = 0;
        req.on('data', (d: Buffer) => {
          got += d.length;
          if (got > 64 * 1024) resolve();
        });
      });
      req.close(http2.constants.NGHTTP2_CANCEL);
      expect(await originClosed).toBe(http2.constants.NGHTTP2_CANCEL);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('mid-upload: the origin sees RST_STREAM, never the end of a truncated body', async () => {
    let closed!: (v: { code: number; bytes: number; endStream: boolean }) => void;
    const originClosed = new Promise<{ code: number; bytes: number; endStream: boolean }>((r) => (closed = r));
    let gotSome!: () => void;
    const originGotSome = new Promise<void>((r) => (gotSome = r));
    const o = await h2Origin((s) => {
      let bytes = 0;
      // Node ends the readable side on END_STREAM and on a reset alike; only after END_STREAM is
      // the stream still open then (the same test as src/proxy/h2/upstream.ts's).
      let endStream = false;
      s.on('data', (d: Buffer) => {
        bytes += d.length;
        gotSome();
      });
      s.on('end', () => (endStream = !s.closed));
      s.on('close', () => closed({ code: s.rstCode ?? -1, bytes, endStream }));
    });
    const c = await session(o);
    try {
      const req = c.request({ ':method': 'POST', ':path': '/upload', ':authority': `${HOST}:${o.port}` });
      req.on('error', () => undefined);
      req.write(Buffer.alloc(1024, 'u'));
      await originGotSome;
      // destroy(), not close(): Node's close() of a stream still open for writing sends END_STREAM
      // first (a complete body); destroy() resets it (RST_STREAM(INTERNAL_ERROR), no END_STREAM).
      req.destroy(new Error('client gone'));
      const end = await originClosed;
      // Reset with the body left open: INTERNAL_ERROR (Node's close(CANCEL) would end the body first).
      expect(end.endStream).toBe(false);
      expect(end.code).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
      expect(end.bytes).toBe(1024);
    } finally {
      c.destroy();
      o.close();
    }
  });
});

describe('HTTP/2 upstream: the upstream clocks (response header and idle timeouts, keep-alive)', () => {
  let short: TestProxy;
  beforeAll(async () => {
    short = await startTestProxy(pki, { limits: { responseHeaderTimeoutMs: 300, responseIdleTimeoutMs: 300, keepAliveTimeoutMs: 300 } });
  });
  afterAll(async () => {
    await short?.close();
  });

  async function originFor(serve: (s: ServerHttp2Stream) => void): Promise<Origin> {
    const o = await h2Origin(serve);
    short.route(o.port);
    return o;
  }

  it('no answer head in time: the proxy answers 504', async () => {
    const o = await originFor(() => undefined);
    const c = await h2Through(short.handle.port, HOST, o.port, short.caPem);
    try {
      const a = await h2Request(c, { ':path': '/', ':authority': `${HOST}:${o.port}` });
      expect(a.status).toBe(504);
      expect(a.headers['proxy-status']).toMatch(/^keygate; error=http_response_timeout/);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('an answer that stalls after its head is cut', async () => {
    const o = await originFor((s) => {
      s.respond({ ':status': 200 });
      s.write('hello');
    });
    const c = await h2Through(short.handle.port, HOST, o.port, short.caPem);
    try {
      const a = await h2Request(c, { ':path': '/', ':authority': `${HOST}:${o.port}` });
      expect(a.status).toBe(200);
      expect(a.rstCode).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('an idle session is closed by the proxy after the keep-alive limit', async () => {
    const o = await originFor((s) => {
      s.respond({ ':status': 200 });
      s.end('ok');
    });
    const c = await h2Through(short.handle.port, HOST, o.port, short.caPem);
    try {
      expect((await h2Request(c, { ':path': '/', ':authority': `${HOST}:${o.port}` })).status).toBe(200);
      // The client's own connection stays open; the proxy's upstream session closes on its own.
      await o.sessionClosed;
      expect(o.sessions).toBe(1);
    } finally {
      c.destroy();
      o.close();
    }
  });
});
