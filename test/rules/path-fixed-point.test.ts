/**
 * Path normalisation is a fixed point (issue #18, class 2): for every target P the proxy
 * accepts, the path it sends upstream passes every check unchanged, and an origin that decodes
 * it once more still reads the same segments, none of them a dot segment. Checked on seeded
 * random targets built from the pieces that broke it (escapes of escapes, encoded `;` after
 * `..`, overlong UTF-8, mixed-case hex) and on the exact cases of the review.
 */
import { describe, expect, it } from 'vitest';
import { isPathRefusal, normalisePath, type NormalisedPath } from '../../src/rules/path.js';
import { prng } from '../proxy/h1/differential.js';
import { DEFAULT_LIMITS } from '../../src/proxy/limits.js';
import { planIntercepted } from '../../src/proxy/plan.js';
import { ProxyError } from '../../src/proxy/errors.js';
import { compileConfig } from '../../src/rules/index.js';

const PIECES = [
  '/', '/', '/', '.', '..', '.', 'a', 'B', '2', 'e', 'E', 'f', '5', 'c', '~', ';', '=', '@', ':', '!', '+', ',',
  '%', '%25', '%25', '%2e', '%2E', '%2f', '%5c', '%32', '%65', '%45', '%66', '%35', '%63', '%3b', '%3B', '%3f', '%23',
  '%41', '%61', '%7e', '%7E', '%20', '%09', '%00', '%c0', '%ae', '%af', '%c3', '%a9', '%e2', '%80', '%a5', '%82', '%ac',
  '%ef', '%bc', '%8e', '%8f', '%ff', '%e2%88%95', '%c2%a5', '%c2', '%a5', '%88', '%95', '%2525', '%252e', '%25%32', '..;', '.%3b', '?', '?x=%2e%2e', '&',
];

function randomTarget(rand: () => number): string {
  let t = '/';
  const n = 1 + Math.floor(rand() * 14);
  for (let i = 0; i < n; i++) t += PIECES[Math.floor(rand() * PIECES.length)];
  return t;
}

/** One more round of percent-decoding, as an origin or framework that decodes twice would do. */
function decodeOnce(path: string): string {
  const bytes: number[] = [];
  for (let i = 0; i < path.length; i++) {
    if (path[i] === '%' && /^[0-9A-Fa-f]{2}$/.test(path.slice(i + 1, i + 3))) {
      bytes.push(parseInt(path.slice(i + 1, i + 3), 16));
      i += 2;
    } else bytes.push(path.charCodeAt(i));
  }
  // An origin reading through a narrow-character API: Windows' best fit makes these `/` or `\`.
  return Buffer.from(bytes).toString('utf8').replace(/[\u2044\u2215\u29f8]/g, '/').replace(/[\u2216\u29f9\u00a5\u20a9\uffe5\uffe6]/g, '\\');
}

/** What a lenient origin reads a segment as: `;` parameters dropped, trailing spaces trimmed, compatibility-mapped. */
const lenientSegment = (seg: string) => seg.normalize('NFKC').split(';')[0].replace(/[ \t]+$/, '');

function checkAccepted(target: string, n: NormalisedPath): void {
  // 1. A fixed point: the path that goes upstream normalises to itself.
  expect(normalisePath(n.path + n.query), target).toEqual(n);
  // 2. Decoded once more, it has the same segments, and none is a dot segment or a control.
  const once = decodeOnce(n.path);
  const segs = n.path.split('/');
  const onceSegs = once.split('/');
  expect(onceSegs.length, `${target} -> ${n.path} -> ${once}`).toBe(segs.length);
  expect(once, target).not.toMatch(/[\u0000-\u001f\u007f\\]/);
  // Nor a `?` or `#` that would end the path there: `/repos/a%3F/issues` read once more is `/repos/a`.
  expect(once, `${target} -> ${n.path} -> ${once}`).not.toMatch(/[?#]/);
  // A segment that is not empty must not read as empty either (a slash-merging origin would drop it).
  const dotOrGone = (s: string) => (s === '' ? ['.', '..'] : ['.', '..', '']);
  for (const s of onceSegs.slice(1)) expect(dotOrGone(s), `${target} -> ${n.path} -> ${once}`).not.toContain(lenientSegment(s));
  // 3. So does the path as sent, read leniently.
  for (const s of segs.slice(1)) expect(dotOrGone(s), `${target} -> ${n.path}`).not.toContain(lenientSegment(decodeOnce(s)));
}

describe('normalisePath is a fixed point', () => {
  it('for 20000 seeded random targets built from hostile pieces', () => {
    const rand = prng(18);
    let accepted = 0;
    for (let i = 0; i < 20_000; i++) {
      const target = randomTarget(rand);
      const n = normalisePath(target);
      if (isPathRefusal(n)) continue;
      accepted++;
      checkAccepted(target, n);
    }
    // The run exercises both outcomes.
    expect(accepted).toBeGreaterThan(2000);
  });

  it.each([
    // An escape spelled with encoded percent-encoding, in every case.
    '/a/%25%32%65%25%32%65/x',
    '/a/%25%32%45%25%32%45/x',
    '/a/%25%32%66x',
    '/a/%25%32%46x',
    '/a/%25%35%63x',
    '/a/%25%33%62x',
    '/a/%25%33%66x',
    '/a/%25%30%30x',
    '/a/%252e%252e/x',
    '/a/%252E%252E/x',
    '/a/%252fx',
    '/a/%253bx',
    '/a/%253fx',
    '/a/%2523x',
    '/a/%2500x',
    '/a/%2525x',
    '/a/%25252e%25252e/x',
    '/a/%25c0%25ae',
    // A `;` parameter, spelled encoded, after `.` or `..`.
    '/a/b/..%3b/x',
    '/a/b/..%3B/x',
    '/a/b/%2e%2e%3b/x',
    '/a/b/%2E%2e%3Bjsessionid=1/x',
    '/a/.%3b/x',
    '/a/b/..;/x',
    '/a/b/..;x=1/x',
    '/a/b/..%20/x',
    '/a/b/..%20%20/x',
    '/a/b/.%20/x',
    // Overlong and invalid UTF-8, and characters a compatibility mapping makes delimiters.
    '/a/%c0%ae%c0%ae/x',
    '/a/%c0%2e',
    '/a/..%c0%afx',
    '/a/%e0%80%ae',
    '/a/%ed%a0%80',
    '/a/%ff',
    '/a/%c3',
    '/a/%ef%bc%8e%ef%bc%8e/x',
    '/a/%ef%bc%8f',
    '/a/%e2%80%a5/x',
    '/a/%e2%80%a4',
    '/a/%ef%bc%9b',
    '/a/%c2%a0',
    // A segment that Tomcat-like or Windows origins read as empty (then merged away: /a/;/b is /a/b to Tomcat).
    '/a/;/b',
    '/a/;jsessionid=1/b',
    '/a/%3B/b',
    '/a/%3bx/b',
    '/a/%20/b',
    '/a/%20%20;x/b',
    // Best-fit mappings (Windows ANSI code pages) that make a slash or a backslash, which NFKC keeps.
    '/a/..%e2%88%95x',
    '/a/..%e2%81%84x',
    '/a/..%e2%88%96x',
    '/a/..%c2%a5x',
    '/a/..%e2%82%a9x',
    '/a/..%ef%bf%a5x',
    // An encoded `?` or `#`: one more decoding ends the path there (outside a rule such as /a/*/x).
    '/a/b%3F/x',
    '/a/b%3f',
    '/a/%23/x',
    '/a/b%23c',
  ])('refuses %s', (target) => {
    expect(normalisePath(target)).toHaveProperty('error');
  });

  it.each([
    ['/%2541', '/%2541'],
    ['/a/%25%34%31', '/a/%2541'],
    ['/100%25', '/100%25'],
    ['/100%25/x', '/100%25/x'],
    ['/a%25zz', '/a%25zz'],
    ['/a;p=1/b', '/a;p=1/b'],
    ['/a/b;/c', '/a/b;/c'],
    ['/a/b%20/c', '/a/b%20/c'],
    ['/a/.hidden/x', '/a/.hidden/x'],
    ['/a/...', '/a/...'],
    ['/a/..x', '/a/..x'],
    ['/caf%c3%a9/%e2%82%ac', '/caf%C3%A9/%E2%82%AC'],
    ['/%F0%9F%98%80', '/%F0%9F%98%80'],
    ['/a/%2e%2E/c', '/c'],
    ['/a/%7euser', '/a/~user'],
  ])('accepts %s as %s, a fixed point', (target, path) => {
    const n = normalisePath(target);
    expect(n).toEqual({ path, query: '' });
    checkAccepted(target, n as NormalisedPath);
  });
});

describe('the plan step sends a path that plans the same', () => {
  const config = compileConfig({
    no_proxy: [],
    rules: [
      { name: 'issues', match_hosts: ['api.test'], match_paths: ['/a/*/e', '/B/*'], headers: [{ name: 'X-Key', value: 'k1' }] },
      { name: 'dots', match_hosts: ['api.test'], match_paths: ['/a/*.f', '/a/2'], headers: [{ name: 'X-Key', value: 'k2' }] },
    ],
  });
  const t = { host: 'api.test', port: 443, authority: 'api.test:443' };
  const facts = (target: string) => ({ method: 'GET', target, version: 11, rawHeaders: ['Host', 'api.test'] });

  it('for 20000 seeded random targets: the path and query sent, planned again, are accepted unchanged with the same rule', () => {
    const rand = prng(1818);
    let matched = 0;
    for (let i = 0; i < 20_000; i++) {
      // Under a rule's prefix most of the time, and sometimes ending as a rule does.
      const target = ['/a', '/a/x', '/B', ''][i % 4] + randomTarget(rand) + ['', '/e', '.f', ''][(i >> 2) % 4];
      const p = planIntercepted(facts(target), t, config, DEFAULT_LIMITS);
      if (p instanceof ProxyError) continue;
      if (p.rule) matched++;
      const again = planIntercepted(facts(p.pathAndQuery), t, config, DEFAULT_LIMITS);
      expect(again, `${target} -> ${p.pathAndQuery}`).toEqual(p);
      // An origin that decodes once more reads a path of the same rule (or one that is refused).
      const once = decodeOnce(p.path);
      const reread = planIntercepted(facts(once + p.pathAndQuery.slice(p.path.length)), t, config, DEFAULT_LIMITS);
      if (!(reread instanceof ProxyError)) expect(reread.rule?.name, `${target} -> ${p.pathAndQuery} -> ${once}`).toBe(p.rule?.name);
    }
    expect(matched).toBeGreaterThan(500);
  });
});
