/**
 * A rule for an IPv4 address, reached by the client through its IPv4-mapped IPv6 spelling: the
 * proxy treats `[::ffff:127.0.0.1]` as 127.0.0.1 (one rule, one no_proxy entry), so it intercepts,
 * and the client, which checks the certificate against the spelling it asked for, accepts the
 * leaf (src/certs/leaf.ts ipNames). Real proxy process, real HTTPS origin with its own test CA.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTunnel, rawExchange, tlsOverTunnel } from '../helpers/connect.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';

const TOKEN = 'ip-literal-token-5150';
let origin: TestOrigin;
let proxy: SpawnedProxy;

beforeAll(async () => {
  const pki = await createTestPki(['127.0.0.1']);
  origin = await startOrigin(pki);
  proxy = await spawnProxy({
    config: { rules: [{ name: 'by-address', match_hosts: ['127.0.0.1'], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }] }] },
    secrets: { API_TOKEN: TOKEN },
    upstreamCa: [pki.caPem],
  });
});

afterAll(async () => {
  await proxy?.stop();
  await origin?.close();
});

describe('a rule for an IPv4 address', () => {
  for (const [spelling, host] of [['dotted quad', '127.0.0.1'], ['IPv4-mapped IPv6', '[::ffff:127.0.0.1]']] as const) {
    it(`is intercepted, with a certificate the client accepts, when asked for as the ${spelling}`, async () => {
      const c = await connectTunnel(proxy.port, `${host}:${origin.port}`);
      expect(c.status, c.body).toBe(200);
      // The client checks the certificate against the address it asked for, without brackets.
      const t = await tlsOverTunnel(c.socket, host.replace(/^\[|\]$/g, ''), proxy.caPem).catch((e: Error) => e);
      // Before the leaf named the mapped form too, the client refused it here (ERR_TLS_CERT_ALTNAME_INVALID).
      expect(t).not.toBeInstanceOf(Error);
      const r = await rawExchange(t as Exclude<typeof t, Error>, `GET /x HTTP/1.1\r\nHost: ${host}:${origin.port}\r\nConnection: close\r\n\r\n`);
      expect(r.status, r.body).toBe(200);
      const seen = JSON.parse(r.body) as { headers: [string, string][] };
      expect(seen.headers.filter(([k]) => k.toLowerCase() === 'authorization').map(([, v]) => v)).toEqual([`Bearer ${TOKEN}`]);
    });
  }
});
