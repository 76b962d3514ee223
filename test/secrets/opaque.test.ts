import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { Envelope } from '../../src/secrets/envelope.js';
import { opaqueOpener, redactProxyConfig, sealOpaqueValues } from '../../src/secrets/opaque.js';

const config = () => ({
  no_proxy: ['localhost'],
  rules: [
    {
      name: 'gh',
      match_hosts: ['api.github.com'],
      headers: [
        { name: 'Authorization', type: 'workspace_secret' as const, value: 'Bearer {GITHUB_TOKEN}' },
        { name: 'X-Opaque', type: 'opaque' as const, value: 'opaque-plain-value' },
        { name: 'X-Plain', type: 'plaintext' as const, value: 'hello' },
      ],
    },
    { name: 'none', match_hosts: ['x.test'], headers: [] },
  ],
});

describe('opaque values at rest', () => {
  it('seals opaque values only, keeps sealed ones, never mutates the input', () => {
    const env = new Envelope(randomBytes(32));
    const input = config();
    const sealed = sealOpaqueValues(input, env);
    expect(input.rules[0].headers[1].value).toBe('opaque-plain-value');
    const h = sealed.rules[0].headers;
    expect(h[0].value).toBe('Bearer {GITHUB_TOKEN}');
    expect(h[2].value).toBe('hello');
    expect(Envelope.isSealed(h[1].value)).toBe(true);
    expect(JSON.stringify(sealed)).not.toContain('opaque-plain-value');
    // Idempotent: an already sealed value is not sealed twice.
    expect(sealOpaqueValues(sealed, env)).toEqual(sealed);
    // Sealed without aad: the generic opener (and key rotation) can open it.
    expect(opaqueOpener(env)(h[1].value)).toBe('opaque-plain-value');
    expect(() => opaqueOpener(new Envelope(randomBytes(32)))(h[1].value)).toThrow(/opaque header value cannot be decrypted: .*another master key/);
  });

  it('redacts: opaque values omitted (no value key), templates and plaintext kept', () => {
    const env = new Envelope(randomBytes(32));
    for (const c of [config(), sealOpaqueValues(config(), env)]) {
      const r = redactProxyConfig(c);
      const h = r.rules[0].headers;
      expect(h[1]).toEqual({ name: 'X-Opaque', type: 'opaque' });
      expect('value' in h[1]).toBe(false);
      expect(h[0]).toEqual({ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GITHUB_TOKEN}' });
      expect(h[2].value).toBe('hello');
      expect(r.no_proxy).toEqual(['localhost']);
      expect(JSON.stringify(r)).not.toMatch(/opaque-plain-value|kg1\./);
    }
  });
});
