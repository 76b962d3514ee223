/**
 * The one error module (src/proxy/errors.ts): every failure keygate's own code reports with a
 * lower layer's code (layerError) maps to a deliberate answer, and no reason carries the
 * failure's own message (only fixed sentences, host names and codes go out).
 */
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { endThenLinger, layerError, ProxyError, upstreamError, type LayerCode } from '../../src/proxy/errors.js';

const HOST = 'api.example.test';

describe('layerError and upstreamError', () => {
  const table: [LayerCode, number, string, string][] = [
    ['ECONNRESET', 502, 'connection_terminated', `upstream ${HOST} closed the connection`],
    ['UND_ERR_SOCKET', 502, 'connection_terminated', `upstream ${HOST} closed the connection`],
    ['UND_ERR_CLOSED', 502, 'connection_terminated', `upstream ${HOST} closed the connection`],
    ['ETIMEDOUT', 504, 'connection_timeout', `connecting to ${HOST} timed out`],
    ['UND_ERR_CONNECT_TIMEOUT', 504, 'connection_timeout', `connecting to ${HOST} timed out`],
    ['UND_ERR_HEADERS_TIMEOUT', 504, 'http_response_timeout', `upstream ${HOST} did not answer in time`],
    ['UND_ERR_BODY_TIMEOUT', 504, 'connection_read_timeout', `upstream ${HOST} stalled`],
    ['ENOTFOUND', 502, 'dns_error', `cannot resolve ${HOST} (ENOTFOUND)`],
    ['UND_ERR_DESTROYED', 503, 'proxy_internal_response', 'proxy is shutting down'],
    // Only ever reported once the client has gone (nobody reads the answer); the catch-all.
    ['UND_ERR_ABORTED', 502, 'proxy_internal_error', `request to ${HOST} failed (UND_ERR_ABORTED)`],
  ];

  it.each(table)('%s is a %i %s', (code, status, type, reason) => {
    const err = layerError('a message with a secret-looking sk-live-123 in it', code);
    expect(err.code).toBe(code);
    const p = upstreamError(err, HOST);
    expect(p).toBeInstanceOf(ProxyError);
    expect([p.status, p.type, p.reason]).toEqual([status, type, reason]);
    expect(p.reason).not.toContain('sk-live');
  });

  it('every code keygate fabricates is in the table (a new one needs a deliberate answer)', () => {
    // LayerCode is a type: the keys of this record must list every member, or this file does not compile.
    const all: Record<LayerCode, true> = {
      ECONNRESET: true,
      ETIMEDOUT: true,
      ENOTFOUND: true,
      UND_ERR_SOCKET: true,
      UND_ERR_CLOSED: true,
      UND_ERR_DESTROYED: true,
      UND_ERR_ABORTED: true,
      UND_ERR_CONNECT_TIMEOUT: true,
      UND_ERR_HEADERS_TIMEOUT: true,
      UND_ERR_BODY_TIMEOUT: true,
    };
    expect(Object.keys(all).sort()).toEqual(table.map(([c]) => c).sort());
  });
});

describe('endThenLinger: the end of a connection after its last answer', () => {
  /** A loopback pair: the server side writes `bytes`, ends and lingers; resolves with the server socket and the client. */
  async function pair(bytes: number): Promise<{ client: net.Socket; server: net.Socket; close(): void }> {
    let serverSocket!: net.Socket;
    const server = net.createServer((s) => {
      serverSocket = s;
      s.on('error', () => undefined);
      // Written without waiting for drain: what the proxy has queued for a slow reader when the
      // exchange is over (its last chunk, the answer's tail).
      const chunk = Buffer.alloc(1 << 20, 0x61);
      for (let left = bytes; left > 0; left -= chunk.length) s.write(left >= chunk.length ? chunk : chunk.subarray(0, left));
      endThenLinger(s);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    // Half-open: the client does not answer the server's FIN with its own (Node would).
    const client = net.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
    client.on('error', () => undefined);
    client.pause();
    await new Promise<void>((r) => client.once('connect', () => r()));
    while (!serverSocket) await new Promise((r) => setTimeout(r, 5));
    return { client, server: serverSocket, close: () => (client.destroy(), server.close()) };
  }

  it('a client that reads slowly still gets the whole answer: the linger counts from when it is all written', async () => {
    const size = 64 << 20;
    const p = await pair(size);
    try {
      // Not read for 3 s, longer than the linger: the answer's tail is still queued in the server.
      await new Promise((r) => setTimeout(r, 3000));
      expect(p.server.destroyed).toBe(false);
      let got = 0;
      const ended = new Promise<string>((resolve) => {
        p.client.on('data', (d: Buffer) => (got += d.length));
        p.client.on('end', () => resolve('end'));
        p.client.on('close', () => resolve('close'));
      });
      p.client.resume();
      expect(await ended).toBe('end');
      expect(got).toBe(size);
    } finally {
      p.close();
    }
  }, 15_000);

  it('once everything is written, a client that never sends its FIN is let go after the linger', async () => {
    const p = await pair(1024);
    try {
      p.client.resume();
      const at = Date.now();
      await new Promise<void>((r) => p.server.once('close', () => r()));
      // The linger (2 s), not any idle clock.
      expect(Date.now() - at).toBeLessThan(4000);
      expect(Date.now() - at).toBeGreaterThanOrEqual(1500);
    } finally {
      p.close();
    }
  }, 10_000);
});
