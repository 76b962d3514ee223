/**
 * Property tests of path normalisation, path patterns and rule order (proxy.md: "Path patterns",
 * "Which rule applies"), against a reference model written here from proxy.md's words.
 *
 * The model (RFC 3986 where proxy.md is silent):
 * - the path is what precedes the first `?`; the query goes upstream as it came;
 * - `%XX` of an unreserved character (ALPHA DIGIT - . _ ~) is decoded, any other escape is kept
 *   with its hex upper-cased (the same escape in any case is one path: `%3a` and `%3A`);
 * - `.` and `..` segments are resolved (RFC 3986 5.2.4); one at the end leaves the trailing slash;
 * - refused: an encoded `/` or `\`, a raw `\`, `..` above the root, a malformed escape, a raw
 *   control, space or non-ASCII character (clients encode them). The implementation refuses more
 *   (hardening against origins that decode twice or strip `;` parameters: see src/rules/path.ts);
 *   the model names those classes "may refuse" and the properties allow refusal only there;
 * - an empty segment (`//`) is a segment (RFC 3986): kept, not merged, unless merging it would
 *   change the rule (an origin such as nginx merges slashes): then the plan refuses it.
 * Patterns: a trailing `/*` matches one or more characters below the prefix; a `*` segment
 * matches one segment (not empty); a `*` inside a segment matches within it; otherwise exact.
 * Rules: the first whose paths match supplies the headers.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compileConfig, compilePathPattern, isPathRefusal, normalisePath, type NormalisedPath } from '../../src/rules/index.js';
import { planIntercepted } from '../../src/proxy/plan.js';
import { ProxyError } from '../../src/proxy/errors.js';
import { DEFAULT_LIMITS } from '../../src/proxy/limits.js';
import { propertyParams } from '../helpers/property.js';

// ---------------------------------------------------------------------------------------------
// Reference model
// ---------------------------------------------------------------------------------------------

const UNRESERVED = /^[A-Za-z0-9._~-]$/;

type ModelPath = { path: string; query: string } | { refused: 'must' | 'may' };

/** proxy.md path normalisation as the model reads it. */
export function modelNormalisePath(target: string): ModelPath {
  if (!target.startsWith('/')) return { refused: 'must' };
  const q = target.indexOf('?');
  const raw = q < 0 ? target : target.slice(0, q);
  const query = q < 0 ? '' : target.slice(q);
  if (/[\u0000-\u0020\u007f-\uffff\\#]/.test(raw)) return { refused: 'must' };
  let may = false;
  let decoded = '';
  for (let i = 0; i < raw.length; i++) {
    if (raw[i] !== '%') {
      decoded += raw[i];
      continue;
    }
    const hex = raw.slice(i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return { refused: 'must' };
    const ch = String.fromCharCode(parseInt(hex, 16));
    if (ch === '/' || ch === '\\') return { refused: 'must' };
    if (UNRESERVED.test(ch)) decoded += ch;
    else {
      decoded += `%${hex.toUpperCase()}`;
      // escapes an origin may decode once more, or that are not text: the implementation's hardening
      if (!/^[!$&'()*+,:=@\[\]]$/.test(ch)) may = true;
    }
    i += 2;
  }
  if (/[;]/.test(decoded) || /%3B/.test(decoded)) may = true;
  const out: string[] = [];
  const segs = decoded.slice(1).split('/');
  for (let i = 0; i < segs.length; i++) {
    const s = segs[i];
    if (s === '.' || s === '..') {
      if (s === '..') {
        if (out.length === 0) return { refused: 'must' };
        out.pop();
      }
      if (i === segs.length - 1) out.push('');
      continue;
    }
    out.push(s);
  }
  if (query && /[\u0000-\u0020\u007f-\uffff#]/.test(query)) return { refused: 'must' };
  return may ? { refused: 'may' } : { path: `/${out.join('/')}`, query };
}

/** A `match_paths` entry, normalised like a path with its `*` kept, and matched by proxy.md's words. */
export function modelPathMatch(pattern: string, path: string): boolean {
  const n = modelNormalisePath(pattern.replace(/\*/g, '%2A'));
  if ('refused' in n) throw new Error(`model: pattern ${pattern} refused`);
  const p = n.path.replace(/%2A/g, '*'); // the test patterns hold no encoded asterisk of their own
  if (!p.includes('*')) return p === path;
  if (p.endsWith('/*')) {
    const prefix = p.slice(0, -1); // ends in '/'
    const ps = prefix.split('/').slice(0, -1);
    const hs = path.split('/');
    if (hs.length <= ps.length) return false;
    if (!ps.every((x, i) => segMatch(x, hs[i]))) return false;
    const below = hs.slice(ps.length).join('/');
    return below.length > 0;
  }
  const ps = p.split('/');
  const hs = path.split('/');
  return ps.length === hs.length && ps.every((x, i) => segMatch(x, hs[i]));
}

function segMatch(pat: string, seg: string): boolean {
  if (pat === '*') return seg.length > 0;
  if (!pat.includes('*')) return pat === seg;
  const pieces = pat.split('*');
  const first = pieces[0];
  const last = pieces[pieces.length - 1];
  if (seg.length < first.length + last.length || !seg.startsWith(first) || !seg.endsWith(last)) return false;
  let at = first.length;
  for (const mid of pieces.slice(1, -1)) {
    const k = seg.indexOf(mid, at);
    if (k < 0) return false;
    at = k + mid.length;
  }
  return at <= seg.length - last.length;
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

const hexCase = (s: string, upper: boolean) => (upper ? s.toUpperCase() : s.toLowerCase());
const enc = (c: string, upper: boolean) => `%${hexCase(c.charCodeAt(0).toString(16).padStart(2, '0'), upper)}`;

/** Plain targets: unreserved text, sub-delimiters, dot segments, escapes of all of these. */
const plainPiece = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom('/', '/', '/', 'a', 'b', 'repos', 'x', 'A', '0', '-', '_', '~', '.', '..', '/./', '/../', '//') },
  { weight: 2, arbitrary: fc.constantFrom('!', '$', '&', "'", '(', ')', '*', '+', ',', '=', ':', '@') },
  { weight: 3, arbitrary: fc.tuple(fc.constantFrom(...'aZ09-._~!$&()*+,=:@'.split('')), fc.boolean()).map(([c, u]) => enc(c, u)) },
);
const plainTarget = fc
  .tuple(fc.array(plainPiece, { maxLength: 12 }), fc.constantFrom('', '', '?', '?a=1', '?x=%2e%2e/..', '?q=a%2Fb'))
  .map(([ps, q]) => `/${ps.join('')}${q}`);

/** Hostile targets: everything the implementation hardens against, next to what it must decode. */
const HOSTILE = [
  '/', '/', '.', '..', 'a', 'B', '%', '%25', '%2e', '%2E', '%2f', '%2F', '%5c', '%5C', '\\', '%3b', '%3B', ';', '%3f', '%23', '%00', '%0d%0a',
  '%20', ' ', '%41', '%7e', '%7E', '%c0%ae', '%c3%a9', '%e2%82%ac', '%ef%bc%8f', '%ff', '%2525', '%252e', '%25%32%65', '..;', '?', '#', 'é', '\u0000', '%zz', '%2',
];
const hostileTarget = fc
  .tuple(fc.array(fc.constantFrom(...HOSTILE), { minLength: 1, maxLength: 10 }), fc.boolean())
  .map(([ps, slash]) => `${slash ? '/' : ''}${ps.join('')}`);

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

const impl = (t: string) => normalisePath(t);

describe('path normalisation against the model', () => {
  it('plain targets: exactly the model (decoded, escapes upper-cased, dots resolved, query apart)', () => {
    fc.assert(
      fc.property(plainTarget, (t) => {
        const m = modelNormalisePath(t);
        const n = impl(t);
        if ('refused' in m) {
          if (m.refused === 'must') expect(isPathRefusal(n), t).toBe(true);
          return;
        }
        expect(n, t).toEqual(m);
      }),
      propertyParams(5000),
    );
  });

  it('hostile targets: what the model must refuse is refused; whatever is accepted is what the model gives', () => {
    fc.assert(
      fc.property(hostileTarget, (t) => {
        const m = modelNormalisePath(t);
        const n = impl(t);
        if ('refused' in m) {
          if (m.refused === 'must') expect(isPathRefusal(n), t).toBe(true);
          return;
        }
        if (!isPathRefusal(n)) expect(n, t).toEqual(m);
      }),
      propertyParams(5000),
    );
  });

  it('is idempotent: the path sent upstream normalises to itself', () => {
    fc.assert(
      fc.property(fc.oneof(plainTarget, hostileTarget), (t) => {
        const n = impl(t);
        if (isPathRefusal(n)) return;
        expect(impl(n.path + n.query), t).toEqual(n);
        // nothing a second decoding turns into a dot segment, a slash or a backslash
        expect(n.path, t).not.toMatch(/%2[eEfF]|%5[cC]|(^|\/)\.\.?(\/|$)/);
      }),
      propertyParams(5000),
    );
  });

  it('encoded reserved characters stay encoded (upper-cased), unreserved ones are decoded', () => {
    fc.assert(
      fc.property(fc.constantFrom(...'!$&\'()*+,=:@'.split('')), fc.constantFrom(...'aZ09-._~'.split('')), fc.boolean(), (reserved, unreserved, upper) => {
        const n = impl(`/p${enc(reserved, upper)}q/r${enc(unreserved, upper)}s`) as NormalisedPath;
        expect(n.path).toBe(`/p${enc(reserved, true)}q/r${unreserved}s`);
        expect(n.path.includes(`p${reserved}q`)).toBe(false);
      }),
      propertyParams(500),
    );
  });
});

describe('alternative spellings of one path', () => {
  const canonicalSeg = fc.stringMatching(/^[a-zA-Z0-9_~-][a-zA-Z0-9._~-]{0,5}$|^[a-z]+%3A[a-z]+$/).filter((s) => s !== '.' && s !== '..');
  const canonical = fc.array(canonicalSeg, { minLength: 1, maxLength: 4 }).map((segs) => `/${segs.join('/')}`);

  /** Another spelling of `path`: unreserved characters encoded, hex in either case, `/./`, `x/../`, encoded dots. */
  const respell = (path: string) =>
    fc.array(fc.integer({ min: 0, max: 9 }), { minLength: path.length * 2, maxLength: path.length * 2 }).map((coins) => {
      let out = '';
      const segs = path.slice(1).split('/');
      segs.forEach((seg, k) => {
        const c = coins[k % coins.length];
        if (c === 1) out += '/.';
        if (c === 2) out += `/zz/..`;
        if (c === 3) out += '/%2e';
        if (c === 4) out += '/q/%2E%2e';
        if (c === 5) out += '/x%2Ey/.%2E';
        out += '/';
        for (let i = 0; i < seg.length; i++) {
          const flip = coins[(k * 7 + i) % coins.length];
          if (seg[i] === '%') {
            out += flip % 2 ? seg.slice(i, i + 3).toLowerCase() : seg.slice(i, i + 3);
            i += 2;
          } else if (UNRESERVED.test(seg[i]) && flip > 5) out += enc(seg[i], flip === 8);
          else out += seg[i];
        }
      });
      return out;
    });

  it('every spelling normalises to the same path (or is refused), and picks the same rule', () => {
    const config = compileConfig({
      no_proxy: [],
      rules: [
        { name: 'exact', match_hosts: ['api.test'], match_paths: ['/a/b'], headers: [{ name: 'x-k', value: '1' }] },
        { name: 'seg', match_hosts: ['api.test'], match_paths: ['/a/*/c', '/x*/y'], headers: [{ name: 'x-k', value: '2' }] },
        { name: 'below', match_hosts: ['api.test'], match_paths: ['/a/*'], headers: [{ name: 'x-k', value: '3' }] },
        { name: 'all', match_hosts: ['api.test'], headers: [{ name: 'x-k', value: '4' }] },
      ],
    });
    fc.assert(
      fc.property(
        canonical.chain((p) => fc.tuple(fc.constant(p), respell(p))),
        ([p, alt]) => {
          const base = impl(p) as NormalisedPath;
          expect(base.path).toBe(p.replace(/%3a/g, '%3A'));
          const n = impl(alt);
          // these spellings use only what proxy.md says is decoded or resolved: never refused
          expect(isPathRefusal(n), `${alt} refused: ${JSON.stringify(n)}`).toBe(false);
          expect((n as NormalisedPath).path, alt).toBe(base.path);
          expect(config.pickRule('api.test', 443, (n as NormalisedPath).path)?.name).toBe(config.pickRule('api.test', 443, base.path)?.name);
        },
      ),
      propertyParams(3000),
    );
  });
});

describe('path patterns and rule order against the model', () => {
  const segs = ['repos', 'reposx', 'a', 'b', 'x', 'a.json', ''];
  const patSeg = fc.constantFrom('repos', 'a', 'b', 'x', '*', 'a*', '*x', '*.json', 'r*s', '.', '..', '%61', '%7E');
  const pattern = fc
    .tuple(fc.array(patSeg, { minLength: 1, maxLength: 3 }), fc.constantFrom('', '/*', '/', ''))
    .map(([ps, tail]) => `/${ps.join('/')}${tail}`)
    .filter((p) => !('refused' in modelNormalisePath(p.replace(/\*/g, '%2A'))));
  const path = fc.array(fc.constantFrom(...segs), { maxLength: 4 }).map((ps) => `/${ps.join('/')}`);

  it('a compiled pattern matches exactly what the model says', () => {
    fc.assert(
      fc.property(pattern, path, (p, h) => {
        let compiled;
        try {
          compiled = compilePathPattern(p);
        } catch {
          return; // e.g. '**' after normalisation: refused at validation, proxy.md gives it no meaning
        }
        expect(compiled.test(h), `${p} vs ${h}`).toBe(modelPathMatch(p, h));
      }),
      propertyParams(5000),
    );
  });

  it('the first rule whose hosts and paths match wins, on the path the plan sends upstream', () => {
    const rules = fc.array(fc.array(pattern, { maxLength: 2 }), { minLength: 1, maxLength: 4 });
    fc.assert(
      fc.property(rules, path, fc.constantFrom('', '?a=1', '?p=/repos/a'), fc.array(fc.constantFrom('/.', '/x/..', ''), { maxLength: 2 }), (rs, h, q, noise) => {
        const usable = rs.filter((ps) =>
          ps.every((p) => {
            try {
              compilePathPattern(p);
              return true;
            } catch {
              return false;
            }
          }),
        );
        if (usable.length === 0) return;
        const config = compileConfig({ no_proxy: [], rules: usable.map((ps, i) => ({ name: `r${i}`, match_hosts: ['api.test'], match_paths: ps, headers: [{ name: 'x-k', value: `v${i}` }] })) });
        const target = noise.join('') + h + q;
        const m = modelNormalisePath(target);
        const t = { host: 'api.test', port: 443, authority: 'api.test:443' };
        const plan = planIntercepted({ method: 'GET', target, version: 11, rawHeaders: ['Host', 'api.test'] }, t, config, DEFAULT_LIMITS);
        if ('refused' in m) {
          expect(plan, target).toBeInstanceOf(ProxyError);
          return;
        }
        const first = (p: string) => usable.findIndex((ps) => ps.length === 0 || ps.some((pat) => modelPathMatch(pat, p)));
        const i = first(m.path);
        // An empty segment that an origin merging slashes (nginx) reads under another rule: read two ways, refused.
        if (m.path.includes('//') && first(m.path.replace(/\/{2,}/g, '/')) !== i) {
          expect(plan, target).toBeInstanceOf(ProxyError);
          expect((plan as ProxyError).status).toBe(400);
          return;
        }
        if (plan instanceof ProxyError) throw new Error(`${target} refused: ${plan.message}`);
        // upstream gets exactly the matched (normalised) path, and the query as it came
        expect(plan.path).toBe(m.path);
        expect(plan.pathAndQuery).toBe(m.path + m.query);
        expect(plan.rule?.name, `${JSON.stringify(usable)} ${target}`).toBe(i < 0 ? undefined : `r${i}`);
      }),
      propertyParams(3000),
    );
  });
});
