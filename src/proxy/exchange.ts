import type { TLSSocket } from 'node:tls';
import type { TunnelTarget } from './context.js';

/**
 * An exchange reads requests on an intercepted (TLS-terminated) connection and relays each one:
 * Node's HTTP server (node-exchange.ts), the strict HTTP/1.1 fast path (h1/), HTTP/2 (h2/). Every
 * exchange, for every request it reads:
 *
 * - turns it into `RequestFacts` (plan.ts: method, target, version, fields; HTTP/2 gives
 *   `:method`, `:path` and `:authority` as the one Host) and calls `planIntercepted` with the
 *   configuration snapshot the request takes when it starts;
 * - on a refusal, answers it with errors.ts (`errorResponse`, `sendError`, or its own framing of
 *   the same status, reason and Proxy-Status: an HTTP/2 stream gets RST only after that answer)
 *   and stops acting on the connection (HTTP/1.1) or the stream;
 * - otherwise sends the request to the plan's path with `upstreamRequestHeaders` (headers.ts:
 *   the rule's headers replace the client's, hop-by-hop ones dropped; HTTP/2 trailers are
 *   request fields of their own and get the same filter), and streams the answer back;
 * - builds one record per request with record.ts (`via` names the exchange).
 *
 * `serve` takes the connection once its TLS handshake has started; the tunnel target is fixed.
 */
export interface Exchange {
  readonly name: 'fast' | 'node' | 'h2';
  serve(socket: TLSSocket, t: TunnelTarget): void;
}

/** Protocols offered to intercepted clients (ALPN), in preference order: a client offering both gets h2. */
export const ALPN_PROTOCOLS = ['h2', 'http/1.1'];

export interface Exchanges {
  fast?: Exchange;
  node: Exchange;
  h2: Exchange;
}

/**
 * The one switch point between exchanges, as undici's client picks `connectH1` or `connectH2`:
 * by the protocol the client's handshake negotiated (known at the TLS 'secure' event, before its
 * first request), then by whether the fast path is on. No ALPN at all is HTTP/1.1.
 */
export function chooseExchange(alpn: string | false | null, exchanges: Exchanges): Exchange {
  if (alpn === 'h2') return exchanges.h2;
  return exchanges.fast ?? exchanges.node;
}
