/**
 * An answer that comes before the request's body has all arrived (an early 413, 401 or 403 to an
 * upload): the client must learn that nobody reads the rest. On every path the answer goes back
 * whole, and then:
 * - HTTP/1.1 clients: `Connection: close` on the answer, and the connection ends after it, on the
 *   Node path as on the fast path (test/proxy/h1/fast-path.test.ts). Before, the Node path said
 *   keep-alive and read and dropped the rest of the upload for as long as the client sent it.
 * - HTTP/2 clients: RST_STREAM(NO_ERROR) once the answer (trailers included) is out (RFC 9113
 *   8.1), which tells the client to stop sending and keeps the answer. Before, the stream stayed
 *   open and the proxy took the client's upload for as long as it came.
 * An answer to a request whose body had ended keeps the connection or the stream as before.
 * A closing answer (this one, or a refusal) is not followed by a reset: the proxy ends its side
 * and goes on reading for a while, so a client still sending reads the answer. Before, the Node
 * path destroyed the connection once the answer was written, and a client that had not read it
 * yet got EPIPE and never the answer.
 * Real clients (raw TLS, node:http2) through the proxy to real origins on loopback.
 */
import http2 from 'node:http2';
import type net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { h2Through } from './h2-helpers.js';
import { closeBothExchanges, dialPlain, HOST, lengthResponse, Reader, request, startBothExchanges, startScriptedOrigin, startTestProxy, values, WS_HEADERS, type ScriptedOrigin, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
/** HTTP/1.1: answers /early as soon as the head and 1,000 bytes of body are in; echoes the rest once whole. */
let h1: ScriptedOrigin;
/** HTTP/1.1, hand-written: answers every request right after its head, reading no body. */
let h1Early: tls.Server;
let h1EarlyPort = 0;
/** HTTP/1.1, hand-written: closes every connection, unanswered, once a request head and some body are in. */
let h1Reset: tls.Server;
let h1ResetPort = 0;
/** HTTP/2: /early answers (with trailers) and /early-204 at once, reading no body; anything else answers once the body ended. */
let h2Origin: http2.Http2SecureServer;
let h2Port = 0;
let proxies: Record<'fast' | 'node', TestProxy>;
let h2Proxy: TestProxy;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  h1 = await startScriptedOrigin(pki, (req, s) => s.write(lengthResponse(`whole ${req.body.length}`)));
  h1Early = tls.createServer({ key: pki.keyPem, cert: pki.certPem }, (s) => {
    s.on('error', () => undefined);
    let head = '';
    s.on('data', (d: Buffer) => {
      if (head.includes('\r\n\r\n')) return;
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      // /bad-...: an answer no path relays (a reason phrase with a control byte), so the proxy answers instead.
      if (head.startsWith('POST /bad')) s.write('HTTP/1.1 200 O\x01K\r\nContent-Length: 2\r\n\r\nok', 'latin1');
      else s.write(lengthResponse('too large', [], '413 Payload Too Large'));
    });
  });
  await new Promise<void>((r) => h1Early.listen(0, '127.0.0.1', () => r()));
  h1EarlyPort = (h1Early.address() as net.AddressInfo).port;
  h1Reset = tls.createServer({ key: pki.keyPem, cert: pki.certPem }, (s) => {
    s.on('error', () => undefined);
    let seen = 0;
    s.on('data', (d: Buffer) => {
      seen += d.length;
      if (seen > 20_000) s.destroy();
    });
  });
  await new Promise<void>((r) => h1Reset.listen(0, '127.0.0.1', () => r()));
  h1ResetPort = (h1Reset.address() as net.AddressInfo).port;
  h2Origin = http2.createSecureServer({ key: pki.keyPem, cert: pki.certPem });
  h2Origin.on('stream', (s, h) => {
    s.on('error', () => undefined);
    if (h[':path'] === '/early') {
      s.respond({ ':status': 413, 'content-type': 'text/plain' }, { waitForTrailers: true });
      s.on('wantTrailers', () => s.sendTrailers({ 'x-reason': 'upload refused' }));
      s.end('too large');
      return;
    }
    if (h[':path'] === '/early-rst') {
      // What RFC 9113 8.1 suggests to a server: the whole answer, then RST_STREAM(NO_ERROR).
      s.respond({ ':status': 413 });
      s.end('too large', () => s.close(http2.constants.NGHTTP2_NO_ERROR));
      return;
    }
    if (h[':path'] === '/early-204') {
      s.respond({ ':status': 204 }, { endStream: true });
      return;
    }
    let n = 0;
    s.on('data', (d: Buffer) => (n += d.length));
    s.on('end', () => {
      s.respond({ ':status': 200 });
      s.end(`whole ${n}`);
    });
  });
  await new Promise<void>((r) => h2Origin.listen(0, '127.0.0.1', () => r()));
  h2Port = (h2Origin.address() as net.AddressInfo).port;
  proxies = await startBothExchanges(pki, h1.port);
  for (const p of Object.values(proxies)) for (const port of [h1EarlyPort, h1ResetPort]) p.route(port);
  h2Proxy = await startTestProxy(pki);
  for (const port of [h1.port, h1EarlyPort, h1ResetPort, h2Port]) h2Proxy.route(port);
});

afterAll(async () => {
  await h2Proxy?.close(200);
  await closeBothExchanges(proxies, h1);
  h1Early?.close();
  h1Reset?.close();
  h2Origin?.close();
});

/** Writes `chunk` every 10 ms until `stop()`; the bytes written so far. */
function keepSending(write: (b: Buffer) => void, chunk = Buffer.alloc(16 * 1024, 0x61)) {
  let sent = 0;
  const timer = setInterval(() => {
    write(chunk);
    sent += chunk.length;
  }, 10);
  return { stop: () => clearInterval(timer), sent: () => sent };
}

/** One 16 KiB piece of an upload in the given framing. */
function uploadPiece(framing: 'chunked' | 'length'): Buffer<ArrayBuffer> {
  const chunk = Buffer.alloc(16 * 1024, 0x61);
  return framing === 'chunked' ? Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]) : chunk;
}

describe.each(['fast', 'node'] as const)('HTTP/1.1 client, the %s exchange', (name) => {
  // A chunked upload takes the Node path even with the fast path on; a Content-Length one the fast path.
  const cases = [
    ['an answer before the chunked upload ended', () => h1EarlyPort, '/early', 'chunked', 413, 'too large'],
    ['an answer before the length upload ended', () => h1EarlyPort, '/early', 'length', 413, 'too large'],
    ['an origin that fails mid-upload (its 502)', () => h1ResetPort, '/reset', 'chunked', 502, undefined],
    ['an early answer the proxy does not relay (its 502)', () => h1EarlyPort, '/bad', 'chunked', 502, undefined],
  ] as const;
  it.each(cases)('%s: Connection: close, then the connection ends (the rest of the body has no reader)', async (_what, port, path, framing, status, body) => {
    const p = port();
    const c = new Reader(await proxies[name].connect(p));
    c.socket.write(request('POST', `${path}-${name}-${framing}`, `${HOST}:${p}`, [framing === 'chunked' ? ['Transfer-Encoding', 'chunked'] : ['Content-Length', String(1 << 30)]]));
    const sender = keepSending((b) => !c.socket.destroyed && c.socket.write(b), uploadPiece(framing));
    try {
      const r = await c.next('POST');
      expect(r.status).toBe(status);
      if (body) expect(r.body.toString()).toBe(body);
      expect(values(r.headers, 'connection')).toEqual(['close']);
      expect(await c.waitClosed(5000)).toBe(true);
    } finally {
      sender.stop();
      c.socket.destroy();
    }
  });

  it('an answer after the upload ended keeps the connection', async () => {
    const c = new Reader(await proxies[name].connect(h1.port));
    const r = await c.exchange(request('POST', `/whole-${name}`, `${HOST}:${h1.port}`, [['Transfer-Encoding', 'chunked']], '5\r\nhello\r\n0\r\n\r\n'), 'POST');
    expect(r.status).toBe(200);
    expect(r.body.toString()).toBe('whole 5');
    expect(values(r.headers, 'connection')).not.toContain('close');
    const again = await c.exchange(request('GET', `/again-${name}`, `${HOST}:${h1.port}`), 'GET');
    expect(again.status).toBe(200);
    c.socket.destroy();
  });
});

describe.each(['fast', 'node'] as const)('a client that reads only after a while, still sending (the %s exchange)', (name) => {
  const cases = [
    ['an early answer to a chunked upload', 'early', 'chunked', 413],
    ['an early answer to a Content-Length upload', 'early', 'length', 413],
    ['a refusal (Host names another authority) of a chunked upload', 'refused', 'chunked', 421],
    ['a refusal of a Content-Length upload', 'refused', 'length', 421],
  ] as const;
  it.each(cases)('%s: the answer is read, not a reset', async (_what, kind, framing, status) => {
    const t = await proxies[name].connect(h1EarlyPort);
    const body = uploadPiece(framing);
    const host = kind === 'refused' ? `other.test.local:${h1EarlyPort}` : `${HOST}:${h1EarlyPort}`;
    let error = '';
    t.on('error', (e: NodeJS.ErrnoException) => (error = e.code ?? e.message));
    // Not read (paused) while it sends: the answer waits in the client's socket.
    t.pause();
    t.write(request('POST', `/slow-${name}-${kind}-${framing}`, host, [framing === 'chunked' ? ['Transfer-Encoding', 'chunked'] : ['Content-Length', String(1 << 30)]]));
    const sender = keepSending((b) => !t.destroyed && t.write(b), body);
    await new Promise((r) => setTimeout(r, 400));
    const c = new Reader(t);
    t.resume();
    try {
      const r = await c.next('POST', 5000);
      expect(r.status).toBe(status);
      expect(values(r.headers, 'connection')).toEqual(['close']);
      expect(await c.waitClosed(5000)).toBe(true);
    } catch (e) {
      throw new Error(`${(e as Error).message} (client error: ${error || 'none'})`);
    } finally {
      sender.stop();
      t.destroy();
    }
  });
});

describe.each(['fast', 'node'] as const)('a client that never ends its side after a closing answer (the %s exchange)', (name) => {
  // The proxy's idle clock (keep_alive_timeout_ms) is 30 s here: a connection the proxy ended is
  // not left to it. Holding half-closed connections open would let a client keep a proxy's
  // sockets, TLS state and connection slots for as long as it likes by never sending its FIN.
  // A FIN looks the same to the client whether the proxy still holds the socket or closed it;
  // a byte sent now and then tells them apart: a closed socket answers it with a reset.
  const cases = [
    ["the client's Connection: close", 'GET', () => h1.port, [['Connection', 'close']], undefined, 200],
    ['an early answer to an upload', 'POST', () => h1EarlyPort, [['Content-Length', '100000']], 'x'.repeat(1000), 413],
    ['a refusal (Host names another authority)', 'GET', () => h1.port, [], undefined, 421],
    ['a WebSocket handshake the origin answered without switching', 'GET', () => h1.port, WS_HEADERS, undefined, 200],
  ] as const;
  it.each(cases)('%s: the proxy closes the connection within its linger, not at the idle clock', async (_what, method, port, headers, body, status) => {
    const p = port();
    const t = await proxies[name].connect(p);
    // A client that keeps its sending side open after the proxy's end (Node would end it).
    (t as tls.TLSSocket & { allowHalfOpen: boolean }).allowHalfOpen = true;
    const c = new Reader(t);
    const host = status === 421 ? `other.test.local:${p}` : `${HOST}:${p}`;
    t.write(request(method, `/hold-${name}-${status}`, host, headers.map(([k, v]) => [k, v] as [string, string]), body));
    let poke: NodeJS.Timeout | undefined;
    try {
      const r = await c.next(method);
      expect(r.status).toBe(status);
      expect(values(r.headers, 'connection')).toEqual(['close']);
      poke = setInterval(() => !t.destroyed && t.write('x'), 200);
      expect(await c.waitClosed(6000), 'closed within 6 s').toBe(true);
    } finally {
      clearInterval(poke);
      t.destroy();
    }
  });
});

describe.each(['fast', 'node'] as const)('a slow reader of a closing answer (the %s exchange)', (name) => {
  // The linger after a closing answer must not cut the answer itself: a client that reads slowly
  // still has the tail of its answer queued in the proxy when the exchange is over.
  it('gets the whole answer, however long after the exchange it reads the tail', async () => {
    const size = 16 << 20;
    const big = await startScriptedOrigin(pki, (_req, s) => s.write(lengthResponse(Buffer.alloc(size, 0x62))));
    try {
      proxies[name].route(big.port);
      const t = await proxies[name].connect(big.port);
      t.write(request('GET', `/big-${name}`, `${HOST}:${big.port}`, [['Connection', 'close']]));
      // Not read for 4 s: the proxy's exchange completes while the tail waits in its queue.
      t.pause();
      await new Promise((r) => setTimeout(r, 4000));
      let got = 0;
      let text = '';
      const done = new Promise<string>((resolve) => {
        t.on('data', (d: Buffer) => {
          if (text.length < 200) text += d.toString('latin1', 0, 200);
          got += d.length;
        });
        t.on('end', () => resolve('end'));
        t.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'));
      });
      t.resume();
      await done;
      expect(text).toMatch(/^HTTP\/1\.1 200 /);
      const headLength = text.indexOf('\r\n\r\n') + 4;
      expect(got - headLength).toBe(size);
    } finally {
      await big.close();
    }
  }, 20_000);
});

it("the proxy's plain listener: a refused absolute-form upload's answer is read by a client still sending, not a reset", async () => {
  const px = proxies.node;
  const t = await dialPlain(px);
  let error = '';
  t.on('error', (e: NodeJS.ErrnoException) => (error = e.code ?? e.message));
  t.pause();
  // The proxy's own address: never reachable through it (a closing 403).
  const target = `127.0.0.1:${px.handle.port}`;
  t.write(request('POST', `http://${target}/upload`, target, [['Transfer-Encoding', 'chunked']]));
  const sender = keepSending((b) => !t.destroyed && t.write(b), uploadPiece('chunked'));
  await new Promise((r) => setTimeout(r, 400));
  let got = '';
  t.on('data', (d: Buffer) => (got += d.toString('latin1')));
  const closed = new Promise<boolean>((resolve) => {
    t.once('close', () => resolve(true));
    setTimeout(() => resolve(false), 5000);
  });
  t.resume();
  try {
    expect(await closed).toBe(true);
    expect(got, `client error: ${error || 'none'}`).toMatch(/^HTTP\/1\.1 403 [^]*\r\nConnection: close\r\n/i);
  } finally {
    sender.stop();
    t.destroy();
  }
});

describe('HTTP/2 client', () => {
  /** POST on a new stream, sending until the stream closes; what the client saw. */
  async function earlyUpload(port: number, path: string, authority = `${HOST}:${port}`) {
    const s = await h2Through(h2Proxy.handle.port, HOST, port, h2Proxy.caPem);
    try {
      const req = s.request({ ':method': 'POST', ':path': path, ':authority': authority }, { endStream: false });
      const out = { status: 0, body: '', trailers: {} as http2.IncomingHttpHeaders, ended: false, rstCode: -1, closed: false };
      req.on('response', (h) => (out.status = Number(h[':status'])));
      req.on('trailers', (t) => (out.trailers = t));
      req.on('data', (d: Buffer) => (out.body += d.toString()));
      req.on('end', () => (out.ended = true));
      req.on('error', () => undefined);
      const sender = keepSending((b) => !req.destroyed && !req.writableEnded && req.write(b));
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 5000);
        req.on('close', () => {
          clearTimeout(timer);
          out.closed = true;
          out.rstCode = req.rstCode ?? -1;
          resolve();
        });
      });
      sender.stop();
      return out;
    } finally {
      s.destroy();
    }
  }

  it('an early answer from an HTTP/1.1 origin: the whole answer, then RST_STREAM(NO_ERROR)', async () => {
    const out = await earlyUpload(h1EarlyPort, '/early-h2-h1');
    expect(out).toMatchObject({ status: 413, body: 'too large', ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
  });

  it('an early answer with trailers from an HTTP/2 origin: the answer and its trailers, then RST_STREAM(NO_ERROR)', async () => {
    const out = await earlyUpload(h2Port, '/early');
    expect(out).toMatchObject({ status: 413, body: 'too large', ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
    expect(out.trailers['x-reason']).toBe('upload refused');
  });

  it("an HTTP/2 origin's own RST_STREAM(NO_ERROR) after its whole answer: the answer, not a cut", async () => {
    const out = await earlyUpload(h2Port, '/early-rst');
    expect(out).toMatchObject({ status: 413, body: 'too large', ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
  });

  it("the proxy's own refusal (an :authority other than the tunnel's) of an upload under way: the answer, then RST_STREAM(NO_ERROR)", async () => {
    const out = await earlyUpload(h2Port, '/refused', `other.test.local:${h2Port}`);
    expect(out).toMatchObject({ status: 421, ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
  });

  it('an origin that fails mid-upload: the 502, then RST_STREAM(NO_ERROR)', async () => {
    const out = await earlyUpload(h1ResetPort, '/reset-h2');
    expect(out).toMatchObject({ status: 502, ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
  });

  it('an early answer the proxy does not relay: its 502, then RST_STREAM(NO_ERROR)', async () => {
    const out = await earlyUpload(h1EarlyPort, '/bad-h2');
    expect(out).toMatchObject({ status: 502, ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
  });

  it('an early 204 (a head that ends the stream, no trailers to wait for): the answer, then RST_STREAM(NO_ERROR)', async () => {
    const out = await earlyUpload(h2Port, '/early-204');
    expect(out).toMatchObject({ status: 204, body: '', ended: true, closed: true, rstCode: http2.constants.NGHTTP2_NO_ERROR });
  });

  it('an answer after the upload ended, from either origin: the answer, and the connection serves the next stream', async () => {
    for (const port of [h1.port, h2Port]) {
      const s = await h2Through(h2Proxy.handle.port, HOST, port, h2Proxy.caPem);
      try {
        for (let i = 0; i < 2; i++) {
          const req = s.request({ ':method': 'POST', ':path': `/whole-${i}`, ':authority': `${HOST}:${port}` });
          let body = '';
          let status = 0;
          req.on('response', (h) => (status = Number(h[':status'])));
          req.on('data', (d: Buffer) => (body += d.toString()));
          req.end('hello');
          await new Promise((r) => req.on('close', r));
          expect({ status, body, rst: req.rstCode }).toEqual({ status: 200, body: 'whole 5', rst: http2.constants.NGHTTP2_NO_ERROR });
        }
      } finally {
        s.destroy();
      }
    }
  });
});
