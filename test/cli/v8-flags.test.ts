/**
 * The V8 setting the server commands apply (src/cli/v8-flags.ts), checked by its effect: a
 * burst of first requests through a fresh `keygate proxy` must not cost the memory spike of
 * V8 recompiling undici's WebAssembly HTTP parser, and the same burst with V8's default does.
 * Intercepted requests normally take the fast path (src/proxy/h1), which does not use undici;
 * undici still carries every request the fast path hands over, plain HTTP and WebSockets, so
 * the burst is sent with the fast path off to exercise that parser.
 */
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { memoryOf, spawnProxy } from '../helpers/proxy.js';

const HOST = 'api.test.local';
const CONCURRENT = 48;

let pki: TestPki;
let origin: TestOrigin;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  origin = await startOrigin(pki);
});
afterAll(async () => {
  await origin?.close();
});

/** Peak RSS growth (MiB) of a fresh proxy over its first request and a burst of concurrent ones. */
async function burstGrowthMib(env: NodeJS.ProcessEnv): Promise<number> {
  const proxy = await spawnProxy({
    config: { rules: [{ name: 'api', match_hosts: [HOST], headers: [{ name: 'Authorization', type: 'plaintext', value: 'Bearer t' }] }] },
    resolve: [`${HOST}:${origin.port}:127.0.0.1`],
    upstreamCa: [pki.caPem],
    env: { KEYGATE_FAST_PATH: '0', ...env },
  });
  try {
    const before = memoryOf(proxy.pid).hwmKb;
    // The first request (the one that compiles the parser), then a burst of concurrent ones.
    const warm = new ProxyAgent({ uri: proxy.url, requestTls: { ca: [proxy.caPem] } });
    const r = await request(`https://${HOST}:${origin.port}/warm`, { dispatcher: warm });
    await r.body.dump();
    await warm.close();
    // Many connections at once: the proxy's upstream pool opens as many, and the parser gets hot.
    const agents = Array.from({ length: CONCURRENT }, () => new ProxyAgent({ uri: proxy.url, requestTls: { ca: [proxy.caPem] } }));
    for (let round = 0; round < 5; round++) {
      await Promise.all(
        agents.map(async (a, i) => {
          const res = await request(`https://${HOST}:${origin.port}/r${round}-${i}`, { dispatcher: a });
          expect(res.statusCode).toBe(200);
          await res.body.dump();
        }),
      );
    }
    await Promise.all(agents.map((a) => a.close()));
    await new Promise((res) => setTimeout(res, 300));
    return (memoryOf(proxy.pid).hwmKb - before) / 1024;
  } finally {
    await proxy.stop();
  }
}

describe('server V8 settings', () => {
  it('a burst of requests does not cost a compiler memory spike; with V8 default tiering it does', async () => {
    const lean = await burstGrowthMib({});
    const tiered = await burstGrowthMib({ KEYGATE_V8_WASM_TIERUP: '1' });
    // Measured here: about 14 MiB (connections, buffers, young generation) against 36.
    const why = `peak growth: ${lean.toFixed(1)} MiB lean, ${tiered.toFixed(1)} MiB with tier-up`;
    expect(lean, why).toBeLessThan(30);
    expect(tiered - lean, why).toBeGreaterThan(15);
  }, 60_000);
});

