import { asVariable, type CompiledRule } from '../rules/compile.js';

/**
 * Headers that belong to one connection and are never forwarded (RFC 9110 7.6.1), plus the
 * proxy's own credentials and framing the next hop recomputes. `upgrade` is kept only for a
 * WebSocket handshake. `http2-settings` belongs to the h2c upgrade of one connection (RFC 9113
 * 3.2.1 made it connection-specific; Node's http2 throws on it, an answer carrying it would
 * fail an HTTP/2 client's stream).
 */
export const HOP_BY_HOP: ReadonlySet<string> = new Set([
  'connection',
  'http2-settings',
  'keep-alive',
  'proxy-authorization',
  'proxy-authenticate',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/** Names listed in every `Connection` header value (also hop-by-hop). */
function connectionListed(raw: string[]): Set<string> | undefined {
  let out: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].length === 10 && raw[i].toLowerCase() === 'connection') {
      for (const token of raw[i + 1].split(',')) {
        const t = token.trim().toLowerCase();
        if (t) (out ??= new Set()).add(t);
      }
    }
  }
  return out;
}

export interface RequestHeaderOptions {
  rule?: CompiledRule;
  /** Keep `Upgrade: websocket` and `Connection: Upgrade` (a WebSocket handshake). */
  websocket?: boolean;
}

/**
 * The header list sent upstream, as a flat `[name, value, ...]` array: hop-by-hop headers and
 * those named in `Connection` removed, `Host` and `Expect` dropped (the client decides neither
 * the destination nor the upstream's framing), every client header that a rule injects removed
 * whatever its case or count (or its `_` for `-`: one variable to CGI-style servers), then the
 * rule's headers added once.
 */
export function upstreamRequestHeaders(raw: string[], opts: RequestHeaderOptions = {}): string[] {
  const listed = connectionListed(raw);
  const injected = opts.rule?.headerNameSet;
  const variables = opts.rule?.headerVariableSet;
  // Names read as variables only where one could meet an injected name: a client name with a `_`,
  // or any name when an injected one has a `_` (most rules have none: nothing more per field).
  const anyName = opts.rule?.headerNameHasUnderscore === true;
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    const lower = name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || lower === 'host' || lower === 'expect') continue;
    if (listed?.has(lower) && !(opts.websocket && lower.startsWith('sec-websocket-'))) continue;
    if (injected?.has(lower)) continue;
    // `X_Key` beside an injected `X-Key` is the same variable to CGI, PHP and WSGI servers.
    if (variables && (anyName || lower.includes('_')) && variables.has(asVariable(lower))) continue;
    out.push(name, raw[i + 1]);
  }
  if (opts.websocket) out.push('connection', 'Upgrade', 'upgrade', 'websocket');
  if (opts.rule) for (const [name, value] of opts.rule.headers) out.push(name, value);
  return out;
}

/**
 * Response headers passed back to the client: a raw header list without hop-by-hop fields
 * (`upgrade` and `connection` kept for a 101). With `status`, also without the framing fields an
 * answer of that status must not carry (RFC 9110 8.6, RFC 9112 6.1: no Content-Length in a 1xx
 * or 204; Transfer-Encoding is hop-by-hop anyway), whatever the origin sent.
 */
export function filterRawResponseHeaders(raw: string[], keepUpgrade: boolean, status?: number): string[] {
  const listed = connectionListed(raw);
  const noLength = status !== undefined && (status < 200 || status === 204);
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i].toLowerCase();
    if (noLength && lower === 'content-length') continue;
    if (keepUpgrade && (lower === 'upgrade' || lower === 'connection')) {
      out.push(raw[i], raw[i + 1]);
      continue;
    }
    if (HOP_BY_HOP.has(lower) || listed?.has(lower)) continue;
    out.push(raw[i], raw[i + 1]);
  }
  return out;
}

/**
 * Fields never relayed in a trailer section, on any path (RFC 9110 6.5.1: a trailer must not
 * carry what frames, routes, modifies or authenticates a message, controls a response or says
 * how to process its content). A client that merges trailers into the head would take them for
 * the message's own. Besides these, hop-by-hop fields and those any `Connection` names.
 */
const NEVER_IN_TRAILERS = new Set([
  // framing, routing
  'content-length',
  'host',
  // request modifiers
  'cache-control',
  'expect',
  'max-forwards',
  'pragma',
  'range',
  'if-match',
  'if-none-match',
  'if-modified-since',
  'if-unmodified-since',
  'if-range',
  // authentication, state
  'authorization',
  'www-authenticate',
  'authentication-info',
  'proxy-authentication-info',
  'cookie',
  'set-cookie',
  // response control data
  'age',
  'expires',
  'date',
  'location',
  'retry-after',
  'vary',
  'warning',
  // how to process the content
  'content-encoding',
  'content-type',
  'content-range',
]);

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** HTAB, SP, VCHAR, obs-text. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

function trailerFieldKept(name: string, value: string, listed: Set<string> | undefined): boolean {
  if (!TOKEN.test(name) || !FIELD_VALUE.test(value)) return false;
  const lower = name.toLowerCase();
  return !HOP_BY_HOP.has(lower) && !NEVER_IN_TRAILERS.has(lower) && !listed?.has(lower);
}

/**
 * Why a trailer section is not relayed at all (the answer is then cut, on every path, as a
 * broken one): a field that is not a field (a name that is no token, control bytes in a value),
 * or one that names the message's framing, which a client merging trailers would act on.
 * undici's parser refuses most of these itself; this is the one rule all paths apply.
 */
export function trailerProblem(raw: readonly string[]): string | undefined {
  for (let i = 0; i < raw.length; i += 2) {
    if (!TOKEN.test(raw[i])) return 'malformed trailer field';
    if (!FIELD_VALUE.test(raw[i + 1])) return 'control bytes in a trailer field';
    const lower = raw[i].toLowerCase();
    if (lower === 'content-length' || lower === 'transfer-encoding') return 'framing field in the trailers';
  }
  return undefined;
}

/**
 * The one trailer policy of every path: the trailer fields of `raw` (`[name, value, ...]`)
 * that are relayed, a flat list in order (the section passed trailerProblem). A field is relayed
 * unless it is hop-by-hop, named by a `Connection` of the head (`headFields`) or of the
 * trailers, or one of NEVER_IN_TRAILERS.
 */
export function relayedTrailers(raw: readonly string[], headFields: readonly string[] = []): string[] {
  const listed = connectionListed([...headFields, ...raw]);
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) if (trailerFieldKept(raw[i], raw[i + 1], listed)) out.push(raw[i], raw[i + 1]);
  return out;
}

/**
 * The lines of an HTTP/1.1 trailer section (`name: value`, CRLF-separated, without the final
 * empty line) that may be relayed, by the same policy; undefined when the section is not relayed
 * at all (trailerProblem, or a line that is not a field: no colon, or obs-fold). Lines are kept
 * byte for byte.
 */
export function relayedTrailerLines(lines: string[], headFields: string[]): string[] | undefined {
  const fields: string[] = [];
  for (const line of lines) {
    const colon = line.indexOf(':');
    if (colon <= 0) return undefined;
    fields.push(line.slice(0, colon), line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, ''));
  }
  if (trailerProblem(fields)) return undefined;
  const listed = connectionListed([...headFields, ...fields]);
  return lines.filter((_line, i) => trailerFieldKept(fields[2 * i], fields[2 * i + 1], listed));
}

/**
 * The same filter for a header object (undici's `request()` answers with one): used by the
 * deployment router, so that every hop in keygate drops the same hop-by-hop set.
 */
export function filterResponseHeaderObject(headers: Record<string, string | string[] | undefined>): string[] {
  const raw: string[] = [];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) raw.push(name, v);
  }
  return filterRawResponseHeaders(raw, false);
}
