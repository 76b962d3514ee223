/** A normalised request target: the path rules match on and that goes upstream, and the raw query. */
export interface NormalisedPath {
  path: string;
  /** '' or the query string including its leading '?', passed upstream unchanged. */
  query: string;
}

export interface PathRefusal {
  error: string;
}

const HEX = /^[0-9A-Fa-f]{2}$/;
const UNRESERVED = /^[A-Za-z0-9\-._~]$/;
// Bytes that never appear raw in an origin-form target: controls, space, DEL, backslash, '#',
// and non-ASCII (clients percent-encode them).
const BAD_RAW = /[\u0000-\u0020\u007f-\uffff\\#]/;
// A `%25` (an encoded `%`) followed by two hex digits: an escape that one more decoding turns
// into another escape. Accepted only when that escape is of a letter, a digit, `-`, `_` or `~`
// (whose meaning is the same encoded or not); anything else could become a dot, a slash, a
// parameter, a query, a control or a byte sequence the first decoding never checked.
const DOUBLE_ESCAPE = /%25([0-9A-Fa-f]{2})/g;
const HARMLESS_SECOND_LEVEL = /^[A-Za-z0-9\-_~]$/;
// Characters that a compatibility mapping (NFKC, "best fit") of an encoded non-ASCII character
// must not produce: it would be a delimiter or a dot to an origin that applies one.
const DELIMITERS_AFTER_MAPPING = /[\u0000-\u0020\u007f./\\;%?#]/;
// Characters that Windows' "best fit" conversion to an ANSI code page (an origin reading the path
// through a narrow-character API) turns into `/` or `\` although NFKC keeps them: division,
// fraction and set-minus slashes, the big solidi, and the yen and won signs that cp932 and cp949
// read as `\` (the "WorstFit" class).
const BEST_FIT_DELIMITERS = /[\u2044\u2215\u2216\u29f8\u29f9\u00a5\u20a9\uffe5\uffe6]/;
const utf8 = new TextDecoder('utf-8', { fatal: true });

/** The escapes `%HH...` (all >= 0x80) starting at `i`: their bytes and where they end. */
function highRun(raw: string, i: number): { bytes: number[]; end: number } | undefined {
  const bytes: number[] = [];
  let j = i;
  while (raw[j] === '%') {
    const hex = raw.slice(j + 1, j + 3);
    if (!HEX.test(hex)) return undefined;
    const code = parseInt(hex, 16);
    if (code < 0x80) break;
    bytes.push(code);
    j += 3;
  }
  return { bytes, end: j };
}

/**
 * A segment that an origin stripping `;` parameters (Tomcat, Spring, Jetty) or trailing
 * whitespace (Windows) would read as `.` or `..` (`..;x`, `.%3B`, `..%3b`, `..%20`), or as empty
 * (`;x`, `%3B`, `%20`), which such an origin then merges away: `/a/;/b` is `/a/b` to Tomcat, no
 * longer under a rule whose wildcard segment matched `;`. An empty segment (`//`) is not one: no
 * wildcard segment matches it, and it reads the same wherever it is kept.
 */
function ambiguousSegment(seg: string): boolean {
  const c = seg.charCodeAt(0);
  if (c !== 0x2e /* . */ && c !== 0x3b /* ; */ && c !== 0x25 /* % */) return false;
  const core = seg.replace(/%3B/gi, ';').replace(/%20/gi, ' ').split(';')[0].replace(/ +$/, '');
  return core === '' || core === '.' || core === '..';
}

/**
 * Normalises an origin-form request target so that what the rules see is exactly what the
 * origin will see: percent-encoded unreserved characters decoded, other escapes upper-cased,
 * `.` and `..` segments resolved. Anything that could be read two ways is refused: encoded `/`,
 * `\`, `?` or `#`, a raw `\`, `..` above the root, NUL or other control characters (raw or encoded),
 * escapes of escapes (`%252e`, or `%25%32%65`, which decodes to it) unless they stand for a
 * letter, a digit, `-`, `_` or `~`, dot segments with parameters or trailing spaces (`..;`,
 * `..%3B`, `..%20`) and segments that are nothing else (`;x`, `%20`), encoded bytes that are not UTF-8 (overlong `%C0%AE` included), and encoded
 * characters that compatibility or best-fit mappings turn into a delimiter (full-width `．` and
 * `／`, `∕`, `¥`).
 *
 * The result is a fixed point: `normalisePath(path + query)` gives it back unchanged, so the
 * path that goes upstream passes every check as it is (test/rules/path-fixed-point.test.ts).
 */
export function normalisePath(target: string): NormalisedPath | PathRefusal {
  if (typeof target !== 'string' || !target.startsWith('/')) return { error: 'request target must start with /' };
  if (target.length > 16384) return { error: 'request target too long' };
  const q = target.indexOf('?');
  const rawPath = q < 0 ? target : target.slice(0, q);
  const query = q < 0 ? '' : target.slice(q);
  if (BAD_RAW.test(rawPath)) return { error: 'path contains a control character, space, backslash or non-ASCII byte' };
  if (query && /[\u0000-\u0020\u007f-\uffff#]/.test(query)) return { error: 'query contains a control character or space' };

  let decoded = '';
  for (let i = 0; i < rawPath.length; i++) {
    const c = rawPath[i];
    if (c !== '%') {
      decoded += c;
      continue;
    }
    const hex = rawPath.slice(i + 1, i + 3);
    if (!HEX.test(hex)) return { error: 'malformed percent-escape in path' };
    const code = parseInt(hex, 16);
    if (code === 0x2f || code === 0x5c) return { error: 'encoded / or \\ in path' };
    // One more decoding would end the path at an encoded `?` or `#`: `/repos/a%3F/issues`, which a
    // rule `/repos/*/issues` matches, is `/repos/a` to an origin or framework that decodes again.
    if (code === 0x3f || code === 0x23) return { error: 'encoded ? or # in path' };
    if (code < 0x20 || code === 0x7f) return { error: 'encoded control character in path' };
    if (code >= 0x80) {
      const run = highRun(rawPath, i)!;
      let text: string;
      try {
        text = utf8.decode(Uint8Array.from(run.bytes));
      } catch {
        return { error: 'encoded bytes in path are not UTF-8' };
      }
      if (DELIMITERS_AFTER_MAPPING.test(text.normalize('NFKC')) || BEST_FIT_DELIMITERS.test(text)) return { error: 'encoded character in path that maps to a delimiter' };
      decoded += rawPath.slice(i, run.end).toUpperCase();
      i = run.end - 1;
      continue;
    }
    const ch = String.fromCharCode(code);
    decoded += UNRESERVED.test(ch) ? ch : `%${hex.toUpperCase()}`;
    i += 2;
  }
  // Checked on the decoded form: `%25%32%65` is `%252e` once its unreserved escapes are decoded.
  if (decoded.includes('%25')) {
    for (const m of decoded.matchAll(DOUBLE_ESCAPE)) {
      if (!HARMLESS_SECOND_LEVEL.test(String.fromCharCode(parseInt(m[1], 16)))) return { error: 'double-encoded character in path' };
    }
  }

  const out: string[] = [];
  const segments = decoded.slice(1).split('/');
  for (let i = 0; i < segments.length; i++) {
    const seg = segments[i];
    const last = i === segments.length - 1;
    if (seg === '.' || seg === '..') {
      if (seg === '..') {
        if (out.length === 0) return { error: 'path escapes above the root' };
        out.pop();
      }
      // `/a/b/..` is `/a/`: a dot segment at the end leaves the trailing slash.
      if (last) out.push('');
      continue;
    }
    if (ambiguousSegment(seg)) return { error: 'ambiguous segment in path: a dot or nothing once parameters or trailing spaces are stripped' };
    out.push(seg);
  }
  return { path: '/' + out.join('/'), query };
}

export function isPathRefusal(v: NormalisedPath | PathRefusal): v is PathRefusal {
  return 'error' in v;
}
