/**
 * A client that pipelines requests and then half-closes (RFC 9112 9.6: a client may end its side
 * once it has sent its last request, and still reads every answer) must get every response, on
 * both exchanges (the fast path and the Node path). A client that goes away for good gets
 * nothing more, and nothing more of its goes upstream with the rule's credentials.
 */
import http from 'node:http';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../../helpers/pki.js';
import { sleep } from '../hardening-helpers.js';
import { closeBothExchanges, echo, HOST, INJECTED, Reader, request, startBothExchanges, startScriptedOrigin, values, type ScriptedOrigin, type TestProxy } from './fast-helpers.js';

let pki: TestPki;
let o: ScriptedOrigin;
let proxies: Record<'fast' | 'node', TestProxy> = {} as never;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  // Answers to the `/gone` requests take a moment: a client that leaves meanwhile is noticed.
  o = await startScriptedOrigin(pki, (req, s) => (req.target.startsWith('/gone') ? setTimeout(() => echo(req, s), 10) : echo(req, s)));
  proxies = await startBothExchanges(pki, o.port);
});

afterAll(() => closeBothExchanges(proxies, o));

const N = 200;

function pipelined(n: number, prefix: string): Buffer {
  const h = `${HOST}:${o.port}`;
  const parts: Buffer[] = [];
  for (let i = 0; i < n; i++) parts.push(request('GET', `${prefix}/${i}`, h));
  return Buffer.concat(parts);
}

/** Every response the client reads until the connection ends. */
async function readAll(c: Reader, ms = 20_000): Promise<number[]> {
  const statuses: number[] = [];
  const until = Date.now() + ms;
  for (;;) {
    try {
      const r = await c.next('GET', Math.max(1, until - Date.now()));
      statuses.push(r.status);
      expect(values(r.headers, 'x-key')).toEqual([]);
    } catch {
      return statuses;
    }
  }
}

describe.each(['fast', 'node'] as const)('the %s exchange', (name) => {
  it(`${N} GETs pipelined in one write, then a half-close: all ${N} answered, in order, then the proxy closes`, async () => {
    const p = proxies[name];
    const before = o.requests.length;
    const c = new Reader(await p.connect(o.port));
    c.socket.write(pipelined(N, `/half-${name}`));
    c.socket.end();
    const statuses = await readAll(c);
    expect(statuses.length).toBe(N);
    expect(statuses.every((s) => s === 200)).toBe(true);
    const got = o.requests.slice(before).map((r) => r.target);
    expect(got).toEqual(Array.from({ length: N }, (_, i) => `/half-${name}/${i}`));
    for (const r of o.requests.slice(before)) expect(values(r.headers, 'x-key')).toEqual([INJECTED]);
    expect(await c.waitClosed(5000)).toBe(true);
  });

  it('a half-close in the middle of a pipelined request head: the complete ones are answered, then the proxy closes', async () => {
    const p = proxies[name];
    const before = o.requests.length;
    const c = new Reader(await p.connect(o.port));
    c.socket.write(Buffer.concat([pipelined(3, `/halfpart-${name}`), Buffer.from(`GET /halfpart-${name}/cut HTTP/1.1\r\nHost: ${HOST}`)]));
    c.socket.end();
    const statuses = await readAll(c, 5000);
    expect(statuses.slice(0, 3)).toEqual([200, 200, 200]);
    // The incomplete head is never forwarded (the Node path may answer it 400 before closing).
    expect(statuses.slice(3).every((s) => s === 400)).toBe(true);
    expect(o.requests.slice(before).map((r) => r.target)).toEqual([0, 1, 2].map((i) => `/halfpart-${name}/${i}`));
    expect(await c.waitClosed(5000)).toBe(true);
  });

  it('a client that closes for good right after pipelining: the proxy stops forwarding once it sees the client gone', async () => {
    const p = proxies[name];
    const before = o.requests.length;
    const c = new Reader(await p.connect(o.port));
    // Unread bytes at close make the kernel reset the connection: the proxy learns at its first write.
    c.socket.write(pipelined(N, `/gone-${name}`));
    await sleep(20);
    c.socket.destroy();
    await sleep(500);
    const forwarded = o.requests.length - before;
    // One at a time, each answered after 10 ms: a handful at most before the reset is seen.
    expect(forwarded).toBeLessThan(20);
    // Settled: nothing more goes upstream afterwards.
    await sleep(300);
    expect(o.requests.length - before).toBe(forwarded);
  });
});

describe('the fast exchange hands over after the client ended its side', () => {
  it('pipelined GET, chunked POST (the Node path), GET, then a half-close: three answers, then the proxy closes', async () => {
    const p = proxies.fast;
    const h = `${HOST}:${o.port}`;
    const before = o.requests.length;
    const c = new Reader(await p.connect(o.port));
    c.socket.write(
      Buffer.concat([
        request('GET', '/ho/1', h),
        request('POST', '/ho/2', h, [['Transfer-Encoding', 'chunked']], '3\r\nabc\r\n0\r\n\r\n'),
        request('GET', '/ho/3', h),
      ]),
    );
    c.socket.end();
    expect(await readAll(c, 5000)).toEqual([200, 200, 200]);
    expect(o.requests.slice(before).map((r) => `${r.method} ${r.target} ${r.body.toString()}`)).toEqual(['GET /ho/1 ', 'POST /ho/2 abc', 'GET /ho/3 ']);
    expect(await c.waitClosed(5000)).toBe(true);
  });
});

describe('the Node path forwards pipelined requests one at a time', () => {
  it('a POST pipelined behind a slow GET reaches the origin only after the GET was answered', async () => {
    const p = proxies.node;
    const seen: string[] = [];
    const slow = await startScriptedOrigin(pki, (req, s) => {
      seen.push(`arrived ${req.target}`);
      const reply = () => {
        seen.push(`answered ${req.target}`);
        echo(req, s);
      };
      if (req.target === '/order/slow') setTimeout(reply, 300);
      else reply();
    });
    try {
      p.route(slow.port);
      const h = `${HOST}:${slow.port}`;
      const c = new Reader(await p.connect(slow.port));
      c.socket.write(Buffer.concat([request('GET', '/order/slow', h), request('POST', '/order/after', h, [['Content-Length', '2']], 'hi')]));
      const [a, b] = [await c.next(), await c.next()];
      expect([a.status, b.status]).toEqual([200, 200]);
      expect(seen).toEqual(['arrived /order/slow', 'answered /order/slow', 'arrived /order/after', 'answered /order/after']);
      expect(slow.requests[1].body.toString()).toBe('hi');
      c.socket.destroy();
    } finally {
      await slow.close();
    }
  });
});

describe('plain absolute-form requests on the proxy port', () => {
  it('20 pipelined, then a half-close: all answered, in order, then the proxy closes', async () => {
    const seen: string[] = [];
    const plain = http.createServer((req, res) => {
      seen.push(req.url ?? '');
      res.end(`plain ${req.url}`);
    });
    await new Promise<void>((r) => plain.listen(0, '127.0.0.1', () => r()));
    try {
      const port = (plain.address() as net.AddressInfo).port;
      const s = net.connect({ port: proxies.node.handle.port, host: '127.0.0.1' });
      await new Promise((r) => s.once('connect', r));
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      const closed = new Promise((r) => s.once('close', r));
      const reqs: string[] = [];
      for (let i = 0; i < 20; i++) reqs.push(`GET http://127.0.0.1:${port}/p/${i} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`);
      s.end(reqs.join(''));
      await Promise.race([closed, sleep(5000)]);
      expect(text.match(/HTTP\/1\.1 200 /g)?.length ?? 0, text.slice(0, 2000)).toBe(20);
      expect(seen).toEqual(Array.from({ length: 20 }, (_, i) => `/p/${i}`));
      s.destroy();
    } finally {
      plain.closeAllConnections();
      await new Promise<void>((r) => plain.close(() => r()));
    }
  });
});
