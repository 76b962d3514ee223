/**
 * Answers from the origin that both exchanges must relay the same way (the fast path and the
 * Node path, whose upstream side is undici): informational answers before the final one, a 304
 * or 204 that names a length it never sends (RFC 9110 8.6 allows it on a 304), and transfer
 * codings the proxy cannot re-frame (the body would reach the client still coded, or cut).
 * After each, the next request on the same client connection is answered by the origin for it.
 */
import type tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../../helpers/pki.js';
import { closeBothExchanges, HOST, Reader, request, startBothExchanges, startScriptedOrigin, values, type ScriptedOrigin, type TestProxy } from './fast-helpers.js';

let pki: TestPki;
let o: ScriptedOrigin;
let proxies: Record<'fast' | 'node', TestProxy> = {} as never;

/** The origin's answer for `/case/NAME`; `/next` gets a small 200 naming its connection. */
const ANSWERS: Record<string, string> = {
  early103: 'HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
  // A 100 Continue the request did not ask for (no Expect), then the answer: RFC 9110 15.2 lets
  // an origin send it; the client must see only the 200.
  continue100: 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
  continue100then103: 'HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
  two1xx: 'HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
  notModifiedWithLength: 'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 1234\r\n\r\n',
  noContentWithLength: 'HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n',
  gzipChunked: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  chunkedTwice: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  trailers:
    'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: x-listed\r\nTrailer: X-Checksum\r\n\r\n5\r\nhello\r\n0\r\n' +
    'X-Checksum: abc\r\nConnection: x-named\r\nKeep-Alive: timeout=1\r\nHost: evil.example\r\n' +
    'Proxy-Authenticate: Basic\r\nX-Listed: 1\r\nX-Named: 2\r\nUpgrade: h2c\r\n\r\n',
  // Framing fields and a line that is no field: undici (the Node path) fails the whole answer.
  framingTrailers: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Checksum: abc\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\nnot a field\r\n\r\n',
  // `Connection: close` in the trailer section, the origin then closing: the next request must
  // reach the origin on a fresh connection, never be sent on (or fail with) this one.
  closeTrailer: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nConnection: close\r\n\r\n',
  // The same, with the origin keeping its side open after all.
  closeTrailerOpen: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nConnection: close\r\n\r\n',
  headCoded: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nETag: "h"\r\n\r\n',
  notModifiedCoded: 'HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: gzip, chunked\r\nETag: "v2"\r\n\r\n',
  twoFields: 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  // Not HTTP: a header line without a colon, and a status line that is not one.
  noColon: 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nthis is not a field\r\n\r\nok',
  badStatus: 'HTTP/1.1 abc\r\nContent-Length: 2\r\n\r\nok',
};

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  o = await startScriptedOrigin(pki, (req, s: tls.TLSSocket) => {
    const which = req.path.split('/')[2];
    if (req.path === '/next') s.write(`HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext`);
    else if (which === 'splitTrailers') {
      // The trailer section in pieces, split inside the last chunk line and inside a field.
      const all = ANSWERS.trailers;
      const cuts = [all.indexOf('0\r\n') + 1, all.indexOf('Keep-Alive') + 4, all.indexOf('X-Named') + 2, all.length];
      cuts.reduce((from, to, i) => (setTimeout(() => s.write(all.slice(from, to)), i * 20), to), 0);
    } else if (which === 'closeTrailer') s.end(ANSWERS[which]);
    else s.write(ANSWERS[which]);
  });
  proxies = await startBothExchanges(pki, o.port);
});

afterAll(() => closeBothExchanges(proxies, o));

async function twoRequests(name: 'fast' | 'node', path: string, method = 'GET') {
  const c = new Reader(await proxies[name].connect(o.port));
  const h = `${HOST}:${o.port}`;
  const first = await c.exchange(request(method, path, h), method);
  const next = await c.exchange(request('GET', '/next', h));
  c.socket.destroy();
  return { first, next };
}

describe.each(['fast', 'node'] as const)('the %s exchange', (name) => {
  it.each(['early103', 'two1xx', 'continue100', 'continue100then103'])('%s: informational answers are not relayed; the final answer is, whole', async (which) => {
    const { first, next } = await twoRequests(name, `/case/${which}`);
    expect(first.status).toBe(200);
    expect(first.body.toString()).toBe('ok');
    expect(next.body.toString()).toBe('next');
  });

  it('a 304 with the Content-Length of the representation (no body): relayed as is, the connection goes on', async () => {
    const { first, next } = await twoRequests(name, '/case/notModifiedWithLength');
    expect(first.status).toBe(304);
    expect(values(first.headers, 'etag')).toEqual(['"v1"']);
    expect(next.body.toString()).toBe('next');
  });

  it('a 204 naming a length: relayed without a body, the connection goes on', async () => {
    const { first, next } = await twoRequests(name, '/case/noContentWithLength');
    expect(first.status).toBe(204);
    expect(next.body.toString()).toBe('next');
  });

  it.each([
    ['HEAD', 'headCoded', 200],
    ['GET', 'notModifiedCoded', 304],
  ])('%s answered without a body but naming a coding (%s): relayed, the connection goes on', async (method, which, status) => {
    const { first, next } = await twoRequests(name, `/case/${which}`, method);
    expect(first.status).toBe(status);
    expect(values(first.headers, 'etag')).toHaveLength(1);
    expect(values(first.headers, 'transfer-encoding')).toEqual([]);
    expect(next.body.toString()).toBe('next');
  });

  it.each(['noColon', 'badStatus'])('%s: an answer that does not parse is 502 "sent an invalid response", coded http_protocol_error', async (which) => {
    const { first, next } = await twoRequests(name, `/case/${which}`);
    expect(first.status).toBe(502);
    expect(first.body.toString()).toMatch(/sent an invalid response/);
    expect(values(first.headers, 'proxy-status').join()).toMatch(/keygate; error=http_protocol_error/);
    expect(next.body.toString()).toBe('next');
  });

  it.each(['gzipChunked', 'chunkedTwice', 'twoFields'])('%s: a transfer coding the proxy cannot re-frame is 502, never relayed as if plain', async (which) => {
    const { first, next } = await twoRequests(name, `/case/${which}`);
    expect(first.status).toBe(502);
    expect(values(first.headers, 'proxy-status').join()).toMatch(/keygate/);
    expect(next.body.toString()).toBe('next');
  });

  it('trailers: hop-by-hop, framing and routing fields (and those Connection names) never reach the client; others may', async () => {
    const { first, next } = await twoRequests(name, '/case/trailers');
    expect(first.status).toBe(200);
    expect(first.body.toString()).toBe('hello');
    // Both paths relay the allowed ones, through the one trailer policy (headers.ts, relayedTrailers).
    expect(first.trailers).toEqual(['X-Checksum: abc']);
    expect(next.body.toString()).toBe('next');
  });

  it.each(['closeTrailer', 'closeTrailerOpen'])('%s: Connection: close in the trailers; the next request is answered by the origin', async (which) => {
    const { first, next } = await twoRequests(name, `/case/${which}`);
    expect([first.status, first.body.toString()]).toEqual([200, 'hello']);
    expect([next.status, next.body.toString()]).toEqual([200, 'next']);
  });

  it('the same trailer section arriving in pieces: filtered the same', async () => {
    const { first, next } = await twoRequests(name, '/case/splitTrailers');
    expect([first.status, first.body.toString()]).toEqual([200, 'hello']);
    expect(first.trailers).toEqual(['X-Checksum: abc']);
    expect(next.body.toString()).toBe('next');
  });

  it('trailers naming the framing, or not fields at all: never relayed; the answer is cut on both paths (headers.ts, trailerProblem)', async () => {
    const c = new Reader(await proxies[name].connect(o.port));
    c.socket.write(request('GET', '/case/framingTrailers', `${HOST}:${o.port}`));
    await expect(c.next()).rejects.toThrow(/connection ended/);
    expect(c.pending.toString('latin1')).not.toMatch(/Content-Length: 99|not a field|\r\n0\r\n/);
    c.socket.destroy();
  });
});
