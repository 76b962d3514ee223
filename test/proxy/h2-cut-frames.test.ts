/**
 * An answer the proxy cuts toward an HTTP/2 client (forward.ts `cut`) ends with RST_STREAM and
 * never with END_STREAM first: a client that sees END_STREAM has a complete answer, whatever
 * follows. Read frame by frame from the wire (test/proxy/h2-raw.ts), since Node's own client
 * cannot show which came first.
 */
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { tunnelTls } from './h2-helpers.js';
import { converseH2, END_HEADERS, END_STREAM, frame, literalBlock } from './h2-raw.js';
import { HOST, INJECTED, startTestProxy, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
let h2Origin: http2.Http2SecureServer;
let h1Origin: tls.Server;
let h2Port = 0;
let h1Port = 0;
let px: TestProxy;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  // Answers with some body, then breaks: a reset with the answer's END_STREAM held back (trailers promised).
  h2Origin = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem });
  h2Origin.on('stream', (s) => {
    s.on('error', () => undefined);
    s.respond({ ':status': 200 }, { waitForTrailers: true });
    s.write('hello', () => setTimeout(() => s.close(http2.constants.NGHTTP2_INTERNAL_ERROR), 50));
  });
  // An HTTP/1.1 answer whose Content-Length is never reached.
  h1Origin = tls.createServer({ key: pki.keyPem, cert: pki.certPem, ALPNProtocols: ['http/1.1'] }, (s) => {
    s.on('error', () => undefined);
    s.once('data', () => s.write('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello', () => setTimeout(() => s.destroy(), 50)));
  });
  await new Promise<void>((r) => h2Origin.listen(0, '127.0.0.1', () => r()));
  await new Promise<void>((r) => h1Origin.listen(0, '127.0.0.1', () => r()));
  h2Port = (h2Origin.address() as net.AddressInfo).port;
  h1Port = (h1Origin.address() as net.AddressInfo).port;
  px = await startTestProxy(pki);
  px.route(h2Port);
  px.route(h1Port);
});

afterAll(async () => {
  await px?.close(200);
  h2Origin?.close();
  h1Origin?.close();
  // The rule's injected value never reaches the log, whatever broke.
  for (const p of [px]) expect(p?.log() ?? '').not.toContain(INJECTED);
});

describe('an answer cut toward an HTTP/2 client', () => {
  it.each(['HTTP/2', 'HTTP/1.1'] as const)('%s origin breaking mid-body: RST_STREAM on the wire, no END_STREAM before it', async (kind) => {
    const port = kind === 'HTTP/2' ? h2Port : h1Port;
    const s = await tunnelTls(px.handle.port, HOST, port, px.caPem, ['h2']);
    const head = literalBlock([[':method', 'GET'], [':scheme', 'https'], [':path', '/cut'], [':authority', `${HOST}:${port}`]]);
    const frames = await converseH2(s, [frame(0x1, END_HEADERS | END_STREAM, 1, head)], (f) => f.some((x) => x.stream === 1 && (x.type === 0x3 || (x.flags & END_STREAM) !== 0)), 5000);
    const mine = frames.filter((f) => f.stream === 1);
    const data = mine.filter((f) => f.type === 0x0).reduce((n, f) => n + f.payload.length, 0);
    expect(data).toBe(5);
    const ended = mine.find((f) => (f.type === 0x0 || f.type === 0x1) && (f.flags & END_STREAM) !== 0);
    expect(ended, `END_STREAM reached the client: ${JSON.stringify(mine.map((f) => [f.type, f.flags]))}`).toBeUndefined();
    const rst = mine.find((f) => f.type === 0x3);
    expect(rst?.payload.readUInt32BE(0)).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
  });
});
