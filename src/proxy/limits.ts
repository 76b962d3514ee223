import { tooLarge, uriTooLong, type ProxyError } from './errors.js';
import type { ProxyTimeouts } from './upstream.js';

/**
 * Every bound the proxy puts on what a client (or an upstream) can make it hold. Each has a
 * safe default and a documented answer (docs/hardening.md). None of them caps a body or a
 * stream that is making progress: the only clocks on an open exchange are idle clocks.
 */
export interface ProxyLimits {
  /** Request line + header section, bytes (431, or 414 when the request line alone is too long). */
  maxHeaderBytes: number;
  /** Header fields in one request (431). */
  maxHeaderCount: number;
  /** Request line (method, target, version), bytes (414). */
  maxRequestLineBytes: number;
  /** Client connections open at once (503 and close). */
  maxConnections: number;
  /** Client connections open at once from one client address (503 and close). */
  maxConnectionsPerClient: number;
  /** A client connection with no byte in either direction for this long is closed. */
  idleTimeoutMs: number;
  /** A request head must be complete this long after it started (slow-loris: 408 and close). */
  headerTimeoutMs: number;
  /** Idle keep-alive connections, both sides. */
  keepAliveTimeoutMs: number;
  /** TCP (+ TLS) connect to an upstream (504). */
  connectTimeoutMs: number;
  /** Upstream response headers after the request was sent (504). */
  responseHeaderTimeoutMs: number;
  /** Silence between two chunks of an upstream response body (the stream is cut). */
  responseIdleTimeoutMs: number;
  /** Client TLS handshake inside an intercepted tunnel (close). */
  tlsHandshakeTimeoutMs: number;
  /** Minted certificates kept (LRU). */
  certCacheSize: number;
  /** Warn (log + 'ca_expiry' event) this many days before the proxy CA expires. */
  caExpiryWarnDays: number;
}

export const DEFAULT_LIMITS: Readonly<ProxyLimits> = Object.freeze({
  maxHeaderBytes: 32 * 1024,
  maxHeaderCount: 100,
  maxRequestLineBytes: 8 * 1024,
  maxConnections: 4096,
  maxConnectionsPerClient: 1024,
  idleTimeoutMs: 300_000,
  headerTimeoutMs: 30_000,
  keepAliveTimeoutMs: 30_000,
  connectTimeoutMs: 10_000,
  responseHeaderTimeoutMs: 300_000,
  responseIdleTimeoutMs: 300_000,
  tlsHandshakeTimeoutMs: 10_000,
  certCacheSize: 1000,
  caExpiryWarnDays: 30,
});

/** `--limit` keys (snake_case, the unit in the name) -> field. One table for the CLI and the docs. */
export const LIMIT_KEYS: Readonly<Record<string, keyof ProxyLimits>> = Object.freeze({
  max_header_bytes: 'maxHeaderBytes',
  max_header_count: 'maxHeaderCount',
  max_request_line_bytes: 'maxRequestLineBytes',
  max_connections: 'maxConnections',
  max_connections_per_client: 'maxConnectionsPerClient',
  idle_timeout_ms: 'idleTimeoutMs',
  header_timeout_ms: 'headerTimeoutMs',
  keep_alive_timeout_ms: 'keepAliveTimeoutMs',
  connect_timeout_ms: 'connectTimeoutMs',
  response_header_timeout_ms: 'responseHeaderTimeoutMs',
  response_idle_timeout_ms: 'responseIdleTimeoutMs',
  tls_handshake_timeout_ms: 'tlsHandshakeTimeoutMs',
  cert_cache_size: 'certCacheSize',
  ca_expiry_warn_days: 'caExpiryWarnDays',
});

export class LimitError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LimitError';
  }
}

/** Parses `key=value` (a `--limit` flag). Throws LimitError naming the key and the allowed range. */
export function parseLimitFlag(raw: string): [keyof ProxyLimits, number] {
  const m = /^([a-z_]+)=([0-9]{1,10})$/.exec(raw.trim());
  if (!m) throw new LimitError(`--limit must be KEY=INTEGER (got '${raw}'); keys: ${Object.keys(LIMIT_KEYS).join(', ')}`);
  const field = LIMIT_KEYS[m[1]];
  if (!field) throw new LimitError(`unknown limit '${m[1]}'; keys: ${Object.keys(LIMIT_KEYS).join(', ')}`);
  const value = Number(m[2]);
  checkLimit(field, value, m[1]);
  return [field, value];
}

function checkLimit(field: keyof ProxyLimits, value: number, name: string): void {
  if (!Number.isSafeInteger(value) || value < 0) throw new LimitError(`limit ${name} must be a non-negative integer`);
  // Zero would mean "no limit" for Node's timers and "refuse everything" for counts: neither is
  // a safe setting for a proxy facing untrusted code, so every limit is at least 1.
  if (value < 1) throw new LimitError(`limit ${name} must be at least 1`);
  if (field === 'maxHeaderBytes' && (value < 1024 || value > 1024 * 1024)) throw new LimitError(`limit ${name} must be between 1024 and 1048576`);
  if (field === 'maxRequestLineBytes' && (value < 256 || value > 1024 * 1024)) throw new LimitError(`limit ${name} must be between 256 and 1048576`);
  if (field === 'maxHeaderCount' && value > 10_000) throw new LimitError(`limit ${name} must be at most 10000`);
  if (field.endsWith('Ms') && value > 24 * 3600_000) throw new LimitError(`limit ${name} must be at most one day`);
}

/** Defaults, overridden by each of `given` in turn (undefined values skipped); every value range-checked. */
export function resolveLimits(...given: (Partial<ProxyLimits> | undefined)[]): ProxyLimits {
  const out = { ...DEFAULT_LIMITS };
  for (const g of given) {
    for (const [k, v] of Object.entries(g ?? {}) as [keyof ProxyLimits, number | undefined][]) {
      if (v === undefined) continue;
      if (!(k in DEFAULT_LIMITS)) throw new LimitError(`unknown limit '${k}'`);
      checkLimit(k, v, k);
      out[k] = v;
    }
  }
  return out;
}

/** The upstream timeouts a set of limits implies. */
export function timeoutsOf(l: ProxyLimits): ProxyTimeouts {
  return {
    connectMs: l.connectTimeoutMs,
    headersMs: l.responseHeaderTimeoutMs,
    bodyMs: l.responseIdleTimeoutMs,
    tlsHandshakeMs: l.tlsHandshakeTimeoutMs,
    clientHeadersMs: l.headerTimeoutMs,
    keepAliveMs: l.keepAliveTimeoutMs,
  };
}

/** The limits the older `timeouts` option sets (kept for callers that pass it). */
export function limitsFromTimeouts(t: Partial<ProxyTimeouts> = {}): Partial<ProxyLimits> {
  return {
    connectTimeoutMs: t.connectMs,
    responseHeaderTimeoutMs: t.headersMs,
    responseIdleTimeoutMs: t.bodyMs,
    tlsHandshakeTimeoutMs: t.tlsHandshakeMs,
    headerTimeoutMs: t.clientHeadersMs,
    keepAliveTimeoutMs: t.keepAliveMs,
  };
}

// The errors of the limits live with every other proxy error (errors.ts).
export { headTimeout, overloaded, tooLarge, uriTooLong } from './errors.js';

/**
 * The client's idle clock (idleTimeoutMs) during an exchange, one policy for every exchange: a
 * client stalled mid-upload (its request body incomplete) or not reading what it asked for
 * (response bytes queued toward it) is cut; a client waiting for a slow upstream is left to the
 * upstream clocks (response header and body timeouts).
 */
export function idleCutsExchange(uploading: boolean, unreadResponse: boolean): boolean {
  return uploading || unreadResponse;
}

/** Bytes of the start of a line kept to tell a request line (`METHOD SP`) from a field line. */
const LINE_START = 24;
const REQUEST_LINE_START = /^[A-Z][A-Z-]* /;

/**
 * What Node's parser does not say when a head overflows max_header_bytes: whether the request
 * line alone was too long (414) or the header section (431). Its error carries only the chunk
 * being parsed, so reading the answer from that chunk made it depend on how the bytes arrived
 * (a 128 KiB field after a request line sent on its own got a 414). This follows the lines of
 * the connection as they arrive, so the answer depends only on the bytes: a head whose request
 * line is longer than max_request_line_bytes is a 414, any other overflowing head a 431.
 *
 * Fed every chunk after the parser (it is a later 'data' listener); `answer` is asked from the
 * parser's error, before this chunk was fed. A line is a request line when it starts with an
 * upper-case method and a space, which no field line can (strict parsing refuses a space before
 * the colon).
 */
export class HeadLines {
  /** Bytes of the current line so far (up to its LF). */
  private lineBytes = 0;
  /** The first LINE_START bytes of the current line. */
  private lineStart = '';
  /** The current line so far ends with CR. */
  private endsWithCr = false;
  /** Length (without CRLF) of the last complete request line. */
  private requestLine = 0;

  feed(chunk: Buffer, end = chunk.length): void {
    let pos = 0;
    for (let lf = chunk.indexOf(0x0a, pos); lf >= 0 && lf < end; lf = chunk.indexOf(0x0a, pos)) {
      this.take(chunk, pos, lf);
      const length = this.lineBytes - (this.endsWithCr ? 1 : 0);
      if (REQUEST_LINE_START.test(this.lineStart)) this.requestLine = length;
      this.lineBytes = 0;
      this.lineStart = '';
      this.endsWithCr = false;
      pos = lf + 1;
    }
    if (pos < end) this.take(chunk, pos, end);
  }

  private take(chunk: Buffer, from: number, to: number): void {
    if (to <= from) return;
    if (this.lineStart.length < LINE_START) this.lineStart += chunk.toString('latin1', from, Math.min(to, from + LINE_START - this.lineStart.length));
    this.lineBytes += to - from;
    this.endsWithCr = chunk[to - 1] === 0x0d;
  }

  /** The answer to a head the parser found too large, `packet` being the chunk it was parsing and `parsed` how far it got. */
  answer(l: Pick<ProxyLimits, 'maxHeaderBytes' | 'maxRequestLineBytes'>, packet?: Buffer, parsed?: number): ProxyError {
    const probe = new HeadLines();
    Object.assign(probe, this);
    if (packet) probe.feed(packet, Math.max(0, Math.min(packet.length, parsed ?? packet.length)));
    const inRequestLine = REQUEST_LINE_START.test(probe.lineStart);
    const line = inRequestLine ? probe.lineBytes : probe.requestLine;
    if (line > l.maxRequestLineBytes) return uriTooLong(`request line longer than ${l.maxRequestLineBytes} bytes`);
    return tooLarge(`request head larger than ${l.maxHeaderBytes} bytes`);
  }
}
