/**
 * The classes of issue #18's hostile review, over real sockets, on both intercepted paths (the
 * fast path of src/proxy/h1 and Node's parser, `fastPath: false`) and on the plain listener,
 * against origins that keep every byte they receive:
 *
 * 1. No request method is a way to read an injected value: TRACE (whose answer reflects the
 *    request) is never forwarded to an intercepted host, and neither are its siblings.
 * 2. The path sent upstream passes every check unchanged (the property itself is in
 *    test/rules/path-fixed-point.test.ts); here, the encodings that broke it are refused end to end.
 * 3. After a refusal that closes the connection, nothing pipelined behind it is acted on: not
 *    forwarded with the credential, no tunnel opened.
 * 4. A refusal's status does not depend on how the bytes arrive (431 against 414).
 */
import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle, type ProxyLimits } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { connectTunnel, piecesOf, tlsOverTunnel } from '../helpers/connect.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { sleep } from './hardening-helpers.js';
import { h2Request, h2Through, type H2Answer } from './h2-helpers.js';

const HOST = 'review.test.local';
/** The injected value: it must never come back to a client, nor appear in a log. */
const SECRET = 'kgSECRET-review-5d1e9c';

// ---- origins that keep every byte ------------------------------------------------------------

interface Keeper {
  port: number;
  /** Every byte received, per connection (latin1). */
  received: string[];
  /** All bytes received on all connections, in arrival order. */
  all(): string;
  close(): Promise<void>;
}

/**
 * Keeps every byte; answers every request head (keep-alive, in order) with a small 200, and a
 * TRACE or TRACK by reflecting the request it received, as RFC 9110 9.3.8 has an origin do.
 * Bodies are skipped by Content-Length; nothing chunked is sent to it by these tests.
 */
async function startKeeper(pki?: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<Keeper> {
  const received: string[] = [];
  let log = '';
  const sockets = new Set<net.Socket>();
  const onSocket = (s: net.Socket) => {
    const i = received.length;
    received.push('');
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    let buf = '';
    s.on('data', (d: Buffer) => {
      received[i] += d.toString('latin1');
      log += d.toString('latin1');
      buf += d.toString('latin1');
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buf.slice(0, end + 4);
        let cl = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        // A chunked body is read to its last chunk before the answer: an origin that answered
        // after the head would make every chunked upload an early answer (which ends the
        // client's connection: test/proxy/early-answer.test.ts).
        if (/\r\ntransfer-encoding: *chunked/i.test(head)) {
          const rest = buf.slice(end + 4);
          const last = rest.startsWith('0\r\n\r\n') ? 0 : rest.indexOf('\r\n0\r\n\r\n');
          if (last < 0) return;
          cl = last === 0 && rest.startsWith('0\r\n\r\n') ? 5 : last + 7;
        }
        if (buf.length < end + 4 + cl) return;
        buf = buf.slice(end + 4 + cl);
        const method = head.slice(0, head.indexOf(' '));
        const body = method === 'TRACE' || method === 'TRACK' ? head : 'origin';
        const type = method === 'TRACE' || method === 'TRACK' ? 'message/http' : 'text/plain';
        if (!s.writableEnded) s.write(`HTTP/1.1 200 OK\r\nContent-Type: ${type}\r\nContent-Length: ${Buffer.byteLength(body, 'latin1')}\r\n\r\n${body}`, 'latin1');
      }
    });
  };
  const server = pki ? tls.createServer({ key: pki.keyPem, cert: pki.certPem }, onSocket) : net.createServer(onSocket);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as net.AddressInfo).port,
    received,
    all: () => log,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

// ---- proxies: the fast path on and off ---------------------------------------------------------

const LIMITS: Partial<ProxyLimits> = { maxHeaderBytes: 4096, maxRequestLineBytes: 1024, maxHeaderCount: 20, headerTimeoutMs: 500 };

interface Px {
  handle: ProxyHandle;
  log(): string;
}

let pki: TestPki;
let ca: Ca;
let tlsOrigin: Keeper;
let plainOrigin: Keeper;
const proxies: Px[] = [];
const byPath = new Map<boolean, Px>();

async function proxy(fastPath: boolean, limits: Partial<ProxyLimits> = LIMITS): Promise<Px> {
  let text = '';
  const logger = createLogger({ destination: new Writable({ write: (c, _e, cb) => ((text += c), cb()) }) });
  const handle = await startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: compileConfig({ no_proxy: [], rules: [{ name: 'review', match_hosts: [HOST], headers: [{ name: 'X-Key', value: SECRET }] }] }),
    logger,
    resolve: new Map([[`${HOST}:${tlsOrigin.port}`, '127.0.0.1']]),
    upstreamCa: [pki.caPem],
    limits,
    fastPath,
  });
  const p = { handle, log: () => text };
  proxies.push(p);
  return p;
}

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  ca = await ensureCa(path.join(mkdtempSync(path.join(os.tmpdir(), 'kg-review-')), 'certs'));
  tlsOrigin = await startKeeper(pki);
  plainOrigin = await startKeeper();
  byPath.set(true, await proxy(true));
  byPath.set(false, await proxy(false));
});

afterAll(async () => {
  for (const p of proxies) await p.handle.close(200);
  await tlsOrigin?.close();
  await plainOrigin?.close();
  for (const p of proxies) expect(p.log()).not.toContain(SECRET);
});

// ---- raw clients ---------------------------------------------------------------------------------

interface Answer {
  text: string;
  /** Status of every HTTP response line in what came back. */
  statuses: number[];
  closed: boolean;
}

function statusesOf(text: string): number[] {
  return [...text.matchAll(/HTTP\/1\.[01] (\d{3}) /g)].map((m) => Number(m[1]));
}

/** Writes each part (pausing `gapMs` between them), then reads until the peer closes or `ms` passes. */
async function converse(s: net.Socket | tls.TLSSocket, parts: (string | Buffer)[], gapMs = 0, ms = 4000): Promise<Answer> {
  let text = '';
  let closed = false;
  s.on('data', (d: Buffer) => (text += d.toString('latin1')));
  const done = new Promise<void>((resolve) => {
    s.once('close', () => {
      closed = true;
      resolve();
    });
    setTimeout(resolve, ms);
  });
  s.on('error', () => undefined);
  for (const p of parts) {
    if (s.destroyed) break;
    s.write(p);
    if (gapMs) await sleep(gapMs);
    else await new Promise((r) => setImmediate(r));
  }
  await done;
  s.destroy();
  return { text, statuses: statusesOf(text), closed };
}

async function tunnel(px: Px): Promise<tls.TLSSocket> {
  const c = await connectTunnel(px.handle.port, `${HOST}:${tlsOrigin.port}`);
  expect(c.status).toBe(200);
  const t = await tlsOverTunnel(c.socket, HOST, ca.certPem);
  t.setNoDelay(true);
  return t;
}

async function plain(px: Px): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(px.handle.port, '127.0.0.1', () => resolve(s));
    s.setNoDelay(true);
    s.once('error', reject);
  });
}

const hostHeader = () => `${HOST}:${tlsOrigin.port}`;
/** A request that passes every check, to send after a refusal. */
const follower = () => `GET /after-refusal HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`;

/** Bytes the origin received after `mark` (a length of `all()`). */
const since = (o: Keeper, mark: number) => o.all().slice(mark);

// ---- 1. methods whose answer reflects the request ------------------------------------------------

describe.each([true, false])('1. reflection (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each([
    ['TRACE', `TRACE / HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['TRACE with Max-Forwards: 0', `TRACE / HTTP/1.1\r\nHost: {HOST}\r\nMax-Forwards: 0\r\n\r\n`],
    ['TRACE with Max-Forwards: 5 and Via', `TRACE /x?y=1 HTTP/1.1\r\nHost: {HOST}\r\nMax-Forwards: 5\r\nVia: 1.1 other\r\n\r\n`],
    ['TRACE in absolute form', `TRACE https://{HOST}/ HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['TRACE with a body', `TRACE / HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 3\r\n\r\nabc`],
    ['TRACE on HTTP/1.0', `TRACE / HTTP/1.0\r\nHost: {HOST}\r\n\r\n`],
    ['TRACE asking for a WebSocket upgrade', `TRACE / HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`],
    ['TRACE asking for h2c', `TRACE / HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n`],
    ['TRACE behind a good GET, pipelined', `GET /first HTTP/1.1\r\nHost: {HOST}\r\n\r\nTRACE / HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['TRACK', `TRACK / HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['trace in lower case', `trace / HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['Trace in mixed case', `Trace / HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['DEBUG', `DEBUG / HTTP/1.1\r\nHost: {HOST}\r\nCommand: stop-debug\r\n\r\n`],
    ['CONNECT inside the tunnel', `CONNECT {HOST} HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['OPTIONS *', `OPTIONS * HTTP/1.1\r\nHost: {HOST}\r\nMax-Forwards: 0\r\n\r\n`],
  ])('%s: the injected value never comes back', async (_name, raw) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [raw.replaceAll('{HOST}', hostHeader())], 0, 1500);
    expect(a.text).not.toContain(SECRET);
    // Nothing that reflects reached the origin (a GET in front of it may).
    expect(since(tlsOrigin, mark)).not.toMatch(/(^|\n)(TRACE|TRACK|trace|Trace|DEBUG|CONNECT|OPTIONS \*) /);
    expect(since(tlsOrigin, mark)).not.toMatch(/TRACE|TRACK/);
    expect(a.statuses.length).toBeGreaterThan(0);
  });

  it('TRACE is refused with the proxy’s own answer, and the connection closes', async () => {
    const a = await converse(await tunnel(px()), [`TRACE / HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n${follower()}`]);
    expect(a.statuses).toEqual([403]);
    expect(a.text).toMatch(/\r\nProxy-Status: keygate; error=http_request_denied/i);
    expect(a.closed).toBe(true);
  });
});

describe('1. reflection on the plain listener', () => {
  it('TRACE to a rule host in clear is refused (no credential in clear), nothing sent', async () => {
    const px = byPath.get(true)!;
    const mark = tlsOrigin.all().length;
    const a = await converse(await plain(px), [`TRACE http://${HOST}:${tlsOrigin.port}/ HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`]);
    expect(a.statuses).toEqual([403]);
    expect(a.text).not.toContain(SECRET);
    expect(since(tlsOrigin, mark)).toBe('');
  });
});

// ---- 2. path encodings -------------------------------------------------------------------------------

describe.each([true, false])('2. path encodings (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each([
    ['an escape spelled with encoded percent-encoding', '/a/%25%32%65%25%32%65/x'],
    ['the same in lower and mixed case', '/a/%25%32%45%25%32%65/x'],
    ['an encoded slash spelled the same way', '/a/%25%32%66x'],
    ['an encoded backslash spelled the same way', '/a/%25%35%63x'],
    ['double-encoded dots', '/a/%252e%252e/x'],
    ['triple-encoded dots', '/a/%25252e%25252e/x'],
    ['an encoded percent followed by the hex of a dot', '/a/%252E'],
    ['`..` then an encoded `;`', '/a/b/..%3b/..%3b/x'],
    ['`..` then an encoded `;` in upper case', '/a/b/..%3B/x'],
    ['encoded dots then an encoded `;`', '/a/b/%2e%2e%3b/x'],
    ['`.` then an encoded `;`', '/a/.%3bjsessionid=1/x'],
    ['`..;` raw', '/a/b/..;/x'],
    ['an overlong UTF-8 dot', '/a/%c0%ae%c0%ae/x'],
    ['an overlong UTF-8 slash', '/a/..%c0%afx'],
    ['an invalid UTF-8 sequence', '/a/%ff'],
    ['a full-width dot pair (NFKC ..)', '/a/%ef%bc%8e%ef%bc%8e/x'],
    ['a two-dot leader (NFKC ..)', '/a/%e2%80%a5/x'],
    ['a full-width solidus (NFKC /)', '/a/..%ef%bc%8fx'],
    ['a segment that is only a parameter (Tomcat reads /a//x, then /a/x)', '/a/;/x'],
    ['a segment that is only an encoded parameter', '/a/%3bjsessionid=1/x'],
    ['a segment that is only a space', '/a/%20/x'],
    ['an encoded ? (decoded once more, the path ends there)', '/a/b%3F/x'],
    ['an encoded # in lower case', '/a/b%23c/x'],
    ['an escape of an escape in the absolute form', `https://{HOST}/a/%252e%252e/x`],
    ['an encoded ? in the absolute form', `https://{HOST}/a/b%3f/x`],
  ])('%s (%s): 400, nothing reaches the origin', async (_name, target) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [`GET ${target.replace('{HOST}', hostHeader())} HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([400]);
    expect(a.closed).toBe(true);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it.each([
    ['/a/%7euser/%41', '/a/~user/A'],
    ['/a/./b/../c', '/a/c'],
    ['/a/%2e%2E/c', '/c'],
    ['/caf%c3%a9/%e2%82%ac', '/caf%C3%A9/%E2%82%AC'],
    ['/a;p=1/b', '/a;p=1/b'],
    ['/a/x%3bp/b', '/a/x%3Bp/b'],
    ['/100%25', '/100%25'],
    ['/a/..%2fish', null],
  ])('%s goes upstream as exactly %s', async (target, expected) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [`GET ${target} HTTP/1.1\r\nHost: ${hostHeader()}\r\nConnection: close\r\n\r\n`]);
    if (expected === null) {
      expect(a.statuses).toEqual([400]);
      return;
    }
    expect(a.statuses).toEqual([200]);
    expect(since(tlsOrigin, mark).startsWith(`GET ${expected} HTTP/1.1\r\n`)).toBe(true);
  });
});

// ---- 3. nothing after a closing refusal ------------------------------------------------------------

/** Refusals inside an intercepted tunnel, each followed in the same write by a good request. */
const TUNNEL_REFUSALS: [string, number, () => string][] = [
  ['framing: Content-Length with Transfer-Encoding', 400, () => `POST /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
  ['framing: Transfer-Encoding gzip', 400, () => `POST /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nTransfer-Encoding: gzip\r\n\r\n`],
  ['framing: Transfer-Encoding on HTTP/1.0', 400, () => `POST /r HTTP/1.0\r\nHost: ${hostHeader()}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
  ['head: too many fields (431)', 431, () => `GET /r HTTP/1.1\r\nHost: ${hostHeader()}\r\n${Array.from({ length: 25 }, (_, i) => `X-H${i}: v\r\n`).join('')}\r\n`],
  ['head: request line too long (414)', 414, () => `GET /${'q'.repeat(1500)} HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['head: two Host fields', 400, () => `GET /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['head: no Host', 400, () => `GET /r HTTP/1.1\r\nX-A: b\r\n\r\n`],
  ['target: Host names another authority (421)', 421, () => `GET /r HTTP/1.1\r\nHost: other.test.local\r\n\r\n`],
  ['target: absolute form to another authority (421)', 421, () => `GET https://other.test.local/r HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['target: a path above the root', 400, () => `GET /../r HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['target: an encoded slash', 400, () => `GET /a%2fb HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['target: http:// inside the tunnel', 400, () => `GET http://${hostHeader()}/r HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['target: asterisk form', 400, () => `OPTIONS * HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['method: TRACE', 403, () => `TRACE /r HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['upgrade: not a WebSocket', 400, () => `GET /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n`],
];

describe.each([true, false])('3. nothing pipelined after a closing refusal, intercepted (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each(TUNNEL_REFUSALS)('%s: %i, then nothing', async (_name, status, refused) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [refused() + follower()]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([status]);
    expect(a.text).toMatch(/\r\nConnection: close\r\n/i);
    expect(a.closed).toBe(true);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it.each(TUNNEL_REFUSALS)('%s, behind a good request: only the good one is forwarded', async (_name, status, refused) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [`GET /before HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n` + refused() + follower()]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([200, status]);
    expect(a.closed).toBe(true);
    const got = since(tlsOrigin, mark);
    expect(got).toContain('GET /before ');
    expect(got).not.toContain('/after-refusal');
  });

  it('the same when the refused request and the next one arrive in separate writes', async () => {
    for (const [name, status, refused] of TUNNEL_REFUSALS) {
      const mark = tlsOrigin.all().length;
      const a = await converse(await tunnel(px()), [refused(), follower()], 20);
      expect(a.statuses, name).toEqual([status]);
      expect(since(tlsOrigin, mark), name).toBe('');
    }
  });

  it('408: a head completed after its answer, and a request behind it, are never forwarded', async () => {
    const mark = tlsOrigin.all().length;
    const t = await tunnel(px());
    const a = await converse(t, [`GET /slow HTTP/1.1\r\nHost: ${hostHeader()}\r\n`, `X-Late: 1\r\n\r\n${follower()}`], 900);
    expect(a.statuses).toEqual([408]);
    expect(since(tlsOrigin, mark)).toBe('');
  });
});

/** Refusals on the plain listener; each followed by a CONNECT to the rule host, or a plain request. */
const PLAIN_REFUSALS: [string, number, () => string][] = [
  ['framing: Content-Length with Transfer-Encoding', 400, () => `POST http://127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
  ['framing: Transfer-Encoding gzip', 400, () => `POST http://127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n`],
  ['head: too many fields (431)', 431, () => `GET http://127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\n${Array.from({ length: 25 }, (_, i) => `X-H${i}: v\r\n`).join('')}\r\n`],
  ['head: request line too long (414)', 414, () => `GET http://127.0.0.1:${plainOrigin.port}/${'q'.repeat(1500)} HTTP/1.1\r\nHost: x\r\n\r\n`],
  ['target: origin form to the proxy', 400, () => `GET /r HTTP/1.1\r\nHost: x\r\n\r\n`],
  ['target: https:// in clear', 400, () => `GET https://127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\n\r\n`],
  ['target: credentials in the target', 400, () => `GET http://u:p@127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\n\r\n`],
  ['target: a rule host in clear (403)', 403, () => `GET http://${HOST}:${tlsOrigin.port}/r HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
  ['target: the proxy itself (403)', 403, () => `GET http://127.0.0.1:{SELF}/r HTTP/1.1\r\nHost: x\r\n\r\n`],
];

describe.each([true, false])('3. nothing pipelined after a closing refusal, plain listener (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;
  const self = (s: string) => s.replace('{SELF}', String(px().handle.port));

  it.each(PLAIN_REFUSALS)('%s: %i, then no tunnel to the rule host', async (_name, status, refused) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await plain(px()), [self(refused()) + `CONNECT ${hostHeader()} HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([status]);
    expect(a.text).not.toMatch(/Connection Established/);
    expect(a.closed).toBe(true);
    await sleep(50);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it.each(PLAIN_REFUSALS)('%s: %i, then no plain request forwarded', async (_name, status, refused) => {
    const mark = plainOrigin.all().length;
    const a = await converse(await plain(px()), [self(refused()) + `GET http://127.0.0.1:${plainOrigin.port}/after-refusal HTTP/1.1\r\nHost: x\r\n\r\n`]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([status]);
    expect(a.closed).toBe(true);
    expect(since(plainOrigin, mark)).not.toContain('/after-refusal');
  });

  it('408: a head completed after its answer, and a CONNECT behind it, are never acted on', async () => {
    const mark = tlsOrigin.all().length;
    const markPlain = plainOrigin.all().length;
    const a = await converse(
      await plain(px()),
      [`GET http://127.0.0.1:${plainOrigin.port}/slow HTTP/1.1\r\n`, `Host: x\r\n\r\nCONNECT ${hostHeader()} HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`],
      900,
    );
    expect(a.statuses).toEqual([408]);
    expect(a.text).not.toMatch(/Connection Established/);
    expect(since(plainOrigin, markPlain)).toBe('');
    expect(since(tlsOrigin, mark)).toBe('');
  });
});

// ---- 4. the same bytes, any segmentation ------------------------------------------------------------

/** `data` cut as the chunking says: the request line alone first, then pieces of `size` bytes. */
function chunkings(data: string): [string, Buffer[]][] {
  const b = Buffer.from(data, 'latin1');
  const eol = b.indexOf('\r\n') + 2;
  const pieces = (from: number, size: number) => piecesOf(b, from, size);
  return [
    ['one write', [b]],
    ['request line, then the rest', [b.subarray(0, eol), b.subarray(eol)]],
    ['request line, then 64 KiB pieces', [b.subarray(0, eol), ...pieces(eol, 65536)]],
    ['request line, then 1000-byte pieces', [b.subarray(0, eol), ...pieces(eol, 1000)]],
    // The field's value alone in each later piece: the piece the parser overflows in holds no line end.
    ...(b.indexOf('X-Big: ') > 0 ? [['the head up to a big value, then 16 KiB pieces of it', [b.subarray(0, b.indexOf('X-Big: ') + 7), ...pieces(b.indexOf('X-Big: ') + 7, 16384)]] as [string, Buffer[]]] : []),
    // Small pieces only for heads of a few KiB (each piece is a write, and a TLS record in a tunnel).
    ...(b.length <= 16384 ? [['7-byte pieces', pieces(0, 7)] as [string, Buffer[]]] : []),
  ];
}

const bigField = (target: string, bytes: number) => `GET ${target} HTTP/1.1\r\nHost: {HOST}\r\nX-Big: ${'a'.repeat(bytes)}\r\n\r\n`;

describe('4. 431 or 414 whatever the segmentation', () => {
  // Proxies of their own: a head sent in many pieces must not meet the 500 ms head timeout.
  const slow = new Map<boolean, Px>();
  beforeAll(async () => {
    slow.set(true, await proxy(true, { ...LIMITS, headerTimeoutMs: 60_000 }));
    slow.set(false, await proxy(false, { ...LIMITS, headerTimeoutMs: 60_000 }));
  });
  const cases: [string, number, string][] = [
    ['a 128 KiB field after a short request line', 431, bigField('{PATH}', 128 * 1024)],
    ['an 8 KiB field after a short request line', 431, bigField('{PATH}', 8 * 1024)],
    ['a request line that alone overflows the head', 414, `GET {PATH}${'p'.repeat(6000)} HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['a request line over its limit, the head within its own', 414, `GET {PATH}${'p'.repeat(2000)} HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    // Malformed after the head's limit: Node's parser says 400 or overflow depending on where the chunks end.
    ['a field name with a bad byte past the head limit', 431, `GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\nX-${'n'.repeat(6000)} b: 1\r\n\r\n`],
    ['a field value with a bad byte past the head limit', 431, `GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\nX-Big: ${'v'.repeat(6000)}\u0001\r\n\r\n`],
    ['a request line with a bad byte past the head limit', 414, `GET {PATH}${'p'.repeat(6000)}\u0001 HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
  ];

  describe.each([true, false])('plain listener (fast path %s)', (fastPath) => {
    it.each(cases)('%s: always %i', async (_name, status, template) => {
      const raw = template.replace('{PATH}', `http://127.0.0.1:${plainOrigin.port}/`).replace('{HOST}', 'x');
      for (const [how, parts] of chunkings(raw)) {
        const a = await converse(await plain(slow.get(fastPath)!), parts, parts.length < 40 ? 15 : 0);
        expect(a.statuses, how).toEqual([status]);
      }
    });
  });

  describe.each([true, false])('intercepted (fast path %s)', (fastPath) => {
    it.each(cases)('%s: always %i', async (_name, status, template) => {
      const raw = template.replace('{PATH}', '/').replace('{HOST}', hostHeader());
      for (const [how, parts] of chunkings(raw)) {
        const a = await converse(await tunnel(slow.get(fastPath)!), parts, parts.length < 40 ? 15 : 0);
        expect(a.statuses, how).toEqual([status]);
      }
    });
  });

  it('byte by byte, on the plain listener and on both intercepted paths', async () => {
    const small = bigField('{PATH}', 5000);
    const line = `GET {PATH}${'p'.repeat(4500)} HTTP/1.1\r\nHost: {HOST}\r\n\r\n`;
    for (const [template, status] of [
      [small, 431],
      [line, 414],
    ] as const) {
      const p = Buffer.from(template.replace('{PATH}', `http://127.0.0.1:${plainOrigin.port}/`).replace('{HOST}', 'x'), 'latin1');
      const bytes = [...p].map((c) => Buffer.from([c]));
      expect((await converse(await plain(slow.get(true)!), bytes, 0, 8000)).statuses).toEqual([status]);
      const t = Buffer.from(template.replace('{PATH}', '/').replace('{HOST}', hostHeader()), 'latin1');
      const tbytes = [...t].map((c) => Buffer.from([c]));
      for (const fast of [true, false]) expect((await converse(await tunnel(slow.get(fast)!), tbytes, 0, 8000)).statuses, `fast ${fast}`).toEqual([status]);
    }
  }, 120_000);

  it('with the default limits too (the held-out case)', async () => {
    const px = await proxy(false, { headerTimeoutMs: 60_000 });
    const raw = bigField(`http://127.0.0.1:${plainOrigin.port}/`, 128 * 1024).replace('{HOST}', 'x');
    for (const [how, parts] of chunkings(raw)) {
      const a = await converse(await plain(px), parts, 15);
      expect(a.statuses, how).toEqual([431]);
    }
  });
});

// ---- siblings of the four classes (a second hostile pass) -------------------------------------------

describe.each([true, false])('1. siblings: a request that asks for TRACE another way (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each([
    ['X-HTTP-Method-Override: TRACE on a GET', `GET /o HTTP/1.1\r\nHost: {HOST}\r\nX-HTTP-Method-Override: TRACE\r\n\r\n`],
    ['X-HTTP-Method-Override: trace on a POST', `POST /o HTTP/1.1\r\nHost: {HOST}\r\nX-HTTP-Method-Override: trace\r\nContent-Length: 0\r\n\r\n`],
    ['X-HTTP-Method: TRACE', `POST /o HTTP/1.1\r\nHost: {HOST}\r\nX-HTTP-Method: TRACE\r\nContent-Length: 0\r\n\r\n`],
    ['X-Method-Override: Track', `POST /o HTTP/1.1\r\nHost: {HOST}\r\nx-method-override: Track\r\nContent-Length: 0\r\n\r\n`],
    ['the override in a list', `POST /o HTTP/1.1\r\nHost: {HOST}\r\nX-HTTP-Method-Override: TRACE, GET\r\nContent-Length: 0\r\n\r\n`],
    ['the override spelled with underscores (CGI reads it the same)', `POST /o HTTP/1.1\r\nHost: {HOST}\r\nX_HTTP_METHOD_OVERRIDE: TRACE\r\nContent-Length: 0\r\n\r\n`],
    ['_method=TRACE in the query', `POST /o?_method=TRACE HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 0\r\n\r\n`],
    ['_method=trace after another parameter', `GET /o?a=1&_method=trace HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['_method encoded', `GET /o?%5Fmethod=%54RACE HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['_method with a PHP-mangled name', `GET /o?.method=TRACE HTTP/1.1\r\nHost: {HOST}\r\n\r\n`],
    ['the override on a WebSocket upgrade', `GET /o HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-HTTP-Method-Override: TRACE\r\n\r\n`],
    ['the override on HTTP/1.0', `GET /o HTTP/1.0\r\nHost: {HOST}\r\nX-HTTP-Method-Override: TRACE\r\n\r\n`],
  ])('%s: 403, nothing reaches the origin', async (_name, raw) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [raw.replaceAll('{HOST}', hostHeader()) + follower()], 0, 1500);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([403]);
    expect(a.text).not.toContain(SECRET);
    expect(a.closed).toBe(true);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it.each([
    ['an override that asks for another method', `POST /o HTTP/1.1\r\nHost: {HOST}\r\nX-HTTP-Method-Override: PATCH\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`],
    ['a parameter that only looks like it', `GET /o?x_method=TRACE&_methods=TRACE HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n`],
  ])('%s is forwarded', async (_name, raw) => {
    const a = await converse(await tunnel(px()), [raw.replaceAll('{HOST}', hostHeader())]);
    expect(a.statuses).toEqual([200]);
  });
});

/** One HTTP/2 request to the tunnel's origin through the fast-path proxy, on a session of its own. */
async function h2Once(headers: Record<string, string>): Promise<H2Answer> {
  const s = await h2Through(byPath.get(true)!.handle.port, HOST, tlsOrigin.port, ca.certPem);
  try {
    return await h2Request(s, { ':authority': hostHeader(), ...headers });
  } finally {
    s.destroy();
  }
}

describe('1. siblings on HTTP/2: :method in any case, TRACK, overrides', () => {
  it.each([
    ['trace', {}],
    ['Trace', {}],
    ['TRACK', {}],
    ['track', {}],
    ['GET', { 'x-http-method-override': 'TRACE' }],
    ['POST', { 'x-method-override': 'trace' }],
  ] as [string, Record<string, string>][])(':method %s %j: refused, nothing reaches the origin', async (method, extra) => {
    const mark = tlsOrigin.all().length;
    const a = await h2Once({ ':method': method, ':path': '/o', ...extra });
    expect(a.status).toBe(403);
    expect(a.body).not.toContain(SECRET);
    await sleep(50);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it(':path with _method=TRACE is refused', async () => {
    const mark = tlsOrigin.all().length;
    const a = await h2Once({ ':method': 'POST', ':path': '/o?_method=TRACE' });
    expect(a.status).toBe(403);
    expect(since(tlsOrigin, mark)).toBe('');
  });
});

const upgrade = (target: string) =>
  `GET ${target} HTTP/1.1\r\nHost: ${hostHeader()}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`;

describe.each([true, false])('2. siblings: the WebSocket path (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each(['/a/%25%32%65%25%32%65/x', '/a/b/..%3b/x', '/a/b%3F/x', '/a/%c0%ae%c0%ae/x'])('an upgrade to %s: 400, nothing reaches the origin', async (target) => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [upgrade(target)]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([400]);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it('an upgrade goes upstream on exactly the normalised path', async () => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [upgrade('/a/./b/%2e%2E/%7ec?q=%2e%2e')]);
    expect(a.statuses).toEqual([200]); // the keeper does not speak WebSocket: its 200 is relayed and the connection closed
    expect(since(tlsOrigin, mark).startsWith('GET /a/~c?q=%2e%2e HTTP/1.1\r\n')).toBe(true);
  });
});

describe('2. siblings: the HTTP/2 :path', () => {
  it.each(['/a/%25%32%65%25%32%65/x', '/a/b/..%3B/x', '/a/b%23/x', '/a/%ef%bc%8e%ef%bc%8e/x', '/../x'])(':path %s: 400, nothing reaches the origin', async (p) => {
    const mark = tlsOrigin.all().length;
    const a = await h2Once({ ':method': 'GET', ':path': p });
    expect(a.status).toBe(400);
    expect(since(tlsOrigin, mark)).toBe('');
  });

  it(':path goes upstream as exactly the normalised path', async () => {
    const mark = tlsOrigin.all().length;
    const a = await h2Once({ ':method': 'GET', ':path': '/a/./b/%2e%2E/%7ec?q=%2e%2e' });
    expect(a.status).toBe(200);
    expect(since(tlsOrigin, mark).startsWith('GET /a/~c?q=%2e%2e HTTP/1.1\r\n')).toBe(true);
  });
});

describe.each([true, false])('3. siblings: other refusals, intercepted (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each([
    ['an expectation other than 100-continue (417)', 417, () => `GET /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nExpect: something-else\r\n\r\n`],
    ['an expectation with a body (417)', 417, () => `POST /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nExpect: 200-ok\r\nContent-Length: 3\r\n\r\nabc`],
    ['a WebSocket upgrade to a refused path', 400, () => upgrade('/a/%252e%252e/x')],
    ['a WebSocket upgrade naming another authority', 421, () => upgrade('https://other.test.local/x')],
    ['a method override asking for TRACE', 403, () => `GET /r HTTP/1.1\r\nHost: ${hostHeader()}\r\nX-HTTP-Method-Override: TRACE\r\n\r\n`],
  ] as [string, number, () => string][])('%s: %i, closed, nothing forwarded, in one write or two', async (_name, status, refused) => {
    for (const parts of [[refused() + follower()], [refused(), follower()]]) {
      const mark = tlsOrigin.all().length;
      const a = await converse(await tunnel(px()), parts, parts.length > 1 ? 20 : 0);
      expect(a.statuses, a.text.slice(0, 300)).toEqual([status]);
      expect(a.closed).toBe(true);
      expect(since(tlsOrigin, mark)).toBe('');
    }
  });

  it('a refusal with a WebSocket upgrade pipelined behind it: the upgrade is never forwarded', async () => {
    for (const parts of [[`GET /../x HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n` + upgrade('/ws-after')], [`TRACE / HTTP/1.1\r\nHost: ${hostHeader()}\r\n\r\n`, upgrade('/ws-after')]]) {
      const mark = tlsOrigin.all().length;
      const a = await converse(await tunnel(px()), parts, parts.length > 1 ? 20 : 0);
      expect(a.statuses.length, a.text.slice(0, 300)).toBe(1);
      expect(a.closed).toBe(true);
      expect(since(tlsOrigin, mark)).toBe('');
    }
  });

  it('a WebSocket upgrade the origin answers without 101: its answer, closed, nothing pipelined forwarded', async () => {
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel(px()), [upgrade('/ws') + follower()]);
    expect(a.statuses).toEqual([200]);
    expect(a.closed).toBe(true);
    const got = since(tlsOrigin, mark);
    expect(got).toContain('GET /ws ');
    expect(got).not.toContain('/after-refusal');
  });
});

describe.each([true, false])('3. siblings: other refusals, plain listener (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;
  const plainUpgrade = (target: string) => `GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`;
  const after = () => `GET http://127.0.0.1:${plainOrigin.port}/after-refusal HTTP/1.1\r\nHost: x\r\n\r\n`;

  it.each([
    ['an expectation other than 100-continue (417)', 417, () => `GET http://127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\n\r\n`],
    ['an upgrade that is not a WebSocket', 400, () => `GET http://127.0.0.1:${plainOrigin.port}/r HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n`],
    ['a WebSocket upgrade to a rule host in clear', 403, () => plainUpgrade(`http://${HOST}:${tlsOrigin.port}/ws`)],
    ['a CONNECT to the proxy itself', 403, () => `CONNECT 127.0.0.1:{SELF} HTTP/1.1\r\nHost: x\r\n\r\n`],
    ['a CONNECT to an unparseable target', 400, () => `CONNECT a..b:x HTTP/1.1\r\nHost: x\r\n\r\n`],
  ] as [string, number, () => string][])('%s: %i, closed, nothing forwarded, in one write or two', async (_name, status, refused) => {
    const first = () => refused().replace('{SELF}', String(px().handle.port));
    for (const parts of [[first() + after()], [first(), after()]]) {
      const mark = plainOrigin.all().length;
      const a = await converse(await plain(px()), parts, parts.length > 1 ? 20 : 0);
      expect(a.statuses, a.text.slice(0, 300)).toEqual([status]);
      expect(a.closed).toBe(true);
      expect(since(plainOrigin, mark)).not.toContain('/after-refusal');
    }
  });

  it('a WebSocket upgrade the origin answers without 101: its answer, closed, nothing pipelined forwarded', async () => {
    const mark = plainOrigin.all().length;
    const a = await converse(await plain(px()), [plainUpgrade(`http://127.0.0.1:${plainOrigin.port}/ws`) + after()]);
    expect(a.statuses).toEqual([200]);
    expect(a.closed).toBe(true);
    expect(since(plainOrigin, mark)).toContain('GET /ws ');
    expect(since(plainOrigin, mark)).not.toContain('/after-refusal');
  });
});

describe.each([true, false])('3. siblings: an egress refusal after resolution closes too (fast path %s)', (fastPath) => {
  it('a rule host resolving to a denied address: 403, closed, and the pipelined request is not acted on', async () => {
    let text = '';
    const logger = createLogger({ destination: new Writable({ write: (c, _e, cb) => ((text += c), cb()) }) });
    const handle = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca,
      config: compileConfig({
        no_proxy: [],
        rules: [{ name: 'review', match_hosts: [HOST], headers: [{ name: 'X-Key', value: SECRET }] }],
        access_control: { deny_addresses: ['127.0.0.0/8'] },
      }),
      logger,
      resolve: new Map([[`${HOST}:${tlsOrigin.port}`, '127.0.0.1']]),
      upstreamCa: [pki.caPem],
      limits: LIMITS,
      fastPath,
    });
    proxies.push({ handle, log: () => text });
    const mark = tlsOrigin.all().length;
    const a = await converse(await tunnel({ handle, log: () => text }), [follower() + follower()]);
    expect(a.statuses, a.text.slice(0, 300)).toEqual([403]);
    expect(a.text).toMatch(/destination_ip_prohibited/);
    expect(a.closed).toBe(true);
    expect(since(tlsOrigin, mark)).toBe('');
  });
});

describe.each([true, false])('3. siblings: a body that breaks after a good head (fast path %s)', (fastPath) => {
  const px = () => byPath.get(fastPath)!;

  it.each([
    ['chunk extensions too large (413)', 413, `;${'e'.repeat(20_000)}\r\n`],
    ['a chunk size that is not hex (400)', 400, `zz\r\nabc\r\n0\r\n\r\n`],
  ])('%s: the message is cut, closed, nothing pipelined forwarded', async (_name, status, badChunk) => {
    const mark = tlsOrigin.all().length;
    const head = `POST /up HTTP/1.1\r\nHost: ${hostHeader()}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n`;
    const a = await converse(await tunnel(px()), [head, `3${badChunk}` + follower()], 50);
    expect(a.statuses.at(-1), a.text.slice(0, 300)).toBe(status);
    expect(a.closed).toBe(true);
    const got = since(tlsOrigin, mark);
    expect(got).not.toContain('/after-refusal');
    // The origin never sees a complete chunked message.
    expect(got).not.toMatch(/\r\n0\r\n\r\n$/);
  });
});
