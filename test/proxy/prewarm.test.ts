/**
 * Connections opened ahead (src/proxy/upstream.ts prewarm): an intercepted CONNECT to an origin
 * with no connection open starts the upstream TLS handshake while the client does its own; the
 * first request then uses that connection. These tests watch the origin's side of it and check
 * that the egress policy and upstream failures apply to such a connection exactly as to any other.
 */
import https from 'node:https';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import type tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { interceptedTls, rawExchange } from '../helpers/connect.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { eventually } from './hardening-helpers.js';

const HOST = 'api.test.local';
const DENIED = 'meta.test.local';
const REFUSED = 'down.test.local';
const TOKEN = 'kgPREWARM-4c1d-token';

let pki: TestPki;
let proxy: SpawnedProxy;
let origin: https.Server;
let originPort: number;
let deadPort: number;
/** TLS connections the origin accepted, and how many of them are closed. */
const seen = { accepted: 0, closed: 0, requests: [] as string[] };

beforeAll(async () => {
  pki = await createTestPki([HOST, DENIED, REFUSED, 'other.test.local']);
  origin = https.createServer({ key: pki.keyPem, cert: pki.certPem }, (req, res) => {
    seen.requests.push(`${req.url} ${req.headers.authorization ?? ''}`);
    res.end('ok');
  });
  origin.on('secureConnection', (s: tls.TLSSocket) => {
    seen.accepted++;
    s.once('close', () => seen.closed++);
  });
  await new Promise<void>((r) => origin.listen(0, '127.0.0.1', () => r()));
  originPort = (origin.address() as AddressInfo).port;
  for (;;) {
    // A port nothing listens on: connections to it are refused.
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', () => r()));
    deadPort = (closed.address() as AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    proxy = await spawnProxy({
      config: {
        rules: [{ name: 'api', match_hosts: ['*.test.local', HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {TOKEN}' }] }],
      },
      secrets: { TOKEN },
      resolve: [`${HOST}:${originPort}:127.0.0.1`, `${DENIED}:443:169.254.169.254`, `${REFUSED}:${deadPort}:127.0.0.1`],
      upstreamCa: [pki.caPem],
    });
    // The freed port can be handed straight back to the proxy's own listener, which (rightly)
    // refuses to connect to itself: then pick again.
    if (proxy.port !== deadPort) break;
    await proxy.stop();
  }
});

afterAll(async () => {
  await proxy?.stop();
  await new Promise<void>((r) => (origin ? origin.close(() => r()) : r()));
  expect(proxy.output()).not.toContain(TOKEN);
});

/** One request over an established TLS session through the tunnel; resolves with the raw answer. */
function get(t: tls.TLSSocket, host: string, port: number, path: string): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    const onData = (d: Buffer) => {
      text += d.toString('latin1');
      const head = text.indexOf('\r\n\r\n');
      const len = /content-length: (\d+)/i.exec(text);
      if (head >= 0 && len && text.length >= head + 4 + Number(len[1])) {
        t.off('data', onData);
        resolve(text);
      }
    };
    t.on('data', onData);
    t.write(`GET ${path} HTTP/1.1\r\nHost: ${host}:${port}\r\n\r\n`);
  });
}

describe('connections opened ahead of the first request', () => {
  it('the upstream handshake starts at CONNECT and the first request uses that connection', async () => {
    const before = seen.accepted;
    const t = await interceptedTls(proxy.port, HOST, originPort, [proxy.caPem]);
    // No request sent yet: the origin already has the proxy's connection.
    expect(await eventually(() => seen.accepted === before + 1, 3000)).toBe(true);
    const answer = await get(t, HOST, originPort, '/first');
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect(seen.requests).toContain(`/first Bearer ${TOKEN}`);
    // ... and no second connection was needed for it.
    expect(seen.accepted).toBe(before + 1);
    // A second tunnel to the same origin finds a connection open: nothing is opened ahead.
    const t2 = await interceptedTls(proxy.port, HOST, originPort, [proxy.caPem]);
    await new Promise((r) => setTimeout(r, 200));
    expect(seen.accepted).toBe(before + 1);
    expect(await get(t2, HOST, originPort, '/second')).toMatch(/^HTTP\/1\.1 200/);
    t.destroy();
    t2.destroy();
  });

  it('a connection opened ahead and never used is closed after 5 s', async () => {
    // A proxy of its own: nothing pooled for this origin yet.
    const other = 'other.test.local';
    const p = await spawnProxy({
      config: { rules: [{ name: 'api', match_hosts: [other], headers: [{ name: 'Authorization', type: 'plaintext', value: 'Bearer x' }] }] },
      resolve: [`${other}:${originPort}:127.0.0.1`],
      upstreamCa: [pki.caPem],
    });
    try {
      const accepted = seen.accepted;
      const closed = seen.closed;
      const t = await interceptedTls(p.port, other, originPort, [p.caPem]);
      expect(await eventually(() => seen.accepted === accepted + 1, 3000)).toBe(true);
      expect(seen.closed).toBe(closed);
      expect(await eventually(() => seen.closed === closed + 1, 8000)).toBe(true);
      t.destroy();
    } finally {
      await p.stop();
    }
  }, 20_000);

  it('the egress policy applies: a rule host pinned to a metadata address is refused, logged once', async () => {
    const t = await interceptedTls(proxy.port, DENIED, 443, [proxy.caPem]);
    const answer = await rawExchange(t, `GET /x HTTP/1.1\r\nHost: ${DENIED}\r\nConnection: close\r\n\r\n`);
    expect(answer.status).toBe(403);
    expect(answer.body).toMatch(/169\.254\.169\.254/);
    expect(await eventually(() => proxy.logs().some((l) => l.type === 'egress_denied' && l.host === DENIED), 3000)).toBe(true);
    // The refusal happened once (when the connection was opened ahead), not again for the request.
    expect(proxy.logs().filter((l) => l.type === 'egress_denied' && l.host === DENIED)).toHaveLength(1);
  });

  it('an origin refusing connections: the request gets the usual 502', async () => {
    const t = await interceptedTls(proxy.port, REFUSED, deadPort, [proxy.caPem]);
    const answer = await rawExchange(t, `GET /x HTTP/1.1\r\nHost: ${REFUSED}:${deadPort}\r\nConnection: close\r\n\r\n`);
    expect(answer.status).toBe(502);
    expect(JSON.stringify(answer)).not.toContain(TOKEN);
  });
});
