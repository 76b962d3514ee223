/**
 * WebSocket upgrades with hostile framing. Node's parser hands every byte after an upgrade
 * request's head to the new protocol, whatever Content-Length or Transfer-Encoding the head
 * announced; an origin reads those bytes as the announced body (and whatever follows them as
 * the next request). Such a request is refused before anything reaches the origin.
 */
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../../helpers/pki.js';
import { sleep } from '../hardening-helpers.js';
import { HOST, INJECTED, startTestProxy, type TestProxy } from './fast-helpers.js';

let pki: TestPki;
let px: TestProxy;
/** The same with the fast path off: every request read by Node's parser. */
let nodePx: TestProxy;
/** Bytes each origin connection received (TLS origin, then the plain one). */
const tlsGot: string[] = [];
const plainGot: string[] = [];
let tlsOrigin: tls.Server;
let plainOrigin: net.Server;

/** Whether each TLS origin connection is closed. */
const tlsClosed: boolean[] = [];

function recorder(into: string[], closed?: boolean[]) {
  return (s: net.Socket) => {
    const i = into.push('') - 1;
    closed?.push(false);
    s.on('close', () => closed && (closed[i] = true));
    s.on('error', () => undefined);
    let answered = false;
    s.on('data', (d: Buffer) => {
      into[i] += d.toString('latin1');
      if (answered || !into[i].includes('\r\n\r\n')) return;
      answered = true;
      if (into[i].startsWith('GET /slow ')) {
        setTimeout(() => s.write('HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow'), 300);
      } else if (into[i].startsWith('GET /ws-slow ')) {
        // Answers late, and keeps the connection: it is the proxy's to close.
        setTimeout(() => !s.destroyed && s.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'), 300);
      } else if (into[i].startsWith('GET /ws-coded ')) s.end('HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n');
      else s.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    });
  };
}

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  tlsOrigin = tls.createServer({ key: pki.keyPem, cert: pki.certPem }, recorder(tlsGot, tlsClosed));
  plainOrigin = net.createServer(recorder(plainGot));
  await new Promise<void>((r) => tlsOrigin.listen(0, '127.0.0.1', () => r()));
  await new Promise<void>((r) => plainOrigin.listen(0, '127.0.0.1', () => r()));
  px = await startTestProxy(pki);
  px.route((tlsOrigin.address() as net.AddressInfo).port);
  nodePx = await startTestProxy(pki, { fastPath: false });
  nodePx.route((tlsOrigin.address() as net.AddressInfo).port);
});

afterAll(async () => {
  await px?.close(500);
  await nodePx?.close(500);
  tlsOrigin?.close();
  plainOrigin?.close();
  expect(px.log()).not.toContain(INJECTED);
  expect(nodePx.log()).not.toContain(INJECTED);
});

const upgrade = (target: string, host: string, extra: string, body: string) =>
  `GET ${target} HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n${extra}\r\n${body}`;

/** Writes `data` on `s` and reads until it closes (or 2 s). */
function exchange(s: net.Socket, data: string): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    s.on('data', (d: Buffer) => (text += d.toString('latin1')));
    s.on('error', () => undefined);
    const timer = setTimeout(() => (s.destroy(), resolve(text)), 2000);
    s.on('close', () => (clearTimeout(timer), resolve(text)));
    s.write(data);
  });
}

const SMUGGLED = 'GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n';
const BODIES: [string, string, string][] = [
  ['Content-Length', `Content-Length: ${SMUGGLED.length}\r\n`, SMUGGLED],
  ['Transfer-Encoding: chunked', 'Transfer-Encoding: chunked\r\n', `${SMUGGLED.length.toString(16)}\r\n${SMUGGLED}\r\n0\r\n\r\n`],
];

describe('an upgrade request that announces a body', () => {
  it.each(BODIES)('inside an intercepted tunnel (%s): 400, nothing reaches the origin', async (_name, extra, body) => {
    const port = (tlsOrigin.address() as net.AddressInfo).port;
    const before = tlsGot.join('').length;
    const text = await exchange(await px.connect(port), upgrade('/ws', `${HOST}:${port}`, extra, body));
    expect(text).toMatch(/^HTTP\/1\.1 400 /);
    await sleep(50);
    expect(tlsGot.join('').slice(before)).toBe('');
  });

  it.each(BODIES)('plain ws:// on the proxy port (%s): 400, nothing reaches the origin', async (_name, extra, body) => {
    const port = (plainOrigin.address() as net.AddressInfo).port;
    const before = plainGot.join('').length;
    const s = net.connect(px.handle.port, '127.0.0.1');
    await new Promise((r) => s.once('connect', r));
    const text = await exchange(s, upgrade(`http://127.0.0.1:${port}/ws`, `127.0.0.1:${port}`, extra, body));
    expect(text).toMatch(/^HTTP\/1\.1 400 /);
    await sleep(50);
    expect(plainGot.join('').slice(before)).toBe('');
  });

  it('control: `Content-Length: 0` and no body is an ordinary handshake, with the rule header injected', async () => {
    const port = (tlsOrigin.address() as net.AddressInfo).port;
    const before = tlsGot.length;
    const text = await exchange(await px.connect(port), upgrade('/ws', `${HOST}:${port}`, 'Content-Length: 0\r\n', ''));
    expect(text).toMatch(/^HTTP\/1\.1 101 /);
    const got = tlsGot.slice(before).join('');
    expect(got).toContain('GET /ws HTTP/1.1');
    expect(got).toContain(`x-key: ${INJECTED}`);
  });

  it('control: a plain ws:// handshake without a body reaches the origin', async () => {
    const port = (plainOrigin.address() as net.AddressInfo).port;
    const before = plainGot.length;
    const s = net.connect(px.handle.port, '127.0.0.1');
    await new Promise((r) => s.once('connect', r));
    const text = await exchange(s, upgrade(`http://127.0.0.1:${port}/ws`, `127.0.0.1:${port}`, '', ''));
    expect(text).toMatch(/^HTTP\/1\.1 101 /);
    expect(plainGot.slice(before).join('')).toContain('GET /ws HTTP/1.1');
  });

  it('an origin refusing the upgrade with a transfer coding the proxy cannot re-frame: 502, not its body as if plain', async () => {
    const port = (tlsOrigin.address() as net.AddressInfo).port;
    const text = await exchange(await px.connect(port), upgrade('/ws-coded', `${HOST}:${port}`, '', ''));
    expect(text).toMatch(/^HTTP\/1\.1 502 /);
    expect(text).toMatch(/Transfer-Encoding/);
  });

  it('a client that leaves before the origin answers: the upstream connection is closed once the 101 comes, and the exchange recorded', async () => {
    const port = (tlsOrigin.address() as net.AddressInfo).port;
    const before = tlsGot.length;
    const c = await px.connect(port);
    c.write(upgrade('/ws-slow', `${HOST}:${port}`, '', ''));
    await sleep(100);
    c.destroy();
    await sleep(800);
    const mine = tlsGot.map((g, i) => [g, i] as const).filter(([g, i]) => i >= before && g.startsWith('GET /ws-slow '));
    expect(mine).toHaveLength(1);
    expect(tlsClosed[mine[0][1]]).toBe(true);
    expect(px.records.some((r) => r.path === '/ws-slow')).toBe(true);
  });
});

describe('answers in request order: an upgrade or a CONNECT pipelined behind a request still being answered', () => {
  it.each([
    ['fast path', () => px],
    ['Node path', () => nodePx],
  ])('%s: a WebSocket upgrade behind a slow GET: the GET’s answer first, then the 101', async (_name, p) => {
    const port = (tlsOrigin.address() as net.AddressInfo).port;
    const h = `${HOST}:${port}`;
    const c = await p().connect(port);
    let text = '';
    c.on('data', (d: Buffer) => (text += d.toString('latin1')));
    c.write(`GET /slow HTTP/1.1\r\nHost: ${h}\r\n\r\n` + upgrade('/ws', h, '', ''));
    await sleep(1000);
    c.destroy();
    expect(text).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*?\r\n\r\nslowHTTP\/1\.1 101 /);
  });

  it('a CONNECT behind a slow plain request: its answer first, then 200 Connection Established', async () => {
    const slowPlain = net.createServer((s) => {
      s.on('error', () => undefined);
      s.once('data', () => setTimeout(() => s.write('HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow'), 300));
    });
    await new Promise<void>((r) => slowPlain.listen(0, '127.0.0.1', () => r()));
    try {
      const sp = (slowPlain.address() as net.AddressInfo).port;
      const tp = (plainOrigin.address() as net.AddressInfo).port;
      const s = net.connect(nodePx.handle.port, '127.0.0.1');
      await new Promise((r) => s.once('connect', r));
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      s.on('error', () => undefined);
      s.write(`GET http://127.0.0.1:${sp}/slow HTTP/1.1\r\nHost: 127.0.0.1:${sp}\r\n\r\nCONNECT 127.0.0.1:${tp} HTTP/1.1\r\nHost: 127.0.0.1:${tp}\r\n\r\n`);
      await sleep(1000);
      s.destroy();
      expect(text).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*?\r\n\r\nslowHTTP\/1\.1 200 Connection Established\r\n/);
    } finally {
      slowPlain.close();
    }
  });
});
