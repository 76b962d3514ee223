/**
 * decide (once per CONNECT) and pickRule (once per request, with the snapshot the request takes)
 * are the same decision of proxy.md: pickRule may name a rule only where decide says
 * `intercept`. A request on a connection opened under an earlier configuration meets only
 * pickRule, so anything decide refuses (config-level no_proxy above all) must stop pickRule too.
 */
import { describe, expect, it } from 'vitest';
import { compileConfig, normaliseHost, type ResolvedProxyConfig } from '../../src/rules/index.js';

const H = (name: string) => [{ name, value: `v-${name}` }];

const CONFIGS: ResolvedProxyConfig[] = [
  { no_proxy: ['api.example.com'], rules: [{ name: 'r', match_hosts: ['api.example.com'], headers: H('a') }] },
  { no_proxy: ['*'], rules: [{ name: 'r', match_hosts: ['*'], headers: H('a') }] },
  { no_proxy: ['*.example.com'], rules: [{ name: 'r', match_hosts: ['*.example.com', 'example.com'], headers: H('a') }] },
  { no_proxy: ['api.example.com:443'], rules: [{ name: 'r', match_hosts: ['api.example.com'], headers: H('a') }] },
  { no_proxy: ['127.0.0.1', '[::1]'], rules: [{ name: 'r', match_hosts: ['*'], headers: H('a') }] },
  { no_proxy: ['BÜCHER.de.'], rules: [{ name: 'r', match_hosts: ['*.de', 'xn--bcher-kva.de'], headers: H('a') }] },
  {
    no_proxy: ['bypass.example.com'],
    rules: [
      { name: 'paths', match_hosts: ['api.example.com'], match_paths: ['/repos/*'], headers: H('a') },
      { name: 'skip', match_hosts: ['*.example.com'], no_proxy: ['skip.example.com', 'api.example.com:8443'], headers: H('b') },
      { name: 'later', match_hosts: ['skip.example.com', 'api.example.com'], headers: H('c') },
    ],
  },
];
const HOSTS = ['api.example.com', 'API.EXAMPLE.COM.', 'example.com', 'a.b.example.com', 'skip.example.com', 'bypass.example.com', 'badexample.com', 'example.com.evil.net', '127.0.0.1', '127.1', '[::1]', '[::ffff:7f00:1]', 'bücher.de', 'xn--bcher-kva.de', 'other.de'];
const PORTS = [443, 8443];
const PATHS = ['/', '/repos', '/repos/x', '/user'];

describe('pickRule names a rule only where decide intercepts', () => {
  it.each(CONFIGS.map((c, i) => [i, c] as const))('configuration %i', (_i, resolved) => {
    const c = compileConfig(resolved);
    for (const raw of HOSTS) {
      const host = normaliseHost(raw);
      for (const port of PORTS) {
        const decision = c.decide(host, port);
        for (const path of PATHS) {
          const rule = c.pickRule(host, port, path);
          if (decision !== 'intercept') expect(rule, `${raw}:${port}${path} is ${decision}`).toBeUndefined();
        }
      }
    }
  });

  it('config-level no_proxy wins over every rule, whatever the spelling', () => {
    const c = compileConfig(CONFIGS[0]);
    for (const raw of ['api.example.com', 'API.example.com.', 'Api.Example.Com']) {
      expect(c.decide(normaliseHost(raw), 443)).toBe('bypass');
      expect(c.pickRule(normaliseHost(raw), 443, '/')).toBeUndefined();
    }
  });

  it('a rule-level no_proxy skips only that rule; the first rule whose hosts, no_proxy and paths match wins', () => {
    const c = compileConfig(CONFIGS[6]);
    expect(c.pickRule('api.example.com', 443, '/repos/x')?.name).toBe('paths');
    // Not under /repos/: the next rule, then the one after for a host the second rule skips.
    expect(c.pickRule('api.example.com', 443, '/user')?.name).toBe('skip');
    expect(c.pickRule('api.example.com', 8443, '/user')?.name).toBe('later');
    expect(c.pickRule('skip.example.com', 443, '/')?.name).toBe('later');
    expect(c.decide('skip.example.com', 443)).toBe('intercept');
    expect(c.pickRule('bypass.example.com', 443, '/')).toBeUndefined();
    expect(c.decide('bypass.example.com', 443)).toBe('bypass');
  });
});
