/**
 * src/half-open.ts joinHalfOpen, the relay every raw byte path shares (the box relays, the
 * WebSocket splice), over real loopback sockets: client <-> [a | relay | b] <-> server.
 * - each direction's end goes on alone;
 * - a reset goes on as a reset (a FIN would tell the other side the stream ended cleanly);
 * - a pair left half-open with nothing moving is cut after its bound, so a peer that never sends
 *   its own FIN cannot hold the pair (and its place in a relay's budget) for ever; bytes still
 *   moving keep it.
 */
import net from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { joinHalfOpen } from '../src/half-open.js';

const opened: { close(): void }[] = [];
afterEach(() => {
  for (const o of opened.splice(0)) o.close();
});

interface Relayed {
  /** The client's socket (to the relay). */
  client: net.Socket;
  /** The server's socket (from the relay). */
  server: net.Socket;
  /** Resolves once both of the relay's sockets are closed. */
  gone: Promise<void>;
}

async function relayed(halfOpenIdleMs: number): Promise<Relayed> {
  let server!: net.Socket;
  const origin = net.createServer({ allowHalfOpen: true }, (s) => (server = s));
  await new Promise<void>((r) => origin.listen(0, '127.0.0.1', () => r()));
  let gone!: () => void;
  const goneP = new Promise<void>((r) => (gone = r));
  const relay = net.createServer({ allowHalfOpen: true }, (a) => {
    const b = net.connect({ port: (origin.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
    joinHalfOpen(a, b, gone, halfOpenIdleMs);
  });
  await new Promise<void>((r) => relay.listen(0, '127.0.0.1', () => r()));
  const client = net.connect({ port: (relay.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
  client.on('error', () => undefined);
  await new Promise<void>((r) => client.once('connect', () => r()));
  while (!server) await new Promise((r) => setTimeout(r, 5));
  server.on('error', () => undefined);
  opened.push({ close: () => (client.destroy(), server.destroy(), relay.close(), origin.close()) });
  return { client, server, gone: goneP };
}

const closedWithin = (p: Promise<void>, ms: number) => Promise.race([p.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);

it("each direction's end goes on alone: the answer after a client's FIN still arrives", async () => {
  const r = await relayed(60_000);
  let got = '';
  r.server.on('data', (d: Buffer) => (got += d.toString()));
  r.server.once('end', () => r.server.end(`answer to ${got}`));
  let answer = '';
  r.client.on('data', (d: Buffer) => (answer += d.toString()));
  const ended = new Promise<void>((res) => r.client.once('end', () => res()));
  r.client.end('question');
  await ended;
  expect(answer).toBe('answer to question');
  expect(await closedWithin(r.gone, 2000)).toBe(true);
});

it('a reset goes on as a reset, never as an end', async () => {
  const r = await relayed(60_000);
  const cut = new Promise<string>((res) => {
    r.client.once('end', () => res('end'));
    r.client.once('error', (e: NodeJS.ErrnoException) => res(e.code ?? 'error'));
  });
  r.client.resume();
  r.server.resetAndDestroy();
  expect(await cut).toBe('ECONNRESET');
  expect(await closedWithin(r.gone, 2000)).toBe(true);
});

it('a pair left half-open with nothing moving is cut after its bound', async () => {
  const r = await relayed(300);
  // The server ends its side; the client never sends its FIN and stays idle.
  r.client.resume();
  r.server.end();
  const at = Date.now();
  expect(await closedWithin(r.gone, 3000)).toBe(true);
  expect(Date.now() - at).toBeGreaterThanOrEqual(250);
});

it('bytes still moving in the open direction keep a half-open pair', async () => {
  const r = await relayed(300);
  let got = 0;
  r.server.on('data', (d: Buffer) => (got += d.length));
  r.client.resume();
  r.server.end();
  // 1.2 s of a byte every 100 ms, four bounds long: never idle for one.
  for (let i = 0; i < 12; i++) {
    r.client.write('x');
    await new Promise((res) => setTimeout(res, 100));
  }
  expect(got).toBe(12);
  expect(await closedWithin(r.gone, 10)).toBe(false);
  r.client.end();
  expect(await closedWithin(r.gone, 2000)).toBe(true);
});
