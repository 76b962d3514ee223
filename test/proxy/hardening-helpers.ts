/**
 * Raw-socket helpers for the hardening tests: send exact bytes, read whatever comes back until
 * the peer closes (or a deadline), and origins that record every byte they receive.
 */
import { readdirSync } from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import type { TestPki } from '../helpers/pki.js';

export interface RawResult {
  /** 0 when no HTTP status line came back. */
  status: number;
  text: string;
  /** The peer closed the connection (false: the deadline passed first). */
  closed: boolean;
  ms: number;
}

function parseStatus(text: string): number {
  return Number(/^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1] ?? 0);
}

/** Reads from `socket` until it closes or `deadlineMs` passes; writes `data` first if given. */
export function readUntilClose(socket: net.Socket | tls.TLSSocket, data?: string | Buffer, deadlineMs = 5000): Promise<RawResult> {
  const started = performance.now();
  return new Promise((resolve) => {
    let text = '';
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (!closed) socket.destroy();
      resolve({ status: parseStatus(text), text, closed, ms: performance.now() - started });
    };
    const timer = setTimeout(() => finish(false), deadlineMs);
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.on('error', () => finish(true));
    socket.on('close', () => finish(true));
    if (data !== undefined) socket.write(data);
  });
}

/** Connects to the proxy and resolves once connected. */
export function dial(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  });
}

/** One exchange of raw bytes with the proxy on a fresh connection. */
export async function rawPlain(port: number, data: string | Buffer, deadlineMs = 5000): Promise<RawResult> {
  return readUntilClose(await dial(port), data, deadlineMs);
}

export interface RecordingOrigin {
  port: number;
  /** Connections accepted. */
  connections: number;
  /** Every byte received, per connection, as latin1 text. */
  received: string[];
  close(): Promise<void>;
}

/**
 * An origin (plain TCP, or TLS with `pki`) that records exactly what reaches it and answers each
 * request head with a small 200 and closes. What it recorded is what an origin could act on.
 */
export async function startRecordingOrigin(pki?: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<RecordingOrigin> {
  const state = { connections: 0, received: [] as string[] };
  const sockets = new Set<net.Socket>();
  const onSocket = (s: net.Socket) => {
    const i = state.connections++;
    state.received[i] = '';
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    s.on('data', (d: Buffer) => {
      state.received[i] += d.toString('latin1');
      if (state.received[i].includes('\r\n\r\n') && !s.writableEnded) s.end('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\nConnection: close\r\n\r\norigin');
    });
  };
  const server = pki ? tls.createServer({ key: pki.keyPem, cert: pki.certPem }, onSocket) : net.createServer(onSocket);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as net.AddressInfo).port,
    get connections() {
      return state.connections;
    },
    get received() {
      return state.received;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** Open file descriptors of a process (Linux /proc). */
export function fdCount(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** Polls `fn` until it returns true or `ms` passes; returns the last result. */
export async function eventually(fn: () => boolean, ms = 5000, every = 50): Promise<boolean> {
  const until = Date.now() + ms;
  for (;;) {
    if (fn()) return true;
    if (Date.now() > until) return false;
    await new Promise((r) => setTimeout(r, every));
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
