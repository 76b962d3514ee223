/**
 * The one error module (src/proxy/errors.ts): every failure keygate's own code reports with a
 * lower layer's code (layerError) maps to a deliberate answer, and no reason carries the
 * failure's own message (only fixed sentences, host names and codes go out).
 */
import { describe, expect, it } from 'vitest';
import { layerError, ProxyError, upstreamError, type LayerCode } from '../../src/proxy/errors.js';

const HOST = 'api.example.test';

describe('layerError and upstreamError', () => {
  const table: [LayerCode, number, string, string][] = [
    ['ECONNRESET', 502, 'connection_terminated', `upstream ${HOST} closed the connection`],
    ['UND_ERR_SOCKET', 502, 'connection_terminated', `upstream ${HOST} closed the connection`],
    ['UND_ERR_CLOSED', 502, 'connection_terminated', `upstream ${HOST} closed the connection`],
    ['ETIMEDOUT', 504, 'connection_timeout', `connecting to ${HOST} timed out`],
    ['UND_ERR_CONNECT_TIMEOUT', 504, 'connection_timeout', `connecting to ${HOST} timed out`],
    ['UND_ERR_HEADERS_TIMEOUT', 504, 'http_response_timeout', `upstream ${HOST} did not answer in time`],
    ['UND_ERR_BODY_TIMEOUT', 504, 'connection_read_timeout', `upstream ${HOST} stalled`],
    ['ENOTFOUND', 502, 'dns_error', `cannot resolve ${HOST} (ENOTFOUND)`],
    ['UND_ERR_DESTROYED', 503, 'proxy_internal_response', 'proxy is shutting down'],
    // Only ever reported once the client has gone (nobody reads the answer); the catch-all.
    ['UND_ERR_ABORTED', 502, 'proxy_internal_error', `request to ${HOST} failed (UND_ERR_ABORTED)`],
  ];

  it.each(table)('%s is a %i %s', (code, status, type, reason) => {
    const err = layerError('a message with a secret-looking sk-live-123 in it', code);
    expect(err.code).toBe(code);
    const p = upstreamError(err, HOST);
    expect(p).toBeInstanceOf(ProxyError);
    expect([p.status, p.type, p.reason]).toEqual([status, type, reason]);
    expect(p.reason).not.toContain('sk-live');
  });

  it('every code keygate fabricates is in the table (a new one needs a deliberate answer)', () => {
    // LayerCode is a type: the keys of this record must list every member, or this file does not compile.
    const all: Record<LayerCode, true> = {
      ECONNRESET: true,
      ETIMEDOUT: true,
      ENOTFOUND: true,
      UND_ERR_SOCKET: true,
      UND_ERR_CLOSED: true,
      UND_ERR_DESTROYED: true,
      UND_ERR_ABORTED: true,
      UND_ERR_CONNECT_TIMEOUT: true,
      UND_ERR_HEADERS_TIMEOUT: true,
      UND_ERR_BODY_TIMEOUT: true,
    };
    expect(Object.keys(all).sort()).toEqual(table.map(([c]) => c).sort());
  });
});
