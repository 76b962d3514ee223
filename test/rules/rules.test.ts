import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import {
  compileConfig,
  compileHostPattern,
  compilePathPattern,
  normaliseHost,
  normalisePath,
  parseAuthority,
  PatternError,
  RuleInputError,
} from '../../src/rules/index.js';
import { formatAuthority, urlAuthority } from '../../src/rules/host.js';

const require = createRequire(import.meta.url);

describe('normaliseHost', () => {
  it.each([
    ['API.Example.COM', 'api.example.com'],
    ['api.example.com.', 'api.example.com'],
    ['bücher.de', 'xn--bcher-kva.de'],
    ['BÜCHER.de.', 'xn--bcher-kva.de'],
    ['xn--bcher-kva.de', 'xn--bcher-kva.de'],
    ['[::1]', '::1'],
    ['::1', '::1'],
    ['[2001:DB8:0:0:0:0:0:1]', '2001:db8::1'],
    ['127.0.0.1', '127.0.0.1'],
    ['0x7f.1', '127.0.0.1'],
    ['2130706433', '127.0.0.1'],
    ['ｅxample.com', 'example.com'],
    ['my_host.internal', 'my_host.internal'],
    // IPv4-mapped IPv6 is the IPv4 address it maps; NAT64 is another address (a translator's).
    ['[::ffff:127.0.0.1]', '127.0.0.1'],
    ['::FFFF:7f00:1', '127.0.0.1'],
    ['[0:0:0:0:0:ffff:a00:5]', '10.0.0.5'],
    ['[64:ff9b::10.0.0.5]', '64:ff9b::a00:5'],
    // As an HTTP/1.1 field arrives (Node reads its bytes as latin1): UTF-8 and latin1 spellings.
    [Buffer.from('Bücher.de', 'utf8').toString('latin1'), 'xn--bcher-kva.de'],
    [Buffer.from('Bücher.de', 'latin1').toString('latin1'), 'xn--bcher-kva.de'],
  ])('%s -> %s', (raw, want) => expect(normaliseHost(raw)).toBe(want));

  it.each(['', 'a..b', 'example.com..', '-a.com', 'a-.com', 'a b.com', 'a/b', 'a\\b', 'user@host', 'a%2eb', 'host:80', '[::1', '[fe80::1%eth0]', '1.2.3.256', '999999999999', 'a\u0000b', 'x'.repeat(64) + '.com', '[1.2.3.4]'])(
    'refuses %j',
    (raw) => expect(() => normaliseHost(raw)).toThrow(RuleInputError),
  );

  it('parses authorities with ports and brackets', () => {
    expect(parseAuthority('Api.Example.com:8443', 443)).toEqual({ host: 'api.example.com', port: 8443 });
    expect(parseAuthority('api.example.com', 443)).toEqual({ host: 'api.example.com', port: 443 });
    expect(parseAuthority('[::1]:9', undefined)).toEqual({ host: '::1', port: 9 });
    expect(() => parseAuthority('::1:9', 443)).toThrow(RuleInputError);
    expect(() => parseAuthority('a.com:0', 443)).toThrow(RuleInputError);
    expect(() => parseAuthority('a.com:65536', 443)).toThrow(RuleInputError);
    expect(() => parseAuthority('a.com:+1', 443)).toThrow(RuleInputError);
    expect(() => parseAuthority('a.com', undefined)).toThrow(RuleInputError);
  });
});

describe('authorities as written', () => {
  it('formatAuthority always has the port; urlAuthority leaves the default one out; IPv6 in brackets', () => {
    expect(formatAuthority('api.example.com', 443)).toBe('api.example.com:443');
    expect(urlAuthority('api.example.com', 443, 443)).toBe('api.example.com');
    expect(urlAuthority('api.example.com', 8443, 443)).toBe('api.example.com:8443');
    expect(urlAuthority('::1', 443, 443)).toBe('[::1]');
    expect(urlAuthority('::1', 8443, 443)).toBe('[::1]:8443');
    expect(urlAuthority('127.0.0.1', 80, 80)).toBe('127.0.0.1');
  });
});

describe('normalisePath', () => {
  it.each([
    ['/repos/a', '/repos/a', ''],
    ['/repos/a?x=1&y=%2F', '/repos/a', '?x=1&y=%2F'],
    ['/repos/%61%2D%7e', '/repos/a-~', ''],
    ['/repos/%e2%82%ac', '/repos/%E2%82%AC', ''],
    ['/repos/./a/../b', '/repos/b', ''],
    ['/repos/%2e%2e/admin', '/admin', ''],
    ['/repos/%2E/a', '/repos/a', ''],
    ['/a/b/..', '/a/', ''],
    ['/a/.', '/a/', ''],
    ['/', '/', ''],
    ['/a//b', '/a//b', ''],
    ['/%2541', '/%2541', ''],
  ])('%s -> %s', (raw, path, query) => expect(normalisePath(raw)).toEqual({ path, query }));

  it.each([
    '/repos/..%2fadmin',
    '/repos/..%2Fadmin',
    '/a%5cb',
    '/a%5Cb',
    '/a\\b',
    '/..',
    '/a/../..',
    '/%2e%2e/x',
    '/a%00b',
    '/a%0d%0ab',
    '/a\u0000b',
    '/a b',
    '/a%zz',
    '/a%2',
    '/repos/%252e%252e/admin',
    '/repos/%252fadmin',
    '/repos/..;/admin',
    '/a#frag',
    'repos/a',
    '*',
    'http://x/y',
    '/caf\u00e9',
  ])('refuses %j', (raw) => expect(normalisePath(raw)).toHaveProperty('error'));
});

describe('host patterns', () => {
  const m = (pattern: string, host: string, port = 443) => compileHostPattern(pattern).test(normaliseHost(host), port);
  it('exact names match only themselves, in any spelling', () => {
    expect(m('api.example.com', 'API.example.com.')).toBe(true);
    expect(m('api.example.com', 'x.api.example.com')).toBe(false);
    expect(m('bücher.de', 'xn--bcher-kva.de')).toBe(true);
  });
  it('*.domain matches every depth, never the apex or look-alikes', () => {
    expect(m('*.example.com', 'a.example.com')).toBe(true);
    expect(m('*.example.com', 'a.b.example.com')).toBe(true);
    expect(m('*.example.com', 'example.com')).toBe(false);
    expect(m('*.example.com', 'badexample.com')).toBe(false);
    expect(m('*.example.com', 'example.com.evil.net')).toBe(false);
    expect(m('*.example.com', 'a.example.com.evil.net')).toBe(false);
  });
  it('* inside a label stays inside that label', () => {
    expect(m('api-*.example.com', 'api-eu.example.com')).toBe(true);
    expect(m('api-*.example.com', 'api-eu.x.example.com')).toBe(false);
    expect(m('api-*.example.com', 'x.api-eu.example.com')).toBe(false);
    expect(m('a.*.example.com', 'a.b.example.com')).toBe(true);
    expect(m('a.*.example.com', 'a.b.c.example.com')).toBe(false);
  });
  it('lone * matches everything; wildcards never match IP literals', () => {
    expect(m('*', 'anything.test')).toBe(true);
    expect(m('*', '10.0.0.1')).toBe(true);
    expect(() => compileHostPattern('*.0.0.1')).toThrow(PatternError);
    expect(m('*.example.com', '127.0.0.1')).toBe(false);
    expect(m('*.bücher.de', 'a.xn--bcher-kva.de')).toBe(true);
  });
  it('IP literals match only the same address', () => {
    expect(m('127.0.0.1', '2130706433')).toBe(true);
    expect(m('127.0.0.1', '127.0.0.2')).toBe(false);
    expect(m('[::1]', '::1')).toBe(true);
    expect(m('::1', '[::1]')).toBe(true);
    expect(m('[::1]:8443', '::1', 8443)).toBe(true);
    expect(m('[::1]:8443', '::1', 443)).toBe(false);
    expect(m('10.0.0.5', '[::ffff:10.0.0.5]')).toBe(true);
    expect(m('[::ffff:10.0.0.5]', '10.0.0.5')).toBe(true);
    expect(m('10.0.0.5', '[::ffff:10.0.0.6]')).toBe(false);
  });
  it('an optional port restricts the match', () => {
    expect(m('api.example.com:8443', 'api.example.com', 8443)).toBe(true);
    expect(m('api.example.com:8443', 'api.example.com', 443)).toBe(false);
    expect(m('*.example.com:443', 'a.example.com', 443)).toBe(true);
    expect(m('*:8443', 'a.example.com', 443)).toBe(false);
  });
  it.each(['', '*.', '*.*', 'a..b', 'exa mple.com', 'a.com:99999', 'a/b', 'api-*', '*x*.example.com/'])('refuses %j', (p) =>
    expect(() => compileHostPattern(p)).toThrow(PatternError),
  );
});

describe('path patterns', () => {
  const m = (pattern: string, path: string) => compilePathPattern(pattern).test(path);
  it('trailing /* matches everything below, not the directory itself or siblings', () => {
    expect(m('/repos/*', '/repos/a')).toBe(true);
    expect(m('/repos/*', '/repos/a/b')).toBe(true);
    expect(m('/repos/*', '/repos')).toBe(false);
    expect(m('/repos/*', '/repos/')).toBe(false);
    expect(m('/repos/*', '/reposx')).toBe(false);
    expect(m('/repos/*', '/reposx/a')).toBe(false);
  });
  it('* elsewhere matches within one segment', () => {
    expect(m('/repos/*/issues', '/repos/a/issues')).toBe(true);
    expect(m('/repos/*/issues', '/repos/a/b/issues')).toBe(false);
    expect(m('/repos/*/issues', '/repos//issues')).toBe(false);
    expect(m('/v1/*.json', '/v1/a.json')).toBe(true);
    expect(m('/v1/*.json', '/v1/a/b.json')).toBe(false);
    expect(m('/repos/*/issues/*', '/repos/a/issues/1/comments')).toBe(true);
  });
  it('exact otherwise; patterns are normalised like requests', () => {
    expect(m('/user', '/user')).toBe(true);
    expect(m('/user', '/user/')).toBe(false);
    expect(m('/a/./b', '/a/b')).toBe(true);
    expect(m('/%7Euser', '/~user')).toBe(true);
  });
  it('an encoded asterisk (%2A, %2a) in a pattern is that literal byte sequence, never a wildcard', () => {
    const norm = (raw: string) => (normalisePath(raw) as { path: string }).path;
    // Requests keep `%2A` as `%2A` (an asterisk is not unreserved): the pattern matches exactly that.
    expect(m('/files/%2A', norm('/files/%2a'))).toBe(true);
    expect(m('/files/%2A', '/files/secret')).toBe(false);
    expect(m('/files/%2a', '/files/x')).toBe(false);
    expect(m('/files/%2A', '/files/*')).toBe(false);
    expect(m('/a%2Ab/*', '/a%2Ab/c')).toBe(true);
    expect(m('/a%2Ab/*', '/axb/c')).toBe(false);
    expect(m('/a/*/%2A', '/a/x/%2A')).toBe(true);
    expect(m('/a/*/%2A', '/a/x/y')).toBe(false);
    // A `/%2A` at the end is not the "everything below" form either.
    expect(m('/repos/%2A', '/repos/a/b')).toBe(false);
    // Real wildcards next to encoded ones still are wildcards, dot segments resolved as before.
    expect(m('/a/%2A*', '/a/%2Axyz')).toBe(true);
    expect(m('/a/%2A*', '/a/xyz')).toBe(false);
    expect(m('/a/*/../b/*', '/a/b/c')).toBe(true);
  });
  it.each(['repos', '/a?b', '/a%2fb', '/..', '/a/**'])('refuses %j', (p) => expect(() => compilePathPattern(p)).toThrow(PatternError));
  it('hostile request paths cannot sneak past a path rule', () => {
    const n = (raw: string) => normalisePath(raw);
    const ok = (raw: string) => {
      const r = n(raw);
      return 'path' in r && m('/repos/*', r.path);
    };
    expect(ok('/repos/%2e%2e/admin')).toBe(false);
    expect(ok('/repos/a/../../admin')).toBe(false);
    expect(ok('/repos/%61')).toBe(true);
    expect(ok('/repos/..%2fadmin')).toBe(false);
  });
});

describe('compileConfig', () => {
  const cfg = compileConfig({
    no_proxy: ['bypass.example.com', '*.internal'],
    rules: [
      { name: 'gh-repos', match_hosts: ['api.github.com'], match_paths: ['/repos/*'], headers: [{ name: 'Authorization', value: 'Bearer s1' }] },
      { name: 'gh-all', match_hosts: ['api.github.com'], headers: [{ name: 'X-Other', value: 's2' }] },
      { name: 'wild', match_hosts: ['*.example.com'], no_proxy: ['skip.example.com'], headers: [{ name: 'X-Key', value: 's3' }] },
    ],
  });
  it('decides bypass, intercept and tunnel', () => {
    expect(cfg.decide('bypass.example.com', 443)).toBe('bypass');
    expect(cfg.decide('a.internal', 443)).toBe('bypass');
    expect(cfg.decide('api.github.com', 443)).toBe('intercept');
    expect(cfg.decide('a.example.com', 443)).toBe('intercept');
    expect(cfg.decide('skip.example.com', 443)).toBe('tunnel');
    expect(cfg.decide('example.com', 443)).toBe('tunnel');
    expect(cfg.decide('other.org', 443)).toBe('tunnel');
  });
  it('picks the first matching rule', () => {
    expect(cfg.pickRule('api.github.com', 443, '/repos/x')?.name).toBe('gh-repos');
    expect(cfg.pickRule('api.github.com', 443, '/user')?.name).toBe('gh-all');
    expect(cfg.pickRule('a.b.example.com', 443, '/')?.name).toBe('wild');
    expect(cfg.pickRule('skip.example.com', 443, '/')).toBeUndefined();
    expect(cfg.noProxy).toEqual(['bypass.example.com', '*.internal']);
  });
  it('pre-builds lower-cased headers and never prints values', () => {
    const rule = cfg.pickRule('api.github.com', 443, '/repos/x')!;
    expect(rule.headers).toEqual([['authorization', 'Bearer s1']]);
    expect(rule.headerNames).toEqual(['authorization']);
    expect(JSON.stringify({ rule, cfg })).not.toContain('s1');
    expect(require('node:util').inspect(rule, { depth: 5 })).not.toContain('s1');
    expect(require('node:util').inspect(cfg, { depth: 5 })).not.toContain('Bearer');
  });
});

describe('normaliseHost memo', () => {
  it('answers a repeated host as the first time, and refuses a bad one every time', () => {
    const inputs = ['Example.COM.', 'bücher.example', '0x7f.1', '[::ffff:127.0.0.1]', 'API.example.com'];
    const first = inputs.map((h) => normaliseHost(h));
    expect(first).toEqual(['example.com', 'xn--bcher-kva.example', '127.0.0.1', '127.0.0.1', 'api.example.com']);
    // Past the memo's bound (it empties itself), then the same inputs again.
    for (let i = 0; i < 1500; i++) normaliseHost(`h${i}.example`);
    expect(inputs.map((h) => normaliseHost(h))).toEqual(first);
    for (let i = 0; i < 2; i++) {
      expect(() => normaliseHost('a b.example')).toThrow();
      expect(() => normaliseHost('1.2.3.256')).toThrow();
    }
  });
});
