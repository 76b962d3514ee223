import net from 'node:net';
import { ProxyAgent, request } from 'undici';
import { describe, expect, it } from 'vitest';
import { connectTunnel, rawExchange, requestThroughTunnel, tlsOverTunnel } from '../helpers/connect.js';
import { SECRET, useProxyFixture } from './fixture.js';

const fx = useProxyFixture();

function tunnelRequest(requestLine: string, headers: [string, string][], host = 'api.test.local') {
  return requestThroughTunnel({
    proxyPort: fx.f.proxy.port,
    authority: `${host}:${fx.f.origin.port}`,
    servername: host,
    ca: fx.f.proxy.caPem,
    requestLine,
    headers,
  });
}

function expectProxyError(res: { status: number; headers: Record<string, unknown>; body: string }, status: number, body: RegExp) {
  expect(res.status).toBe(status);
  expect(String(res.headers['proxy-status'])).toMatch(/^keygate; error=[a-z_]+; details="/);
  expect(res.body).toMatch(body);
  expect(res.body).not.toContain(SECRET);
}

describe('421: the CONNECT target is the only destination', () => {
  it('refuses a Host header naming another host, and nothing reaches the origin', async () => {
    const before = fx.f.origin.requests;
    const res = await tunnelRequest('GET /repos/x HTTP/1.1', [['Host', `other.test.local:${fx.f.origin.port}`]]);
    expectProxyError(res, 421, /does not match the tunnel/);
    expect(fx.f.origin.requests).toBe(before);
  });

  it('refuses a Host header with another port', async () => {
    const res = await tunnelRequest('GET /repos/x HTTP/1.1', [['Host', 'api.test.local']]);
    expect(res.status).toBe(421);
  });

  it('refuses an absolute URI naming another authority', async () => {
    const before = fx.f.origin.requests;
    const res = await tunnelRequest(`GET https://other.test.local:${fx.f.origin.port}/repos/x HTTP/1.1`, [['Host', `api.test.local:${fx.f.origin.port}`]]);
    expectProxyError(res, 421, /inside a tunnel/);
    expect(fx.f.origin.requests).toBe(before);
  });

  it('accepts an absolute URI naming the tunnel target, and a Host in another spelling', async () => {
    const res = await tunnelRequest(`GET https://API.test.local:${fx.f.origin.port}/repos/x HTTP/1.1`, [['Host', `api.TEST.local.:${fx.f.origin.port}`]]);
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body).headers).toContainEqual(['authorization', `Bearer ${SECRET}`]);
  });

  it('refuses two Host headers', async () => {
    const res = await tunnelRequest('GET /repos/x HTTP/1.1', [
      ['Host', `api.test.local:${fx.f.origin.port}`],
      ['Host', `other.test.local:${fx.f.origin.port}`],
    ]);
    expect(res.status).toBe(400);
  });
});

describe('502/504: upstream failures', () => {
  it('502 with a reason for an origin whose certificate is not trusted, nothing sent to it', async () => {
    const res = await request(fx.f.url('evil.test.local', '/anything'), { dispatcher: fx.agent });
    const body = await res.body.text();
    expect(res.statusCode).toBe(502);
    expect(String(res.headers['proxy-status'])).toContain('error=tls_certificate_error');
    expect(body).toMatch(/certificate of evil\.test\.local not trusted/);
    expect(fx.f.evil.requests).toBe(0);
  });

  it('502 for a blind tunnel to a closed port (CONNECT answered only after the upstream connects)', async () => {
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise((r) => closed.close(r));
    const c = await connectTunnel(fx.f.proxy.port, `127.0.0.1:${port}`);
    expect(c.status).toBe(502);
    expect(c.head).toMatch(/Proxy-Status: keygate; error=connection_refused/);
  });
});

describe('403: no credentials over cleartext, no loops', () => {
  it('refuses plain http:// to a rule host (absolute-form)', async () => {
    const before = fx.f.origin.requests;
    const plain = new ProxyAgent({ uri: fx.f.proxy.url, proxyTunnel: false });
    try {
      const res = await request(`http://api.test.local:${fx.f.origin.port}/repos/x`, { dispatcher: plain });
      const body = await res.body.text();
      expect(res.statusCode).toBe(403);
      expect(body).toMatch(/credentials are injected only over HTTPS/);
      expect(res.headers['proxy-status']).toMatch(/^keygate; error=http_request_denied/);
    } finally {
      await plain.close();
    }
    expect(fx.f.origin.requests).toBe(before);
  });

  it('refuses cleartext HTTP sent through a CONNECT tunnel to a rule host', async () => {
    const before = fx.f.origin.requests;
    const res = await request(`http://api.test.local:${fx.f.origin.port}/repos/x`, { dispatcher: fx.agent });
    expect(res.statusCode).toBe(403);
    expect(await res.body.text()).toMatch(/only over HTTPS/);
    expect(fx.f.origin.requests).toBe(before);
  });

  it('refuses CONNECT to the proxy itself', async () => {
    const c = await connectTunnel(fx.f.proxy.port, `127.0.0.1:${fx.f.proxy.port}`);
    expect(c.status).toBe(403);
    const l = await connectTunnel(fx.f.proxy.port, `localhost:${fx.f.proxy.port}`);
    expect(l.status).toBe(403);
  });
});

describe('plain HTTP forwarding for other hosts', () => {
  it('forwards absolute-form http:// untouched for a non-rule host', async () => {
    const http = await import('node:http');
    const server = http.createServer((req, res) => res.end(JSON.stringify({ url: req.url, headers: req.rawHeaders })));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as net.AddressInfo).port;
    try {
      const s = net.connect(fx.f.proxy.port, '127.0.0.1');
      const res = await rawExchange(
        s,
        `GET http://127.0.0.1:${port}/plain?q=1 HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nX-Mine: yes\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nConnection: close\r\n\r\n`,
      );
      const echo = JSON.parse(res.body) as { url: string; headers: string[] };
      expect(res.status).toBe(200);
      expect(echo.url).toBe('/plain?q=1');
      expect(echo.headers).toContain('X-Mine');
      expect(echo.headers.map((h) => h.toLowerCase())).not.toContain('proxy-authorization');
    } finally {
      server.close();
    }
  });
});

describe('400: malformed', () => {
  it('refuses CONNECT to a host that does not parse', async () => {
    for (const target of ['bad..host:443', 'bad_host%2e:443', 'a b:443', 'api.test.local', 'api.test.local:0', '[::1:443']) {
      const c = await connectTunnel(fx.f.proxy.port, target.replace(' ', '%20'));
      expect(c.status, target).toBe(400);
      expect(c.head).toMatch(/Proxy-Status: keygate; error=http_request_error/);
    }
  });

  it.each(['/repos/..%2fadmin', '/repos/%2F', '/repos/%5Cadmin', '/../admin', '/repos/%252e%252e/admin', '/repos/a%00'])('refuses the path %s', async (p) => {
    const before = fx.f.origin.requests;
    const res = await tunnelRequest(`GET ${p} HTTP/1.1`, [['Host', `api.test.local:${fx.f.origin.port}`]]);
    expectProxyError(res, 400, /./);
    expect(fx.f.origin.requests).toBe(before);
  });

  it('resolves an encoded traversal before matching: /repos/%2e%2e/admin is /admin, not a /repos/* request', async () => {
    const res = await tunnelRequest('GET /repos/%2e%2e/admin HTTP/1.1', [['Host', `api.test.local:${fx.f.origin.port}`]]);
    expect(res.status).toBe(200);
    const echo = JSON.parse(res.body) as { url: string; headers: [string, string][] };
    expect(echo.url).toBe('/admin');
    expect(echo.headers.filter(([k]) => k === 'authorization')).toEqual([]);
  });

  it('refuses an origin-form request to the proxy itself and garbage', async () => {
    const s1 = net.connect(fx.f.proxy.port, '127.0.0.1');
    const r1 = await rawExchange(s1, 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    expectProxyError(r1, 400, /absolute-form/);
    const s2 = net.connect(fx.f.proxy.port, '127.0.0.1');
    const r2 = await rawExchange(s2, 'HELLO\r\n\r\n');
    expect(r2.status).toBe(400);
  });
});

describe('hop-by-hop headers', () => {
  it('are not forwarded upstream', async () => {
    const res = await tunnelRequest('GET /repos/hop HTTP/1.1', [
      ['Host', `api.test.local:${fx.f.origin.port}`],
      ['Connection', 'X-Custom-Hop'],
      ['X-Custom-Hop', 'drop-me'],
      ['Keep-Alive', 'timeout=5'],
      ['Proxy-Authorization', 'Basic Zm9vOmJhcg=='],
      ['Proxy-Connection', 'keep-alive'],
      ['TE', 'trailers'],
      ['Trailer', 'X-T'],
      ['Upgrade', 'h2c'],
      ['X-End-To-End', 'keep-me'],
    ]);
    expect(res.status).toBe(200);
    const names = (JSON.parse(res.body) as { headers: [string, string][] }).headers.map(([k]) => k.toLowerCase());
    for (const hop of ['x-custom-hop', 'keep-alive', 'proxy-authorization', 'proxy-connection', 'te', 'trailer', 'upgrade']) expect(names).not.toContain(hop);
    expect(names).toContain('x-end-to-end');
  });

  it('are not passed back to the client', async () => {
    const res = await request(fx.f.url('api.test.local', '/hop'), { dispatcher: fx.agent });
    await res.body.text();
    expect(res.headers['x-hop']).toBeUndefined();
    expect(res.headers['x-end-to-end']).toBe('kept');
  });
});

describe('keep-alive inside a tunnel', () => {
  it('serves several requests on one intercepted connection, each checked and injected', async () => {
    const c = await connectTunnel(fx.f.proxy.port, `api.test.local:${fx.f.origin.port}`);
    const t = await tlsOverTunnel(c.socket, 'api.test.local', fx.f.proxy.caPem);
    const { default: http } = await import('node:http');
    const ka = new http.Agent({ keepAlive: true, maxSockets: 1 });
    (ka as unknown as { createConnection: () => unknown }).createConnection = () => t;
    const one = (p: string) =>
      new Promise<string>((resolve, reject) => {
        http.get({ agent: ka, host: 'api.test.local', port: fx.f.origin.port, path: p }, (res) => {
          let b = '';
          res.on('data', (d) => (b += d));
          res.on('end', () => resolve(b));
        }).on('error', reject);
      });
    const a = JSON.parse(await one('/repos/1')) as { headers: [string, string][] };
    const b = JSON.parse(await one('/user')) as { headers: [string, string][] };
    expect(a.headers).toContainEqual(['authorization', `Bearer ${SECRET}`]);
    expect(b.headers.filter(([k]) => k === 'authorization')).toEqual([]);
    ka.destroy();
    t.destroy();
  });
});
