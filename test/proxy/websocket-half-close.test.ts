/**
 * After a WebSocket handshake the proxy splices two sockets, and the splice must carry each
 * direction's end (FIN) on its own, as the blind tunnel does (tunnel-relay.test.ts): one side
 * that stops sending has not stopped reading.
 * - An origin that says its last words and half-closes still gets what the client sends after.
 * - A client that sends its last words and half-closes still gets the origin's answer to them.
 * Every path that splices: ws:// (absolute-form to the listener, TCP to the origin) and wss://
 * (CONNECT, the proxy's TLS towards the client and the origin's TLS), each through both HTTP/1.1
 * exchanges. Real sockets to real origins on loopback.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { eventually } from './hardening-helpers.js';
import { closeBothExchanges, dialPlain, HOST, request, startBothExchanges, WS_HEADERS, type TestProxy } from './h1/fast-helpers.js';

let pki: TestPki;
let plainOrigin: net.Server;
let tlsOrigin: tls.Server;
let plainPort = 0;
let tlsPort = 0;
let proxies: Record<'fast' | 'node', TestProxy>;
/** What each origin connection read after its handshake, by the path it was opened on, once the client's FIN came. */
const readAfter = new Map<string, string>();
const sockets = new Set<net.Socket>();

const ACCEPT = createHash('sha1').update(`${WS_HEADERS[2][1]}258EAFA5-E914-47DA-95CA-C5AB0DC11B85`).digest('base64');

/**
 * The origin's side of one connection: the 101, then by path:
 * - /greet-ID: 'hello' and a FIN at once, then reads until the client's FIN;
 * - /count-ID: reads until the client's FIN, then answers with what it read and ends.
 */
function originConnection(s: net.Socket): void {
  sockets.add(s);
  s.on('error', () => undefined);
  let head = '';
  let path = '';
  let after = '';
  s.on('data', (d: Buffer) => {
    if (path) {
      after += d.toString('latin1');
      return;
    }
    head += d.toString('latin1');
    const at = head.indexOf('\r\n\r\n');
    if (at < 0) return;
    path = head.split(' ')[1];
    after = head.slice(at + 4);
    s.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${ACCEPT}\r\n\r\n`);
    if (path.startsWith('/greet')) s.end('hello');
  });
  s.on('end', () => {
    readAfter.set(path, after);
    if (path.startsWith('/count')) s.end(`read ${after}`);
  });
}

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  plainOrigin = net.createServer({ allowHalfOpen: true }, originConnection);
  tlsOrigin = tls.createServer({ key: pki.keyPem, cert: pki.certPem, allowHalfOpen: true }, originConnection);
  await new Promise<void>((r) => plainOrigin.listen(0, '127.0.0.1', () => r()));
  await new Promise<void>((r) => tlsOrigin.listen(0, '127.0.0.1', () => r()));
  plainPort = (plainOrigin.address() as net.AddressInfo).port;
  tlsPort = (tlsOrigin.address() as net.AddressInfo).port;
  proxies = await startBothExchanges(pki, tlsPort);
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await closeBothExchanges(proxies, { close: () => new Promise<void>((r) => tlsOrigin.close(() => r())) });
  await new Promise<void>((r) => plainOrigin.close(() => r()));
});

/** A spliced connection through `px`: the client's socket, with the bytes after the 101's head and whether a FIN came. */
interface Spliced {
  socket: net.Socket;
  /** Resolves with everything read after the handshake's head once the proxy's FIN arrived (or with the error that came instead). */
  ended: Promise<string>;
}

async function open(px: TestProxy, scheme: 'ws' | 'wss', path: string): Promise<Spliced> {
  const socket: net.Socket = scheme === 'wss' ? await px.connect(tlsPort) : await dialPlain(px);
  // The client too keeps its sending side open after the proxy's FIN (Node would end it).
  (socket as net.Socket & { allowHalfOpen: boolean }).allowHalfOpen = true;
  sockets.add(socket);
  // Plain ws:// goes to a host no rule matches (credentials go only over TLS): the address itself.
  const authority = scheme === 'wss' ? `${HOST}:${tlsPort}` : `127.0.0.1:${plainPort}`;
  socket.write(request('GET', scheme === 'wss' ? path : `http://${authority}${path}`, authority, WS_HEADERS));
  let got = '';
  let switched!: () => void;
  const headRead = new Promise<void>((r) => (switched = r));
  const ended = new Promise<string>((resolve) => {
    socket.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (got.includes('\r\n\r\n')) switched();
    });
    socket.on('end', () => resolve(got.slice(got.indexOf('\r\n\r\n') + 4)));
    socket.on('error', (e: NodeJS.ErrnoException) => resolve(`error ${e.code} after ${JSON.stringify(got)}`));
  });
  await headRead;
  expect(got.slice(0, 200)).toMatch(/^HTTP\/1.1 101 /);
  return { socket, ended };
}

/** Resolves once the origin's side of the connection opened on `path` saw the client's FIN. */
async function originRead(path: string): Promise<string | undefined> {
  await eventually(() => readAfter.has(path), 2000, 10);
  return readAfter.get(path);
}

let n = 0;
describe.each(['fast', 'node'] as const)('the WebSocket splice (%s exchange)', (exchange) => {
  it.each(['ws', 'wss'] as const)("%s: the client's bytes after the origin's FIN still reach the origin", async (scheme) => {
    const path = `/greet-${++n}`;
    const c = await open(proxies[exchange], scheme, path);
    // The origin's last words and its FIN both reach the client.
    await expect(c.ended).resolves.toBe('hello');
    // The client's direction is still open: its answer and its own FIN go through.
    c.socket.end('goodbye');
    await expect(originRead(path)).resolves.toBe('goodbye');
  });

  it.each(['ws', 'wss'] as const)("%s: the origin's answer after the client's FIN still reaches the client", async (scheme) => {
    const path = `/count-${++n}`;
    const c = await open(proxies[exchange], scheme, path);
    c.socket.end('last words');
    await expect(c.ended).resolves.toBe('read last words');
    await expect(originRead(path)).resolves.toBe('last words');
  });
});
