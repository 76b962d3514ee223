/**
 * Property tests of proxy_config validation and resolution (proxy.md "Injection"; common.md:
 * secrets never in errors), against a reference model written here:
 * - a header name is an RFC 9110 token; a value is legal when it holds only HTAB, SP, visible
 *   ASCII and obs-text (0x80-0xFF), and neither begins nor ends with SP or HTAB (RFC 9110 5.5:
 *   leading and trailing whitespace is not part of a field value, so it could not be sent as
 *   written). Anything else (CR, LF, NUL, other controls, DEL, characters above U+00FF) makes
 *   the configuration invalid;
 * - `{KEY}` (a letter or `_`, then letters, digits and `_`) in a workspace_secret value is replaced by
 *   the secret's value and every other character is kept; a replacement is never expanded again;
 * - a referenced secret that does not exist makes the configuration invalid;
 * - no error text (issue messages, the thrown error's message, a config file error) holds a
 *   secret value, an opaque value (sealed or in clear) or a rejected header value.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { validateProxyConfig, type HeaderSpec, type ProxyConfig } from '../../src/config/schema.js';
import { resolveProxyConfig, templateValueProblem } from '../../src/config/resolve.js';
import { prepareProxyConfig } from '../../src/config/prepare.js';
import { ConfigFileError, loadProxyConfigFile } from '../../src/config/load.js';
import { Envelope } from '../../src/secrets/envelope.js';
import { ValidationFailure } from '../../src/validation/errors.js';
import { propertyParams } from '../helpers/property.js';

// ---------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------

const TCHAR = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const modelLegalName = (n: string) => TCHAR.test(n);
function modelLegalValue(v: string): boolean {
  for (const ch of v) {
    const c = ch.codePointAt(0)!;
    if (!(c === 0x09 || (c >= 0x20 && c <= 0x7e) || (c >= 0x80 && c <= 0xff))) return false;
  }
  return !/^[ \t]|[ \t]$/.test(v);
}
/** Template pieces: literal text or a reference. */
type Piece = { text: string } | { key: string };
const modelResolve = (pieces: Piece[], secrets: Map<string, string>) => pieces.map((p) => ('text' in p ? p.text : secrets.get(p.key)!)).join('');
const templateOf = (pieces: Piece[]) => pieces.map((p) => ('text' in p ? p.text : `{${p.key}}`)).join('');

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

const BAD = ['\r', '\n', '\r\n', '\u0000', '\u0001', '\u000b', '\u001f', '\u007f', '\u0100', '\u2028', '€', '😀', ' ', '\t'];
const fieldChar = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom(...'abcXYZ019-_.~!#$%&*+^`|/=:;,"\'()<>?@[]\\ \t'.split('')) },
  { weight: 1, arbitrary: fc.constantFrom('\u0080', 'é', 'ÿ', '\u00a0') },
  { weight: 1, arbitrary: fc.constantFrom(...BAD) },
);
const fieldValue = fc.array(fieldChar, { maxLength: 12 }).map((a) => a.join(''));
const headerName = fc.oneof(
  { weight: 4, arbitrary: fc.stringMatching(/^[A-Za-z][A-Za-z0-9-]{0,10}$/) },
  { weight: 2, arbitrary: fc.array(fc.constantFrom(...'aZ09-_!#$%&*+.^`|~'.split(''), ...BAD, ':', '(', '"', '/', '@', ' ', 'é'), { minLength: 1, maxLength: 6 }).map((a) => a.join('')) },
);
const key = fc.stringMatching(/^[A-Z_][A-Z0-9_]{0,8}$/);
/** Literal text of a template: legal, no braces (a stray brace is a typo the validation refuses). */
const literal = fc.array(fc.constantFrom(...'abc XY09-_.:/=$&\'`'.split(''), '$&', "$'", '$`', '$1'), { maxLength: 5 }).map((a) => a.join(''));
/** A secret value: a distinctive marker (asserted absent from errors), and sometimes text that looks like a template. */
const secretValue = fc
  .tuple(fc.stringMatching(/^[a-z0-9]{10}$/), fc.array(fc.constantFrom('{A}', '{OTHER}', '{', '}', '$&', '$1', "$'", ' ', '%s', ''), { maxLength: 3 }))
  .map(([m, extra]) => `S3CR3T${m}${extra.join('')}Z`);

const rule = (headers: HeaderSpec[]): ProxyConfig => ({ rules: [{ name: 'r', match_hosts: ['api.example.com'], headers }] });

/** Every text an error could show a user or a log. */
function errorTexts(f: () => unknown): string[] {
  try {
    f();
    return [];
  } catch (err) {
    const out = [String((err as Error).message), String(err)];
    if (err instanceof ValidationFailure || err instanceof ConfigFileError) out.push(JSON.stringify((err as ValidationFailure).issues));
    return out;
  }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

describe('header names and values: legal fields only', () => {
  it('a plaintext or opaque header is valid exactly when its name and value are legal fields', () => {
    fc.assert(
      fc.property(headerName, fieldValue, fc.constantFrom('plaintext', 'opaque') as fc.Arbitrary<'plaintext' | 'opaque'>, (name, value, type) => {
        fc.pre(!['host', 'content-length', 'transfer-encoding', 'connection', 'te', 'trailer', 'upgrade', 'expect', 'keep-alive'].includes(name.toLowerCase()));
        fc.pre(!(type === 'opaque' && value.startsWith('kg1.')));
        const issues = validateProxyConfig(rule([{ name, type, value }]));
        const at = (f: string) => issues.some((i) => JSON.stringify(i.loc) === JSON.stringify(['rules', 0, 'headers', 0, f]));
        expect(at('name'), JSON.stringify(name)).toBe(!modelLegalName(name));
        // (a name the schema refuses stops validation there: the value is judged once the name is legal)
        if (modelLegalName(name)) expect(at('value'), JSON.stringify(value)).toBe(!modelLegalValue(value));
        expect(issues.length === 0).toBe(modelLegalName(name) && modelLegalValue(value));
        // a rejected value is never quoted back
        if (value.length >= 3 && !modelLegalValue(value)) expect(JSON.stringify(issues)).not.toContain(JSON.stringify(value).slice(1, -1));
      }),
      propertyParams(4000),
    );
  });

  it('a workspace_secret value whose secret holds an illegal byte makes the configuration invalid at resolution', () => {
    fc.assert(
      fc.property(literal, fieldValue, literal, (before, secret, after) => {
        const tmpl = `X${before}{K}${after}Y`;
        const cfg = rule([{ name: 'Authorization', type: 'workspace_secret', value: tmpl }]);
        expect(validateProxyConfig(cfg)).toEqual([]);
        const resolved = `X${before}${secret}${after}Y`;
        const run = () => resolveProxyConfig(cfg, (k) => (k === 'K' ? secret : undefined));
        if (modelLegalValue(resolved)) {
          expect(run().rules[0].headers[0].value).toBe(resolved);
          expect(templateValueProblem(tmpl, (k) => (k === 'K' ? secret : undefined))).toBeNull();
        } else {
          expect(run).toThrow(ValidationFailure);
          const problem = templateValueProblem(tmpl, (k) => (k === 'K' ? secret : undefined));
          expect(problem).toMatch(/'K'/);
          if (secret.length >= 3) for (const t of [...errorTexts(run), problem!]) expect(t).not.toContain(secret);
        }
      }),
      propertyParams(3000),
    );
  });
});

describe('{KEY} templates', () => {
  const piece: fc.Arbitrary<Piece> = fc.oneof(literal.map((text) => ({ text })), key.map((k) => ({ key: k })));
  const template = fc.array(piece, { minLength: 1, maxLength: 6 }).filter((ps) => ps.some((p) => 'key' in p));

  it('resolution replaces every {KEY}, keeps all other text, and never expands a secret value again', () => {
    fc.assert(
      fc.property(template, fc.dictionary(key, secretValue, { maxKeys: 4 }), fc.constantFrom('', 'Bearer ', 'token='), (pieces0, extra, prefix) => {
        const pieces: Piece[] = [{ text: `${prefix}p` }, ...pieces0, { text: 'q' }];
        const secrets = new Map<string, string>(Object.entries(extra));
        for (const p of pieces) if ('key' in p && !secrets.has(p.key)) secrets.set(p.key, `S3CR3T${p.key.toLowerCase()}v{${p.key}}{OTHER}$&`);
        secrets.set('OTHER', 'S3CR3Tother-must-not-appear');
        const cfg = rule([{ name: 'X-K', type: 'workspace_secret', value: templateOf(pieces) }]);
        expect(validateProxyConfig(cfg), templateOf(pieces)).toEqual([]);
        const r = resolveProxyConfig(cfg, (k) => secrets.get(k));
        const want = modelResolve(pieces, secrets);
        expect(r.rules[0].headers[0].value).toBe(want);
        if (!pieces.some((p) => 'key' in p && p.key === 'OTHER')) expect(r.rules[0].headers[0].value).not.toContain('must-not-appear');
        // the template itself is untouched (the configuration as stored keeps its references)
        expect(cfg.rules![0].headers![0].value).toBe(templateOf(pieces));
      }),
      propertyParams(3000),
    );
  });

  it('every missing key is reported by name, the configuration is invalid, and no secret value is in any error', () => {
    fc.assert(
      fc.property(template, fc.dictionary(key, secretValue, { minKeys: 1, maxKeys: 4 }), fc.integer({ min: 0, max: 5 }), (pieces, present, dropAt) => {
        const refs = [...new Set(pieces.flatMap((p) => ('key' in p ? [p.key] : [])))];
        const secrets = new Map<string, string>(Object.entries(present));
        for (const k of refs) if (!secrets.has(k)) secrets.set(k, `S3CR3T${k}filled`);
        const missing = refs[dropAt % refs.length];
        secrets.delete(missing);
        const cfg: ProxyConfig = {
          rules: [
            { name: 'r', match_hosts: ['api.example.com'], headers: [{ name: 'X-K', type: 'workspace_secret', value: templateOf(pieces) }] },
            // another rule resolving fine: its value must not leak into the error either
            { name: 's', match_hosts: ['*.example.com'], headers: [{ name: 'X-Ok', type: 'workspace_secret', value: `{${[...secrets.keys()][0] ?? 'NONE'}}` }] },
          ],
        };
        if (secrets.size === 0) cfg.rules!.pop();
        const run = () => resolveProxyConfig(cfg, (k) => secrets.get(k));
        expect(run).toThrow(ValidationFailure);
        let issues: ValidationFailure['issues'] = [];
        try {
          run();
        } catch (err) {
          issues = (err as ValidationFailure).issues;
        }
        expect(issues.some((i) => i.type === 'missing_secret' && i.msg.includes(`'${missing}'`))).toBe(true);
        const texts = [...errorTexts(run), ...errorTexts(() => prepareProxyConfig(cfg, (k) => secrets.get(k)))];
        expect(texts.length).toBeGreaterThan(0);
        for (const v of secrets.values()) for (const t of texts) expect(t).not.toContain(v.slice(0, 16));
      }),
      propertyParams(1000),
    );
  });
});

describe('no secret or opaque value in any error', () => {
  const env = new Envelope(Buffer.alloc(32, 7));
  const other = new Envelope(Buffer.alloc(32, 8));
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-config-prop-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  let n = 0;

  /** A way a configuration can fail, given a secret value it holds or references. */
  const failure = fc.constantFrom('missing-other', 'illegal-secret', 'edge-space', 'opaque-illegal', 'opaque-sealed-nokey', 'opaque-sealed-wrongkey', 'opaque-sealed-illegal', 'bad-host', 'bad-path', 'plaintext-illegal');

  it('whatever makes a configuration invalid, its errors hold neither the secrets nor the opaque values', () => {
    fc.assert(
      fc.property(secretValue, failure, fc.constantFrom('\r\n', '\n', '\u0000', '\u007f', 'Ā'), (secret, how, bad) => {
        const secrets = new Map([['TOKEN', secret]]);
        const sealedGood = env.seal(secret);
        const headers: HeaderSpec[] = [
          { name: 'Authorization', type: 'workspace_secret', value: 'Bearer {TOKEN}' },
          { name: 'X-Opaque', type: 'opaque', value: sealedGood },
        ];
        const cfg: ProxyConfig = { rules: [{ name: 'r', match_hosts: ['api.example.com'], headers }] };
        const leaks = [secret, sealedGood, sealedGood.slice(-24)];
        switch (how) {
          case 'missing-other':
            headers.push({ name: 'X-Two', type: 'workspace_secret', value: '{TOKEN}:{ABSENT}' });
            break;
          case 'illegal-secret':
            secrets.set('TOKEN', `${secret}${bad}x`);
            leaks.push(`${secret}${bad}x`);
            break;
          case 'edge-space':
            headers[0].value = '{TOKEN}';
            secrets.set('TOKEN', `${secret}\n`);
            break;
          case 'opaque-illegal':
            headers[1].value = `${secret}${bad}`;
            break;
          case 'opaque-sealed-nokey':
            break;
          case 'opaque-sealed-wrongkey':
            break;
          case 'opaque-sealed-illegal':
            headers[1].value = env.seal(`${secret}${bad}`);
            leaks.push(headers[1].value);
            break;
          case 'bad-host':
            cfg.rules![0].match_hosts.push('bad host');
            break;
          case 'bad-path':
            cfg.rules![0].match_paths = ['/a%2Fb'];
            break;
          case 'plaintext-illegal':
            headers.push({ name: 'X-Plain', type: 'plaintext', value: `${secret}${bad}` });
            break;
        }
        const opts = how === 'opaque-sealed-nokey' ? {} : how === 'opaque-sealed-wrongkey' ? { openOpaque: (s: string) => other.open(s) } : { openOpaque: (s: string) => env.open(s) };
        const lookup = (k: string) => secrets.get(k);
        const file = path.join(dir, `c${n++}.json`);
        writeFileSync(file, JSON.stringify(cfg));
        const texts = [
          JSON.stringify(validateProxyConfig(cfg)),
          ...errorTexts(() => prepareProxyConfig(cfg, lookup, opts)),
          ...errorTexts(() => loadProxyConfigFile(file, lookup, opts)),
          String(templateValueProblem(headers[0].value, lookup)),
        ];
        // the configuration is indeed refused somewhere
        expect(texts.slice(1).join('').length, how).toBeGreaterThan(0);
        for (const t of texts) for (const v of leaks) expect(t, how).not.toContain(v);
      }),
      propertyParams(800),
    );
  });
});
