import { asVariable, type CompiledRule } from '../rules/compile.js';

/**
 * Headers that belong to one connection and are never forwarded (RFC 9110 7.6.1), plus the
 * proxy's own credentials and framing the next hop recomputes. `upgrade` is kept only for a
 * WebSocket handshake.
 */
const HOP_BY_HOP = new Set([
  'connection',
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

/** Response headers passed back to the client: a raw header list without hop-by-hop fields (`upgrade` and `connection` kept for a 101). */
export function filterRawResponseHeaders(raw: string[], keepUpgrade: boolean): string[] {
  const listed = connectionListed(raw);
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i].toLowerCase();
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
 * Fields that mean something only in a head: framing and routing (RFC 9110 6.5.1). In a trailer
 * section a client that merges trailers into the head would take them for the message's own.
 */
const HEAD_ONLY = new Set(['content-length', 'host']);

/**
 * The lines of an HTTP/1.1 trailer section (`name: value`, CRLF-separated, without the final
 * empty line) that may be relayed: not hop-by-hop, not named in the head's or the trailers'
 * `Connection`, not head-only, and well formed (a line that is not a field is dropped). Lines
 * are kept byte for byte.
 */
export function relayedTrailerLines(lines: string[], headFields: string[]): string[] {
  const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
  const fields: string[] = [];
  const kept: { line: string; lower: string }[] = [];
  for (const line of lines) {
    const colon = line.indexOf(':');
    const name = line.slice(0, colon);
    if (colon <= 0 || !TOKEN.test(name)) continue;
    fields.push(name, line.slice(colon + 1));
    kept.push({ line, lower: name.toLowerCase() });
  }
  const listed = connectionListed([...headFields, ...fields]);
  return kept.filter((k) => !HOP_BY_HOP.has(k.lower) && !HEAD_ONLY.has(k.lower) && !listed?.has(k.lower)).map((k) => k.line);
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
