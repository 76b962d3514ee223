import { malformed, type ProxyError } from '../errors.js';
import type { RequestFacts } from '../plan.js';

/**
 * An HTTP/2 request's header block turned into what the plan step and the upstream take, or
 * refused. Pure.
 *
 * The request may go upstream as HTTP/1.1, so nothing in it may become HTTP/1.1 framing (the
 * h2-to-h1 desync class): connection-specific fields (`transfer-encoding`, `connection`, ...),
 * `te` other than `trailers`, a `content-length` that is not one plain number, names that are
 * not lower-case tokens, values with CR, LF, NUL or surrounding whitespace, misused
 * pseudo-headers, and a field that takes one value sent twice are refused, never forwarded. nghttp2 (under Node's http2) checks most of this
 * too; this is the proxy's own check, in front of whatever the next hop does.
 */
export interface H2Request {
  /** For the plan: `:method`, `:path`, version 20, the fields with `:authority` as the one `host`. */
  facts: RequestFacts;
  /** A `host` field sent besides `:authority` (checked against the tunnel too), or undefined. */
  hostField: string | undefined;
  /** The regular fields to filter and send upstream (no pseudo-header, no `host`, cookies joined). */
  fields: string[];
  /** The declared body length, or undefined. */
  contentLength: number | undefined;
  /**
   * The client sent `te: trailers`: it reads trailer fields. Passed on to an HTTP/2 origin (gRPC
   * servers check it to detect proxies that lose trailers; every keygate path relays them).
   */
  trailers: boolean;
}

/** Fields that are connection-specific (RFC 9113 8.2.2): never in an HTTP/2 request. */
const CONNECTION_SPECIFIC = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade']);
const REQUEST_PSEUDO = new Set([':method', ':scheme', ':authority', ':path']);
/**
 * Fields that take one value, which node:http2 refuses to send more than once (its
 * kSingleValueHeaders, pseudo-headers left out; test/proxy/h2/fields.test.ts checks this list
 * against the running Node). Repeated in an HTTP/2 request they are refused here (RFC 9110 5.3: a
 * sender must not repeat a field that is not a list); repeated in an answer for an HTTP/2 client,
 * the answer cannot be relayed (forward.ts). Without this list, either was an exception in the
 * middle of an exchange: a 502 blaming the origin, or a stream left hanging.
 */
export const SINGLE_VALUE: ReadonlySet<string> = new Set([
  'access-control-allow-credentials',
  'access-control-max-age',
  'access-control-request-method',
  'age',
  'authorization',
  'content-encoding',
  'content-language',
  'content-length',
  'content-location',
  'content-md5',
  'content-range',
  'content-type',
  'date',
  'dnt',
  'etag',
  'expires',
  'from',
  'host',
  'if-match',
  'if-modified-since',
  'if-none-match',
  'if-range',
  'if-unmodified-since',
  'last-modified',
  'location',
  'max-forwards',
  'proxy-authorization',
  'range',
  'referer',
  'retry-after',
  'tk',
  'upgrade-insecure-requests',
  'user-agent',
  'x-content-type-options',
]);

/** The first field of SINGLE_VALUE that `raw` (`[name, value, ...]`, names in any case) has more than once, or undefined. */
export function repeatedSingleValue(raw: readonly string[]): string | undefined {
  let seen: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    if (!SINGLE_VALUE.has(name)) continue;
    if (seen?.has(name)) return name;
    (seen ??= new Set()).add(name);
  }
  return undefined;
}

/** Lower-case token characters (RFC 9110 5.6.2 tchar, without upper case). */
const NAME = /^[!#$%&'*+\-.^_`|~0-9a-z]+$/;
/** Field value bytes: no NUL, CR, LF (RFC 9113 8.2.1), nothing outside latin1, no whitespace at either end. */
const BAD_VALUE = /[\0\r\n]|[^\x00-\xff]|^[ \t]|[ \t]$/;

/** Reads an HTTP/2 request's raw header list (`[name, value, ...]`, pseudo-headers first). */
export function readH2Request(raw: readonly string[]): H2Request | ProxyError {
  const pseudo = new Map<string, string>();
  const fields: string[] = [];
  const cookies: string[] = [];
  let hostField: string | undefined;
  let contentLength: number | undefined;
  let trailers = false;
  let regular = false;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    const value = raw[i + 1];
    if (name.startsWith(':')) {
      if (regular) return malformed('HTTP/2 pseudo-header after a regular field');
      if (!REQUEST_PSEUDO.has(name)) return malformed(`HTTP/2 pseudo-header not accepted: ${name.slice(0, 20)}`);
      if (pseudo.has(name)) return malformed(`HTTP/2 pseudo-header repeated: ${name}`);
      if (BAD_VALUE.test(value)) return malformed(`invalid value in ${name}`);
      pseudo.set(name, value);
      continue;
    }
    regular = true;
    if (!NAME.test(name)) return malformed('invalid HTTP/2 field name');
    if (BAD_VALUE.test(value)) return malformed('invalid HTTP/2 field value');
    if (CONNECTION_SPECIFIC.has(name)) return malformed(`connection-specific field in an HTTP/2 request: ${name}`);
    if (name === 'te') {
      // A token: any letter case (RFC 9113 8.2.2; nghttp2 compares it so).
      if (value.length !== 8 || value.toLowerCase() !== 'trailers') return malformed('TE other than "trailers" in an HTTP/2 request');
      trailers = true;
      continue; // hop-by-hop: the proxy sends its own (forward.ts)
    }
    if (name === 'content-length') {
      if (contentLength !== undefined || !/^[0-9]{1,15}$/.test(value)) return malformed('invalid Content-Length in an HTTP/2 request');
      contentLength = Number(value);
    }
    if (name === 'host') {
      if (hostField !== undefined) return malformed('more than one Host header');
      hostField = value;
      continue;
    }
    // RFC 9113 8.2.3: cookie crumbs are joined before the request goes on as HTTP/1.1.
    if (name === 'cookie') {
      cookies.push(value);
      continue;
    }
    fields.push(name, value);
  }
  const method = pseudo.get(':method');
  const path = pseudo.get(':path');
  if (method === undefined || path === undefined || path === '' || pseudo.get(':scheme') === undefined) return malformed('HTTP/2 request without :method, :scheme or :path');
  if (method === 'CONNECT') return malformed('CONNECT is not accepted inside a tunnel');
  if (pseudo.get(':scheme') !== 'https') return malformed('only https requests are accepted inside a tunnel');
  if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(method)) return malformed('invalid HTTP/2 :method');
  const repeated = repeatedSingleValue(fields);
  if (repeated) return malformed(`more than one ${repeated} field in an HTTP/2 request (it takes one value)`);
  if (cookies.length) fields.push('cookie', cookies.join('; '));
  const authority = pseudo.get(':authority') ?? hostField;
  const factsHeaders = authority === undefined ? fields : [...fields, 'host', authority];
  return {
    facts: { method, target: path, version: 20, rawHeaders: factsHeaders },
    hostField: pseudo.has(':authority') ? hostField : undefined,
    fields,
    contentLength,
    trailers,
  };
}
