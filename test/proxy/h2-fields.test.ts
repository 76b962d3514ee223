/** readH2Request (src/proxy/h2/fields.ts) without sockets: what an HTTP/2 header block becomes, or why it is refused. */
import http2 from 'node:http2';
import type net from 'node:net';
import { describe, expect, it } from 'vitest';
import { ProxyError } from '../../src/proxy/errors.js';
import { readH2Request, repeatedSingleValue, SINGLE_VALUE } from '../../src/proxy/h2/fields.js';

const P = [':method', 'GET', ':scheme', 'https', ':path', '/a?b=1', ':authority', 'h.test:443'];

describe('readH2Request', () => {
  it('gives the plan :method, :path and :authority as the one host; cookies joined; te: trailers noted, not a field', () => {
    const r = readH2Request([...P, 'cookie', 'a=1', 'x-k', 'v', 'cookie', 'b=2', 'te', 'trailers']);
    if (r instanceof ProxyError) throw r;
    expect(r.facts).toEqual({ method: 'GET', target: '/a?b=1', version: 20, rawHeaders: ['x-k', 'v', 'cookie', 'a=1; b=2', 'host', 'h.test:443'] });
    expect(r.fields).toEqual(['x-k', 'v', 'cookie', 'a=1; b=2']);
    expect(r.hostField).toBeUndefined();
    expect(r.trailers).toBe(true);
    const without = readH2Request([...P, 'x-k', 'v']);
    expect(without instanceof ProxyError ? without : without.trailers).toBe(false);
  });

  it('te: trailers in any letter case (a token, as RFC 9113 8.2.2 and nghttp2 read it) is noted, not refused', () => {
    for (const v of ['Trailers', 'TRAILERS', 'tRaIlErS']) {
      const r = readH2Request([...P, 'te', v]);
      expect(r instanceof ProxyError ? r.reason : r.trailers).toBe(true);
    }
    for (const v of ['trailers, gzip', 'trailer', 'trailers;q=1']) expect(readH2Request([...P, 'te', v])).toBeInstanceOf(ProxyError);
  });

  it('list fields may repeat (accept, x- fields); fields that take one value may not', () => {
    const r = readH2Request([...P, 'accept', 'a', 'accept', 'b', 'x-k', '1', 'x-k', '2']);
    expect(r instanceof ProxyError ? r : r.fields).toEqual(['accept', 'a', 'accept', 'b', 'x-k', '1', 'x-k', '2']);
    for (const name of ['content-type', 'user-agent', 'authorization', 'range', 'if-match']) {
      const twice = readH2Request([...P, name, 'a', 'x', 'y', name, 'b']);
      expect(twice).toBeInstanceOf(ProxyError);
      expect((twice as ProxyError).status).toBe(400);
      expect((twice as ProxyError).reason).toBe(`more than one ${name} field in an HTTP/2 request (it takes one value)`);
      // The value is the client's: it is never quoted in the reason.
      expect((twice as ProxyError).reason).not.toMatch(/\ba\b|\bb\b/);
    }
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

describe('SINGLE_VALUE', () => {
  it('repeatedSingleValue reads names in any case (HTTP/1.1 answers) and finds the first repeated one', () => {
    expect(repeatedSingleValue(['Content-Type', 'a', 'X-A', '1', 'content-type', 'b'])).toBe('content-type');
    expect(repeatedSingleValue(['Vary', 'a', 'vary', 'b', 'Set-Cookie', 'x', 'set-cookie', 'y'])).toBeUndefined();
    expect(repeatedSingleValue([])).toBeUndefined();
  });

  it('is exactly the set of fields the running node:http2 refuses to send twice', async () => {
    // Every field name Node knows (http2.constants), each sent twice on a real session: the ones
    // Node refuses are the ones keygate must refuse or not relay, before Node throws mid-exchange.
    const server = http2.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const session = http2.connect(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`);
    session.on('error', () => undefined);
    const names = Object.entries(http2.constants)
      .filter(([k]) => k.startsWith('HTTP2_HEADER_'))
      .map(([, v]) => String(v))
      .filter((n) => !n.startsWith(':'));
    const refused = new Set<string>();
    try {
      for (const name of names) {
        try {
          const req = session.request({ ':path': '/', [name]: ['a', 'b'] });
          req.on('error', () => undefined);
          req.close();
        } catch (err) {
          if ((err as { code?: string }).code === 'ERR_HTTP2_HEADER_SINGLE_VALUE') refused.add(name);
        }
      }
    } finally {
      session.destroy();
      server.close();
    }
    expect(names.length).toBeGreaterThan(60);
    expect([...refused].sort()).toEqual([...SINGLE_VALUE].sort());
  });
});
