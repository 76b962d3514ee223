/**
 * The upstream trust store (~140 public roots plus the extra CAs, about 1 MiB of OpenSSL objects)
 * is built on first use and shared by every Upstream with the same extra CAs: `keygate serve`
 * runs one proxy per sandbox, and an idle sidecar has not dialled yet (issue #20). That undici's
 * Agent is not loaded by an idle or fast-path proxy: test/cli/proxy-imports.test.ts.
 */
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
});
