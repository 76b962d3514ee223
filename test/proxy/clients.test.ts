import { spawn, spawnSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import tls from 'node:tls';
import { request } from 'undici';
import WebSocket from 'ws';
import { describe, expect, it } from 'vitest';
import { connectTunnel, tlsOverTunnel } from '../helpers/connect.js';
import { CONFIG, OPAQUE, SECRET, useProxyFixture } from './fixture.js';
import { eventually } from './hardening-helpers.js';

/** Runs a command without blocking this process (the origin lives here and must keep answering). */
function run(cmd: string, args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

type Echo = { method: string; url: string; host: string; headers: [string, string][] };
const named = (e: Echo, name: string) => e.headers.filter(([k]) => k.toLowerCase() === name).map(([, v]) => v);

const fx = useProxyFixture();

async function get(host: string, path: string, headers: string[] | Record<string, string> = {}): Promise<{ status: number; echo: Echo }> {
  const res = await request(fx.f.url(host, path), { dispatcher: fx.agent, headers });
  const text = await res.body.text();
  return { status: res.statusCode, echo: JSON.parse(text) as Echo };
}

describe('undici ProxyAgent', () => {
  it('injects the secret for a matching host and path, exactly once', async () => {
    const { status, echo } = await get('api.test.local', '/repos/keygate/issues?state=open');
    expect(status).toBe(200);
    expect(named(echo, 'authorization')).toEqual([`Bearer ${SECRET}`]);
    expect(echo.url).toBe('/repos/keygate/issues?state=open');
    expect(echo.host).toBe(`api.test.local:${fx.f.origin.port}`);
  });

  it('replaces client-sent headers of the same name, any case, duplicates included', async () => {
    const { echo } = await get('api.test.local', '/repos/x', ['authorization', 'Bearer client-1', 'AUTHORIZATION', 'Bearer client-2', 'x-other', 'kept']);
    expect(named(echo, 'authorization')).toEqual([`Bearer ${SECRET}`]);
    expect(named(echo, 'x-other')).toEqual(['kept']);
  });

  it('forwards a path that matched only after normalisation as the normalised path', async () => {
    const { echo } = await get('api.test.local', '/repos/a/../%62');
    expect(echo.url).toBe('/repos/b');
    expect(named(echo, 'authorization')).toEqual([`Bearer ${SECRET}`]);
  });

  it('injects nothing for a non-matching path (client header passes unchanged)', async () => {
    const { echo } = await get('api.test.local', '/user', { authorization: 'Bearer mine' });
    expect(named(echo, 'authorization')).toEqual(['Bearer mine']);
    expect(named(echo, 'x-api-key')).toEqual([]);
    const repos = await get('api.test.local', '/repos');
    expect(named(repos.echo, 'authorization')).toEqual([]);
  });

  it('injects nothing for another host of the same domain without a matching rule path', async () => {
    const { echo } = await get('other.test.local', '/repos/x');
    expect(named(echo, 'authorization')).toEqual([]);
    expect(named(echo, 'x-api-key')).toEqual([]);
  });

  it('wildcard: any depth below the domain, opaque and plaintext values, never the apex', async () => {
    for (const host of ['a.test.local', 'x.y.test.local']) {
      const { echo } = await get(host, '/w/thing');
      expect(named(echo, 'x-api-key')).toEqual([OPAQUE]);
      expect(named(echo, 'x-plain')).toEqual(['plain-value']);
    }
    const apex = await get('test.local', '/w/thing');
    expect(named(apex.echo, 'x-api-key')).toEqual([]);
  });

  it('rule-level and config-level no_proxy get no injection', async () => {
    expect(named((await get('skip.test.local', '/w/thing')).echo, 'x-api-key')).toEqual([]);
    expect(named((await get('bypass.test.local', '/w/thing')).echo, 'x-api-key')).toEqual([]);
    expect(named((await get('bypass.test.local', '/repos/x')).echo, 'authorization')).toEqual([]);
  });

  it('logs one line per request with decision, rule and header names only', async () => {
    await get('api.test.local', '/repos/logged?token=abc');
    // Info lines are written in batches (every 100 ms by default): wait for it, within a bound.
    const find = () => fx.f.proxy.logs().find((l) => l.msg === 'request' && l.path === '/repos/logged');
    expect(await eventually(() => find() !== undefined, 2000)).toBe(true);
    const line = find();
    expect(line).toMatchObject({ decision: 'intercept', rule: 'api-repos', injected: ['authorization'], status: 200, method: 'GET', host: 'api.test.local' });
    expect(typeof line!.duration_ms).toBe('number');
    expect(typeof line!.bytes_out).toBe('number');
    expect(JSON.stringify(fx.f.proxy.logs())).not.toContain('token=abc');
  });
});

describe('blind tunnels are not intercepted', () => {
  async function peer(host: string): Promise<X509Certificate> {
    const c = await connectTunnel(fx.f.proxy.port, `${host}:${fx.f.origin.port}`);
    expect(c.status).toBe(200);
    const t = await tlsOverTunnel(c.socket, host, [fx.f.proxy.caPem, fx.f.pki.caPem]);
    const cert = new X509Certificate(t.getPeerCertificate(false).raw);
    t.destroy();
    return cert;
  }

  it('the client sees the origin’s own certificate for no_proxy and unmatched hosts', async () => {
    for (const host of ['bypass.test.local', 'skip.test.local', 'test.local']) {
      const cert = await peer(host);
      expect(cert.fingerprint256).toBe(fx.f.pki.fingerprint256);
      expect(cert.issuer).toContain('keygate test origin CA');
    }
  });

  it('an intercepted host gets a certificate minted by the keygate CA', async () => {
    const cert = await peer('api.test.local');
    expect(cert.fingerprint256).not.toBe(fx.f.pki.fingerprint256);
    expect(cert.checkIssued(new X509Certificate(fx.f.proxy.caPem))).toBe(true);
    expect(cert.subjectAltName).toBe('DNS:api.test.local');
  });

  it('logs tunnels with their decision', async () => {
    const tunnels = () => fx.f.proxy.logs().filter((l) => l.type === 'tunnel' && l.phase === 'close');
    expect(await eventually(() => tunnels().some((l) => l.host === 'bypass.test.local' && l.decision === 'bypass'))).toBe(true);
    // Each line is written when its tunnel closes: the last one may still be on its way.
    expect(await eventually(() => tunnels().some((l) => l.host === 'test.local' && l.decision === 'tunnel'))).toBe(true);
  });
});

describe('curl', () => {
  it('gets the injected header through -x with --cacert', async () => {
    const r = await run('curl', ['-sS', '--max-time', '20', '-x', fx.f.proxy.url, '--cacert', fx.f.proxy.caPath, '-H', 'Authorization: Bearer curl-own', fx.f.url('api.test.local', '/repos/curl')]);
    expect(r.stderr).toBe('');
    const echo = JSON.parse(r.stdout) as Echo;
    expect(named(echo, 'authorization')).toEqual([`Bearer ${SECRET}`]);
  });

  it('reaches a blind-tunnelled host with the origin’s CA only', async () => {
    const r = await run('curl', ['-sS', '--max-time', '20', '-x', fx.f.proxy.url, '--cacert', fx.f.bundlePath, fx.f.url('test.local', '/w/x')]);
    expect(r.status).toBe(0);
    expect(named(JSON.parse(r.stdout) as Echo, 'x-api-key')).toEqual([]);
  });
});

function pythonWithRequests(): string | undefined {
  for (const py of ['python3', '/usr/bin/python3', 'python']) {
    const r = spawnSync(py, ['-c', 'import requests'], { encoding: 'utf8' });
    if (r.status === 0) return py;
  }
  return undefined;
}

describe('Python requests', () => {
  const py = pythonWithRequests();
  it.skipIf(!py)('uses proxies= and verify=bundle', async () => {
    const script = `
import json, sys, requests
r = requests.get(sys.argv[1], proxies={"https": sys.argv[2]}, verify=sys.argv[3], headers={"authorization": "py-own"}, timeout=20)
print(json.dumps({"status": r.status_code, "echo": r.json()}))
`;
    const r = await run(py!, ['-c', script, fx.f.url('x.y.test.local', '/w/py'), fx.f.proxy.url, fx.f.bundlePath]);
    expect(r.stderr).toBe('');
    const out = JSON.parse(r.stdout) as { status: number; echo: Echo };
    expect(out.status).toBe(200);
    expect(named(out.echo, 'x-api-key')).toEqual([OPAQUE]);
    expect(named(out.echo, 'authorization')).toEqual(['py-own']);
  });
});

describe('WebSocket through an intercepted tunnel', () => {
  async function open(host: string, path: string, headers: Record<string, string> = {}): Promise<{ ws: WebSocket; first: { url: string; headers: [string, string][] } }> {
    const c = await connectTunnel(fx.f.proxy.port, `${host}:${fx.f.origin.port}`);
    expect(c.status).toBe(200);
    const ws = new WebSocket(fx.f.url(host, path).replace('https:', 'wss:'), {
      headers,
      createConnection: () => tls.connect({ socket: c.socket, servername: host, ca: [fx.f.proxy.caPem, fx.f.pki.caPem] }),
    } as WebSocket.ClientOptions);
    const first = await new Promise<{ url: string; headers: [string, string][] }>((resolve, reject) => {
      ws.once('message', (d) => resolve(JSON.parse(String(d))));
      ws.once('error', reject);
    });
    return { ws, first };
  }

  it('injects the rule headers into the upgrade request and splices the sockets', async () => {
    const { ws, first } = await open('api.test.local', '/ws', { Authorization: 'Bearer client' });
    const auth = first.headers.filter(([k]) => k.toLowerCase() === 'authorization').map(([, v]) => v);
    expect(auth).toEqual([`Bearer ${SECRET}`]);
    expect(first.headers.some(([k, v]) => k.toLowerCase() === 'upgrade' && v.toLowerCase() === 'websocket')).toBe(true);
    const echoed = await new Promise<string>((resolve) => {
      ws.once('message', (d) => resolve(String(d)));
      ws.send('hello through keygate');
    });
    expect(echoed).toBe('hello through keygate');
    ws.close();
  });

  it('passes an upgrade on a non-matching path without injection', async () => {
    const { ws, first } = await open('api.test.local', '/other-ws');
    expect(first.headers.filter(([k]) => k.toLowerCase() === 'authorization')).toEqual([]);
    ws.close();
  });
});

// Keep the fixture's configuration honest: the rule names used above exist.
it('fixture sanity', () => expect(CONFIG.rules.map((r) => r.name)).toContain('api-repos'));
