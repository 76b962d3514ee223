import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Ajv } from 'ajv';
import { FORBIDDEN_HEADER_NAMES, proxyConfigSchema, usesPrecompiledValidator, validateProxyConfig, type ProxyConfig } from '../../src/config/schema.js';
import { HOP_BY_HOP } from '../../src/proxy/headers.js';
import { referencedSecretKeys, resolveProxyConfig } from '../../src/config/resolve.js';
import { ConfigFileError, loadProxyConfigFile } from '../../src/config/load.js';
import { Envelope } from '../../src/secrets/envelope.js';
import { ValidationFailure } from '../../src/validation/errors.js';

const good: ProxyConfig = {
  no_proxy: ['localhost', '*.internal'],
  rules: [
    {
      name: 'github',
      match_hosts: ['api.github.com', '*.githubusercontent.com'],
      match_paths: ['/repos/*'],
      headers: [
        { name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GITHUB_TOKEN}' },
        { name: 'X-Client', type: 'plaintext', value: 'keygate' },
      ],
      no_proxy: ['raw.githubusercontent.com'],
    },
  ],
};

const cases: [string, unknown, (string | number)[], RegExp][] = [
  ['unknown top-level property', { ...good, extra: 1 }, ['extra'], /Extra inputs/],
  ['unknown rule property', { rules: [{ name: 'a', match_hosts: ['a.com'], bogus: 1 }] }, ['rules', 0, 'bogus'], /Extra/],
  ['missing name', { rules: [{ match_hosts: ['a.com'] }] }, ['rules', 0, 'name'], /required/],
  ['bad header type', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X', type: 'secret', value: 'v' }] }] }, ['rules', 0, 'headers', 0, 'type'], /Input should be/],
  ['bad host pattern', { rules: [{ name: 'a', match_hosts: ['ok.com', 'bad host'] }] }, ['rules', 0, 'match_hosts', 1], /Invalid host pattern/],
  ['bad no_proxy', { no_proxy: ['a..b'] }, ['no_proxy', 0], /Invalid host pattern/],
  ['bad rule no_proxy', { rules: [{ name: 'a', match_hosts: ['a.com'], no_proxy: ['*.'] }] }, ['rules', 0, 'no_proxy', 0], /Invalid host pattern/],
  ['bad path pattern', { rules: [{ name: 'a', match_hosts: ['a.com'], match_paths: ['/ok', 'nope'] }] }, ['rules', 0, 'match_paths', 1], /Invalid path pattern/],
  ['encoded slash in path pattern', { rules: [{ name: 'a', match_hosts: ['a.com'], match_paths: ['/a%2Fb'] }] }, ['rules', 0, 'match_paths', 0], /encoded/],
  ['header name not a token', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X Bad', type: 'plaintext', value: 'v' }] }] }, ['rules', 0, 'headers', 0, 'name'], /pattern/],
  ['CRLF in value', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X', type: 'plaintext', value: 'v\r\nX-Evil: 1' }] }] }, ['rules', 0, 'headers', 0, 'value'], /legal HTTP field/],
  ['NUL in value', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X', type: 'plaintext', value: 'v\u0000' }] }] }, ['rules', 0, 'headers', 0, 'value'], /legal HTTP field/],
  ['forbidden header', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'Host', type: 'plaintext', value: 'evil.com' }] }] }, ['rules', 0, 'headers', 0, 'name'], /cannot be injected/],
  ['connection-specific header (HTTP/2)', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'HTTP2-Settings', type: 'plaintext', value: 'AAMAAABkAAQAoAAAAAIAAAAA' }] }] }, ['rules', 0, 'headers', 0, 'name'], /cannot be injected/],
  ['duplicate header', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X-A', type: 'plaintext', value: '1' }, { name: 'x-a', type: 'plaintext', value: '2' }] }] }, ['rules', 0, 'headers', 1, 'name'], /set twice/],
  ['duplicate rule name', { rules: [{ name: 'a', match_hosts: ['a.com'] }, { name: 'a', match_hosts: ['b.com'] }] }, ['rules', 1, 'name'], /Duplicate rule/],
  ['secret without reference', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X', type: 'workspace_secret', value: 'Bearer TOKEN' }] }] }, ['rules', 0, 'headers', 0, 'value'], /at least one secret/],
  ['malformed reference', { rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X', type: 'workspace_secret', value: '{A} {bad-key}' }] }] }, ['rules', 0, 'headers', 0, 'value'], /Malformed/],
  ['empty match_hosts', { rules: [{ name: 'a', match_hosts: [] }] }, ['rules', 0, 'match_hosts'], /fewer than 1/],
  ['too many rules', { rules: Array.from({ length: 101 }, (_, i) => ({ name: `r${i}`, match_hosts: ['a.com'] })) }, ['rules'], /more than 100/],
  ['not an object', [], [], /object/],
];

describe('validateProxyConfig', () => {
  it('accepts the spec shape, both no_proxy placements', () => {
    expect(validateProxyConfig(good)).toEqual([]);
    expect(validateProxyConfig({})).toEqual([]);
  });

  it('is a plain embeddable JSON schema', () => {
    expect(JSON.stringify(proxyConfigSchema)).not.toMatch(/"\$(id|schema|ref)"/);
    expect(new Ajv().compile({ type: 'object', properties: { proxy_config: proxyConfigSchema } })).toBeTypeOf('function');
  });

  it.each(cases)('%s', (_name, value, loc, msg) => {
    const issues = validateProxyConfig(value);
    const hit = issues.find((i) => JSON.stringify(i.loc) === JSON.stringify(loc));
    expect(hit, JSON.stringify(issues)).toBeDefined();
    expect(hit!.msg).toMatch(msg);
  });

  it('forbids a rule every hop-by-hop field the proxy drops from requests (a rule\'s headers are added after that filter)', () => {
    for (const name of HOP_BY_HOP) expect(FORBIDDEN_HEADER_NAMES.has(name), name).toBe(true);
  });

  it('never quotes a header value in a message', () => {
    const issues = validateProxyConfig({ rules: [{ name: 'a', match_hosts: ['a.com'], headers: [{ name: 'X', type: 'plaintext', value: 'sup3rs3cret\n' }] }] });
    expect(issues.length).toBeGreaterThan(0);
    expect(JSON.stringify(issues)).not.toContain('sup3rs3cret');
  });
});

describe('the standalone validator built by npm run build (scripts/build-validators.mjs)', () => {
  const built = () => import(path.resolve('dist/config/schema.js')) as Promise<typeof import('../../src/config/schema.js')>;

  it('is what the built proxy uses (no ajv at run time), while the sources compile the schema', async () => {
    const dist = await built();
    expect(dist.usesPrecompiledValidator()).toBe(true);
    expect(usesPrecompiledValidator()).toBe(false);
  });

  it('gives exactly the issues ajv gives, for every case above and the good config', async () => {
    const dist = await built();
    for (const [, value] of [['good', good] as const, ...cases]) expect(dist.validateProxyConfig(value)).toEqual(validateProxyConfig(value));
  });
});

describe('resolveProxyConfig', () => {
  const secrets: Record<string, string> = { GITHUB_TOKEN: 'ghp_s3cr3t', A: 'aval_9q7z' };
  it('replaces templates, keeps other text, plaintext as written', () => {
    const r = resolveProxyConfig(good, (k) => secrets[k]);
    expect(r.rules[0].headers).toEqual([
      { name: 'Authorization', value: 'Bearer ghp_s3cr3t' },
      { name: 'X-Client', value: 'keygate' },
    ]);
    expect(r.no_proxy).toEqual(['localhost', '*.internal']);
    expect(r.rules[0].no_proxy).toEqual(['raw.githubusercontent.com']);
  });

  it('reports every missing key with rule, header and key, never a value', () => {
    const cfg: ProxyConfig = {
      rules: [
        { name: 'one', match_hosts: ['a.com'], headers: [{ name: 'X-A', type: 'workspace_secret', value: '{A}:{MISSING_1}' }] },
        { name: 'two', match_hosts: ['b.com'], headers: [{ name: 'X-P', type: 'plaintext', value: 'p' }, { name: 'X-B', type: 'workspace_secret', value: 'k {MISSING_2}' }] },
      ],
    };
    let err: unknown;
    try {
      resolveProxyConfig(cfg, (k) => secrets[k]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ValidationFailure);
    const issues = (err as ValidationFailure).issues;
    expect(issues.map((i) => i.loc)).toEqual([
      ['rules', 0, 'headers', 0, 'value'],
      ['rules', 1, 'headers', 1, 'value'],
    ]);
    expect(issues[0].msg).toMatch(/MISSING_1.*'one'.*'X-A'/);
    expect(issues[1].msg).toMatch(/MISSING_2.*'two'.*'X-B'/);
    expect(JSON.stringify(issues) + (err as Error).message).not.toContain('aval_9q7z');
  });

  it('refuses a secret value that is not a legal field value', () => {
    expect(() => resolveProxyConfig(good, (k) => (k === 'GITHUB_TOKEN' ? 'a\r\nInjected: 1' : undefined))).toThrow(/not a legal HTTP field value/);
  });

  it('opens sealed opaque values, uses unsealed ones as given', () => {
    const env = new Envelope(Buffer.alloc(32, 7));
    const cfg: ProxyConfig = {
      rules: [{ name: 'o', match_hosts: ['a.com'], headers: [{ name: 'X-S', type: 'opaque', value: env.seal('op4que') }, { name: 'X-P', type: 'opaque', value: 'plain-op' }] }],
    };
    expect(validateProxyConfig(cfg)).toEqual([]);
    const r = resolveProxyConfig(cfg, () => undefined, { openOpaque: (s) => env.open(s) });
    expect(r.rules[0].headers.map((h) => h.value)).toEqual(['op4que', 'plain-op']);
    expect(() => resolveProxyConfig(cfg, () => undefined)).toThrow(/encrypted and no key/);
    const other = new Envelope(Buffer.alloc(32, 8));
    expect(() => resolveProxyConfig(cfg, () => undefined, { openOpaque: (s) => other.open(s) })).toThrow(/cannot be decrypted/);
  });

  it('lists referenced keys with their locations', () => {
    expect(referencedSecretKeys(good)).toEqual([{ key: 'GITHUB_TOKEN', loc: ['rules', 0, 'headers', 0, 'value'] }]);
  });
});

describe('loadProxyConfigFile', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-config-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const write = (name: string, text: string) => {
    const f = path.join(dir, name);
    writeFileSync(f, text);
    return f;
  };
  it('names the JSON path and the reason', () => {
    const f = write('bad.json', JSON.stringify({ rules: [{ name: 'a', match_hosts: ['a..com'] }] }));
    expect(() => loadProxyConfigFile(f, () => undefined)).toThrow(/rules\[0\]\.match_hosts\[0\]: Invalid host pattern/);
    expect(() => loadProxyConfigFile(write('syntax.json', '{nope'), () => undefined)).toThrow(/not valid JSON/);
    expect(() => loadProxyConfigFile(path.join(dir, 'absent.json'), () => undefined)).toThrow(ConfigFileError);
  });
  it('compiles a good file', () => {
    const f = write('good.json', JSON.stringify(good));
    const { compiled } = loadProxyConfigFile(f, (k) => (k === 'GITHUB_TOKEN' ? 't' : undefined));
    expect(compiled.decide('api.github.com', 443)).toBe('intercept');
  });
});
