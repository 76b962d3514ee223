import type { ServerOptions as Http2ServerOptions } from 'node:http2';
import type { ProxyLimits } from '../limits.js';

/** Streams one client connection may have open at once (advertised in SETTINGS, enforced by nghttp2). */
export const H2_MAX_CONCURRENT_STREAMS = 100;

/**
 * The HTTP/2 server's limits against abuse of the protocol itself, each enforced by nghttp2 or
 * Node's session (docs/hardening.md lists them with their tests):
 *
 * - a header block (HPACK-decoded, CONTINUATION frames included) over `maxHeaderBytes`, or with
 *   more fields than `maxHeaderCount` (plus the four pseudo-headers), is refused; an HPACK bomb
 *   (a small block that decodes large) hits the same bound, and the dynamic table stays 4 KiB;
 * - at most 100 concurrent streams per connection; streams opened and reset at once (rapid
 *   reset) are bounded by nghttp2's reset-rate limit, and refused streams close the session
 *   (exchange.ts starts no upstream request for a stream already reset when its turn comes);
 * - SETTINGS without acknowledgement, PING and other frames the proxy must answer are bounded
 *   (`maxSettings`, `maxOutstandingPings`, nghttp2's outbound-queue flood check);
 * - a session's buffered memory (a client that stops reading) is capped by `maxSessionMemory`,
 *   past which new streams are refused; flow control keeps the upstream from being read faster
 *   than the client reads.
 */
export function h2ServerOptions(l: ProxyLimits): Http2ServerOptions {
  return {
    maxHeaderListPairs: l.maxHeaderCount + 4,
    maxSessionMemory: 16, // MiB per connection
    maxSettings: 32,
    maxOutstandingPings: 10,
    maxSessionInvalidFrames: 100,
    maxSessionRejectedStreams: 100,
    peerMaxConcurrentStreams: H2_MAX_CONCURRENT_STREAMS,
    settings: {
      maxConcurrentStreams: H2_MAX_CONCURRENT_STREAMS,
      maxHeaderListSize: l.maxHeaderBytes,
      headerTableSize: 4096,
      enablePush: false,
    },
  };
}
