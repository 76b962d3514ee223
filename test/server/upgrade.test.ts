// Upgrade requests (WebSocket, and other protocols such as h2c) go through the same front door as
// every request: refused with the documented error shape, and the socket closed by the server
// afterwards, so a refused upgrade never holds a connection (nor the server's close) open. A raw
// TCP client writes the upgrade request and reads what comes back until the server closes.
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startInProcess, type InProcessServer } from './inprocess.js';

let s: InProcessServer;
beforeAll(async () => {
  s = await startInProcess();
});
afterAll(async () => {
  await s?.close();
});

interface RawAnswer {
  status: number;
  headers: string;
  body: string;
  /** True when the server ended the connection (the client never closes it). */
  closedByServer: boolean;
}

/** Writes one upgrade request on a fresh connection and waits for the server to close it. */
function rawUpgrade(url: string, p: string, headers: Record<string, string>): Promise<RawAnswer> {
  const { port } = new URL(url);
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: '127.0.0.1', port: Number(port) });
    let data = '';
    sock.setEncoding('latin1');
    sock.on('data', (c: string) => (data += c));
    sock.on('error', reject);
    sock.on('connect', () => {
      const lines = [`GET ${p} HTTP/1.1`, `Host: 127.0.0.1:${port}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`), '', ''];
      sock.write(lines.join('\r\n'));
    });
    sock.on('close', () => {
      const at = data.indexOf('\r\n\r\n');
      const head = at < 0 ? data : data.slice(0, at);
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), headers: head, body: at < 0 ? '' : data.slice(at + 4), closedByServer: true });
    });
  });
}

const WS_HEADERS = { Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Version': '13', 'Sec-WebSocket-Key': 'dGhlIHNhbXBsZSBub25jZQ==' };
const WS_PATH = '/api/v2/sandboxes/boxes/nobox/execute/ws';

/** The body of an answer: JSON `{"detail": "..."}` (chunked or not). */
function detailOf(a: RawAnswer): unknown {
  const body = /transfer-encoding: chunked/i.test(a.headers) ? a.body.split('\r\n').filter((_l, i) => i % 2 === 1).join('') : a.body;
  return JSON.parse(body);
}

describe('a refused upgrade is answered and its socket closed', () => {
  it('WebSocket upgrade without a key: 401 {detail}, then the server closes the socket', async () => {
    const a = await rawUpgrade(s.url, WS_PATH, WS_HEADERS);
    expect(a.status, a.headers).toBe(401);
    expect(detailOf(a)).toEqual({ detail: expect.stringContaining('X-Api-Key') });
    expect(a.closedByServer).toBe(true);
  });

  it('WebSocket upgrade with a wrong key: 401 and closed', async () => {
    const a = await rawUpgrade(s.url, WS_PATH, { ...WS_HEADERS, 'X-Api-Key': 'kg_not_a_key_at_all_000000' });
    expect(a.status, a.headers).toBe(401);
    expect(detailOf(a)).toEqual({ detail: 'Invalid API key.' });
  });

  it("WebSocket upgrade with another workspace's key, or to an unknown box: 404 and closed", async () => {
    const a = await rawUpgrade(s.url, WS_PATH, { ...WS_HEADERS, 'X-Api-Key': s.keyB });
    expect(a.status, a.headers).toBe(404);
    expect(detailOf(a)).toEqual({ detail: expect.any(String) });
  });

  it('WebSocket upgrade to a route that is not a WebSocket: 400 (checked before credentials, like routing)', async () => {
    expect((await rawUpgrade(s.url, '/v2/deployments', WS_HEADERS)).status).toBe(400);
    const a = await rawUpgrade(s.url, '/v2/deployments', { ...WS_HEADERS, 'X-Api-Key': s.key });
    expect(a.status, a.headers).toBe(400);
    expect(detailOf(a)).toEqual({ detail: expect.stringContaining('upgrade') });
  });

  it('WebSocket upgrade to an unknown path: 404 and closed', async () => {
    const a = await rawUpgrade(s.url, '/no/such/path', { ...WS_HEADERS, 'X-Api-Key': s.key });
    expect(a.status, a.headers).toBe(404);
    expect(detailOf(a)).toEqual({ detail: 'Not Found' });
  });

  it('an upgrade with a malformed URL: 400 and closed', async () => {
    const a = await rawUpgrade(s.url, '/v2/deployments/%zz', WS_HEADERS);
    expect(a.status, a.headers).toBe(400);
    expect(detailOf(a)).toEqual({ detail: expect.any(String) });
  });

  it('an h2c (or any non-WebSocket) upgrade on a normal route: 400 in the documented shape, closed', async () => {
    for (const key of [s.key, undefined]) {
      const a = await rawUpgrade(s.url, '/v2/deployments', { Connection: 'Upgrade, HTTP2-Settings', Upgrade: 'h2c', 'HTTP2-Settings': 'AAMAAABkAARAAAAAAAIAAAAA', ...(key ? { 'X-Api-Key': key } : {}) });
      expect(a.status, a.headers).toBe(400);
      expect(detailOf(a)).toEqual({ detail: expect.any(String) });
    }
    const h = await rawUpgrade(s.url, '/healthz', { Connection: 'Upgrade', Upgrade: 'h2c' });
    expect(h.status, h.headers).toBe(400);
  });

  it('the ws client sees the 401 as an unexpected response', async () => {
    const ws = new WebSocket(s.url.replace('http', 'ws') + WS_PATH);
    const status = await new Promise<number>((resolve, reject) => {
      ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
      ws.on('open', () => reject(new Error('opened without a key')));
      ws.on('error', () => undefined);
    });
    expect(status).toBe(401);
  });
});

describe('refused upgrades do not hold the server open', () => {
  it('after refused upgrades whose clients never close, the server still closes', async () => {
    const own = await startInProcess();
    const { port } = new URL(own.url);
    // Clients that send the upgrade and then just wait, never closing.
    const socks: net.Socket[] = [];
    const answered: Promise<void>[] = [];
    for (const headers of [WS_HEADERS, { ...WS_HEADERS, 'X-Api-Key': 'kg_wrong_key_00000000000000' }, { Connection: 'Upgrade', Upgrade: 'h2c', 'X-Api-Key': own.key }]) {
      const sock = net.connect({ host: '127.0.0.1', port: Number(port) });
      sock.on('error', () => undefined);
      answered.push(new Promise((r) => sock.once('data', () => r())));
      sock.write([`GET ${WS_PATH} HTTP/1.1`, 'Host: x', ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`), '', ''].join('\r\n'));
      socks.push(sock);
    }
    await Promise.all(answered);
    const closed = socks.map((sk) => new Promise<void>((r) => (sk.destroyed ? r() : sk.once('close', () => r()))));
    await Promise.all(closed); // the server ends each one after its answer
    await own.close(); // and nothing it holds keeps close() waiting
  });
});
