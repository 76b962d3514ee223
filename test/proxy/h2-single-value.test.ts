/**
 * Fields node:http2 carries once (src/proxy/h2/fields.ts SINGLE_VALUE), and `te: trailers`, on
 * the HTTP/2 client's leg. Before: a request repeating such a field was a 502 blaming the origin;
 * an answer repeating one (HTTP/1.1 or HTTP/2 origin) left the client's stream hanging until an
 * idle clock reset it; a trailer repeating one threw as the answer ended; and `te: trailers`
 * never reached an HTTP/2 origin (gRPC servers check it to detect proxies that lose trailers).
 * Real origins on loopback with the test CA; hand-built frames where Node's own HTTP/2 peers
 * refuse to send what is tested.
 */
import http2 from 'node:http2';
import type net from 'node:net';
import type tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { h2Request, h2Through, tunnelTls } from './h2-helpers.js';
import { converseH2, END_HEADERS, END_STREAM, frame, literalBlock, outcome, rawH2Server, statusOf } from './h2-raw.js';
import { HOST, INJECTED, lengthResponse, startScriptedOrigin, startTestProxy, type ScriptedOrigin, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
let px: TestProxy;
/** An HTTP/2 origin: answers with what it received (`te`, user-agent, the injected key) as JSON. */
let h2Origin: http2.Http2SecureServer;
let h2Port = 0;
let h2Streams = 0;
/** An HTTP/1.1 origin: the answer each path names. */
let h1: ScriptedOrigin;
/** An HTTP/2 origin written frame by frame: its answer repeats content-type (node:http2 cannot send that). */
let rawH2: tls.Server;
let rawH2Port = 0;

const ANSWERS: Record<string, Buffer> = {
  '/echo': Buffer.alloc(0),
  '/two-types': lengthResponse('hello', ['Content-Type: text/plain', 'Content-Type: text/html']),
  '/two-dates': lengthResponse('hello', ['Date: Fri, 27 Nov 2026 10:00:00 GMT', 'date: Fri, 27 Nov 2026 10:00:01 GMT']),
  '/trailers': Buffer.from('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: ETag\r\n\r\n5\r\nhello\r\n0\r\nETag: "1"\r\nETag: "2"\r\n\r\n', 'latin1'),
  '/one-trailer': Buffer.from('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: ETag\r\n\r\n5\r\nhello\r\n0\r\nETag: "1"\r\n\r\n', 'latin1'),
};

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  px = await startTestProxy(pki);
  h2Origin = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem });
  h2Origin.on('stream', (s, h) => {
    h2Streams++;
    s.on('error', () => undefined);
    s.respond({ ':status': 200, 'content-type': 'application/json' });
    s.end(JSON.stringify({ te: h.te ?? null, ua: h['user-agent'] ?? null, key: h['x-key'] ?? null }));
  });
  await new Promise<void>((r) => h2Origin.listen(0, '127.0.0.1', () => r()));
  h2Port = (h2Origin.address() as net.AddressInfo).port;
  h1 = await startScriptedOrigin(pki, (req, s) => {
    if (req.path === '/echo') s.write(lengthResponse(JSON.stringify(req.headers.map(([n]) => n.toLowerCase()))));
    else s.write(ANSWERS[req.path] ?? lengthResponse('?', [], '404 Not Found'));
  });
  rawH2 = await rawH2Server(pki, (s, stream) => {
    const block = literalBlock([[':status', '200'], ['content-type', 'text/plain'], ['content-type', 'text/html']]);
    s.write(Buffer.concat([frame(0x1, END_HEADERS, stream, block), frame(0x0, END_STREAM, stream, Buffer.from('hello'))]));
  });
  rawH2Port = (rawH2.address() as net.AddressInfo).port;
  for (const port of [h2Port, h1.port, rawH2Port]) px.route(port);
});

afterAll(async () => {
  await px?.close(200);
  h2Origin?.close();
  rawH2?.close();
  await h1?.close();
  expect(px?.log() ?? '').not.toContain(INJECTED);
});

const get = (s: http2.ClientHttp2Session, port: number, path: string, extra: http2.OutgoingHttpHeaders = {}) => h2Request(s, { ':path': path, ':authority': `${HOST}:${port}`, ...extra });

describe('te: trailers', () => {
  it('reaches an HTTP/2 origin when the client sent it, and only then', async () => {
    const c = await h2Through(px.handle.port, HOST, h2Port, px.caPem);
    try {
      const asked = await get(c, h2Port, '/', { te: 'trailers' });
      expect(asked.status).toBe(200);
      expect(JSON.parse(asked.body)).toEqual({ te: 'trailers', ua: null, key: INJECTED });
      const not = await get(c, h2Port, '/');
      expect(JSON.parse(not.body).te).toBeNull();
    } finally {
      c.destroy();
    }
  });

  it('is not sent to an HTTP/1.1 origin (TE there must be named in Connection, which is the proxy pool\'s own)', async () => {
    const c = await h2Through(px.handle.port, HOST, h1.port, px.caPem);
    try {
      // Twice: the first request finds out the origin speaks HTTP/1.1, the second goes to the pool directly.
      for (let i = 0; i < 2; i++) {
        const a = await get(c, h1.port, '/echo', { te: 'trailers' });
        expect(a.status).toBe(200);
        const names = JSON.parse(a.body) as string[];
        expect(names).not.toContain('te');
        expect(names).toContain('x-key');
      }
    } finally {
      c.destroy();
    }
  });
});

describe('a field that takes one value, twice', () => {
  it('in an HTTP/2 request: 400 from the proxy, nothing reaches the origin', async () => {
    const before = h2Streams;
    const s = await tunnelTls(px.handle.port, HOST, h2Port, px.caPem, ['h2']);
    const head = literalBlock([[':method', 'GET'], [':scheme', 'https'], [':path', '/'], [':authority', `${HOST}:${h2Port}`], ['user-agent', 'one'], ['user-agent', 'two']]);
    const frames = await converseH2(s, [frame(0x1, END_HEADERS | END_STREAM, 1, head)], (f) => f.some((x) => x.stream === 1 && (x.flags & END_STREAM) !== 0), 5000);
    const o = outcome(frames);
    expect(statusOf(o.headers)).toBe(400);
    const body = Buffer.concat(frames.filter((f) => f.type === 0x0 && f.stream === 1).map((f) => f.payload)).toString();
    expect(body).toBe('more than one user-agent field in an HTTP/2 request (it takes one value)\n');
    expect(h2Streams).toBe(before);
    const rec = px.records.at(-1)!;
    expect([rec.status, rec.error]).toEqual([400, 'more than one user-agent field in an HTTP/2 request (it takes one value)']);
  });

  it.each([
    ['an HTTP/1.1 origin, Content-Type', 'h1', '/two-types', 'content-type'],
    ['an HTTP/1.1 origin, Date (names in two cases)', 'h1', '/two-dates', 'date'],
    ['an HTTP/2 origin, Content-Type', 'raw', '/', 'content-type'],
  ] as const)('in an answer from %s: a prompt 502 to the HTTP/2 client, not a stream left hanging', async (_name, which, path, field) => {
    const port = which === 'h1' ? h1.port : rawH2Port;
    const c = await h2Through(px.handle.port, HOST, port, px.caPem);
    try {
      const started = Date.now();
      const a = await get(c, port, path);
      expect(Date.now() - started).toBeLessThan(5000);
      expect(a.status).toBe(502);
      expect(a.rstCode).toBe(0);
      expect(a.body).toBe(`upstream ${HOST} sent an invalid response (more than one ${field} field, which HTTP/2 carries once)\n`);
      expect(String(a.headers['proxy-status'])).toContain('error=http_protocol_error');
      // Only the proxy's own fields: nothing the origin sent went out with the error.
      expect(a.headers['content-type']).toBe('text/plain; charset=utf-8');
      const rec = px.records.at(-1)!;
      expect(rec.status).toBe(502);
      // The session goes on: the next request on it is served.
      if (which === 'h1') expect((await get(c, port, '/one-trailer')).status).toBe(200);
    } finally {
      c.destroy();
    }
  });

  it('an HTTP/1.1 client is not affected: its fast path relays both values, as the origin sent them', async () => {
    const t = await px.connect(h1.port);
    try {
      const answer = await new Promise<string>((resolve) => {
        let got = '';
        t.on('data', (d: Buffer) => {
          got += d.toString('latin1');
          if (got.endsWith('hello')) resolve(got);
        });
        t.write(`GET /two-types HTTP/1.1\r\nHost: ${HOST}:${h1.port}\r\n\r\n`);
      });
      expect(answer).toMatch(/^HTTP\/1\.1 200 /);
      expect(answer).toContain('Content-Type: text/plain\r\nContent-Type: text/html\r\n');
    } finally {
      t.destroy();
    }
  });

  it('in a trailer section: the HTTP/2 client\'s stream is cut (INTERNAL_ERROR), never ended as complete', async () => {
    const c = await h2Through(px.handle.port, HOST, h1.port, px.caPem);
    try {
      const good = await get(c, h1.port, '/one-trailer', { te: 'trailers' });
      expect([good.status, good.body, good.trailers.etag, good.rstCode]).toEqual([200, 'hello', '"1"', 0]);
      const a = await get(c, h1.port, '/trailers', { te: 'trailers' });
      expect(a.status).toBe(200);
      expect(a.rstCode).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
      expect(a.trailers.etag).toBeUndefined();
      expect(px.records.at(-1)!.error).toBe('upstream sent a trailer section HTTP/2 cannot carry');
    } finally {
      c.destroy();
    }
  });
});
