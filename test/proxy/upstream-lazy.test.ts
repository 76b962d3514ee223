/**
 * The upstream trust store (~140 public roots plus the extra CAs, about 1 MiB of OpenSSL objects)
 * is built on first use and shared by every Upstream with the same extra CAs: `keygate serve`
 * runs one proxy per sandbox, and an idle sidecar has not dialled yet (issue #20). That undici's
 * Agent is not loaded by an idle or fast-path proxy: test/cli/proxy-imports.test.ts.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { DEFAULT_TIMEOUTS, trustStoresBuilt, Upstream } from '../../src/proxy/upstream.js';
import { createTestPki } from '../helpers/pki.js';

describe('upstream trust store', () => {
  it('is not built by new Upstream(); one store for every Upstream with the same CAs, another for other CAs', async () => {
    const [a, b] = await Promise.all([createTestPki(['a.test']), createTestPki(['b.test'])]);
    const before = trustStoresBuilt();
    const u1 = new Upstream({ timeouts: DEFAULT_TIMEOUTS, upstreamCa: [a.caPem] });
    const u2 = new Upstream({ timeouts: DEFAULT_TIMEOUTS, upstreamCa: [a.caPem] });
    const u3 = new Upstream({ timeouts: DEFAULT_TIMEOUTS, upstreamCa: [b.caPem] });
    try {
      expect(trustStoresBuilt()).toBe(before);
      const ctx = u1.secureContext;
      expect(trustStoresBuilt()).toBe(before + 1);
      expect(u2.secureContext).toBe(ctx);
      expect(trustStoresBuilt()).toBe(before + 1);
      expect(u3.secureContext).not.toBe(ctx);
      expect(trustStoresBuilt()).toBe(before + 2);
    } finally {
      await Promise.all([u1.close(), u2.close(), u3.close()]);
    }
  });

  it('reads NODE_EXTRA_CA_CERTS with the first dial, not when the proxy starts: a CA written there after new Upstream() is trusted', async () => {
    const pki = await createTestPki(['late.test'], 'keygate late extra CA');
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-extra-ca-'));
    const file = path.join(dir, 'extra.pem');
    const saved = process.env.NODE_EXTRA_CA_CERTS;
    process.env.NODE_EXTRA_CA_CERTS = file;
    const u = new Upstream({ timeouts: DEFAULT_TIMEOUTS });
    const server = tls.createServer({ cert: pki.certPem, key: pki.keyPem }, (s) => s.end());
    try {
      // Not there yet when the Upstream is made: read then, it would have been nothing.
      writeFileSync(file, pki.caPem);
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      const { port } = server.address() as AddressInfo;
      const authorized = await new Promise<boolean>((resolve, reject) => {
        const s = tls.connect({ host: '127.0.0.1', port, servername: 'late.test', secureContext: u.secureContext, rejectUnauthorized: false }, () => {
          resolve(s.authorized);
          s.destroy();
        });
        s.on('error', reject);
      });
      expect(authorized).toBe(true);
    } finally {
      if (saved === undefined) delete process.env.NODE_EXTRA_CA_CERTS;
      else process.env.NODE_EXTRA_CA_CERTS = saved;
      server.close();
      await u.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
