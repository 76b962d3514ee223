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

/**
 * Normalises an origin-form request target so that what the rules see is exactly what the
 * origin will see: percent-encoded unreserved characters decoded, other escapes upper-cased,
 * `.` and `..` segments resolved. Anything that could be read two ways is refused: encoded `/`
 * or `\`, a raw `\`, `..` above the root, NUL or other control characters (raw or encoded),
 * double-encoded dots and slashes (`%252e`), and `..;`-style segments some servers strip.
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
    if (code < 0x20 || code === 0x7f) return { error: 'encoded control character in path' };
    if (code === 0x25 && /^(2e|2f|5c)$/i.test(rawPath.slice(i + 3, i + 5))) {
      return { error: 'double-encoded dot, slash or backslash in path' };
    }
    const ch = String.fromCharCode(code);
    decoded += UNRESERVED.test(ch) ? ch : `%${hex.toUpperCase()}`;
    i += 2;
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
    if (/^\.\.?;/.test(seg)) return { error: 'ambiguous dot segment with parameters in path' };
    out.push(seg);
  }
  return { path: '/' + out.join('/'), query };
}

export function isPathRefusal(v: NormalisedPath | PathRefusal): v is PathRefusal {
  return 'error' in v;
}
