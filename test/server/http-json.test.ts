// The body reader, JSON writer and parser-refusal answers shared by the hand-rolled servers, on a
// real node:http server, with undici and raw sockets (to send what no well-behaved client sends).
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answerParserErrors, sendError } from '../../src/server/http-errors.js';
import { MAX_URL_LENGTH, checkUrlLength, readJsonBody, sendJson } from '../../src/server/http-json.js';
import { rawExchange, segmentations, statusAfterPieces } from '../helpers/connect.js';

let server: http.Server;
let base: string;
let port: number;
let reads = 0;

beforeAll(async () => {
  server = http.createServer((req, res) => {
    (async () => {
      checkUrlLength(req);
      reads++;
      const body = await readJsonBody(req, { maxBytes: 64 });
      sendJson(res, 200, { present: body !== undefined, body: body ?? null });
    })().catch((err) => sendError(req, res, err));
  });
  answerParserErrors(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
  base = `http://127.0.0.1:${port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

async function call(body: string | Buffer | undefined, headers: Record<string, string> = {}, method = 'POST') {
  const r = await request(base + '/x', { method: method as 'POST', headers, body });
  const text = await r.body.text();
  return { status: r.statusCode, headers: r.headers, text, json: JSON.parse(text) };
}

function raw(bytes: string | Buffer) {
  return new Promise<net.Socket>((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  }).then((s) => rawExchange(s, bytes));
}

describe('readJsonBody', () => {
  it('parses a JSON body; application/*+json and no Content-Type count as JSON', async () => {
    expect((await call('{"a":1}', { 'content-type': 'application/json; charset=utf-8' })).json).toEqual({ present: true, body: { a: 1 } });
    expect((await call('[1]', { 'content-type': 'application/merge-patch+json' })).json).toEqual({ present: true, body: [1] });
    expect((await call('"s"')).json).toEqual({ present: true, body: 's' });
  });

  it('a request without a body is never parsed, whatever its Content-Type says', async () => {
    const cases: Record<string, string>[] = [{ 'content-type': 'application/json' }, { 'content-type': 'text/plain' }, { 'content-type': 'application/json', 'content-length': '0' }];
    for (const headers of cases) {
      const r = await call(undefined, headers);
      expect(r.status, JSON.stringify(headers)).toBe(200);
      expect(r.json).toEqual({ present: false, body: null });
    }
    // Chunked with no data at all: no body either.
    const chunked = await raw('POST /x HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n');
    expect(JSON.parse(chunked.body)).toEqual({ present: false, body: null });
  });

  it('415 for a body of another type, in the detail shape', async () => {
    const r = await call('a=b', { 'content-type': 'application/x-www-form-urlencoded' });
    expect(r.status).toBe(415);
    expect(r.json).toEqual({ detail: expect.stringContaining('application/json') });
    expect(r.headers['content-type']).toBe('application/json');
  });

  it('413 for a declared or a streamed body over the limit; the connection is closed', async () => {
    // Declared and not sent yet: the answer must close (what is left of the body is not a next request).
    // (A body that arrived with its head is read by then, and the connection may stay open.)
    const declared = await raw('POST /x HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 65\r\n\r\n');
    expect(declared.status).toBe(413);
    expect(JSON.parse(declared.body)).toEqual({ detail: 'Request body too large (limit 64 bytes).' });
    expect(declared.headers.connection).toBe('close');
    expect((await call('x'.repeat(65), { 'content-type': 'application/json' })).status).toBe(413);
    // No Content-Length: counted while streaming, refused at the first chunk past the limit.
    const streamed = await raw(
      'POST /x HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n' + `28\r\n${'"'.padEnd(40, 'y')}\r\n`.repeat(3) + '0\r\n\r\n',
    );
    expect(streamed.status).toBe(413);
    expect(JSON.parse(streamed.body)).toEqual({ detail: 'Request body too large (limit 64 bytes).' });
  });

  it('422 json_invalid with a position for bad JSON and for bytes that are not UTF-8; the input is never echoed', async () => {
    const bad = await call('{"token": "kg-never-echoed', { 'content-type': 'application/json' });
    expect(bad.status).toBe(422);
    expect(bad.json).toEqual({ detail: [{ loc: ['body'], msg: expect.stringMatching(/^JSON decode error at /), type: 'json_invalid' }] });
    expect(bad.text).not.toContain('never-echoed');
    const latin1 = await call(Buffer.from([0x22, 0xe9, 0x22]), { 'content-type': 'application/json' });
    expect(latin1.status).toBe(422);
    expect(latin1.json.detail[0]).toMatchObject({ loc: ['body'], type: 'json_invalid' });
  });
});

describe('refusals before the handler', () => {
  it('431 for an oversized header block, as JSON, connection closed', async () => {
    const before = reads;
    const r = await raw(`GET /x HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(r.status).toBe(431);
    expect(r.headers['content-type']).toBe('application/json');
    expect(r.headers.connection).toBe('close');
    expect(JSON.parse(r.body)).toEqual({ detail: 'Request headers are too large.' });
    expect(reads).toBe(before);
  });

  it('414 for a request target over the limit, whether Node or the handler notices', async () => {
    const huge = await raw(`GET /${'u'.repeat(20_000)} HTTP/1.1\r\nHost: t\r\n\r\n`);
    expect(huge.status).toBe(414);
    expect(JSON.parse(huge.body)).toEqual({ detail: `Request URL too long (limit ${MAX_URL_LENGTH} bytes).` });
    // Within Node's header limit but over ours: the handler refuses it.
    const long = await request(`${base}/${'u'.repeat(MAX_URL_LENGTH + 1)}`);
    expect(long.statusCode).toBe(414);
    expect(await long.body.json()).toEqual({ detail: `Request URL too long (limit ${MAX_URL_LENGTH} bytes).` });
  });

  it('408 for a request whose headers never finish, as JSON', async () => {
    const slow = http.createServer({ headersTimeout: 300, requestTimeout: 400, connectionsCheckingInterval: 50 }, (_req, res) => sendJson(res, 200, {}));
    answerParserErrors(slow);
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    try {
      const s = await new Promise<net.Socket>((resolve, reject) => {
        const c = net.connect((slow.address() as AddressInfo).port, '127.0.0.1', () => resolve(c));
        c.once('error', reject);
      });
      // Half a request, then nothing: the server gives up and says so.
      const r = await rawExchange(s, 'GET /x HTTP/1.1\r\nHost: t\r\n');
      expect(r.status).toBe(408);
      expect(JSON.parse(r.body)).toEqual({ detail: 'The request took too long to arrive.' });
    } finally {
      slow.closeAllConnections();
      await new Promise((r) => slow.close(r));
    }
  });

  it('400 for a malformed request, as JSON', async () => {
    const r = await raw('GET /x HTTP/1.1\r\nHost: t\r\nBad Header Line\r\n\r\n');
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body)).toEqual({ detail: 'Malformed HTTP request.' });
  });
});

describe('414 or 431 whatever the segmentation (issue #18, class 4)', () => {
  it.each([
    ['a 128 KiB field after a short request line', 431, `GET /x HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(128 * 1024)}\r\n\r\n`],
    ['a 20 KiB field after a short request line', 431, `GET /x HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(20 * 1024)}\r\n\r\n`],
    ['a 20 KiB request line', 414, `GET /${'u'.repeat(20 * 1024)} HTTP/1.1\r\nHost: t\r\n\r\n`],
    ['a 10 KiB request line, then a 10 KiB field', 414, `GET /${'u'.repeat(10 * 1024)} HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(10 * 1024)}\r\n\r\n`],
    ['a 4 KiB request line, then a 20 KiB field', 431, `GET /${'u'.repeat(4 * 1024)} HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(20 * 1024)}\r\n\r\n`],
    // Malformed past the limit: Node's parser says 400 or overflow depending on where the chunks end.
    ['a field name with a bad byte past the limit', 431, `GET /x HTTP/1.1\r\nHost: t\r\nX-${'n'.repeat(20 * 1024)} b: 1\r\n\r\n`],
    ['a request line with a bad byte past the limit', 414, `GET /${'u'.repeat(20 * 1024)}\u0001 HTTP/1.1\r\nHost: t\r\n\r\n`],
    ['a field name with a bad byte within the limit', 400, `GET /x HTTP/1.1\r\nHost: t\r\nX-${'n'.repeat(8 * 1024)} b: 1\r\n\r\n`],
  ])('%s: always %i', async (_name, status, bytes) => {
    for (const [how, parts] of segmentations(bytes)) expect(await statusAfterPieces(port, parts), how).toBe(status);
  }, 60_000);
});
