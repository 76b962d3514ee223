/**
 * The Node path's first upstream connection in a process (undici compiles its llhttp parser for
 * it, so the parser comes late): the two answers undici 7 alone turns into a 502 (an unsolicited
 * 100 Continue; Connection: close in the trailers, then more requests) are relayed right on it,
 * not only on later connections (src/proxy/upstream.ts, patchParserClass). Its own file: a fresh
 * process, with no undici connection made before.
 */
import type tls from 'node:tls';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTestPki } from '../../helpers/pki.js';
import { HOST, Reader, request, startScriptedOrigin, startTestProxy, type ScriptedOrigin, type TestProxy } from './fast-helpers.js';

let o: ScriptedOrigin;
let proxy: TestProxy;

beforeAll(async () => {
  const pki = await createTestPki([HOST]);
  o = await startScriptedOrigin(pki, (req, s: tls.TLSSocket) => {
    if (req.path === '/first') s.write('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n0\r\nConnection: close\r\n\r\n');
    else s.write(`HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext`);
  });
  proxy = await startTestProxy(pki, { fastPath: false });
  proxy.route(o.port);
});

afterAll(async () => {
  await proxy?.close(500);
  await o?.close();
});

it('the first answer on the first connection: 100 skipped, the trailer close honoured, the next request answered', async () => {
  const c = new Reader(await proxy.connect(o.port));
  const h = `${HOST}:${o.port}`;
  const first = await c.exchange(request('GET', '/first', h));
  expect([first.status, first.body.toString()]).toEqual([200, 'first']);
  const next = await c.exchange(request('GET', '/next', h));
  expect([next.status, next.body.toString()]).toEqual([200, 'next']);
  // The origin's first connection carried one request; the next went on a new one.
  expect(o.requests.map((r) => [r.path, r.conn.id])).toEqual([
    ['/first', 0],
    ['/next', 1],
  ]);
  c.socket.destroy();
});
