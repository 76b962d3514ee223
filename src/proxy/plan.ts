import type { CompiledConfig, CompiledRule, Decision } from '../rules/compile.js';
import { formatAuthority, parseAuthority, RuleInputError } from '../rules/host.js';
import { isPathRefusal, normalisePath } from '../rules/path.js';
import { EgressDenied } from './egress.js';
import { expectationFailed, malformed, misdirected, ProxyError, reflecting, refused, tooLarge, uriTooLong } from './errors.js';
import type { ProxyLimits } from './limits.js';

/**
 * The plan step of the data path: what to do with one request, decided from what an exchange
 * read of it, the configuration snapshot the request took and the limits. Pure: no socket, no
 * clock, no log line, no event (the caller reports an egress refusal: `EgressDenied`). Every
 * exchange (Node's parser, the strict HTTP/1.1 fast path, HTTP/2 in h2/) calls it, so every
 * request meets the same checks in the same order, and a refusal is a value the exchange
 * renders (errors.ts) and after which it closes the connection (HTTP/1.1) or the stream (HTTP/2).
 *
 * Order: the head against the limits, its framing and expectation, the method, the destination
 * (the egress policy by name, then the authority), the path; then the rule (and, under a rule
 * scoped to some paths, no field naming another path).
 */

/**
 * One request as an exchange read it. HTTP/1.x fills it from the request line and the fields;
 * HTTP/2 (h2/fields.ts) fills `method` and `target` from `:method` and `:path`, and gives `:authority` as
 * the one `host` value (`version` 20).
 */
export interface RequestFacts {
  method: string;
  /** The request target as sent: origin form, absolute form, `*` or an authority. */
  target: string;
  /** 10 for HTTP/1.0, 11 for HTTP/1.1, 20 for HTTP/2. */
  version: number;
  /** `[name, value, ...]` as received. */
  rawHeaders: readonly string[];
}

/** Where an intercepted request goes: the CONNECT target, always. */
export interface TunnelDestination {
  host: string;
  port: number;
  /** `host:port` as normalised (brackets for IPv6). */
  authority: string;
}

/** An intercepted request that may go: the exact path and query to send, and the rule whose headers it gets. */
export interface InterceptPlan {
  pathAndQuery: string;
  /** The normalised path (what the rules matched, what the log shows). */
  path: string;
  rule: CompiledRule | undefined;
}

/** A plain (absolute-form `http://`) request that may go: never with a rule's headers. */
export interface PlainPlan {
  host: string;
  port: number;
  pathAndQuery: string;
  decision: Exclude<Decision, 'intercept'>;
}

const ABSOLUTE = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\/([^/?#]*)(.*)$/;

/**
 * The limits Node's parser does not enforce exactly: the request line (the parser only bounds
 * line + fields together) and the number of fields (Node keeps one more than the limit so that
 * going over is visible here).
 */
export function checkHead(req: RequestFacts, l: Pick<ProxyLimits, 'maxRequestLineBytes' | 'maxHeaderCount'>): ProxyError | undefined {
  // HTTP/0.9 (Node's parser reads a request line without a version as one): no fields, no
  // framing, an answer without a head; nothing a next hop reads the same way.
  if (req.version !== 10 && req.version !== 11 && req.version !== 20) return malformed('only HTTP/1.0, HTTP/1.1 and HTTP/2 requests are accepted');
  const line = req.method.length + 1 + req.target.length + 9;
  if (line > l.maxRequestLineBytes) return uriTooLong(`request line longer than ${l.maxRequestLineBytes} bytes`);
  if (req.rawHeaders.length / 2 > l.maxHeaderCount) return tooLarge(`more than ${l.maxHeaderCount} header fields`);
  return undefined;
}

/**
 * Message framing the proxy will not relay, because a next hop could read it differently
 * (request smuggling): any Transfer-Encoding other than exactly one `chunked` on HTTP/1.1.
 * Node's parser (strict, never lenient here) already refuses Content-Length with
 * Transfer-Encoding, duplicate or malformed Content-Length, obs-fold, bare CR/LF and invalid
 * bytes; transfer codings it passes through (`gzip, chunked`) are refused here, since the proxy
 * re-frames the body and the coding would be lost.
 */
export function framingProblem(req: RequestFacts): ProxyError | undefined {
  let te: string | undefined;
  let count = 0;
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i];
    if (name.length === 17 && name.toLowerCase() === 'transfer-encoding') {
      count++;
      te = req.rawHeaders[i + 1];
    }
  }
  if (count === 0) return undefined;
  if (req.version !== 11) return malformed('Transfer-Encoding is not accepted on HTTP/1.0 requests');
  if (count > 1 || te!.trim().toLowerCase() !== 'chunked') return malformed('only Transfer-Encoding: chunked is accepted');
  return undefined;
}

/**
 * Methods whose answer is the request itself: TRACE (RFC 9110 9.3.8) and IIS's TRACK. Compared
 * upper-cased: HTTP/1.1's parsers refuse other cases, but an HTTP/2 `:method` may be any token,
 * and an origin that upper-cases methods (PHP frameworks do) would read `trace` as TRACE.
 */
const REFLECTING = new Set(['TRACE', 'TRACK']);
/**
 * Fields by which frameworks let a request name the method to use instead of its own (Express's
 * method-override, Symfony/Laravel, ASP.NET, Google's APIs), compared with `_` read as `-` (CGI
 * and PHP map both to the same variable).
 */
const METHOD_OVERRIDE_FIELDS = new Set(['x-http-method-override', 'x-http-method', 'x-method-override']);

/** A method or an override value (maybe a list) that names a reflecting method. */
function namesReflecting(value: string): boolean {
  for (const part of value.split(',')) if (REFLECTING.has(part.trim().toUpperCase())) return true;
  return false;
}

/** One query component percent-decoded (and `+` as a space), or undefined when it does not decode. */
function queryDecode(s: string): string | undefined {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}

/**
 * A `_method` query parameter (Symfony, Laravel, Rails' Rack::MethodOverride read it) naming a
 * reflecting method. The name is read as PHP does: leading spaces dropped, space, `.` and `[` as
 * `_`. An undecodable name or value counts as one, so what cannot be read is never let through.
 */
function queryAsksReflecting(target: string): boolean {
  const q = target.indexOf('?');
  if (q < 0) return false;
  for (const pair of target.slice(q + 1).split(/[&;]/)) {
    const eq = pair.indexOf('=');
    // Only a name that says `method`, or one spelled with escapes, can be `_method` (no decoding per parameter).
    if (eq < 0 || (!/method/i.test(pair) && !pair.includes('%'))) continue;
    const name = queryDecode(pair.slice(0, eq));
    const value = queryDecode(pair.slice(eq + 1));
    if (name === undefined || value === undefined) {
      if (/METHOD/i.test(pair) && /TRAC[EK]/i.test(pair)) return true;
      continue;
    }
    if (name.trimStart().replace(/[ .[]/g, '_').toLowerCase() === '_method' && namesReflecting(value)) return true;
  }
  return false;
}

/**
 * A request whose answer would reflect it, injected headers included: a reflecting method in any
 * case, or a GET/POST asking a framework to treat it as one (an override field or `_method` in the
 * query). An override in a form body is not seen (bodies stream, unread): docs/hardening.md.
 */
export function reflectionProblem(req: RequestFacts): ProxyError | undefined {
  if (REFLECTING.has(req.method.toUpperCase())) return reflecting();
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i];
    if (name.length >= 12 && name.length <= 22 && METHOD_OVERRIDE_FIELDS.has(name.toLowerCase().replace(/_/g, '-')) && namesReflecting(req.rawHeaders[i + 1])) return reflecting();
  }
  if (queryAsksReflecting(req.target)) return reflecting();
  return undefined;
}

/**
 * An expectation the proxy cannot meet: any `Expect` but `100-continue` (RFC 9110 10.1.1), a
 * `417` that closes like every refusal (Node's server would answer it itself and go on reading
 * the connection; the servers hand it here instead: `boundary.ts`, `checkExpectation`).
 */
export function expectationProblem(req: RequestFacts): ProxyError | undefined {
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i];
    if (name.length === 6 && name.toLowerCase() === 'expect' && req.rawHeaders[i + 1].trim().toLowerCase() !== '100-continue') return expectationFailed();
  }
  return undefined;
}

/** The Host values of a request. */
function hostValues(req: RequestFacts): string[] {
  const out: string[] = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    if (req.rawHeaders[i].length === 4 && req.rawHeaders[i].toLowerCase() === 'host') out.push(req.rawHeaders[i + 1]);
  }
  return out;
}

/**
 * Inside a tunnel the CONNECT target is the only destination: an absolute-form request target
 * and the Host header must both name it (a missing Host is refused on HTTP/1.1), and the path
 * must normalise. The path and query to forward, or the refusal.
 */
export function tunnelTarget(req: RequestFacts, t: TunnelDestination): { pathAndQuery: string; path: string } | ProxyError {
  const hosts = hostValues(req);
  if (hosts.length > 1) return malformed('more than one Host header');
  let target = req.target;
  if (!target.startsWith('/')) {
    const m = ABSOLUTE.exec(target);
    if (!m) return malformed('unsupported request target');
    if (m[1].toLowerCase() !== 'https') return malformed('only https requests are accepted inside a tunnel');
    let abs;
    try {
      abs = parseAuthority(m[2], 443);
    } catch {
      return malformed('invalid authority in request target');
    }
    if (abs.host !== t.host || abs.port !== t.port) return misdirected(`request names ${formatAuthority(abs.host, abs.port)} inside a tunnel to ${t.authority}`);
    target = m[3] || '/';
  }
  if (hosts.length === 1) {
    let h;
    try {
      h = parseAuthority(hosts[0], 443);
    } catch {
      return malformed('invalid Host header');
    }
    if (h.host !== t.host || h.port !== t.port) return misdirected(`Host ${formatAuthority(h.host, h.port)} does not match the tunnel to ${t.authority}`);
  } else if (req.version >= 11) {
    return malformed('missing Host header');
  }
  const n = normalisePath(target);
  if (isPathRefusal(n)) return malformed(n.error);
  return { pathAndQuery: n.path + n.query, path: n.path };
}

/** A request inside an intercepted tunnel to `t`: where it goes and with which rule, or why not. */
export function planIntercepted(req: RequestFacts, t: TunnelDestination, config: CompiledConfig, limits: ProxyLimits): InterceptPlan | ProxyError {
  const bad = checkHead(req, limits) ?? framingProblem(req) ?? expectationProblem(req);
  if (bad) return bad;
  // A method whose answer reflects the request would hand the injected value back.
  const reflects = reflectionProblem(req);
  if (reflects) return reflects;
  const denied = config.egress.checkName(t.host, t.port);
  if (denied) return new EgressDenied(denied, t.host, t.port);
  const target = tunnelTarget(req, t);
  if (target instanceof ProxyError) return target;
  const rule = config.pickRule(t.host, t.port, target.path);
  if (target.path.includes('//') && config.pickRule(t.host, t.port, mergeSlashes(target.path)) !== rule) return emptySegmentRefusal();
  // A rule scoped to some paths gives its headers only to those: a field that has the origin
  // serve another path than the request line names would carry them anywhere.
  if (rule !== undefined && rule.paths.length !== 0) {
    const override = pathOverrideProblem(req);
    if (override) return override;
  }
  return { ...target, rule };
}

/** The path as an origin that merges slashes reads it (nginx's merge_slashes, on by default; Apache's MergeSlashes). */
export function mergeSlashes(path: string): string {
  return path.replace(/\/{2,}/g, '/');
}

/**
 * An empty segment (`//`) is a segment (RFC 3986) and is sent as it is, unless the rule it falls
 * under depends on it: nginx serves `//admin/x` as `/admin/x`, so a rule that keeps the token
 * away from `/admin/*`, before one for every path, would not hold for it. Such a path is read two
 * ways, and proxy.md refuses a path that cannot be normalised without ambiguity. Where merging
 * changes nothing about the rule (`/v1//chat/completions` under `/v1/*`), it passes unchanged.
 */
function emptySegmentRefusal(): ProxyError {
  return malformed('path has an empty segment (//): an origin that merges slashes would read it under another rule than the proxy; send the path without it');
}

/**
 * Fields by which servers and frameworks let a request name the path to serve instead of its
 * request line: `X-Original-URL` and `X-Rewrite-URL` (IIS URL Rewrite, Zend/Laminas, Symfony
 * before CVE-2018-14773), compared with `_` read as `-` (CGI and PHP map both to one variable).
 */
const PATH_OVERRIDE_FIELDS = new Set(['x-original-url', 'x-rewrite-url']);

/** A request naming another path in a field (only asked under a rule with match_paths). */
export function pathOverrideProblem(req: RequestFacts): ProxyError | undefined {
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i];
    if ((name.length === 13 || name.length === 14) && PATH_OVERRIDE_FIELDS.has(name.toLowerCase().replace(/_/g, '-'))) {
      return malformed(`${name} names another path than the request line; it is not forwarded under a rule scoped to some paths`);
    }
  }
  return undefined;
}

/**
 * An absolute-form `http://` request on the plain listener: forwarded as is to a host no rule
 * covers; a rule host is refused (credentials travel only over verified TLS). `isDenied` names
 * the proxy's own listeners (a loop, or the admin API).
 */
export function planPlain(req: RequestFacts, config: CompiledConfig, limits: ProxyLimits, isDenied: (host: string, port: number) => boolean): PlainPlan | ProxyError {
  const bad = checkHead(req, limits) ?? framingProblem(req) ?? expectationProblem(req);
  if (bad) return bad;
  const m = ABSOLUTE.exec(req.target);
  if (!m) return malformed('this is a proxy: send absolute-form requests (http://host/path) or CONNECT');
  const scheme = m[1].toLowerCase();
  if (scheme !== 'http' && scheme !== 'ws') return malformed(`use CONNECT for ${scheme}:// targets`);
  if (m[2].includes('@')) return malformed('credentials in the request target are not accepted');
  let t;
  try {
    t = parseAuthority(m[2], 80);
  } catch {
    return malformed('invalid target host');
  }
  const pathAndQuery = m[3] || '/';
  if (!pathAndQuery.startsWith('/')) return malformed('invalid request target');
  if (req.version >= 11 && hostValues(req).length === 0) return malformed('missing Host header');
  if (isDenied(t.host, t.port)) return refused(`${formatAuthority(t.host, t.port)} is not reachable through this proxy`);
  const denied = config.egress.checkName(t.host, t.port);
  if (denied) return new EgressDenied(denied, t.host, t.port);
  const decision = config.decide(t.host, t.port);
  if (decision === 'intercept') return refused('credentials are injected only over HTTPS: use https:// for this host');
  return { ...t, pathAndQuery, decision };
}

/** A CONNECT request's target, or why it is refused (before any policy: the listener applies that). */
export function connectTarget(req: RequestFacts, limits: ProxyLimits): { host: string; port: number } | ProxyError {
  const bad = checkHead(req, limits);
  if (bad) return bad;
  try {
    return parseAuthority(req.target, undefined);
  } catch (err) {
    return malformed(`invalid target host: ${err instanceof RuleInputError ? err.message : 'unparseable'}`);
  }
}
