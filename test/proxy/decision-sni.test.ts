/**
 * proxy.md "Integrity of the destination": inside an intercepted tunnel the request goes to the
 * CONNECT target, always, whatever the client's TLS SNI names. The leaf is minted for the CONNECT
 * target (not for the SNI name), the rule is the CONNECT target's, and a Host naming the SNI's
 * host instead is 421. Real proxy in-process, raw TLS clients choosing their SNI, a local HTTPS
 * origin with its own test CA that echoes the request it received (and the SNI it was sent).
 */
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { connectTunnel, rawExchange } from '../helpers/connect.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';

const TARGET = 'target.test.local';
const OTHER = 'other.test.local';
const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-sni-'));
let ca: Ca;
let origin: TestOrigin;
const proxies: ProxyHandle[] = [];

beforeAll(async () => {
  const pki = await createTestPki([TARGET, OTHER, '127.0.0.1']);
  origin = await startOrigin(pki);
  ca = await ensureCa(path.join(dir, 'certs'));
  for (const fastPath of [true, false]) {
    proxies.push(
      await startProxy({
        listen: { host: '127.0.0.1', port: 0 },
        ca,
        config: compileConfig({
          no_proxy: [],
          rules: [
            { name: 'target', match_hosts: [TARGET, '127.0.0.1'], headers: [{ name: 'X-Key', value: 'kgSNI-target' }] },
            { name: 'other', match_hosts: [OTHER], headers: [{ name: 'X-Key', value: 'kgSNI-other' }] },
          ],
        }),
        logger: createLogger({ destination: new Writable({ write: (_c, _e, cb) => cb() }) }),
        fastPath,
        resolve: new Map([
          [`${TARGET}:${origin.port}`, '127.0.0.1'],
          [`${OTHER}:${origin.port}`, '127.0.0.1'],
        ]),
        upstreamCa: [pki.caPem],
      }),
    );
  }
});
afterAll(async () => {
  for (const p of proxies) await p.close(200);
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** CONNECT `connectHost`, TLS with `sni` (none when undefined), the certificate's names, then one request with `host`. */
async function through(p: ProxyHandle, connectHost: string, sni: string | undefined, host: string) {
  const c = await connectTunnel(p.port, `${connectHost}:${origin.port}`);
  expect(c.status).toBe(200);
  const t = await new Promise<tls.TLSSocket>((resolve, reject) => {
    // The name is checked below by hand: the client here is the one that lies about it.
    const s = tls.connect({ socket: c.socket, servername: sni, ca: ca.certPem, ALPNProtocols: ['http/1.1'], checkServerIdentity: () => undefined }, () => resolve(s));
    s.on('error', reject);
  });
  const san = new X509Certificate(t.getPeerX509Certificate()!.raw).subjectAltName ?? '';
  const r = await rawExchange(t, `GET /sni HTTP/1.1\r\nHost: ${host}:${origin.port}\r\nConnection: close\r\n\r\n`);
  t.destroy();
  return { san, status: r.status, body: r.body };
}

describe('the SNI never chooses the destination, the certificate or the rule', () => {
  for (const [name, i] of [
    ['fast path', 0],
    ['Node path', 1],
  ] as const) {
    it(`${name}: SNI names another rule host`, async () => {
      const r = await through(proxies[i], TARGET, OTHER, TARGET);
      expect(r.san).toBe(`DNS:${TARGET}`);
      expect(r.status).toBe(200);
      const echo = JSON.parse(r.body) as { host: string; headers: [string, string][] };
      expect(echo.host).toBe(`${TARGET}:${origin.port}`);
      expect(echo.headers.filter(([k]) => k === 'x-key').map(([, v]) => v)).toEqual(['kgSNI-target']);
    });

    it(`${name}: SNI and Host both name another rule host: 421, nothing sent`, async () => {
      const before = origin.requests;
      const r = await through(proxies[i], TARGET, OTHER, OTHER);
      expect(r.san).toBe(`DNS:${TARGET}`);
      expect(r.status).toBe(421);
      expect(origin.requests).toBe(before);
    });

    it(`${name}: no SNI at all, and an IP-literal CONNECT target with a name as SNI`, async () => {
      const none = await through(proxies[i], TARGET, undefined, TARGET);
      expect(none.san).toBe(`DNS:${TARGET}`);
      expect(none.status).toBe(200);
      const ip = await through(proxies[i], '127.0.0.1', TARGET, '127.0.0.1');
      // The address (and its IPv4-mapped form, leaf.ts), never the SNI's name.
      expect(ip.san.split(', ')[0]).toBe('IP Address:127.0.0.1');
      expect(ip.san).not.toContain('DNS:');
      expect(ip.status).toBe(200);
      expect((JSON.parse(ip.body) as { headers: [string, string][] }).headers.filter(([k]) => k === 'x-key').map(([, v]) => v)).toEqual(['kgSNI-target']);
      const misdirected = await through(proxies[i], '127.0.0.1', TARGET, TARGET);
      expect(misdirected.status).toBe(421);
    });
  }
});
