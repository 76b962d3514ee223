/**
 * The plan step (src/proxy/plan.ts) without a socket: what every exchange calls for each request.
 * Refusals are values with a status, an RFC 9209 type and a code; an allowed request carries the
 * exact path to send and the rule whose headers it gets.
 */
import { describe, expect, it } from 'vitest';
import { EgressDenied } from '../../src/proxy/egress.js';
import { ProxyError } from '../../src/proxy/errors.js';
import { DEFAULT_LIMITS } from '../../src/proxy/limits.js';
import { connectTarget, planIntercepted, planPlain, type RequestFacts } from '../../src/proxy/plan.js';
import { compileConfig } from '../../src/rules/index.js';

const config = compileConfig({
  no_proxy: ['bypass.test'],
  rules: [
    { name: 'repos', match_hosts: ['api.test'], match_paths: ['/repos/*'], headers: [{ name: 'Authorization', value: 'Bearer s1' }] },
    { name: 'meta', match_hosts: ['meta.test'], headers: [{ name: 'X-Key', value: 's2' }] },
  ],
  access_control: { deny_hosts: ['denied.test'] },
});
const limits = { ...DEFAULT_LIMITS, maxRequestLineBytes: 256, maxHeaderCount: 4 };
const t = { host: 'api.test', port: 443, authority: 'api.test:443' };
const req = (method: string, target: string, headers: string[] = ['Host', 'api.test'], version = 11): RequestFacts => ({ method, target, version, rawHeaders: headers });

function refusal(v: unknown): { status: number; code: string } {
  expect(v).toBeInstanceOf(ProxyError);
  const e = v as ProxyError;
  return { status: e.status, code: e.code };
}

describe('planIntercepted', () => {
  it('normalises the path, picks the rule on it, and sends exactly that path', () => {
    expect(planIntercepted(req('GET', '/repos/%61/../b?x=1'), t, config, limits)).toEqual({ pathAndQuery: '/repos/b?x=1', path: '/repos/b', rule: config.rules[0] });
    expect(planIntercepted(req('GET', '/repos/%2e%2e/admin'), t, config, limits)).toEqual({ pathAndQuery: '/admin', path: '/admin', rule: undefined });
    expect(planIntercepted(req('GET', 'https://api.test/repos/x'), t, config, limits)).toMatchObject({ path: '/repos/x', rule: config.rules[0] });
  });

  it('an empty segment (//) that an origin merging slashes (nginx) reads under another rule is refused; one that reads the same passes', () => {
    // A carve-out before a catch-all: the operator keeps the token away from /admin/*.
    const carved = compileConfig({
      no_proxy: [],
      rules: [
        { name: 'no-admin', match_hosts: ['api.test'], match_paths: ['/admin/*'], headers: [] },
        { name: 'all', match_hosts: ['api.test'], headers: [{ name: 'Authorization', value: 'Bearer s1' }] },
        { name: 'v1', match_hosts: ['v1.test'], match_paths: ['/v1/*'], headers: [{ name: 'Authorization', value: 'Bearer s2' }] },
      ],
    });
    // nginx serves //admin/x as /admin/x: under the carve-out, so the token must not go with it.
    for (const target of ['//admin/x', '/x/..//admin/x', '///admin/x?q=1']) {
      expect(refusal(planIntercepted(req('GET', target), t, carved, limits))).toEqual({ status: 400, code: 'KEYGATE_MALFORMED' });
    }
    expect(planIntercepted(req('GET', '/admin/x'), t, carved, limits)).toMatchObject({ rule: carved.rules[0] });
    // The same rule either way (a client joining a base URL ending in / with a path starting with /): forwarded as sent.
    const v1 = { host: 'v1.test', port: 443, authority: 'v1.test:443' };
    expect(planIntercepted(req('GET', '/v1//chat/completions', ['Host', 'v1.test']), v1, carved, limits)).toEqual({ pathAndQuery: '/v1//chat/completions', path: '/v1//chat/completions', rule: carved.rules[2] });
    expect(planIntercepted(req('GET', '//x//y', ['Host', 'api.test']), t, carved, limits)).toMatchObject({ path: '//x//y', rule: carved.rules[1] });
    // A rule scoped to some paths: //v1/x is outside it as sent, inside it merged.
    expect(refusal(planIntercepted(req('GET', '//v1/x', ['Host', 'v1.test']), v1, carved, limits))).toEqual({ status: 400, code: 'KEYGATE_MALFORMED' });
  });

  it.each([
    ['TRACE', req('TRACE', '/repos/x'), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['TRACE in absolute form', req('TRACE', 'https://api.test/'), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['trace (an HTTP/2 :method may be any case)', req('trace', '/repos/x', ['Host', 'api.test'], 20), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['TRACK', req('TRACK', '/repos/x'), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['an Expect other than 100-continue', req('GET', '/repos/x', ['Host', 'api.test', 'Expect', 'x-y']), 417, 'KEYGATE_EXPECTATION_FAILED'],
    ['X-HTTP-Method-Override: TRACE', req('POST', '/repos/x', ['Host', 'api.test', 'X-HTTP-Method-Override', ' trace ']), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['X_HTTP_METHOD: GET, TRACK', req('POST', '/repos/x', ['Host', 'api.test', 'X_HTTP_METHOD', 'GET, TRACK']), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['_method=TRACE in the query', req('POST', '/repos/x?a=b&_method=TRACE'), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['_method spelled with escapes and +', req('POST', '/repos/x?%5fmethod=+trace'), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['_method=TRACE beside an undecodable escape', req('POST', '/repos/x?_method=TRACE%zz'), 403, 'KEYGATE_REFLECTING_METHOD'],
    ['a Host naming another authority', req('GET', '/', ['Host', 'other.test']), 421, 'KEYGATE_MISDIRECTED'],
    ['an absolute target to another port', req('GET', 'https://api.test:8443/'), 421, 'KEYGATE_MISDIRECTED'],
    ['two Host fields', req('GET', '/', ['Host', 'api.test', 'Host', 'api.test']), 400, 'KEYGATE_MALFORMED'],
    ['no Host on HTTP/1.1', req('GET', '/', []), 400, 'KEYGATE_MALFORMED'],
    ['http:// inside a tunnel', req('GET', 'http://api.test/'), 400, 'KEYGATE_MALFORMED'],
    ['the asterisk form', req('OPTIONS', '*'), 400, 'KEYGATE_MALFORMED'],
    ['a path above the root', req('GET', '/../x'), 400, 'KEYGATE_MALFORMED'],
    ['an escape of an escape', req('GET', '/repos/%25%32%65%25%32%65/x'), 400, 'KEYGATE_MALFORMED'],
    ['an encoded parameter after ..', req('GET', '/repos/a/..%3B/x'), 400, 'KEYGATE_MALFORMED'],
    ['a request line over its limit', req('GET', `/${'a'.repeat(300)}`), 414, 'KEYGATE_URI_TOO_LONG'],
    ['too many fields', req('GET', '/', ['Host', 'api.test', 'A', '1', 'B', '2', 'C', '3', 'D', '4']), 431, 'KEYGATE_HEAD_TOO_LARGE'],
    ['Transfer-Encoding gzip', req('POST', '/', ['Host', 'api.test', 'Transfer-Encoding', 'gzip']), 400, 'KEYGATE_MALFORMED'],
    ['Transfer-Encoding on HTTP/1.0', req('POST', '/', ['Host', 'api.test', 'Transfer-Encoding', 'chunked'], 10), 400, 'KEYGATE_MALFORMED'],
  ])('refuses %s', (_name, facts, status, code) => {
    expect(refusal(planIntercepted(facts, t, config, limits))).toEqual({ status, code });
  });

  it('forwards overrides and parameters that ask for another method, or only look like _method', () => {
    for (const facts of [
      req('POST', '/repos/x', ['Host', 'api.test', 'X-HTTP-Method-Override', 'PATCH']),
      req('GET', '/repos/x?x_method=TRACE&_methods=TRACE&q=TRACE'),
      req('GET', '/repos/x?_method=GET'),
      req('GET', '/repos/x', ['Host', 'api.test', 'X-Trace', 'TRACE']),
      req('POST', '/repos/x', ['Host', 'api.test', 'Expect', '100-Continue']),
    ]) {
      expect(planIntercepted(facts, t, config, limits)).toMatchObject({ rule: config.rules[0] });
    }
  });

  it('refuses a destination the egress policy denies by name, as a value the caller reports', () => {
    const d = { host: 'denied.test', port: 443, authority: 'denied.test:443' };
    const r = planIntercepted(req('GET', '/', ['Host', 'denied.test']), d, config, limits);
    expect(r).toBeInstanceOf(EgressDenied);
    expect(refusal(r)).toEqual({ status: 403, code: 'KEYGATE_EGRESS_DENIED' });
  });

  it('the head limits come first, then framing, then the method', () => {
    expect(refusal(planIntercepted(req('TRACE', `/${'a'.repeat(300)}`), t, config, limits)).status).toBe(414);
    expect(refusal(planIntercepted(req('TRACE', '/', ['Host', 'api.test', 'Transfer-Encoding', 'gzip']), t, config, limits)).status).toBe(400);
  });
  it('refuses HTTP/0.9 (and any version but 1.0, 1.1 and 2) on every kind of request', () => {
    expect(refusal(planIntercepted(req('GET', '/repos/a', [], 9), t, config, limits))).toEqual({ status: 400, code: 'KEYGATE_MALFORMED' });
    expect(refusal(planIntercepted(req('GET', '/repos/a', ['Host', 'api.test'], 12), t, config, limits)).status).toBe(400);
    expect(refusal(planPlain(req('GET', 'http://plain.test/', [], 9), config, limits, () => false)).status).toBe(400);
    expect(refusal(connectTarget(req('CONNECT', 'plain.test:443', [], 9), limits)).status).toBe(400);
    for (const version of [10, 11, 20]) expect(planIntercepted(req('GET', '/repos/a', ['Host', 'api.test'], version), t, config, limits)).not.toBeInstanceOf(ProxyError);
  });
});

describe('planPlain', () => {
  const self = (host: string, port: number) => host === '127.0.0.1' && port === 3128;
  it('forwards a host no rule covers, as is', () => {
    expect(planPlain(req('GET', 'http://plain.test/a/../b?q', ['Host', 'plain.test']), config, limits, self)).toEqual({ host: 'plain.test', port: 80, pathAndQuery: '/a/../b?q', decision: 'tunnel' });
    expect(planPlain(req('GET', 'http://bypass.test:8080/', ['Host', 'x']), config, limits, self)).toMatchObject({ decision: 'bypass', port: 8080 });
  });
  it.each([
    ['a rule host in clear', req('GET', 'http://meta.test/'), 403, 'KEYGATE_REFUSED'],
    ['TRACE to a rule host in clear', req('TRACE', 'http://meta.test/'), 403, 'KEYGATE_REFUSED'],
    ['the proxy itself', req('GET', 'http://127.0.0.1:3128/'), 403, 'KEYGATE_REFUSED'],
    ['an origin-form target', req('GET', '/x'), 400, 'KEYGATE_MALFORMED'],
    ['https:// in clear', req('GET', 'https://plain.test/'), 400, 'KEYGATE_MALFORMED'],
    ['credentials in the target', req('GET', 'http://u:p@plain.test/'), 400, 'KEYGATE_MALFORMED'],
    ['no Host on HTTP/1.1', req('GET', 'http://plain.test/', []), 400, 'KEYGATE_MALFORMED'],
    ['a denied name', req('GET', 'http://denied.test/'), 403, 'KEYGATE_EGRESS_DENIED'],
  ])('refuses %s', (_name, facts, status, code) => {
    expect(refusal(planPlain(facts, config, limits, self))).toEqual({ status, code });
  });
  it('accepts HTTP/1.0 without Host', () => {
    expect(planPlain(req('GET', 'http://plain.test/', [], 10), config, limits, self)).toMatchObject({ host: 'plain.test' });
  });
});

describe('connectTarget', () => {
  it('parses the authority or refuses it', () => {
    expect(connectTarget(req('CONNECT', 'API.test:443', []), limits)).toEqual({ host: 'api.test', port: 443 });
    expect(refusal(connectTarget(req('CONNECT', 'api.test', []), limits))).toEqual({ status: 400, code: 'KEYGATE_MALFORMED' });
    expect(refusal(connectTarget(req('CONNECT', `${'a'.repeat(300)}.test:443`, []), limits))).toEqual({ status: 414, code: 'KEYGATE_URI_TOO_LONG' });
  });
});
