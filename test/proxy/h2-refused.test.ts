/**
 * An HTTP/2 origin that did not process a stream (RFC 9113 8.7: REFUSED_STREAM, or a GOAWAY whose
 * last stream id is below it) said the request may be retried. keygate's HTTP/2 client sends
 * such a request again once, with its body whole when all that was read of it is kept (the first
 * 64 KiB: src/proxy/h2/replay.ts); otherwise the client gets the proxy's 502. Before, every such
 * request was a 502, and later every one with a body: each origin restart or connection
 * recycling (nginx's `keepalive_requests`) showed up as failed requests. A hand-written origin,
 * since node:http2 servers do not refuse on demand; real HTTP/2 clients through the proxy.
 */
import type http2 from 'node:http2';
import type net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { h2Request, h2Through } from './h2-helpers.js';
import { END_HEADERS, END_STREAM, frame, literalBlock, rawH2Server } from './h2-raw.js';
import { HOST, INJECTED, startTestProxy, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
let px: TestProxy;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  px = await startTestProxy(pki);
});
afterAll(async () => {
  await px?.close(200);
  expect(px?.log() ?? '').not.toContain(INJECTED);
});

/** What the origin does with a stream: refuse it at once, refuse it once more than 70,000 bytes of its body came, or answer. */
type Refusal = 'goaway' | 'rst' | 'rst-late' | 'answer';

interface RawOrigin {
  port: number;
  /** Streams that arrived, per connection: `conn:stream:path`. */
  seen: string[];
  /** The body each answered stream received, by `conn:stream`. */
  bodies: Map<string, Buffer>;
  connections: number;
  close(): void;
}

/** An HTTP/2 origin whose connection `conn` treats its `nth` stream (from 0) as `plan` says. */
async function rawOrigin(plan: (conn: number, nth: number) => Refusal): Promise<RawOrigin> {
  const o: RawOrigin = { port: 0, seen: [], bodies: new Map(), connections: 0, close: () => undefined };
  const streams = new Map<number, number>();
  /** Per `conn:stream`: what the plan said, and the body so far. */
  const open = new Map<string, { what: Refusal; body: Buffer[]; bytes: number }>();
  const refuse = (s: net.Socket, stream: number) => {
    const p = Buffer.alloc(4);
    p.writeUInt32BE(0x7, 0); // REFUSED_STREAM
    s.write(frame(0x3, 0, stream, p));
  };
  const answer = (s: net.Socket, stream: number, conn: number, body?: Buffer) => {
    if (body) o.bodies.set(`${conn}:${stream}`, body);
    const head = literalBlock([[':status', '200']]);
    const text = body ? `served on ${conn}: ${body.length} bytes` : `served on ${conn}`;
    s.write(Buffer.concat([frame(0x1, END_HEADERS, stream, head), frame(0x0, END_STREAM, stream, Buffer.from(text))]));
  };
  const server = await rawH2Server(
    pki,
    (s, stream, block, conn, endStream) => {
      o.connections = Math.max(o.connections, conn + 1);
      const nth = streams.get(conn) ?? 0;
      streams.set(conn, nth + 1);
      // The path, for the record (a literal the proxy's HPACK encoder may index: only its presence is checked).
      o.seen.push(`${conn}:${stream}:${block.includes('/with-body') ? 'body' : 'get'}`);
      const what = plan(conn, nth);
      if (what === 'goaway') {
        // Last processed stream: 0. This stream was not processed.
        s.write(frame(0x7, 0, 0, Buffer.alloc(8)));
        setTimeout(() => s.end(), 20);
      } else if (what === 'rst') refuse(s, stream);
      else if (endStream) answer(s, stream, conn);
      else open.set(`${conn}:${stream}`, { what, body: [], bytes: 0 });
    },
    (s, stream, payload, endStream, conn) => {
      const st = open.get(`${conn}:${stream}`);
      if (!st) return;
      st.body.push(payload);
      st.bytes += payload.length;
      if (st.what === 'rst-late' && st.bytes > 70_000) {
        open.delete(`${conn}:${stream}`);
        refuse(s, stream);
      } else if (endStream) {
        open.delete(`${conn}:${stream}`);
        answer(s, stream, conn, Buffer.concat(st.body));
      }
    },
  );
  o.port = (server.address() as net.AddressInfo).port;
  o.close = () => server.close();
  px.route(o.port);
  return o;
}

/** A POST whose body is written in `parts`, `gapMs` apart (so a refusal lands in the middle of it). */
function postInParts(c: http2.ClientHttp2Session, port: number, parts: Buffer[], gapMs: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve) => {
    const req = c.request({ ':method': 'POST', ':path': '/with-body', ':authority': `${HOST}:${port}` }, { endStream: false });
    const out = { status: 0, body: '' };
    req.on('response', (h) => (out.status = Number(h[':status'])));
    req.setEncoding('utf8');
    req.on('data', (d: string) => (out.body += d));
    req.on('error', () => undefined);
    req.on('close', () => resolve(out));
    let i = 0;
    const next = () => {
      if (i === parts.length) return void req.end();
      req.write(parts[i++]);
      setTimeout(next, gapMs);
    };
    next();
  });
}

describe('an HTTP/2 origin that did not process a stream', () => {
  it.each([
    ['a GOAWAY below the stream', 'goaway'],
    ['RST_STREAM REFUSED_STREAM', 'rst'],
  ] as const)('%s: a request without a body is sent again, once', async (_name, refusal) => {
    // Only the first stream is refused: after a GOAWAY the retry needs a new session; after a
    // refused stream the session goes on and takes it.
    const o = await rawOrigin((conn, nth) => (conn === 0 && nth === 0 ? refusal : 'answer'));
    const c = await h2Through(px.handle.port, HOST, o.port, px.caPem);
    try {
      const a = await h2Request(c, { ':path': '/', ':authority': `${HOST}:${o.port}` });
      const conn = refusal === 'goaway' ? '1' : '0';
      expect([a.status, a.body]).toEqual([200, `served on ${conn}`]);
      expect(o.seen.map((x) => x.split(':').slice(0, 2).join(':'))).toEqual(refusal === 'goaway' ? ['0:1', '1:1'] : ['0:1', '0:3']);
      expect(px.records.at(-1)!.status).toBe(200);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('refused again on the retry: the 502, not a third attempt', async () => {
    const o = await rawOrigin(() => 'rst');
    const c = await h2Through(px.handle.port, HOST, o.port, px.caPem);
    try {
      const a = await h2Request(c, { ':path': '/', ':authority': `${HOST}:${o.port}` });
      expect(a.status).toBe(502);
      expect(o.seen).toHaveLength(2);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it.each([
    ['a GOAWAY below the stream', 'goaway'],
    ['RST_STREAM REFUSED_STREAM', 'rst'],
  ] as const)('%s: a request with a body is sent again, once, its body whole', async (_name, refusal) => {
    const o = await rawOrigin((conn, nth) => (conn === 0 && nth === 0 ? refusal : 'answer'));
    const c = await h2Through(px.handle.port, HOST, o.port, px.caPem);
    try {
      // Eight parts, 30 ms apart: the refusal comes while the body is still arriving.
      const parts = Array.from({ length: 8 }, (_, i) => Buffer.from(`part ${i} `.repeat(100)));
      const a = await postInParts(c, o.port, parts, 30);
      const whole = Buffer.concat(parts);
      const conn = refusal === 'goaway' ? 1 : 0;
      expect([a.status, a.body]).toEqual([200, `served on ${conn}: ${whole.length} bytes`]);
      expect(o.seen).toHaveLength(2);
      expect([...o.bodies.values()].map((b) => b.equals(whole))).toEqual([true]);
      expect(px.records.at(-1)).toMatchObject({ status: 200, bytes_in: whole.length });
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('a body read past what is kept (64 KiB) when the refusal comes: not sent again, 502', async () => {
    const o = await rawOrigin((conn, nth) => (conn === 0 && nth === 0 ? 'rst-late' : 'answer'));
    const c = await h2Through(px.handle.port, HOST, o.port, px.caPem);
    try {
      const parts = Array.from({ length: 16 }, () => Buffer.alloc(16 * 1024, 0x61));
      const a = await postInParts(c, o.port, parts, 5);
      expect(a.status).toBe(502);
      expect(o.seen).toHaveLength(1);
    } finally {
      c.destroy();
      o.close();
    }
  });

  it('a request with a body refused twice: the 502, not a third attempt', async () => {
    const o = await rawOrigin(() => 'rst');
    const c = await h2Through(px.handle.port, HOST, o.port, px.caPem);
    try {
      const a = await postInParts(c, o.port, [Buffer.from('one '), Buffer.from('two')], 30);
      expect(a.status).toBe(502);
      expect(o.seen).toHaveLength(2);
    } finally {
      c.destroy();
      o.close();
    }
  });
});
