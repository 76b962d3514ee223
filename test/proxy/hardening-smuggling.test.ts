/**
 * Request smuggling and parsing (issue #9 part 4): ambiguous framing and malformed heads are
 * refused with 400 and never forwarded. Each case is sent as raw bytes over plain absolute-form
 * and inside a CONNECT tunnel + TLS to an intercepted host, against origins that record every
 * byte they receive: a refused request must leave them with nothing.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTunnel, tlsOverTunnel } from '../helpers/connect.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { rawPlain, readUntilClose, startRecordingOrigin, type RecordingOrigin, type RawResult } from './hardening-helpers.js';

let pki: TestPki;
let plainOrigin: RecordingOrigin;
let tlsOrigin: RecordingOrigin;
let proxy: SpawnedProxy;

beforeAll(async () => {
  pki = await createTestPki(['rec.test.local']);
  plainOrigin = await startRecordingOrigin();
  tlsOrigin = await startRecordingOrigin(pki);
  proxy = await spawnProxy({
    config: { rules: [{ name: 'rec', match_hosts: ['rec.test.local'], headers: [{ name: 'X-Key', type: 'plaintext', value: 'injected' }] }] },
    resolve: [`rec.test.local:${tlsOrigin.port}:127.0.0.1`],
    upstreamCa: [pki.caPem],
  });
});

afterAll(async () => {
  await proxy?.stop();
  await plainOrigin?.close();
  await tlsOrigin?.close();
});

/**
 * What each origin connection has received so far, to diff against later. Bytes, not
 * connections: an intercepted CONNECT opens the upstream connection ahead of any request
 * (src/proxy/upstream.ts prewarm), so a refused request may leave an idle connection behind, but
 * never a byte on it.
 */
function mark(origin: RecordingOrigin): number[] {
  return origin.received.map((r) => r.length);
}

/** The bytes each connection received since `m`, for the connections that received any. */
function sinceMark(origin: RecordingOrigin, m: number[]): string[] {
  return origin.received.map((r, i) => r.slice(m[i] ?? 0)).filter((r) => r.length > 0);
}

/** One request head (lines joined by CRLF unless a case needs otherwise) + body, plain absolute-form. */
async function viaPlain(head: string): Promise<RawResult> {
  return rawPlain(proxy.port, head.replace('{TARGET}', `http://127.0.0.1:${plainOrigin.port}/x`).replace('{HOST}', `127.0.0.1:${plainOrigin.port}`));
}

/** The same bytes inside CONNECT + TLS to the intercepted host. */
async function viaTunnel(head: string): Promise<RawResult> {
  const c = await connectTunnel(proxy.port, `rec.test.local:${tlsOrigin.port}`);
  expect(c.status).toBe(200);
  const t = await tlsOverTunnel(c.socket, 'rec.test.local', proxy.caPem);
  return readUntilClose(t, head.replace('{TARGET}', '/x').replace('{HOST}', `rec.test.local:${tlsOrigin.port}`));
}

const CASES: [string, string][] = [
  ['Content-Length with Transfer-Encoding', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n'],
  ['Transfer-Encoding with Content-Length (other order)', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n'],
  ['duplicate Content-Length, different values', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!'],
  ['duplicate Content-Length, same value', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello'],
  ['Content-Length as a list', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5, 5\r\n\r\nhello'],
  ['Content-Length with a sign', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: +5\r\n\r\nhello'],
  ['obsolete line folding', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nX-Folded: a\r\n b\r\n\r\n'],
  ['bare CR inside a field value', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nX-A: a\rb\r\n\r\n'],
  ['bare LF line endings', 'GET {TARGET} HTTP/1.1\nHost: {HOST}\nX-A: b\n\n'],
  ['bare LF after one header', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\nX-A: b\r\n\r\n'],
  ['NUL in a field value', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nX-A: a\x00b\r\n\r\n'],
  ['control byte in a field value', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nX-A: a\x01b\r\n\r\n'],
  ['space inside a field name', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nX A: b\r\n\r\n'],
  ['space before the colon', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length : 5\r\n\r\nhello'],
  ['non-token byte in a field name', 'GET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nX-A\x7f: b\r\n\r\n'],
  ['Transfer-Encoding: gzip (not chunked)', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: gzip\r\n\r\nabc'],
  ['Transfer-Encoding: gzip, chunked', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n'],
  ['Transfer-Encoding: identity', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: identity\r\n\r\n'],
  ['two Transfer-Encoding fields', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n'],
  ['Transfer-Encoding: chunked on HTTP/1.0', 'POST {TARGET} HTTP/1.0\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n'],
  ['Transfer-Encoding with a trailing comma', 'POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked,\r\n\r\n3\r\nabc\r\n0\r\n\r\n'],
  ['control byte in the request target', 'GET {TARGET}\x01 HTTP/1.1\r\nHost: {HOST}\r\n\r\n'],
  ['unknown HTTP version', 'GET {TARGET} HTTP/1.2\r\nHost: {HOST}\r\n\r\n'],
  // HTTP/0.9 has no headers and no framing: Node's parser reads the request line alone as a request.
  ['HTTP/0.9 request line (no version)', 'GET {TARGET}\r\n\r\n'],
  ['HTTP/0.9 request line, then header lines', 'GET {TARGET}\r\nHost: {HOST}\r\n\r\n'],
  ['HTTP/0.9 request line, then a request', 'GET {TARGET}\r\nGET {TARGET} HTTP/1.1\r\nHost: {HOST}\r\n\r\n'],
  ['HTTP/0.9 asked for explicitly', 'GET {TARGET} HTTP/0.9\r\nHost: {HOST}\r\n\r\n'],
];

describe.each([
  ['plain absolute-form', viaPlain, () => plainOrigin],
  ['CONNECT tunnel + TLS (intercepted)', viaTunnel, () => tlsOrigin],
] as const)('%s', (_name, send, originOf) => {
  it.each(CASES)('%s: 400, nothing reaches the origin', async (_case, head) => {
    const origin = originOf();
    const before = mark(origin);
    const res = await send(head);
    expect(res.status, res.text.slice(0, 200)).toBe(400);
    expect(res.text).toMatch(/\r\nProxy-Status: keygate; error=http_request_error/i);
    expect(res.text).toMatch(/\r\nConnection: close\r\n/i);
    expect(res.closed).toBe(true);
    // Give a forwarded request time to arrive, if one had been sent.
    await new Promise((r) => setTimeout(r, 30));
    expect(sinceMark(origin, before)).toEqual([]);
  });

  it('a chunk size that is not hex, after a good head: the origin never sees a complete message', async () => {
    const origin = originOf();
    const before = mark(origin);
    const res = await send('POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\nGET /smuggled HTTP/1.1\r\n\r\n0\r\n\r\n');
    expect(res.status === 400 || res.status === 0).toBe(true);
    await new Promise((r) => setTimeout(r, 100));
    for (const got of sinceMark(origin, before)) {
      expect(got).not.toContain('/smuggled');
      expect(got).not.toMatch(/\r\n0\r\n\r\n$/);
    }
  });

  it('control: well-framed requests (Content-Length, chunked) pass, re-framed by the proxy', async () => {
    const origin = originOf();
    const before = mark(origin);
    const cl = await send('POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello');
    expect(cl.status).toBe(200);
    const afterFirst = sinceMark(origin, before);
    const mid = mark(origin);
    const chunked = await send('POST {TARGET} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n');
    expect(chunked.status).toBe(200);
    // Each request reached the origin once, on one connection.
    expect(afterFirst).toHaveLength(1);
    const [first] = afterFirst;
    const afterSecond = sinceMark(origin, mid);
    expect(afterSecond).toHaveLength(1);
    const [second] = afterSecond;
    expect(first).toMatch(/\r\ncontent-length: 5\r\n/i);
    expect(first).not.toMatch(/transfer-encoding/i);
    expect(first.endsWith('\r\n\r\nhello')).toBe(true);
    expect(second).toMatch(/\r\ntransfer-encoding: chunked\r\n/i);
    expect(second).not.toMatch(/content-length/i);
    expect(second).toMatch(/\r\n\r\n5\r\nhello\r\n0\r\n\r\n$/);
  });
});

describe('no lenient parsing anywhere', () => {
  it('NODE_OPTIONS=--insecure-http-parser does not make the proxy lenient', async () => {
    const lenient = await spawnProxy({ config: { rules: [] }, env: { NODE_OPTIONS: '--insecure-http-parser' } });
    try {
      const before = mark(plainOrigin);
      const res = await rawPlain(lenient.port, `POST http://127.0.0.1:${plainOrigin.port}/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`);
      expect(res.status).toBe(400);
      const fold = await rawPlain(lenient.port, `GET http://127.0.0.1:${plainOrigin.port}/x HTTP/1.1\r\nHost: x\r\nX-F: a\r\n b\r\n\r\n`);
      expect(fold.status).toBe(400);
      expect(sinceMark(plainOrigin, before)).toEqual([]);
    } finally {
      await lenient.stop();
    }
  });
});
