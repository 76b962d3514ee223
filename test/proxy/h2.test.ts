/**
 * HTTP/2 through interception (issue #19): clients offering h2 get the HTTP/2 exchange, every
 * check of the data path applies per stream (421 for a misdirected `:authority` or `host`, path
 * normalisation on `:path`, the rule's headers replacing the client's), bodies and answers
 * stream both ways with trailers kept, and HTTP/1.1 clients (WebSocket included) are served on
 * the same host as before. The upstream here is an HTTP/1.1 origin.
 */
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import http2 from 'node:http2';
import https from 'node:https';
import path from 'node:path';
import { promisify } from 'node:util';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { memoryOf, spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import tls from 'node:tls';
import { connectTunnel, interceptedTls, rawExchange } from '../helpers/connect.js';
import { CONFIG, NAMES, OPAQUE, SECRET } from './fixture.js';
import { h2Request, h2Through, tunnelTls } from './h2-helpers.js';
import { converseH2, END_HEADERS, END_STREAM, frame, literalBlock, outcome, statusOf } from './h2-raw.js';
import { pumpChunks } from '../helpers/pump.js';

let pki: TestPki;
let origin: TestOrigin;
let trailerOrigin: https.Server;
let trailerPort: number;
/** How the origin's /big answers ended, by request target: 'finished' (all sent) or 'closed' (the proxy went away first). */
const bigEnds: string[] = [];
let proxy: SpawnedProxy;
const HOST = 'api.test.local';
const execFileAsync = promisify(execFile);

beforeAll(async () => {
  pki = await createTestPki([...NAMES, 'tr.test.local']);
  origin = await startOrigin(pki);
  // An HTTP/1.1 origin answering with trailers (chunked), and echoing what it got.
  trailerOrigin = https.createServer({ key: pki.keyPem, cert: pki.certPem }, (req, res) => {
    if (req.url?.startsWith('/big')) {
      // 96 MiB, written as fast as the proxy reads it (backpressure respected).
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.once('close', () => bigEnds.push(`${req.url} ${res.writableFinished ? 'finished' : 'closed'}`));
      pumpChunks(res, Buffer.alloc(64 * 1024, 'q'), 1536);
      return;
    }
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/plain', trailer: 'x-checksum' });
      res.write('part1;');
      res.addTrailers({ 'x-checksum': 'abc123' });
      res.end(`auth=${req.headers['authorization'] ?? ''}`);
    });
  });
  await new Promise<void>((r) => trailerOrigin.listen(0, '127.0.0.1', r));
  trailerPort = (trailerOrigin.address() as AddressInfo).port;
  const config = { ...CONFIG, rules: [...CONFIG.rules, { name: 'tr', match_hosts: ['tr.test.local'], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }] }] };
  const resolve = [...NAMES.map((n) => `${n}:${origin.port}:127.0.0.1`), `tr.test.local:${trailerPort}:127.0.0.1`];
  proxy = await spawnProxy({ config, secrets: { API_TOKEN: SECRET }, resolve, upstreamCa: [pki.caPem] });
});

afterAll(async () => {
  const output = proxy?.output() ?? '';
  if (process.env.H2_DEBUG) console.log(output.slice(-4000));
  await proxy?.stop();
  await origin?.close();
  trailerOrigin?.closeAllConnections();
  await new Promise<void>((r) => trailerOrigin?.close(() => r()));
  for (const value of [SECRET, OPAQUE, 'plain-value']) expect(output).not.toContain(value);
});

const session = () => h2Through(proxy.port, HOST, origin.port, proxy.caPem);
const authority = () => `${HOST}:${origin.port}`;
/** Stands for the tunnel's authority in tables built before the origin has a port. */
const AUTH = '<authority>';
type Echo = { method: string; url: string; host: string; headers: [string, string][] };

describe('HTTP/2 through interception', () => {
  it('a client offering h2 and http/1.1 gets h2; an HTTP/1.1-only client gets HTTP/1.1 on the same host', async () => {
    const t2 = await tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['h2', 'http/1.1']);
    expect(t2.alpnProtocol).toBe('h2');
    t2.destroy();
    const t1 = await tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['http/1.1']);
    expect(t1.alpnProtocol).toBe('http/1.1');
    const r = await rawExchange(t1, `GET /repos/one HTTP/1.1\r\nHost: ${authority()}\r\nAuthorization: client-value\r\nConnection: close\r\n\r\n`);
    expect(r.status).toBe(200);
    const echo = JSON.parse(r.body) as Echo;
    expect(echo.headers.filter(([n]) => n.toLowerCase() === 'authorization')).toEqual([['authorization', `Bearer ${SECRET}`]]);
  });

  it('curl --http2 through the proxy speaks h2 and gets the credential injected', async () => {
    const caFile = path.join(proxy.dir, 'ca-for-curl.pem');
    writeFileSync(caFile, proxy.caPem);
    const { stdout, stderr } = await execFileAsync('curl', ['-sS', '-v', '--http2', '-x', proxy.url, '--cacert', caFile, '-H', 'Authorization: client', `https://${authority()}/repos/curl`], { timeout: 20_000 });
    expect(stderr).toMatch(/< HTTP\/2 200/);
    const echo = JSON.parse(stdout) as Echo;
    expect(echo.headers.filter(([n]) => n.toLowerCase() === 'authorization')).toEqual([['authorization', `Bearer ${SECRET}`]]);
  });

  it('injects on h2: the rule header replaces every client value, one stream after another and at once on one connection', async () => {
    const s = await session();
    try {
      const answers = await Promise.all(
        Array.from({ length: 8 }, (_, i) => h2Request(s, { ':method': 'GET', ':path': `/repos/r${i}?q=1`, ':authority': authority(), authorization: 'client-one', 'x-end': 'kept' })),
      );
      answers.forEach((a, i) => {
        expect(a.status).toBe(200);
        const echo = JSON.parse(a.body) as Echo;
        expect(echo.url).toBe(`/repos/r${i}?q=1`);
        expect(echo.host).toBe(authority());
        expect(echo.headers.filter(([n]) => n.toLowerCase() === 'authorization')).toEqual([['authorization', `Bearer ${SECRET}`]]);
        expect(echo.headers).toContainEqual(['x-end', 'kept']);
        expect(echo.headers.some(([n]) => n.startsWith(':'))).toBe(false);
        expect(a.body).not.toContain('client-one');
      });
      // No rule for this path: nothing injected, the client's value goes as is.
      const free = await h2Request(s, { ':path': '/other', ':authority': authority(), authorization: 'client-own' });
      expect((JSON.parse(free.body) as Echo).headers).toContainEqual(['authorization', 'client-own']);
    } finally {
      s.close();
    }
    const h2Records = () => proxy.logs().filter((l) => l.type === 'request' && l.via === 'h2');
    await expect.poll(() => h2Records().length).toBeGreaterThanOrEqual(9);
    const recs = h2Records();
    expect(recs[0]).toMatchObject({ proto: 'h2', host: HOST, decision: 'intercept' });
  });

  it(':authority or host naming another host is 421, per stream; the connection goes on', async () => {
    const s = await session();
    try {
      const wrongAuthority = await h2Request(s, { ':path': '/repos/x', ':authority': `other.test.local:${origin.port}` });
      expect(wrongAuthority.status).toBe(421);
      expect(wrongAuthority.headers['proxy-status']).toMatch(/keygate/);
      const wrongPort = await h2Request(s, { ':path': '/repos/x', ':authority': `${HOST}:1` });
      expect(wrongPort.status).toBe(421);
      const wrongHost = await h2Request(s, { ':path': '/repos/x', ':authority': authority(), host: `other.test.local:${origin.port}` });
      expect(wrongHost.status).toBe(421);
      const ok = await h2Request(s, { ':path': '/repos/x', ':authority': authority(), host: authority() });
      expect(ok.status).toBe(200);
    } finally {
      s.close();
    }
  });

  it.each([
    ['/a/%7euser/%41', '/a/~user/A'],
    ['/a/./b/../c', '/a/c'],
    ['/a/%2e%2E/c', '/c'],
    ['/w/../repos/x', '/repos/x'],
    ['/100%25', '/100%25'],
  ])(':path %s goes upstream as exactly %s', async (p, expected) => {
    const s = await session();
    try {
      const a = await h2Request(s, { ':path': p, ':authority': authority() });
      expect(a.status).toBe(200);
      const echo = JSON.parse(a.body) as Echo;
      expect(echo.url).toBe(expected);
      if (expected.startsWith('/repos/')) expect(echo.headers).toContainEqual(['authorization', `Bearer ${SECRET}`]);
    } finally {
      s.close();
    }
  });

  // `repos/x` and `*` nghttp2 itself refuses (a stream error) before the proxy sees them.
  it.each(['/a/%25%32%65%25%32%65/x', '/a/%252e%252e/x', '/a/b/..%3b/x', '/a/%c0%ae%c0%ae/x', '/a/..%2fish', 'repos/x', '*'])(':path %s is refused (400 or a stream error), nothing reaches the origin', async (p) => {
    const before = origin.requests;
    const s = await session();
    try {
      const a = await h2Request(s, { ':path': p, ':authority': authority() });
      if (p.startsWith('/')) expect(a.status).toBe(400);
      else expect(a.status === 400 || a.rstCode !== 0).toBe(true);
      expect(origin.requests).toBe(before);
    } finally {
      s.close();
    }
  });

  it('TRACE is refused (its answer would reflect the credential)', async () => {
    const s = await session();
    try {
      expect((await h2Request(s, { ':method': 'TRACE', ':path': '/repos/x', ':authority': authority() })).status).toBe(403);
    } finally {
      s.close();
    }
  });

  it('SSE over h2 arrives event by event', async () => {
    const s = await session();
    try {
      const req = s.request({ ':path': '/sse?n=3', ':authority': authority() });
      req.setEncoding('utf8');
      const events: string[] = [];
      const next = () => new Promise<string>((resolve) => req.once('data', (d: string) => resolve(d)));
      events.push(await next());
      expect(events[0]).toContain('data: 1');
      origin.release();
      events.push(await next());
      expect(events[1]).toContain('data: 2');
      origin.release();
      events.push(await next());
      expect(events[2]).toContain('data: 3');
      await new Promise((r) => req.on('close', r).resume());
    } finally {
      s.close();
    }
  });

  it('a request body streams upstream (no length given, sent in pieces)', async () => {
    const s = await session();
    try {
      const chunks = Array.from({ length: 64 }, () => Buffer.alloc(16 * 1024, 'z'));
      const a = await h2Request(s, { ':method': 'POST', ':path': '/upload', ':authority': authority() }, chunks);
      expect(a.status).toBe(200);
      expect(JSON.parse(a.body)).toEqual({ bytes: 64 * 16 * 1024 });
    } finally {
      s.close();
    }
  });

  it('response trailers reach the h2 client; the credential is injected', async () => {
    const s = await h2Through(proxy.port, 'tr.test.local', trailerPort, proxy.caPem);
    try {
      const a = await h2Request(s, { ':path': '/t', ':authority': `tr.test.local:${trailerPort}`, authorization: 'client' });
      expect(a.status).toBe(200);
      expect(a.body).toBe(`part1;auth=Bearer ${SECRET}`);
      expect(a.trailers['x-checksum']).toBe('abc123');
    } finally {
      s.close();
    }
  });

  it('a slow reader of a large h2 response: flow control holds it, memory stays bounded, others are served', async () => {
    const rssBefore = memoryOf(proxy.pid).rssKb;
    const slow = await h2Through(proxy.port, 'tr.test.local', trailerPort, proxy.caPem);
    try {
      const req = slow.request({ ':path': '/big', ':authority': `tr.test.local:${trailerPort}` });
      let got = 0;
      req.on('data', (d: Buffer) => {
        got += d.length;
        if (got > 256 * 1024) req.pause();
      });
      await new Promise((r) => setTimeout(r, 1500));
      // The reader stopped early; the 96 MiB answer is not buffered in the proxy.
      expect(got).toBeLessThan(8 * 1024 * 1024);
      expect(memoryOf(proxy.pid).rssKb - rssBefore).toBeLessThan(48 * 1024);
      const s = await session();
      try {
        expect((await h2Request(s, { ':path': '/repos/ok', ':authority': authority() })).status).toBe(200);
      } finally {
        s.close();
      }
    } finally {
      slow.destroy();
    }
  });

  it('a stream the client resets mid-answer stops the upstream download; the connection goes on', async () => {
    const s = await h2Through(proxy.port, 'tr.test.local', trailerPort, proxy.caPem);
    try {
      // Its own target: the answer an earlier test left may still end meanwhile.
      const mine = () => bigEnds.filter((e) => e.startsWith('/big?reset '));
      const req = s.request({ ':path': '/big?reset', ':authority': `tr.test.local:${trailerPort}` });
      await new Promise<void>((resolve) => {
        let got = 0;
        req.on('data', (d: Buffer) => {
          got += d.length;
          if (got > 256 * 1024) resolve();
        });
      });
      req.close(http2.constants.NGHTTP2_CANCEL);
      // The origin's answer is cut (the proxy closed its upstream request), not pulled to the end:
      // within one 50 ms poll on a quiet machine; the bound leaves room for a loaded CI.
      const deadline = Date.now() + 10_000;
      while (mine().length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      // A rare failure here (2 in many runs, never reproduced alone): the proxy's log says how it saw the reset.
      expect(mine(), proxy.output().split('\n').filter((l) => l.includes('/big?reset')).join('\n')).toEqual(['/big?reset closed']);
      // The same connection still serves the next stream.
      const next = await h2Request(s, { ':method': 'POST', ':path': '/', ':authority': `tr.test.local:${trailerPort}` }, ['x']);
      expect(next.status).toBe(200);
    } finally {
      s.destroy();
    }
  });

  it('WebSocket still works for HTTP/1.1 clients, with the credential injected', async () => {
    // The handshake by hand over an intercepted TLS socket offering only http/1.1.
    const t = await interceptedTls(proxy.port, HOST, origin.port, proxy.caPem);
    const r = await new Promise<string>((resolve, reject) => {
      let buf = '';
      t.on('data', (d: Buffer) => {
        buf += d.toString('latin1');
        if (buf.includes(SECRET)) resolve(buf);
      });
      t.on('error', reject);
      t.write(`GET /ws HTTP/1.1\r\nHost: ${authority()}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`);
    });
    t.destroy();
    expect(r.startsWith('HTTP/1.1 101')).toBe(true);
    // The origin's first frame echoes the handshake it got: the credential was injected.
    expect(r).toContain(SECRET);
  });
});

// ---- h2-to-h1 desync inputs, sent as raw frames (Node's client refuses to send them) ----------

describe('HTTP/2 requests that could become HTTP/1.1 framing are refused, never forwarded', () => {
  const base = (): [string, string][] => [
    [':method', 'POST'],
    [':scheme', 'https'],
    [':path', '/repos/x'],
    [':authority', AUTH],
  ];
  const cases: Array<[string, [string, string][]]> = [
    ['transfer-encoding: chunked', [...base(), ['transfer-encoding', 'chunked']]],
    ['connection: close', [...base(), ['connection', 'close']]],
    ['keep-alive', [...base(), ['keep-alive', 'timeout=5']]],
    ['upgrade', [...base(), ['upgrade', 'websocket']]],
    ['proxy-connection', [...base(), ['proxy-connection', 'close']]],
    ['te: gzip', [...base(), ['te', 'gzip']]],
    ['CR LF in a value', [...base(), ['x-a', 'a\r\nTransfer-Encoding: chunked']]],
    ['LF in a value', [...base(), ['x-a', 'a\nx: y']]],
    ['NUL in a value', [...base(), ['x-a', 'a\0b']]],
    ['CR LF in :path', [[':method', 'GET'], [':scheme', 'https'], [':path', '/repos/x HTTP/1.1\r\nX: y'], [':authority', AUTH]]],
    ['a colon in a name', [...base(), ['x:a', 'v']]],
    ['upper case in a name', [...base(), ['X-Up', 'v']]],
    ['a space in a name', [...base(), ['x a', 'v']]],
    ['a pseudo-header after a regular field', [[':method', 'GET'], [':scheme', 'https'], ['x-a', 'v'], [':path', '/repos/x'], [':authority', AUTH]]],
    ['an unknown pseudo-header', [...base(), [':foo', 'v']]],
    ['a response pseudo-header in a request', [...base(), [':status', '200']]],
    ['a repeated :path', [[':method', 'GET'], [':scheme', 'https'], [':path', '/repos/x'], [':path', '/w/y'], [':authority', AUTH]]],
    ['no :path', [[':method', 'GET'], [':scheme', 'https'], [':authority', AUTH]]],
    ['a content-length that is not a number', [...base(), ['content-length', '5, 5']]],
    ['two content-lengths', [...base(), ['content-length', '3'], ['content-length', '3']]],
    ['CONNECT', [[':method', 'CONNECT'], [':authority', AUTH]]],
    ['http scheme', [[':method', 'GET'], [':scheme', 'http'], [':path', '/repos/x'], [':authority', AUTH]]],
  ];

  const dropped = new Set(['CR LF in a value', 'LF in a value', 'NUL in a value', 'a colon in a name', 'a space in a name']);

  it.each(cases)('%s: a stream error or 400, nothing reaches the origin', async (_name, given) => {
    const fields = given.map(([n, v]): [string, string] => [n, v === AUTH ? authority() : v]);
    const before = origin.requests;
    const t = await tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['h2']);
    const frames = await converseH2(t, [frame(1, END_HEADERS | END_STREAM, 1, literalBlock(fields))], (f) => outcome(f).reset || outcome(f).headers !== undefined);
    const o = outcome(frames);
    const why = JSON.stringify(frames.map((f) => [f.type, f.stream, f.payload.subarray(0, 8).toString('hex')]));
    if (dropped.has(_name) && statusOf(o.headers) === 200) {
      // nghttp2 drops a regular field with invalid bytes and lets the request go (it has no
      // strict mode Node exposes): the field itself never reaches the origin.
      const echo = JSON.parse(frames.filter((f) => f.type === 0 && f.stream === 1).map((f) => f.payload.toString('latin1')).join('')) as Echo;
      const sent = fields.filter(([n]) => !n.startsWith(':'));
      for (const [n] of sent) expect(echo.headers.some(([h]) => h.toLowerCase() === n.toLowerCase()), n).toBe(false);
      expect(JSON.stringify(echo.headers).toLowerCase()).not.toContain('transfer-encoding');
      return;
    }
    expect(o.reset || (statusOf(o.headers) >= 400 && statusOf(o.headers) < 500), why).toBe(true);
    expect(origin.requests).toBe(before);
  });

  it('a DATA length that disagrees with content-length never completes upstream', async () => {
    const t = await tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['h2']);
    const fields: [string, string][] = [[':method', 'POST'], [':scheme', 'https'], [':path', '/upload'], [':authority', authority()], ['content-length', '5']];
    const frames = await converseH2(t, [frame(1, END_HEADERS, 1, literalBlock(fields)), frame(0, END_STREAM, 1, Buffer.from('0123456789'))], (f) => outcome(f).reset || outcome(f).headers !== undefined);
    const o = outcome(frames);
    const data = frames.filter((f) => f.type === 0 && f.stream === 1).map((f) => f.payload.toString()).join('');
    expect(o.reset || (o.headers !== undefined && o.headers[0] !== 0x88), JSON.stringify(frames.map((f) => [f.type, f.stream]))).toBe(true);
    expect(data).not.toContain('"bytes":10');
  });

  it('the valid control request with the same encoder goes through (the encoder is not what is refused)', async () => {
    const t = await tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['h2']);
    const fields: [string, string][] = [[':method', 'GET'], [':scheme', 'https'], [':path', '/repos/x'], [':authority', authority()], ['x-a', 'v']];
    const frames = await converseH2(t, [frame(1, END_HEADERS | END_STREAM, 1, literalBlock(fields))], (f) => f.some((x) => x.type === 0 && x.stream === 1 && (x.flags & END_STREAM) !== 0));
    const o = outcome(frames);
    expect(o.reset).toBe(false);
    expect(o.headers?.[0]).toBe(0x88); // :status 200
  });
});

describe('client handshake failures say what failed', () => {
  it('a connection that made a request (HTTP/1.1 or h2) is not logged as closed right after the handshake', async () => {
    const closedEarly = () => proxy.output().split('\n').filter((l) => / the TLS handshake, without a request/.test(l)).length;
    const before = closedEarly();
    const t1 = await tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['http/1.1']);
    const r = await rawExchange(t1, `GET /repos/served-h1 HTTP/1.1\r\nHost: ${authority()}\r\nConnection: close\r\n\r\n`);
    expect(r.status).toBe(200);
    t1.destroy();
    const s = await session();
    expect((await h2Request(s, { ':method': 'GET', ':path': '/repos/served-h2', ':authority': authority() })).status).toBe(200);
    await new Promise<void>((resolve) => s.close(() => resolve()));
    await expect.poll(() => proxy.output()).toMatch(/served-h1[\s\S]*served-h2|served-h2[\s\S]*served-h1/);
    // The proxy's close handlers run after the records; its log goes out in batches of 100 ms.
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(closedEarly()).toBe(before);
  });

  it('TLS 1.1 only: logged as no protocol version in common', async () => {
    const c = await connectTunnel(proxy.port, authority());
    await new Promise<void>((resolve) => {
      const t = tls.connect({ socket: c.socket, servername: HOST, ca: proxy.caPem, maxVersion: 'TLSv1.1', minVersion: 'TLSv1', ciphers: 'DEFAULT:@SECLEVEL=0' });
      t.on('error', () => resolve());
      t.on('secureConnect', () => resolve());
    });
    await expect.poll(() => proxy.output()).toMatch(/handshake failed: no TLS protocol version in common/);
  });

  it('ALPN with no protocol in common, and an untrusted CA, are logged as such', async () => {
    let before = proxy.output().length;
    await expect(tunnelTls(proxy.port, HOST, origin.port, proxy.caPem, ['spdy/3'])).rejects.toThrow();
    await expect.poll(() => proxy.output().slice(before)).toMatch(/handshake failed: no application protocol in common \(ALPN/);
    // Node's TLS 1.3 client closes without an alert: the log says so, and names the CA as the likely cause.
    // (Only this connection's lines are read: another test's client closing early must not pass this.)
    before = proxy.output().length;
    await expect(tunnelTls(proxy.port, HOST, origin.port, pki.caPem)).rejects.toThrow();
    await expect.poll(() => proxy.output().slice(before)).toMatch(/does the client trust the keygate CA\?|does it trust the keygate CA\?/);
  });

  it('a client that does not trust the keygate CA and says so (curl: alert unknown CA): logged as such', async () => {
    // curl (OpenSSL) checks the certificate inside the handshake and sends the alert, so the
    // message is the precise one, not the guess made when a client just closes.
    const before = proxy.output().length;
    const wrongCa = path.join(proxy.dir, 'not-the-keygate-ca.pem');
    writeFileSync(wrongCa, pki.caPem);
    await expect(execFileAsync('curl', ['-sS', '--http2', '-x', proxy.url, '--cacert', wrongCa, `https://${authority()}/repos/x`], { timeout: 20_000 })).rejects.toThrow(/SSL certificate problem|certificate/);
    await expect.poll(() => proxy.output().slice(before)).toMatch(/client TLS handshake failed: the client does not trust the certificate \(does it trust the keygate CA\?\)/);
  });
});
