import { isIPv4, isIPv6 } from 'node:net';
import { domainToASCII } from 'node:url';

/** A host (or path) that cannot be normalised without ambiguity: the request is refused. */
export class RuleInputError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RuleInputError';
  }
}

// Characters that would make the WHATWG host parser read something other than a host name
// (userinfo, port, path, query, fragment, percent-escapes) or that never belong in one.
const NOT_IN_HOST = /[\s\u0000-\u001f\u007f/\\?#@%:[\]<>^|"'`{}]/;
const LABEL = /^(?!-)[a-z0-9_-]{1,63}$/;

/**
 * Canonical text of an IPv6 literal (compressed, lower-case), or undefined. An IPv4-mapped
 * address (`::ffff:127.0.0.1`, `::ffff:7f00:1`) is the IPv4 address it maps (RFC 4291 2.5.5.2):
 * written in dotted form, so that a pattern or a no_proxy entry naming the IPv4 address matches
 * it too (else `[::ffff:10.0.0.5]` would escape a no_proxy of `10.0.0.5`).
 */
function canonicalIPv6(raw: string): string | undefined {
  if (raw.includes('%') || !isIPv6(raw)) return undefined; // zone ids are local, never a destination
  const v6 = new URL(`http://[${raw}]/`).hostname.slice(1, -1);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v6);
  if (!mapped) return v6;
  const hi = parseInt(mapped[1], 16);
  const lo = parseInt(mapped[2], 16);
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

/**
 * An internationalised name as it arrives in an HTTP/1.1 field: Node reads field bytes as
 * latin1, so UTF-8 `bücher` comes as `bÃ¼cher`. Bytes that decode as UTF-8 are read so; anything
 * else (a name typed in the configuration, latin1 on the wire) stays as it is.
 */
function fromWire(raw: string): string {
  if (!/[\x80-\xff]/.test(raw) || /[^\x00-\xff]/.test(raw)) return raw;
  const utf8 = Buffer.from(raw, 'latin1').toString('utf8');
  return utf8.includes('\ufffd') ? raw : utf8;
}

/**
 * The one form of a host every comparison uses: lower-case, one trailing dot removed,
 * internationalised names in punycode (sent as UTF-8 or typed), IPv4 in dotted decimal (so `0x7f.1`, `2130706433` and the
 * IPv4-mapped `[::ffff:127.0.0.1]` are `127.0.0.1`), IPv6 compressed and without brackets. Throws RuleInputError for anything else.
 */
export function normaliseHost(raw: string): string {
  if (typeof raw !== 'string' || raw.length === 0 || raw.length > 1024) throw new RuleInputError('empty or oversized host');
  const known = normalised.get(raw);
  if (known !== undefined) return known;
  const host = normaliseHostUncached(raw);
  // Bounded: a client sending ever new names empties the memo instead of growing it.
  if (normalised.size >= NORMALISED_MAX) normalised.clear();
  normalised.set(raw, host);
  return host;
}

/**
 * Hosts already normalised, by the exact string given: the proxy checks every request's Host
 * against its tunnel's target, and a keep-alive connection sends the same Host each time. The
 * URL parse and the IPv6 regex behind it were about 3 % of the proxy's busy time at 32
 * connections (bench/README.md, session 5). normaliseHostUncached is a pure function of its
 * input, so the memo gives the same answer; only successes are kept (a refusal throws anew).
 */
const normalised = new Map<string, string>();
const NORMALISED_MAX = 1024;

/**
 * normaliseHost for a host name written in the configuration (a pattern, a no_proxy entry): text
 * already, so never read as latin1 bytes of UTF-8. `Ü` followed by a soft hyphen is ü to IDNA, but
 * its two code points are also the UTF-8 bytes of U+072D: read as wire bytes, an entry would name
 * a host its author never wrote, and differ from a wildcard entry with the same label.
 */
export function normaliseConfiguredHost(text: string): string {
  if (typeof text !== 'string' || text.length === 0 || text.length > 1024) throw new RuleInputError('empty or oversized host');
  return normaliseHostUncached(text, false);
}

function normaliseHostUncached(raw: string, wire = true): string {
  if (raw.startsWith('[')) {
    if (!raw.endsWith(']')) throw new RuleInputError('unterminated IPv6 literal');
    const v6 = canonicalIPv6(raw.slice(1, -1));
    if (!v6) throw new RuleInputError('invalid IPv6 literal');
    return v6;
  }
  if (raw.includes(':')) {
    const v6 = canonicalIPv6(raw);
    if (!v6) throw new RuleInputError('invalid host');
    return v6;
  }
  const name = wire ? fromWire(raw) : raw;
  const text = name.endsWith('.') ? name.slice(0, -1) : name;
  let host = text;
  // One trailing dot only: the URL parser would drop a second one from an IPv4 form (`1.2.3.4..`)
  // while a name keeps it as an empty label and is refused.
  if (host.length === 0 || host.endsWith('.') || NOT_IN_HOST.test(host)) throw new RuleInputError('invalid host');
  try {
    host = new URL(`http://${host}/`).hostname;
  } catch {
    throw new RuleInputError('invalid host');
  }
  if (isIPv4(host)) {
    // The IDNA mapping may make a trailing dot of a non-ASCII character (U+3002, U+FF0E, `.` then
    // a soft hyphen): a name keeps it as an empty label and is refused below, but the IPv4 parser
    // drops it. Refused here too, so that only the one trailing dot of the text is ever removed.
    if (/[^\x00-\x7f]/.test(text) && domainToASCII(`${text}.a`).endsWith('..a')) throw new RuleInputError('invalid host');
    return host;
  }
  if (host.length > 253) throw new RuleInputError('host name longer than 253 characters');
  for (const label of host.split('.')) {
    if (!LABEL.test(label) || label.endsWith('-')) throw new RuleInputError('invalid host name');
  }
  // A name whose last label is numeric is an IPv4 form the URL parser did not accept (e.g. 1.2.3.256).
  if (/^[0-9]+$/.test(host.slice(host.lastIndexOf('.') + 1))) throw new RuleInputError('invalid IPv4 address');
  return host;
}

/** normaliseHost without throwing. */
export function tryNormaliseHost(raw: string): string | undefined {
  try {
    return normaliseHost(raw);
  } catch {
    return undefined;
  }
}

export function isIpLiteral(host: string): boolean {
  return isIPv4(host) || isIPv6(host);
}

/**
 * Splits an authority (`host`, `host:port`, `[v6]`, `[v6]:port`) into a normalised host and a
 * port (`defaultPort` when absent). `from`: a request's bytes (`wire`, read as normaliseHost
 * reads them) or text an operator wrote (`configured`: `--resolve`, deny targets; read as
 * normaliseConfiguredHost does). Throws RuleInputError.
 */
export function parseAuthority(raw: string, defaultPort: number | undefined, from: 'wire' | 'configured' = 'wire'): { host: string; port: number } {
  let hostPart = raw;
  let portPart: string | undefined;
  if (raw.startsWith('[')) {
    const end = raw.indexOf(']');
    if (end < 0) throw new RuleInputError('unterminated IPv6 literal');
    hostPart = raw.slice(0, end + 1);
    const rest = raw.slice(end + 1);
    if (rest) {
      if (!rest.startsWith(':')) throw new RuleInputError('invalid authority');
      portPart = rest.slice(1);
    }
  } else {
    const colon = raw.lastIndexOf(':');
    if (colon >= 0) {
      if (raw.indexOf(':') !== colon) throw new RuleInputError('IPv6 literal must be in brackets');
      hostPart = raw.slice(0, colon);
      portPart = raw.slice(colon + 1);
    }
  }
  let port: number;
  if (portPart === undefined) {
    if (defaultPort === undefined) throw new RuleInputError('port required');
    port = defaultPort;
  } else {
    if (!/^[0-9]{1,5}$/.test(portPart)) throw new RuleInputError('invalid port');
    port = Number(portPart);
    if (port < 1 || port > 65535) throw new RuleInputError('port out of range');
  }
  return { host: from === 'wire' ? normaliseHost(hostPart) : normaliseConfiguredHost(hostPart), port };
}

/** `host:port` with brackets around IPv6, for keys, logs and URLs. */
export function formatAuthority(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/** `host[:port]` as a URL writes it (and an HTTP/1.1 Host header): the default port left out. */
export function urlAuthority(host: string, port: number, defaultPort: number): string {
  return port === defaultPort ? (host.includes(':') ? `[${host}]` : host) : formatAuthority(host, port);
}
