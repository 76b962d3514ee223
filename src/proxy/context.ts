import type { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { Logger } from '../log.js';
import type { CompiledConfig, Decision } from '../rules/compile.js';
import type { Upstream, ProxyTimeouts } from './upstream.js';

/** What the data-path modules share; built once by startProxy. */
export interface ProxyCore {
  /** The configuration snapshot to use for something starting now. */
  config(): CompiledConfig;
  upstream: Upstream;
  logger: Logger;
  events: EventEmitter;
  timeouts: ProxyTimeouts;
  /** Targets the proxy must never connect to (its own listeners, the admin listener). */
  isDenied(host: string, port: number): boolean;
  /** True once close() started: finish what is in flight, keep nothing alive. */
  draining(): boolean;
  /**
   * Watches a long-lived channel the proxy cannot read into (a blind tunnel, a spliced
   * WebSocket) until `s` closes: when a new egress policy denies where it goes, `hold.close` ends it.
   */
  watchEgress(s: Duplex, hold: EgressHold): void;
}

/** Where a long-lived channel goes, and how to end it (ProxyCore.watchEgress). */
export interface EgressHold {
  host: string;
  port: number;
  /** The address it connected to (the policy's address checks apply to it). */
  address: string;
  /** Ends the channel, recording why. */
  close(reason: string): void;
}

/** The CONNECT target of an intercepted tunnel, remembered on its TLS socket. */
export interface TunnelTarget {
  host: string;
  port: number;
  /** `host:port` as the client sent it after normalisation (brackets for IPv6). */
  authority: string;
  client: string;
  /** Requests in flight on this connection (graceful close waits for them). */
  inFlight: number;
}

/** One log line and 'request' event per request. Never any header value. */
export interface RequestRecord {
  type: 'request';
  client: string;
  method: string;
  host: string;
  port: number;
  path: string;
  decision: Decision;
  /** Which path served it: the intercepted fast path (src/proxy/h1), Node's HTTP server, or the HTTP/2 exchange (src/proxy/h2). */
  via: 'fast' | 'node' | 'h2';
  /** The client's protocol. */
  proto: 'h1' | 'h2';
  rule: string | null;
  injected: readonly string[];
  status: number;
  bytes_in: number;
  bytes_out: number;
  duration_ms: number;
  error?: string;
}

/** One log line and 'tunnel' close event per blind tunnel. */
export interface TunnelRecord {
  type: 'tunnel';
  phase: 'open' | 'close';
  client: string;
  host: string;
  port: number;
  decision: Decision;
  status?: number;
  bytes_in?: number;
  bytes_out?: number;
  duration_ms?: number;
  error?: string;
}
