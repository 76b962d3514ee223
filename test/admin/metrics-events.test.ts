// The hardening events (egress refusals, connection limits, malformed requests, CA expiry) reach
// /metrics: driven through a real in-process proxy with real sockets.
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ProxyMetrics } from '../../src/admin/metrics.js';
import { ensureCa } from '../../src/certs/ca.js';
import { createLogger } from '../../src/log.js';
import { startProxy } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/compile.js';
import { connectTunnel, interceptedTls, rawExchange } from '../helpers/connect.js';
import { startOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-metrics-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(series + ' '));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe('ProxyMetrics counts the hardening events of a real proxy', () => {
  it('egress refusals by kind, connection-limit refusals, client errors by status, CA days left', async () => {
    const ca = await ensureCa(path.join(dir, 'certs'));
    const common = { listen: { host: '127.0.0.1', port: 0 }, ca, config: compileConfig({ rules: [], no_proxy: [] }), logger: createLogger({ level: 'silent' }) };
    const proxy = await startProxy({ ...common, resolve: new Map([['meta.test.local:80', '169.254.169.254']]) });
    // Its own instance: a closing connection of another check must not count against the limit.
    const limited = await startProxy({ ...common, limits: { maxConnectionsPerClient: 1 } });
    const metrics = new ProxyMetrics();
    const detachLimited = metrics.attach(limited.events);
    const detach = metrics.attach(proxy.events, proxy.caExpiry);
    try {
      const denied = await connectTunnel(proxy.port, 'meta.test.local:80');
      expect(denied.status).toBe(403);

      // Hold one connection open, then a second from the same client is over the per-client limit.
      const held = net.connect(limited.port, '127.0.0.1');
      await new Promise((r) => held.once('connect', r));
      await new Promise((r) => setTimeout(r, 50));
      const second = await new Promise<string>((resolve) => {
        const s = net.connect(limited.port, '127.0.0.1');
        let out = '';
        s.on('data', (d) => (out += d.toString('latin1')));
        s.on('close', () => resolve(out));
        s.on('error', () => resolve(out));
      });
      expect(second).toMatch(/^HTTP\/1\.1 503/);

      // A malformed head on the held connection: the proxy answers 400 itself.
      const bad = await new Promise<string>((resolve) => {
        let out = '';
        held.on('data', (d) => (out += d.toString('latin1')));
        held.on('close', () => resolve(out));
        held.write('GET http://x/ HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n');
      });
      expect(bad).toMatch(/^HTTP\/1\.1 400/);

      // Detaching another proxy must not take the CA gauge with it.
      detachLimited();
      const text = metrics.render();
      const deniedLines = text.split('\n').filter((l) => l.startsWith('keygate_proxy_egress_denied_total{'));
      expect(deniedLines).toHaveLength(1);
      expect(deniedLines[0]).toMatch(/^keygate_proxy_egress_denied_total\{kind="[a-z_]+"\} 1$/);
      expect(sample(text, 'keygate_proxy_connections_refused_total{limit="max_connections_per_client"}')).toBe(1);
      expect(sample(text, 'keygate_proxy_client_errors_total{status="400"}')).toBe(1);
      const days = sample(text, 'keygate_proxy_ca_expiry_days');
      expect(days).toBeGreaterThan(3000); // a fresh CA is valid for 10 years
      expect(days).toBe(proxy.caExpiry().daysLeft);
    } finally {
      detach();
      await proxy.close(0);
      await limited.close(0);
    }
  });
});

describe('ProxyMetrics counts hand-overs from the fast path to the Node path', () => {
  it('by reason: a head the strict parser does not take, a request a check refuses; a plain GET counts nothing', async () => {
    const HOST = 'api.test.local';
    const pki = await createTestPki([HOST]);
    const origin = await startOrigin(pki);
    const ca = await ensureCa(path.join(dir, 'certs-fast'));
    const proxy = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca,
      config: compileConfig({ no_proxy: [], rules: [{ name: 'api', match_hosts: [HOST], headers: [{ name: 'X-Key', value: 'k' }] }] }),
      logger: createLogger({ level: 'silent' }),
      resolve: new Map([[`${HOST}:${origin.port}`, '127.0.0.1']]),
      upstreamCa: [pki.caPem],
    });
    const metrics = new ProxyMetrics();
    const detach = metrics.attach(proxy.events);
    const exchange = async (raw: string) => rawExchange(await interceptedTls(proxy.port, HOST, origin.port, [ca.certPem]), raw);
    const authority = `${HOST}:${origin.port}`;
    try {
      expect((await exchange(`GET /plain HTTP/1.1\r\nHost: ${authority}\r\nConnection: close\r\n\r\n`)).status).toBe(200);
      expect(metrics.render()).not.toContain('keygate_proxy_fast_path_fallbacks_total{');
      // Chunked request bodies are the Node path's: the head goes there with its bytes.
      const chunked = await exchange(`POST /upload HTTP/1.1\r\nHost: ${authority}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n`);
      expect(chunked.status).toBe(200);
      // A Host naming another authority: refused (421) by the plan step the fast path calls too, no hand-over.
      const misdirected = await exchange(`GET /x HTTP/1.1\r\nHost: other.test.local\r\nConnection: close\r\n\r\n`);
      expect(misdirected.status).toBe(421);
      const text = metrics.render();
      expect(sample(text, 'keygate_proxy_fast_path_fallbacks_total{reason="head"}')).toBe(1);
      expect(text).not.toContain('keygate_proxy_fast_path_fallbacks_total{reason="check"}');
    } finally {
      detach();
      await proxy.close(0);
      await origin.close();
    }
  });
});
