/**
 * An HTTP/2 origin that did not process a stream (RFC 9113 8.7: REFUSED_STREAM, or a GOAWAY whose
 * last stream id is below it) said the request may be retried. keygate's HTTP/2 client sends
 * such a request again once, on a new session, when nothing of it was read from the client (no
 * body); otherwise the client gets the proxy's 502. Before, every such request was a 502: each
 * origin restart or connection recycling showed up as failed requests. A hand-written origin,
 * since node:http2 servers do not refuse on demand; real HTTP/2 clients through the proxy.
 */
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

type Refusal = 'goaway' | 'rst' | 'answer';

interface RawOrigin {
  port: number;
  /** Streams that arrived, per connection: `conn:stream:path`. */
  seen: string[];
  connections: number;
  close(): void;
}

/** An HTTP/2 origin whose connection `conn` treats its `nth` stream (from 0) as `plan` says. */
async function rawOrigin(plan: (conn: number, nth: number) => Refusal): Promise<RawOrigin> {
  const o: RawOrigin = { port: 0, seen: [], connections: 0, close: () => undefined };
  const streams = new Map<number, number>();
  const server = await rawH2Server(pki, (s, stream, block, conn) => {
    o.connections = Math.max(o.connections, conn + 1);
    const nth = streams.get(conn) ?? 0;
    streams.set(conn, nth + 1);
    // The path, for the record (a literal the proxy's HPACK encoder may index: only its presence is checked).
    o.seen.push(`${conn}:${stream}:${block.includes('/with-body') ? 'body' : 'get'}`);
    const what = plan(conn, nth);
    if (what === 'goaway') {
      // Last processed stream: 0. This stream was not processed.
      const p = Buffer.alloc(8);
      s.write(frame(0x7, 0, 0, p));
      setTimeout(() => s.end(), 20);
    } else if (what === 'rst') {
      const p = Buffer.alloc(4);
      p.writeUInt32BE(0x7, 0); // REFUSED_STREAM
      s.write(frame(0x3, 0, stream, p));
    } else {
      const answer = literalBlock([[':status', '200']]);
      s.write(Buffer.concat([frame(0x1, END_HEADERS, stream, answer), frame(0x0, END_STREAM, stream, Buffer.from(`served on ${conn}`))]));
    }
  });
  o.port = (server.address() as net.AddressInfo).port;
  o.close = () => server.close();
  px.route(o.port);
  return o;
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

  it('a request with a body is not sent again (its body was read from the client): 502', async () => {
    const o = await rawOrigin((conn, nth) => (conn === 0 && nth === 0 ? 'rst' : 'answer'));
    const c = await h2Through(px.handle.port, HOST, o.port, px.caPem);
    try {
      const a = await h2Request(c, { ':method': 'POST', ':path': '/with-body', ':authority': `${HOST}:${o.port}` }, ['payload']);
      expect(a.status).toBe(502);
      expect(o.seen).toHaveLength(1);
    } finally {
      c.destroy();
      o.close();
    }
  });
});
