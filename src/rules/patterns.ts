import { domainToASCII } from 'node:url';
import { isIpLiteral, normaliseConfiguredHost, RuleInputError } from './host.js';
import { isPathRefusal, normalisePath } from './path.js';

/** A pattern in the configuration that cannot be compiled (reported at validation time). */
export class PatternError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PatternError';
  }
}

/** A compiled host pattern. `test` takes a host already passed through normaliseHost. */
export interface HostPattern {
  source: string;
  /** undefined: every port. */
  port?: number;
  test(host: string, port: number): boolean;
}

function escapeRe(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** One fixed label of a wildcard pattern in ASCII (punycode) form, or undefined. */
function literalLabel(label: string): string | undefined {
  const ok = (l: string) => /^(?!-)[a-z0-9_-]{1,63}$/.test(l) && !l.endsWith('-');
  if (/^[\x00-\x7f]*$/.test(label)) return ok(label) ? label : undefined;
  if (/[\s/\\?#@%:[\]]/.test(label)) return undefined;
  const ascii = domainToASCII(`${label}.invalid`);
  const first = ascii.endsWith('.invalid') ? ascii.slice(0, -'.invalid'.length) : '';
  return ok(first) ? first : undefined;
}

const GLOB_LABEL = /^[a-z0-9_*-]{1,63}$/;

/**
 * Compiles one entry of `match_hosts` or `no_proxy`:
 * - `*` alone: every host (names and addresses);
 * - `*.example.com`: any name below example.com at any depth, never example.com itself;
 * - `*` inside a label (`api-*.example.com`): within that label only;
 * - an IP literal: only the same address (in any spelling, since both sides are normalised);
 * - otherwise the exact name. Any entry may end in `:port`.
 * Wildcard patterns match host names only, never IP addresses.
 */
export function compileHostPattern(raw: string): HostPattern {
  if (typeof raw !== 'string' || raw.length === 0) throw new PatternError('empty pattern');
  let hostPart = raw;
  let port: number | undefined;
  const portMatch = /^(.*[^:]):([0-9]{1,5})$/.exec(raw);
  // `::1` style bare IPv6 has several colons: only `[v6]:port` or a single colon carries a port.
  if (portMatch && (raw.startsWith('[') ? portMatch[1].endsWith(']') : !portMatch[1].includes(':'))) {
    hostPart = portMatch[1];
    port = Number(portMatch[2]);
    if (port < 1 || port > 65535) throw new PatternError('port out of range');
  }
  const source = raw;
  const portOk = (p: number) => port === undefined || p === port;

  if (hostPart === '*') return { source, port, test: (_h, p) => portOk(p) };

  if (!hostPart.includes('*')) {
    let host: string;
    try {
      host = normaliseConfiguredHost(hostPart);
    } catch (err) {
      throw new PatternError(err instanceof RuleInputError ? err.message : 'invalid host');
    }
    return { source, port, test: (h, p) => h === host && portOk(p) };
  }

  // ASCII letters only: a non-ASCII label's case is folded by the IDNA mapping (literalLabel), as
  // normaliseHost folds it in host names. toLowerCase folds differently (`ẞ` is `ß` to it, `ss`
  // to UTS 46), and `*.STRAẞE.de` would then never match a.strasse.de, which `STRAẞE.de` names.
  let name = hostPart.replace(/[A-Z]+/g, (c) => c.toLowerCase());
  if (name.endsWith('.')) name = name.slice(0, -1);
  const labels = name.split('.');
  if (labels.length < 2) throw new PatternError("a wildcard pattern needs a fixed part (use '*' alone for every host)");
  const reParts: string[] = [];
  labels.forEach((label, i) => {
    if (label === '*' && i === 0) {
      reParts.push('(?:[^.]+\\.)*[^.]+');
      return;
    }
    if (label.includes('*')) {
      if (!GLOB_LABEL.test(label)) throw new PatternError(`invalid label '${label}'`);
      if (label === '*') {
        reParts.push('[^.]+');
      } else {
        reParts.push(label.split('*').map(escapeRe).join('[^.]*'));
      }
      return;
    }
    const ascii = literalLabel(label);
    if (!ascii) throw new PatternError(`invalid label '${label}'`);
    reParts.push(escapeRe(ascii));
  });
  if (/^[0-9]+$/.test(labels[labels.length - 1])) throw new PatternError('wildcards match host names only, not IP addresses');
  if (labels.slice(1).every((l) => l === '*')) throw new PatternError('a wildcard pattern needs at least one fixed label');
  // Compiled once per configuration; labels exclude '.', so matching is linear in the host.
  const re = new RegExp(`^${reParts.join('\\.')}$`);
  return { source, port, test: (h, p) => portOk(p) && !isIpLiteral(h) && re.test(h) };
}

/** A compiled `match_paths` entry. `test` takes a path already passed through normalisePath. */
export interface PathPattern {
  source: string;
  test(path: string): boolean;
}

/**
 * Compiles one `match_paths` entry: a trailing `/*` matches everything below (`/repos/*`:
 * `/repos/a`, `/repos/a/b`, not `/repos` nor `/reposx`); a `*` elsewhere matches within one
 * segment; otherwise the path must be equal. The pattern is normalised like request paths.
 */
export function compilePathPattern(raw: string): PathPattern {
  if (typeof raw !== 'string' || !raw.startsWith('/')) throw new PatternError('a path pattern must start with /');
  const q = raw.indexOf('?');
  if (q >= 0) throw new PatternError('a path pattern cannot contain a query string');
  // The wildcards go through normalisation as escapes (dot segments resolve around them the same
  // as around any segment), twice, as two different escapes: where the results differ is a
  // wildcard. Escapes the pattern itself holds (`%2A`, an encoded asterisk) stay literal: a
  // request path keeps `%2A` as `%2A` (an asterisk is not unreserved), and `/files/%2A` must
  // match only that, never every name under /files/.
  const normalised = normalisePath(raw.replace(/\*/g, '%2A'));
  if (isPathRefusal(normalised)) throw new PatternError(normalised.error);
  const twin = normalisePath(raw.replace(/\*/g, '%2B'));
  if (isPathRefusal(twin) || twin.path.length !== normalised.path.length) throw new PatternError('a wildcard cannot stand there');
  let pattern = '';
  for (let i = 0; i < normalised.path.length; i++) {
    if (normalised.path.startsWith('%2A', i) && twin.path.startsWith('%2B', i)) {
      pattern += '*';
      i += 2;
    } else pattern += normalised.path[i];
  }
  const source = raw;
  if (!pattern.includes('*')) return { source, test: (p) => p === pattern };

  const below = pattern.endsWith('/*');
  const body = below ? pattern.slice(0, -1) : pattern;
  if (/\*\*/.test(body)) throw new PatternError("'**' is not supported; a trailing '/*' already matches every depth");
  const segs = body.split('/').map((seg) => {
    if (seg === '*') return '[^/]+';
    return seg.split('*').map(escapeRe).join('[^/]*');
  });
  if (!body.includes('*')) {
    // Pure prefix: no regular expression needed.
    return { source, test: (p) => p.length > body.length && p.startsWith(body) };
  }
  const re = new RegExp(`^${segs.join('/')}${below ? '.+' : ''}$`);
  return { source, test: (p) => re.test(p) };
}
