/**
 * Property tests of host normalisation, host patterns and the decision (proxy.md: "Host
 * normalisation", "Decision for a target host", "Host patterns", "Which rule applies"), against a
 * small reference model written here from proxy.md's words, not from src/rules.
 *
 * The model's own choices, where proxy.md is silent:
 * - IPv4 literals are read as the WHATWG URL standard reads them (decimal, `0x` hex, `0` octal,
 *   1 to 4 parts, the last filling the remaining bytes: `127.1`, `0x7f.1`, `2130706433`), since
 *   that is how clients built on URL parsers address them; every spelling is the same address and
 *   is written in dotted decimal.
 * - An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is that IPv4 address ("an IP literal matches
 *   only the same address": else `[::ffff:10.0.0.5]` escapes a no_proxy or rule of `10.0.0.5`).
 * - Exactly one trailing dot is removed (on the text as given); what is left must parse, so a
 *   second trailing dot is refused, for names and addresses alike.
 * - Case of non-ASCII letters is folded by the IDNA mapping (UTS 46), not by toLowerCase: the two
 *   may differ (`ẞ` is `ss` to Node 20's UTS 46, `ß` to toLowerCase), and a name must have one form.
 * - The IDNA mapping is node:url's domainToASCII (the oracle for internationalised names); labels
 *   are letters, digits, `-` (not at either end) and `_`, 1 to 63 of them, 253 in all.
 * - A percent sign, and any other ASCII character outside those, makes a host refused: the proxy
 *   never reads an escape in a host name.
 */
import { domainToASCII, domainToUnicode } from 'node:url';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compileConfig, compileHostPattern, normaliseHost, RuleInputError, type ResolvedProxyConfig } from '../../src/rules/index.js';
import { propertyParams } from '../helpers/property.js';

// ---------------------------------------------------------------------------------------------
// Reference model
// ---------------------------------------------------------------------------------------------

/** WHATWG "IPv4 number": decimal, 0x hex, leading-0 octal; undefined when not a number. */
function ipv4Number(part: string): number | undefined {
  let s = part;
  let radix = 10;
  if (/^0[xX]/.test(s)) {
    s = s.slice(2);
    radix = 16;
  } else if (s.length >= 2 && s.startsWith('0')) {
    s = s.slice(1);
    radix = 8;
  }
  if (s === '') return 0;
  const digits = radix === 16 ? /^[0-9a-fA-F]+$/ : radix === 8 ? /^[0-7]+$/ : /^[0-9]+$/;
  if (!digits.test(s)) return undefined;
  // BigInt: huge spellings must not round into range.
  const v = BigInt(radix === 16 ? `0x${s}` : radix === 8 ? `0o${s}` : s);
  return v > 0xffffffffn ? Infinity : Number(v);
}

/** Whether an ASCII host (no trailing dot) is meant as an IPv4 address: its last label is a number. */
function endsInNumber(host: string): boolean {
  const last = host.slice(host.lastIndexOf('.') + 1);
  if (last === '') return false;
  return /^[0-9]+$/.test(last) || ipv4Number(last) !== undefined;
}

/** Dotted decimal of an IPv4 spelling, or undefined when it is not one. */
function modelIPv4(host: string): string | undefined {
  const parts = host.split('.');
  if (parts.length > 4 || parts.some((p) => p === '')) return undefined;
  const nums = parts.map(ipv4Number);
  if (nums.some((n) => n === undefined)) return undefined;
  const ns = nums as number[];
  for (let i = 0; i < ns.length - 1; i++) if (ns[i] > 255) return undefined;
  const last = ns[ns.length - 1];
  if (last >= 256 ** (5 - ns.length)) return undefined;
  let v = last;
  for (let i = 0; i < ns.length - 1; i++) v += ns[i] * 256 ** (3 - i);
  return [v >>> 24, (v >>> 16) & 255, (v >>> 8) & 255, v & 255].join('.');
}

/** Eight 16-bit groups of an IPv6 literal (no brackets), or undefined. */
function ipv6Groups(s: string): number[] | undefined {
  if (s.includes('%')) return undefined; // zone ids name a local interface, never a destination
  let tail: number[] = [];
  let text = s;
  const v4 = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (v4) {
    const bytes = v4[2].split('.');
    if (bytes.some((b) => !/^(0|[1-9][0-9]{0,2})$/.test(b) || Number(b) > 255)) return undefined;
    const [a, b, c, d] = bytes.map(Number);
    tail = [(a << 8) | b, (c << 8) | d];
    text = v4[1].endsWith('::') ? v4[1] : v4[1].slice(0, -1);
  }
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const parse = (h: string) => (h === '' ? [] : h.split(':'));
  const head = parse(halves[0]);
  const rest = halves.length === 2 ? parse(halves[1]) : [];
  const all = [...head, ...rest];
  if (all.some((g) => !/^[0-9a-fA-F]{1,4}$/.test(g))) return undefined;
  const given = all.length + tail.length;
  if (halves.length === 1 && given !== 8) return undefined;
  if (halves.length === 2 && given > 7) return undefined;
  const zeros = Array<number>(8 - given).fill(0);
  return [...head.map((g) => parseInt(g, 16)), ...(halves.length === 2 ? zeros : []), ...rest.map((g) => parseInt(g, 16)), ...tail];
}

/** RFC 5952 text of eight groups; an IPv4-mapped address as its IPv4 address. */
function ipv6Text(g: number[]): string {
  if (g.slice(0, 5).every((x) => x === 0) && g[5] === 0xffff) return [g[6] >> 8, g[6] & 255, g[7] >> 8, g[7] & 255].join('.');
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (g[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && g[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = g.map((x) => x.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}

const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** proxy.md "Host normalisation", as the model reads it. undefined: refused (400). */
export function modelNormaliseHost(raw: string): string | undefined {
  if (raw.length === 0) return undefined;
  if (raw.startsWith('[')) {
    if (!raw.endsWith(']')) return undefined;
    const g = ipv6Groups(raw.slice(1, -1));
    return g && ipv6Text(g);
  }
  if (raw.includes(':')) {
    const g = ipv6Groups(raw);
    return g && ipv6Text(g);
  }
  let name = raw.endsWith('.') ? raw.slice(0, -1) : raw;
  if (name === '' || name.endsWith('.')) return undefined;
  // ASCII outside letters, digits, '.', '-', '_' never belongs in a host (no escapes, no userinfo, no port).
  if (/[\x00-\x2c/\x3a-\x40\x5b-\x5e\x60\x7b-\x7f]/.test(name)) return undefined;
  // ASCII letters lower-cased here; the rest is the IDNA mapping's (UTS 46 folds case itself, and
  // differently from toLowerCase: capital sharp s `ẞ` is `ss` to Node 20's, `ß` to toLowerCase).
  name = name.replace(/[A-Z]/g, (c) => c.toLowerCase());
  // IDNA: node:url's domainToASCII is the oracle; it also reads IPv4 forms, so ask it only for the mapping.
  let ascii = /^[\x00-\x7f]*$/.test(name) ? name : domainToASCII(`${name}.x-model`).replace(/\.x-model$/, '');
  if (ascii === '' || /[^\x00-\x7f]/.test(ascii)) return undefined;
  ascii = ascii.toLowerCase();
  if (ascii.endsWith('.')) return undefined;
  if (endsInNumber(ascii)) return modelIPv4(ascii);
  if (ascii.length > 253) return undefined;
  const labels = ascii.split('.');
  if (!labels.every((l) => LABEL.test(l))) return undefined;
  // A punycode label must decode (domainToASCII refuses one that does not).
  if (labels.some((l) => l.startsWith('xn--')) && domainToASCII(ascii) === '') return undefined;
  return ascii;
}

/**
 * A host as it arrives in an HTTP/1.1 field: Node gives the bytes as latin1 characters, so a client
 * sending a name in UTF-8 (as curl does with an IDN in CONNECT) shows as `bÃ¼cher`. Bytes that are
 * valid UTF-8 are read as UTF-8; anything else is latin1 text. A name written in the configuration
 * is text already and never read this way.
 */
export function modelWire(raw: string): string {
  if (!/[\x80-\xff]/.test(raw) || /[^\x00-\xff]/.test(raw)) return raw;
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(Buffer.from(raw, 'latin1'));
  } catch {
    return raw;
  }
}

/** A target host as the proxy receives it (CONNECT, Host, absolute URI). */
export const modelTargetHost = (raw: string) => modelNormaliseHost(modelWire(raw));

const isIp = (h: string) => h.includes(':') || /^[0-9.]+$/.test(h);

/** proxy.md "Host patterns": does `pattern` (as written in a config) match the target `raw:port`? */
export function modelHostMatch(pattern: string, rawHost: string, port: number): boolean {
  const host = modelTargetHost(rawHost);
  if (host === undefined) throw new Error('model: host is refused before any matching');
  let hostPart = pattern;
  let pPort: number | undefined;
  const m = /^(.*):([0-9]{1,5})$/.exec(pattern);
  if (m && (m[1].startsWith('[') ? m[1].endsWith(']') : !m[1].includes(':'))) {
    hostPart = m[1];
    pPort = Number(m[2]);
  }
  if (pPort !== undefined && pPort !== port) return false;
  if (hostPart === '*') return true;
  if (!hostPart.includes('*')) return modelNormaliseHost(hostPart) === host;
  if (isIp(host)) return false; // a wildcard names host names, never addresses
  let p = hostPart;
  if (p.endsWith('.')) p = p.slice(0, -1);
  const pl = p.split('.');
  const hl = host.split('.');
  const label = (pat: string, l: string) => {
    if (!pat.includes('*')) return (modelNormaliseHost(`${pat}.x-model`) ?? '\0').replace(/\.x-model$/, '') === l;
    const pieces = pat.replace(/[A-Z]/g, (c) => c.toLowerCase()).split('*');
    // within one label: prefix, suffix, and the middle pieces in order
    if (!l.startsWith(pieces[0]) || !l.endsWith(pieces[pieces.length - 1])) return false;
    if (pieces[0].length + pieces[pieces.length - 1].length > l.length) return false;
    let at = pieces[0].length;
    for (const mid of pieces.slice(1, -1)) {
      const k = l.indexOf(mid, at);
      if (k < 0) return false;
      at = k + mid.length;
    }
    return at <= l.length - pieces[pieces.length - 1].length;
  };
  if (pl[0] === '*' && pl.length > 1) {
    // any name below the rest, at any depth, never the rest itself
    const rest = pl.slice(1);
    if (hl.length <= rest.length) return false;
    const tail = hl.slice(hl.length - rest.length);
    return rest.every((x, i) => label(x, tail[i]));
  }
  return pl.length === hl.length && pl.every((x, i) => label(x, hl[i]));
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

const implNorm = (raw: string): string | undefined => {
  try {
    return normaliseHost(raw);
  } catch (err) {
    expect(err).toBeInstanceOf(RuleInputError);
    return undefined;
  }
};

const ALNUM = 'abcdefghijklmnopqrstuvwxyz0123456789';
/** Characters a hostile host is built from: case, IDN, mappings, invisible ones, delimiters. */
const ODD = ['A', 'Z', 'ü', 'Ü', 'ß', 'ẞ', 'é', 'İ', 'ı', 'Σ', 'ς', 'K', 'ｅ', 'Ａ', '１', '。', '．', '\u00ad', '\u200d', '\u200b', 'ﬁ', '💩', '-', '_', '%', '%2e', '@', '/', '\\', ':', ' ', '\t', '\u0000', '#', '?', '*', '!', '$', '~', '\u0130', 'xn--', '\u0301', '\uff0f', '\u2024'];

const label = fc.oneof(
  { weight: 6, arbitrary: fc.stringMatching(/^[a-z0-9][a-z0-9-]{0,8}[a-z0-9]$|^[a-z0-9]$/) },
  { weight: 2, arbitrary: fc.constantFrom('example', 'com', 'api', 'bücher', 'xn--bcher-kva', 'evil', 'net', 'a', 'b', 'bad', 'github', 'de', 'xn--zca', 'ß', 'ｅxample', 'EXAMPLE', 'x'.repeat(63), 'x'.repeat(64)) },
  {
    weight: 2,
    arbitrary: fc
      .array(fc.oneof(fc.constantFrom(...ALNUM.split('')), fc.constantFrom(...ODD)), { minLength: 1, maxLength: 6 })
      .map((a) => a.join('')),
  },
);
const name = fc.array(label, { minLength: 1, maxLength: 4 }).map((ls) => ls.join('.'));

/** A 32-bit address spelled in one of the WHATWG forms (parts, radix, case), sometimes out of range. */
const ipv4Spelling = fc
  .tuple(fc.nat({ max: 0xffffffff }), fc.integer({ min: 1, max: 4 }), fc.array(fc.constantFrom('dec', 'hex', 'HEX', 'oct', 'zeros'), { minLength: 4, maxLength: 4 }), fc.integer({ min: 0, max: 9 }))
  .map(([v, n, forms, mutate]) => {
    const parts: number[] = [];
    for (let i = 0; i < n - 1; i++) parts.push((v >>> (24 - 8 * i)) & 255);
    parts.push(n === 1 ? v : v % 256 ** (5 - n));
    const spell = (x: number, f: string) =>
      f === 'hex' ? `0x${x.toString(16)}` : f === 'HEX' ? `0X${x.toString(16).toUpperCase()}` : f === 'oct' ? `0${x.toString(8)}` : f === 'zeros' ? `00${x.toString(8)}` : String(x);
    let s = parts.map((x, i) => spell(x, forms[i])).join('.');
    if (mutate === 0) s += '.';
    if (mutate === 1) s += '..';
    if (mutate === 2) s = s.replace(/\d$/, '9'); // may leave octal or range
    if (mutate === 3) s += '.1';
    if (mutate === 4) s = `0x${s}`;
    return s;
  });

const ipv6Spelling = fc
  .tuple(
    fc.array(fc.oneof({ weight: 3, arbitrary: fc.constant(0) }, { weight: 2, arbitrary: fc.nat({ max: 0xffff }) }), { minLength: 8, maxLength: 8 }),
    fc.integer({ min: 0, max: 9 }),
    fc.boolean(),
    fc.boolean(),
    fc.integer({ min: 0, max: 12 }),
  )
  .map(([groups, form, brackets, upper, mutate]) => {
    const g = [...groups];
    if (form === 1) g.splice(0, 6, 0, 0, 0, 0, 0, 0xffff); // IPv4-mapped
    if (form === 2) g.splice(0, 6, 0x64, 0xff9b, 0, 0, 0, 0); // NAT64: another address
    let s: string;
    if (form === 3 || form === 1) {
      s = `${g.slice(0, 6).map((x) => x.toString(16)).join(':')}:${g[6] >> 8}.${g[6] & 255}.${g[7] >> 8}.${g[7] & 255}`;
    } else if (form === 4) {
      s = g.map((x) => x.toString(16).padStart(4, '0')).join(':');
    } else {
      // compress a random (not necessarily the longest) run of zeros
      const zi = g.indexOf(0);
      let zj = zi;
      while (zj >= 0 && zj < 8 && g[zj] === 0) zj++;
      s = zi < 0 || form === 5 ? g.map((x) => x.toString(16)).join(':') : `${g.slice(0, zi).map((x) => x.toString(16)).join(':')}::${g.slice(zj).map((x) => x.toString(16)).join(':')}`;
    }
    if (upper) s = s.toUpperCase();
    if (mutate === 0) s += '%eth0';
    if (mutate === 1) s += ':1';
    if (mutate === 2) s = s.replace('::', ':::');
    if (mutate === 3) s = `${s}::1`;
    if (mutate === 4) s = s.replace(/[0-9a-f]$/i, 'g');
    if (mutate === 5) s = `${s}.`;
    return brackets ? `[${s}]` : s;
  });

const trailing = fc.constantFrom('', '', '', '.', '..');
const anyHost = fc.oneof(
  { weight: 5, arbitrary: fc.tuple(name, trailing).map(([n, t]) => n + t) },
  { weight: 2, arbitrary: ipv4Spelling },
  { weight: 2, arbitrary: ipv6Spelling },
  { weight: 1, arbitrary: fc.string({ maxLength: 12 }) },
);

/** Spellings of one host a client could send: case, one trailing dot, unicode or punycode, mapped forms. */
function respellings(host: string): string[] {
  const out = [host, host.toUpperCase(), `${host}.`, host.replace(/^./, (c) => c.toUpperCase())];
  if (host.includes('xn--') && domainToASCII(host) !== '') {
    out.push(domainToUnicode(host)); // the unicode form of the same name
  }
  if (/[a-z]/.test(host) && !host.includes(':')) out.push(host.replace(/[a-z]/g, (c) => String.fromCharCode(c.charCodeAt(0) - 0x61 + 0xff41))); // full-width letters
  if (host.includes(':')) out.push(`[${host}]`);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

describe('host normalisation against the model', () => {
  it('agrees with the model on every generated host (names, IPv4 and IPv6 spellings, garbage)', () => {
    fc.assert(
      fc.property(anyHost, (raw) => {
        expect(implNorm(raw), JSON.stringify(raw)).toBe(modelTargetHost(raw));
      }),
      propertyParams(4000),
    );
  });

  it('every IPv4 spelling of an address normalises to the same dotted address', () => {
    fc.assert(
      fc.property(fc.nat({ max: 0xffffffff }), ipv4Spelling, (_v, spelling) => {
        const model = modelNormaliseHost(spelling);
        expect(implNorm(spelling), spelling).toBe(model);
      }),
      propertyParams(2000),
    );
  });

  it('is idempotent, and its output is a fixed point of the model too', () => {
    fc.assert(
      fc.property(anyHost, (raw) => {
        const once = implNorm(raw);
        if (once === undefined) return;
        expect(implNorm(once), JSON.stringify(raw)).toBe(once);
        expect(modelTargetHost(once)).toBe(once);
        // what the proxy compares is ASCII, lower-case, without brackets or a trailing dot
        expect(once).toMatch(/^[a-z0-9._:-]+$/);
        expect(once.endsWith('.')).toBe(false);
      }),
      propertyParams(3000),
    );
  });

  it('a host sent as UTF-8 bytes read as latin1 (an HTTP/1.1 field) is the same name', () => {
    fc.assert(
      fc.property(name, (n) => {
        const wire = Buffer.from(n, 'utf8').toString('latin1');
        // the name the client meant, read as text (not its own latin1 reading, which may differ)
        expect(implNorm(wire), JSON.stringify(n)).toBe(modelNormaliseHost(n));
      }),
      propertyParams(2000),
    );
  });
});

describe('regressions found by the properties', () => {
  it('refuses a host with two trailing dots, an IPv4 address as well as a name (only one is removed)', () => {
    for (const raw of ['1.2.3.4..', '0..', '127.1..', '0x7f.1..', 'example.com..']) expect(() => normaliseHost(raw), raw).toThrow(RuleInputError);
    expect(() => compileHostPattern('10.0.0.5..')).toThrow();
    expect(normaliseHost('1.2.3.4.')).toBe('1.2.3.4');
  });
});

describe('regressions found by the properties (IDNA case folding)', () => {
  it('a wildcard pattern folds the case of a non-ASCII label as host names do (UTS 46 on Node 20: ẞ is ss)', () => {
    // The exact pattern and the host both read `STRAẞE.de` as strasse.de; the wildcard's fixed
    // labels must too, else a no_proxy of `*.STRAẞE.de` leaves a.STRAẞE.de to a rule of `*`.
    // Node 20's URL parser (UTS 46 before Unicode 15.1) maps ẞ to ss; Node 24's maps it to ß, as
    // toLowerCase does. Whatever the mapping, a wildcard's fixed label must read as host names do.
    expect(normaliseHost('a.STRAẞE.de')).toBe(`a.${normaliseHost('STRAẞE.de')}`);
    expect(compileHostPattern('*.STRAẞE.de').test(normaliseHost('a.STRAẞE.de'), 443)).toBe(true);
    expect(compileHostPattern('a.*.ẞ.example').test(normaliseHost('a.b.ẞ.example'), 443)).toBe(true);
    expect(compileHostPattern('*.STRAẞE.de').test(normaliseHost('a.STRAẞE.de.evil'), 443)).toBe(false);
    const c = compileConfig({ no_proxy: ['*.STRAẞE.de'], rules: [{ name: 'all', match_hosts: ['*'], headers: [{ name: 'x-k', value: 'v' }] }] });
    expect(c.decide(normaliseHost('api.straße.de'.replace('ß', 'ẞ')), 443)).toBe('bypass');
    expect(c.pickRule(normaliseHost('api.STRAẞE.de'), 443, '/')).toBeUndefined();
  });
});

describe('regressions found by the properties (configuration text is not wire bytes)', () => {
  it('a host name in the configuration is read as the text it is, never as latin1 bytes of UTF-8', () => {
    // 'Ü' U+00DC and a soft hyphen U+00AD are also the UTF-8 bytes of the Syriac letter U+072D. As
    // text, 'Ü\u00ad.example' is ü.example (IDNA drops the soft hyphen), which is how '*.Ü\u00ad.example'
    // reads it too; the exact pattern read it as xn--3nb.example, a name the operator never wrote.
    const exact = compileHostPattern('Ü\u00ad.example');
    expect(exact.test(normaliseHost('ü.example'), 443)).toBe(true);
    expect(exact.test(normaliseHost('xn--3nb.example'), 443)).toBe(false);
    const c = compileConfig({ no_proxy: ['Ü\u00ad.example'], rules: [{ name: 'all', match_hosts: ['*'], headers: [{ name: 'x-k', value: 'v' }] }] });
    expect(c.decide(normaliseHost('ü.example'), 443)).toBe('bypass');
    expect(c.decide(normaliseHost('xn--tda.example'), 443)).toBe('bypass');
    // A client sending the UTF-8 bytes of ü.example (read by Node as latin1) still names ü.example.
    expect(c.decide(normaliseHost(Buffer.from('ü.example', 'utf8').toString('latin1')), 443)).toBe('bypass');
  });
});

describe('regressions found by the properties (a dot that IDNA makes)', () => {
  it('an IPv4 form whose non-ASCII spelling maps to a trailing dot is refused, as such a name is', () => {
    // A soft hyphen maps to nothing and U+3002, U+FF0E to '.': '3.\u00ad' is '3.' once mapped, a
    // trailing dot the text did not end with (so none was removed). A name so spelled keeps the dot
    // as an empty label and is refused ('example.com。'); the URL parser dropped it from an IPv4 form.
    for (const raw of ['3.\u00ad', '0.\u00ad', '1.2.3.4\u3002', '1.2.3.4\uff0e', '127.1.\u3002', 'example.com\u3002']) expect(() => normaliseHost(raw), JSON.stringify(raw)).toThrow(RuleInputError);
    expect(() => compileHostPattern('10.0.0.5\u3002')).toThrow();
    // the same spellings without the mapped dot still name the address
    expect(normaliseHost('１２７.０.０.１')).toBe('127.0.0.1');
    expect(normaliseHost('127\u30020\u30020\u30021')).toBe('127.0.0.1');
  });
});

describe('host patterns against the model', () => {
  /** A pattern derived from a base name, in each form proxy.md names. */
  const patternOf = (base: string, kind: number, port: number | undefined): string => {
    const labels = base.split('.');
    const core =
      kind === 0
        ? base
        : kind === 1
          ? `*.${base}`
          : kind === 2
            ? `${labels[0].slice(0, 2)}*.${labels.slice(1).join('.') || 'com'}`
            : kind === 3
              ? `*${labels[0].slice(-1)}.${labels.slice(1).join('.') || 'com'}`
              : kind === 4
                ? `a.*.${base}`
                : '*';
    return port === undefined ? core : `${core.includes(':') ? `[${core}]` : core}:${port}`;
  };

  /** Hosts around a base name: the tricks of proxy.md's list and a few more. */
  const hostileAround = (base: string): string[] => [
    base,
    `a.${base}`,
    `a.b.${base}`,
    `bad${base}`,
    `${base}.evil.net`,
    `a.${base}.evil.net`,
    `${base}x`,
    `x${base}`,
    `-.${base}`,
    `.${base}`,
    `a..${base}`,
    `a%2e${base}`,
    `a%2E${base}`,
    `${base}%00`,
    `a${base.replace(/\./g, '%2e')}`,
    `a@${base}`,
    `${base}/x`,
    `a.${base}:443`,
    `${base}..`,
    `*.${base}`,
    `a。${base}`,
    `a．${base}`,
    `a.${base}。`,
    ...respellings(base),
    ...respellings(`a.${base}`),
  ];

  const base = fc.oneof(
    { weight: 4, arbitrary: fc.array(fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?$/), { minLength: 1, maxLength: 3 }).map((l) => l.join('.')) },
    { weight: 2, arbitrary: fc.constantFrom('example.com', 'bücher.de', 'xn--bcher-kva.de', 'ß.example', 'api.github.com', 'EXAMPLE.COM', 'a_b.internal', 'com', 'ẞ.example', 'STRAẞE.de', 'K.example', 'Ü\u00ad.example', 'Ãª.example', 'bÃ¼cher.de') },
    { weight: 1, arbitrary: fc.constantFrom('127.0.0.1', '127.1', '0x7f.0.0.1', '10.0.0.5', '[::1]', '::1', '[::ffff:10.0.0.5]', '[2001:db8::1]') },
  );

  it('a compiled pattern matches exactly the hosts the model says, over hostile hosts around it', () => {
    fc.assert(
      fc.property(base, fc.integer({ min: 0, max: 5 }), fc.option(fc.constantFrom(443, 8443), { nil: undefined }), fc.constantFrom(443, 8443), (b, kind, pPort, port) => {
        const pattern = patternOf(b, kind, pPort);
        let compiled;
        try {
          compiled = compileHostPattern(pattern);
        } catch {
          // A pattern the implementation refuses must be one the model cannot read either, or a
          // wildcard over an address, which proxy.md gives no meaning.
          const core = pattern.replace(/:[0-9]+$/, '');
          if (!core.includes('*')) expect(modelNormaliseHost(core), pattern).toBeUndefined();
          return;
        }
        for (const raw of [...hostileAround(b), ...hostileAround(modelNormaliseHost(b) ?? b)]) {
          const host = implNorm(raw);
          expect(host, `model and implementation disagree on refusing ${JSON.stringify(raw)}`).toBe(modelTargetHost(raw));
          if (host === undefined) continue;
          expect(compiled.test(host, port), `${pattern} vs ${JSON.stringify(raw)} (${host}) port ${port}`).toBe(modelHostMatch(pattern, raw, port));
        }
      }),
      propertyParams(1500),
    );
  });

  it('proxy.md examples of *.example.com hold for any base name', () => {
    fc.assert(
      fc.property(fc.array(fc.stringMatching(/^[a-wyz][a-z0-9-]{0,6}[a-z0-9]$/), { minLength: 2, maxLength: 3 }), fc.stringMatching(/^[a-z]{1,5}$/), (ls, x) => {
        const b = ls.join('.');
        const p = compileHostPattern(`*.${b}`);
        // a host that does not parse is refused before any matching: never matched
        const t = (h: string) => {
          const n = implNorm(h);
          return n !== undefined && p.test(n, 443);
        };
        expect(t(`${x}.${b}`)).toBe(true);
        expect(t(`${x}.${x}.${b}`)).toBe(true);
        expect(t(b)).toBe(false);
        expect(t(`${x}${b}`)).toBe(false);
        expect(t(`${b}.${x}`)).toBe(false);
        expect(t(`${x}.${b}.${x}`)).toBe(false);
        expect(t(`${x}-${b}`)).toBe(false);
      }),
      propertyParams(1000),
    );
  });

  it('an IP literal pattern matches every spelling of its address and no other address', () => {
    fc.assert(
      fc.property(ipv4Spelling, ipv4Spelling, fc.constantFrom(false, true), (a, b, mapped) => {
        const na = modelNormaliseHost(a);
        const nb = modelNormaliseHost(b);
        if (na === undefined || nb === undefined || !isIp(na) || !isIp(nb)) return;
        const p = compileHostPattern(mapped ? `[::ffff:${na}]` : a);
        for (const spelling of [b, `[::ffff:${nb}]`, `::ffff:${nb}`, `[0:0:0:0:0:ffff:${nb}]`]) {
          expect(p.test(normaliseHost(spelling), 443), `${a} vs ${spelling}`).toBe(na === nb);
        }
        expect(p.test(normaliseHost(na), 443)).toBe(true);
      }),
      propertyParams(2000),
    );
  });
});

describe('the decision and the rule chosen, against the model', () => {
  const hostPool = ['ü.example', 'a.ü.example', 'Ü\u00ad.example', 'ܭ.example', 'api.example.com', 'a.b.example.com', 'example.com', 'badexample.com', 'example.com.evil.net', 'skip.example.com', 'bücher.de', 'xn--bcher-kva.de', '127.0.0.1', '10.0.0.5', '::1', 'other.org'];
  const patternPool = [
    '*',
    '*.example.com',
    'example.com',
    'api.example.com',
    'api.example.com:8443',
    '*.example.com:443',
    'api-*.example.com',
    '*e.example.com',
    'skip.example.com',
    'BÜCHER.de.',
    'Ü\u00ad.example',
    '*.Ü\u00ad.example',
    '*.de',
    '127.1',
    '0x7f.0.0.1:443',
    '[::ffff:10.0.0.5]',
    '10.0.0.5:8443',
    '[::1]',
    '::1',
    '*.org',
  ];
  const hostSpelling = fc.constantFrom(...hostPool).chain((h) => fc.constantFrom(...respellings(h), h));
  const rule = fc.record({
    match_hosts: fc.array(fc.constantFrom(...patternPool), { minLength: 1, maxLength: 3 }),
    no_proxy: fc.option(fc.array(fc.constantFrom(...patternPool), { maxLength: 2 }), { nil: undefined }),
  });
  const config = fc.record({ no_proxy: fc.array(fc.constantFrom(...patternPool), { maxLength: 2 }), rules: fc.array(rule, { maxLength: 4 }) });

  /** proxy.md "Decision for a target host" and "Which rule applies" (every path matches: no match_paths here). */
  const modelDecide = (c: { no_proxy: string[]; rules: { match_hosts: string[]; no_proxy?: string[] }[] }, raw: string, port: number) => {
    if (c.no_proxy.some((p) => modelHostMatch(p, raw, port))) return { decision: 'bypass', rule: undefined };
    const i = c.rules.findIndex((r) => r.match_hosts.some((p) => modelHostMatch(p, raw, port)) && !(r.no_proxy ?? []).some((p) => modelHostMatch(p, raw, port)));
    return i < 0 ? { decision: 'tunnel', rule: undefined } : { decision: 'intercept', rule: `r${i}` };
  };

  it('decide and pickRule agree with the model for every spelling of the target', () => {
    fc.assert(
      fc.property(config, hostSpelling, fc.constantFrom(443, 8443), (c, raw, port) => {
        const host = implNorm(raw);
        expect(host, raw).toBe(modelTargetHost(raw));
        if (host === undefined) return;
        const resolved: ResolvedProxyConfig = { no_proxy: c.no_proxy, rules: c.rules.map((r, i) => ({ name: `r${i}`, ...r, headers: [{ name: 'x-k', value: `v${i}` }] })) };
        const compiled = compileConfig(resolved);
        const want = modelDecide(c, raw, port);
        const ctx = `${JSON.stringify(c)} ${JSON.stringify(raw)}:${port}`;
        expect(compiled.decide(host, port), ctx).toBe(want.decision);
        expect(compiled.pickRule(host, port, '/')?.name, ctx).toBe(want.rule);
      }),
      propertyParams(3000),
    );
  });
});
