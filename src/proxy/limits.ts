import { HeadLines } from '../server/head-lines.js';
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

/**
 * What the access record says of an exchange its client's idle clock cut. An upload the proxy
 * itself holds back (the upstream not reading it, so the proxy stopped reading the client) is
 * the upstream's stall, not the client's.
 */
export function idleCutReason(uploading: boolean, heldBack: boolean): string {
  if (!uploading) return 'client stopped reading';
  return heldBack ? 'upstream stopped reading the request body' : 'client stopped sending the request body';
}

export { HeadLines } from '../server/head-lines.js';

/**
 * The proxy's answer to a head Node's parser found too large (its `maxHeaderBytes`): `414` when
 * the head's request line is longer than `maxRequestLineBytes`, `431` otherwise, from the lines
 * followed on the connection (HeadLines), so whatever the segmentation.
 */
export function headOverflowAnswer(lines: HeadLines, l: Pick<ProxyLimits, 'maxHeaderBytes' | 'maxRequestLineBytes'>, packet?: Buffer, parsed?: number): ProxyError {
  if (lines.requestLineBytes(packet, parsed) > l.maxRequestLineBytes) return uriTooLong(`request line longer than ${l.maxRequestLineBytes} bytes`);
  return tooLarge(`request head larger than ${l.maxHeaderBytes} bytes`);
}
