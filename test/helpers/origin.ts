/**
 * A local HTTPS origin for proxy tests (127.0.0.1, port 0), with its own test CA:
 * - any path: echoes `{method, url, headers (raw pairs), host}` as JSON;
 * - `/sse?n=N`: server-sent events; event i+1 is written only after the test calls
 *   `origin.release()` (so a test can prove event i reached the client before the stream ended);
 * - `/upload`: counts and discards the request body, answers `{bytes}`;
 * - `/hop`: answers with hop-by-hop response headers (Connection: X-Hop, X-Hop, Keep-Alive, ...);
 * - `/status/NNN`: answers with that status;
 * - WebSocket on any path: first message is the upgrade request's raw headers as JSON, then echo.
 * `requests` counts every HTTP request and upgrade that reached it.
 */
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { WebSocketServer } from 'ws';
import type { TestPki } from './pki.js';

export interface TestOrigin {
  port: number;
  /** HTTP requests and WebSocket upgrades received. */
  requests: number;
  /** Let the SSE handler write its next event. */
  release(): void;
  close(): Promise<void>;
}

export function pairs(raw: string[]): [string, string][] {
  const out: [string, string][] = [];
  for (let i = 0; i < raw.length; i += 2) out.push([raw[i], raw[i + 1]]);
  return out;
}

export async function startOrigin(pki: Pick<TestPki, 'certPem' | 'keyPem'>): Promise<TestOrigin> {
  let waiters: (() => void)[] = [];
  let credits = 0;
  const gate = () =>
    new Promise<void>((resolve) => {
      if (credits > 0) {
        credits--;
        resolve();
      } else waiters.push(resolve);
    });

  const state = { requests: 0 };
  const server = https.createServer({ key: pki.keyPem, cert: pki.certPem, requestTimeout: 0 }, (req: IncomingMessage, res: ServerResponse) => {
    state.requests++;
    const url = new URL(req.url ?? '/', 'https://origin.invalid');
    if (url.pathname === '/upload') {
      let bytes = 0;
      req.on('data', (c: Buffer) => (bytes += c.length));
      req.on('end', () => {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ bytes }));
      });
      return;
    }
    if (url.pathname === '/sse') {
      const n = Number(url.searchParams.get('n') ?? '3');
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.flushHeaders();
      void (async () => {
        for (let i = 1; i <= n; i++) {
          if (i > 1) await gate();
          res.write(`event: tick\ndata: ${i}\n\n`);
        }
        res.end();
      })();
      return;
    }
    if (url.pathname === '/hop') {
      res.writeHead(200, [
        ['content-type', 'text/plain'],
        ['connection', 'X-Hop'],
        ['x-hop', 'secret-hop'],
        ['keep-alive', 'timeout=5'],
        ['x-end-to-end', 'kept'],
      ].flat());
      res.end('hop');
      return;
    }
    const status = /^\/status\/([1-5][0-9][0-9])$/.exec(url.pathname);
    req.resume();
    req.on('end', () => {
      res.writeHead(status ? Number(status[1]) : 200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ method: req.method, url: req.url, host: req.headers.host, headers: pairs(req.rawHeaders) }));
    });
  });
  const wss = new WebSocketServer({ noServer: true });
  server.on('upgrade', (req, socket, head) => {
    state.requests++;
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.send(JSON.stringify({ url: req.url, headers: pairs(req.rawHeaders) }));
      ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    get requests() {
      return state.requests;
    },
    release() {
      const w = waiters.shift();
      if (w) w();
      else credits++;
    },
    async close() {
      waiters.forEach((w) => w());
      waiters = [];
      wss.clients.forEach((c) => c.terminate());
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
