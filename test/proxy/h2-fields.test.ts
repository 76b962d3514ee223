/** readH2Request (src/proxy/h2/fields.ts) without sockets: what an HTTP/2 header block becomes, or why it is refused. */
import { describe, expect, it } from 'vitest';
import { ProxyError } from '../../src/proxy/errors.js';
import { readH2Request } from '../../src/proxy/h2/fields.js';

const P = [':method', 'GET', ':scheme', 'https', ':path', '/a?b=1', ':authority', 'h.test:443'];

describe('readH2Request', () => {
  it('gives the plan :method, :path and :authority as the one host; cookies joined; te: trailers dropped', () => {
    const r = readH2Request([...P, 'cookie', 'a=1', 'x-k', 'v', 'cookie', 'b=2', 'te', 'trailers']);
    if (r instanceof ProxyError) throw r;
    expect(r.facts).toEqual({ method: 'GET', target: '/a?b=1', version: 20, rawHeaders: ['x-k', 'v', 'cookie', 'a=1; b=2', 'host', 'h.test:443'] });
    expect(r.fields).toEqual(['x-k', 'v', 'cookie', 'a=1; b=2']);
    expect(r.hostField).toBeUndefined();
  });

  it('a host field besides :authority is kept for its own check; host alone stands for :authority', () => {
    const both = readH2Request([...P, 'host', 'other:443']);
    expect(both instanceof ProxyError ? both : both.hostField).toBe('other:443');
    const alone = readH2Request([':method', 'GET', ':scheme', 'https', ':path', '/', 'host', 'h.test']);
    expect(alone instanceof ProxyError ? alone : alone.facts.rawHeaders).toEqual(['host', 'h.test']);
  });

  it.each([
    ['transfer-encoding', [...P, 'transfer-encoding', 'chunked']],
    ['connection', [...P, 'connection', 'close']],
    ['keep-alive', [...P, 'keep-alive', '5']],
    ['upgrade', [...P, 'upgrade', 'h2c']],
    ['proxy-connection', [...P, 'proxy-connection', 'close']],
    ['te other than trailers', [...P, 'te', 'gzip']],
    ['content-length list', [...P, 'content-length', '5, 5']],
    ['content-length sign', [...P, 'content-length', '+5']],
    ['two content-lengths', [...P, 'content-length', '5', 'content-length', '5']],
    ['two host fields', [...P, 'host', 'a', 'host', 'a']],
    ['CR LF in a value', [...P, 'x', 'a\r\nb: c']],
    ['NUL in a value', [...P, 'x', 'a\0']],
    ['leading space in a value', [...P, 'x', ' a']],
    ['upper case name', [...P, 'X', 'a']],
    ['colon in a name', [...P, 'x:y', 'a']],
    ['CR LF in :path', [':method', 'GET', ':scheme', 'https', ':path', '/a\r\nX: y', ':authority', 'h']],
    ['pseudo after a field', [':method', 'GET', 'x', 'y', ':scheme', 'https', ':path', '/']],
    ['unknown pseudo', [...P, ':protocol', 'websocket']],
    ['repeated pseudo', [...P, ':path', '/b']],
    ['no :path', [':method', 'GET', ':scheme', 'https', ':authority', 'h']],
    ['CONNECT', [':method', 'CONNECT', ':scheme', 'https', ':path', '/', ':authority', 'h']],
    ['http scheme', [':method', 'GET', ':scheme', 'http', ':path', '/', ':authority', 'h']],
    ['bad method', [':method', 'G T', ':scheme', 'https', ':path', '/', ':authority', 'h']],
  ])('refuses %s with a 400', (_name, raw) => {
    const r = readH2Request(raw);
    expect(r).toBeInstanceOf(ProxyError);
    expect((r as ProxyError).status).toBe(400);
  });
});
