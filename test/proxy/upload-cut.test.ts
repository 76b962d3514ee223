/**
 * A request body the client breaks off must never reach the origin as a complete one: the proxy
 * must not end the upstream request (no last chunk, no END_STREAM) for a body it did not get whole.
 */
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { tunnelTls } from './h2-helpers.js';
import { END_HEADERS, PREFACE, frame, literalBlock } from './h2-raw.js';
import { HOST, INJECTED, request, startTestProxy, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
let h1Origin: https.Server;
let h2Origin: http2.Http2SecureServer;
let h1Port = 0;
let h2Port = 0;
let fast: TestProxy;
let node: TestProxy;
/** What each origin saw of each upload: 'complete:<bytes>' or 'broken:<bytes>'. */
const seen = new Map<string, string>();

function record(id: string, req: NodeJS.ReadableStream & { on(e: string, f: (...a: unknown[]) => void): unknown }): void {
  let n = 0;
  let ended = false;
  req.on('data', (d: unknown) => (n += (d as Buffer).length));
  req.on('end', () => (ended = true));
  req.on('close', () => seen.set(id, `${ended ? 'complete' : 'broken'}:${n}`));
  req.on('error', () => undefined);
}

/**
 * The same for an HTTP/2 origin's stream. Node ends a stream's readable side on END_STREAM and
 * on a reset alike; at that moment the stream is still open after END_STREAM and already closed
 * after a reset (src/proxy/h2/upstream.ts relies on the same). An application would act on the
 * first: 'complete' means the body ended with END_STREAM, whatever followed.
 */
function recordH2(id: string, stream: http2.ServerHttp2Stream): void {
  let n = 0;
  let ended = false;
  stream.on('data', (d: Buffer) => (n += d.length));
  stream.on('end', () => (ended = !stream.closed));
  stream.on('close', () => seen.set(id, `${ended ? 'complete' : 'broken'}:${n}`));
  stream.on('error', () => undefined);
}

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  h1Origin = https.createServer({ key: pki.keyPem, cert: pki.certPem }, (req, res) => {
    record(String(req.url), req);
    req.on('end', () => res.end('ok'));
  });
  h2Origin = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem });
  h2Origin.on('stream', (stream, headers) => {
    recordH2(String(headers[':path']), stream);
    stream.on('end', () => {
      if (!stream.closed) stream.respond({ ':status': 200 }, { endStream: true });
    });
  });
  await new Promise<void>((r) => h1Origin.listen(0, '127.0.0.1', () => r()));
  await new Promise<void>((r) => h2Origin.listen(0, '127.0.0.1', () => r()));
  h1Port = (h1Origin.address() as net.AddressInfo).port;
  h2Port = (h2Origin.address() as net.AddressInfo).port;
  fast = await startTestProxy(pki);
  fast.route(h1Port);
  fast.route(h2Port);
  node = await startTestProxy(pki, { fastPath: false });
  node.route(h1Port);
});

afterAll(async () => {
  for (const p of [fast, node]) await p?.close(200);
  h1Origin?.close();
  h2Origin?.close();
  // The rule's injected value never reaches the log, whatever broke.
  for (const p of [fast, node]) expect(p?.log() ?? '').not.toContain(INJECTED);
});

async function until(id: string): Promise<string> {
  const deadline = Date.now() + 10_000;
  while (!seen.has(id) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  return seen.get(id) ?? 'nothing';
}

describe('a request body the client breaks off', () => {
  const CODES: [string, number][] = [
    ['NO_ERROR', http2.constants.NGHTTP2_NO_ERROR],
    ['CANCEL', http2.constants.NGHTTP2_CANCEL],
    ['INTERNAL_ERROR', http2.constants.NGHTTP2_INTERNAL_ERROR],
  ];
  it.each(CODES.flatMap(([name, code]) => (['HTTP/1.1', 'HTTP/2'] as const).map((origin) => [name, origin, code] as const)))(
    'HTTP/2 client resetting its stream (%s) mid-upload, %s origin: never a complete upload',
    async (name, origin, code) => {
      const port = origin === 'HTTP/2' ? h2Port : h1Port;
      const id = `/h2-${name}-${port}`;
      // Frames written by hand: Node's own client ends the body (END_STREAM) before a reset it is asked for.
      const s = await tunnelTls(fast.handle.port, HOST, port, fast.caPem, ['h2']);
      s.on('error', () => undefined);
      try {
        const head = literalBlock([[':method', 'POST'], [':scheme', 'https'], [':path', id], [':authority', `${HOST}:${port}`]]);
        s.write(Buffer.concat([PREFACE, frame(0x4, 0, 0), frame(0x1, END_HEADERS, 1, head), frame(0x0, 0, 1, Buffer.alloc(1000, 97))]));
        await new Promise((r) => setTimeout(r, 200));
        const rst = Buffer.alloc(4);
        rst.writeUInt32BE(code);
        s.write(frame(0x3, 0, 1, rst));
        expect(await until(id)).toMatch(/^broken:/);
      } finally {
        s.destroy();
      }
    },
  );

  it.each([
    ['fast', 'chunked', 'leaving'],
    ['node', 'chunked', 'leaving'],
    ['fast', 'chunked', 'half-closing'],
    ['node', 'chunked', 'half-closing'],
    ['fast', 'length', 'leaving'],
    ['node', 'length', 'leaving'],
    ['fast', 'length', 'half-closing'],
    ['node', 'length', 'half-closing'],
  ] as const)('HTTP/1.1 client (%s path, %s body) %s mid-upload: never a complete upload', async (path, framing, how) => {
    const px = path === 'fast' ? fast : node;
    const id = `/h1-${path}-${framing}-${how}`;
    const c = await px.connect(h1Port);
    c.on('error', () => undefined);
    if (framing === 'chunked') {
      c.write(request('POST', id, `${HOST}:${h1Port}`, [['Transfer-Encoding', 'chunked']]));
      c.write('3e8\r\n' + 'a'.repeat(1000) + '\r\n');
    } else {
      c.write(request('POST', id, `${HOST}:${h1Port}`, [['Content-Length', '2000']]));
      c.write('a'.repeat(1000));
    }
    await new Promise((r) => setTimeout(r, 200));
    if (how === 'leaving') c.destroy();
    else c.end();
    expect(await until(id)).toMatch(/^broken:/);
    c.destroy();
  });
});
