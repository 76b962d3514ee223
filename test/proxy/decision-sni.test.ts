/**
 * proxy.md "Integrity of the destination": inside an intercepted tunnel the request goes to the
 * CONNECT target, always, whatever the client's TLS SNI names. The leaf is minted for the CONNECT
 * target (not for the SNI name), the rule is the CONNECT target's, and a Host naming the SNI's
 * host instead is 421. Real proxy in-process, raw TLS clients choosing their SNI, a local HTTPS
 * origin with its own test CA that echoes the request it received (and the SNI it was sent).
 */
import { X509Certificate } from 'node:crypto';
import tls from 'node:tls';
import { describe, expect, it } from 'vitest';
import type { ProxyHandle } from '../../src/proxy/server.js';
import { connectTunnel, rawExchange } from '../helpers/connect.js';
import { useProxyPair } from './fixture.js';

const TARGET = 'target.test.local';
const OTHER = 'other.test.local';

const pair = useProxyPair({
  names: [TARGET, OTHER, '127.0.0.1'],
  tmpPrefix: 'kg-sni-',
  rules: [
    { name: 'target', match_hosts: [TARGET, '127.0.0.1'], headers: [{ name: 'X-Key', value: 'kgSNI-target' }] },
    { name: 'other', match_hosts: [OTHER], headers: [{ name: 'X-Key', value: 'kgSNI-other' }] },
  ],
});

/** CONNECT `connectHost`, TLS with `sni` (none when undefined), the certificate's names, then one request with `host`. */
async function through(p: ProxyHandle, connectHost: string, sni: string | undefined, host: string) {
  const c = await connectTunnel(p.port, `${connectHost}:${pair.origin.port}`);
  expect(c.status).toBe(200);
  const t = await new Promise<tls.TLSSocket>((resolve, reject) => {
    // The name is checked below by hand: the client here is the one that lies about it.
    const s = tls.connect({ socket: c.socket, servername: sni, ca: pair.ca.certPem, ALPNProtocols: ['http/1.1'], checkServerIdentity: () => undefined }, () => resolve(s));
    s.on('error', reject);
  });
  const san = new X509Certificate(t.getPeerX509Certificate()!.raw).subjectAltName ?? '';
  const r = await rawExchange(t, `GET /sni HTTP/1.1\r\nHost: ${host}:${pair.origin.port}\r\nConnection: close\r\n\r\n`);
  t.destroy();
  return { san, status: r.status, body: r.body };
}

describe('the SNI never chooses the destination, the certificate or the rule', () => {
  for (const [name, i] of [
    ['fast path', 0],
    ['Node path', 1],
  ] as const) {
    it(`${name}: SNI names another rule host`, async () => {
      const r = await through(pair.proxies[i], TARGET, OTHER, TARGET);
      expect(r.san).toBe(`DNS:${TARGET}`);
      expect(r.status).toBe(200);
      const echo = JSON.parse(r.body) as { host: string; headers: [string, string][] };
      expect(echo.host).toBe(`${TARGET}:${pair.origin.port}`);
      expect(echo.headers.filter(([k]) => k === 'x-key').map(([, v]) => v)).toEqual(['kgSNI-target']);
    });

    it(`${name}: SNI and Host both name another rule host: 421, nothing sent`, async () => {
      const before = pair.origin.requests;
      const r = await through(pair.proxies[i], TARGET, OTHER, OTHER);
      expect(r.san).toBe(`DNS:${TARGET}`);
      expect(r.status).toBe(421);
      expect(pair.origin.requests).toBe(before);
    });

    it(`${name}: no SNI at all, and an IP-literal CONNECT target with a name as SNI`, async () => {
      const none = await through(pair.proxies[i], TARGET, undefined, TARGET);
      expect(none.san).toBe(`DNS:${TARGET}`);
      expect(none.status).toBe(200);
      const ip = await through(pair.proxies[i], '127.0.0.1', TARGET, '127.0.0.1');
      // The address (and its IPv4-mapped form, leaf.ts), never the SNI's name.
      expect(ip.san.split(', ')[0]).toBe('IP Address:127.0.0.1');
      expect(ip.san).not.toContain('DNS:');
      expect(ip.status).toBe(200);
      expect((JSON.parse(ip.body) as { headers: [string, string][] }).headers.filter(([k]) => k === 'x-key').map(([, v]) => v)).toEqual(['kgSNI-target']);
      const misdirected = await through(pair.proxies[i], '127.0.0.1', TARGET, TARGET);
      expect(misdirected.status).toBe(421);
    });
  }
});
