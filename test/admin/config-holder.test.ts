import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ConfigApplyError, ConfigHolder, parseConfigPush } from '../../src/admin/config-holder.js';
import { ProxyMetrics } from '../../src/admin/metrics.js';
import { parseAdminListen } from '../../src/admin/sidecar.js';
import type { CompiledConfig } from '../../src/rules/compile.js';
import { Envelope } from '../../src/secrets/envelope.js';
import { sealOpaqueValues } from '../../src/secrets/opaque.js';
import type { SecretStore } from '../../src/secrets/types.js';
import { ValidationFailure } from '../../src/validation/errors.js';

const cfg = (value: string, type = 'opaque') => ({ rules: [{ name: 'r', match_hosts: ['a.test'], headers: [{ name: 'X-K', type, value }] }] });
const headersOf = (c: CompiledConfig) => Object.fromEntries(c.rules[0].headers.map(([k, v]) => [k, v]));

describe('ConfigHolder', () => {
  it('opens sealed opaque values with the envelope, only when there is one to open', async () => {
    const env = new Envelope(randomBytes(32));
    let calls = 0;
    const swapped: CompiledConfig[] = [];
    const holder = new ConfigHolder({ proxy: { setConfig: (c) => swapped.push(c) }, envelope: () => (calls++, env) });
    await holder.apply(cfg('plain-opaque'), { source: 'push' });
    expect(calls).toBe(0);
    await holder.apply(sealOpaqueValues(cfg('sealed-opaque'), env), { source: 'push' });
    expect(calls).toBe(1);
    expect(headersOf(swapped[1])).toEqual({ 'x-k': 'sealed-opaque' });
    // Sealed under another key: 422-style issue at the value, nothing swapped.
    const other = sealOpaqueValues(cfg('x'), new Envelope(randomBytes(32)));
    const err = await holder.apply(other, { source: 'push', locPrefix: ['body'] }).catch((e) => e);
    expect(err).toBeInstanceOf(ValidationFailure);
    expect(err.issues[0].loc).toEqual(['body', 'rules', 0, 'headers', 0, 'value']);
    expect(swapped.length).toBe(2);
    expect(holder.current()!.proxy_config.rules![0].headers![0]).toEqual({ name: 'X-K', type: 'opaque' });
  });

  it('serialises concurrent applies: generations follow the order of the swaps', async () => {
    const swapped: string[] = [];
    const holder = new ConfigHolder({ proxy: { setConfig: (c) => swapped.push(headersOf(c)['x-k']) } });
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => holder.apply(cfg(`v${i}`, 'plaintext'), { source: 'push' })));
    expect(results.map((r) => r.generation)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    expect(swapped).toEqual(results.map((_, i) => `v${i}`));
    expect(holder.generation).toBe(10);
  });

  it('a store that cannot be read is a ConfigApplyError naming the store, and counts as rejected', async () => {
    const store: SecretStore = {
      description: 'broken store',
      writable: false,
      get: async () => undefined,
      list: async () => [],
      snapshot: async () => {
        throw new Error('secret K in /x: value was encrypted with another master key');
      },
      set: async () => undefined,
      delete: async () => false,
    };
    const metrics = new ProxyMetrics();
    const holder = new ConfigHolder({ proxy: { setConfig: () => undefined }, store, metrics });
    const err = await holder.apply(cfg('Bearer {K}', 'workspace_secret'), { source: 'sighup' }).catch((e) => e);
    expect(err).toBeInstanceOf(ConfigApplyError);
    expect(err.message).toMatch(/broken store.*another master key/);
    expect(metrics.configApplies.get({ source: 'sighup', result: 'rejected' })).toBe(1);
    // A config with no template does not need the store at all.
    await holder.apply(cfg('v', 'plaintext'), { source: 'sighup' });
    expect(holder.generation).toBe(1);
    await expect(new ConfigHolder({ proxy: { setConfig: () => undefined } }).reapply('sighup')).rejects.toThrow(/no configuration/);
  });
});

describe('parseConfigPush', () => {
  it('accepts a bare proxy_config or the wrapped form', () => {
    expect(parseConfigPush({ rules: [] })).toEqual({ config: { rules: [] }, locPrefix: ['body'] });
    const w = parseConfigPush({ proxy_config: { rules: [] }, secrets: { A: 'x' } });
    expect(w.locPrefix).toEqual(['body', 'proxy_config']);
    expect(w.secrets).toEqual(new Map([['A', 'x']]));
    expect(() => parseConfigPush(null)).toThrow(ValidationFailure);
    expect(() => parseConfigPush({ proxy_config: {}, secrets: [] })).toThrow(/secrets/);
  });
});

describe('parseAdminListen', () => {
  it('parses TCP and unix forms', () => {
    expect(parseAdminListen('127.0.0.1:9000')).toEqual({ host: '127.0.0.1', port: 9000 });
    expect(parseAdminListen('[::1]:0')).toEqual({ host: '::1', port: 0 });
    expect(parseAdminListen('unix:/run/kg/admin.sock')).toEqual({ path: '/run/kg/admin.sock' });
    expect(() => parseAdminListen('9000')).toThrow(/HOST:PORT or unix/);
    expect(() => parseAdminListen('unix:')).toThrow(/needs a path/);
    expect(() => parseAdminListen('h:70000')).toThrow();
  });
});
