// examples/github-agent end to end: the app (real CLI process) holds no token and reaches a local
// HTTPS "GitHub" only through HTTPS_PROXY. The proxy here is a minimal intercepting proxy written
// in this test (the auth proxy sidecar, src/proxy/server.ts, was not committed yet when this was
// written): it terminates TLS for the CONNECT host with its own certificate (which the app trusts
// through NODE_EXTRA_CA_CERTS, as in a sandbox) and adds Authorization before forwarding.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT, startCli, type RunningCli } from '../helpers/cli.js';
import { names, streamRun } from './sse-client.js';

const SECRET = 'ghp_test_secret_never_in_the_app_0123456789';
const HOST = 'api.github.test';

let tmp: string;
let origin: https.Server;
let proxy: http.Server;
let inner: http.Server;
let app: RunningCli;
let inject = true;
const originSaw: http.IncomingHttpHeaders[] = [];
const connects: string[] = [];

function selfSigned(name: string, dir: string): { key: string; cert: string; certFile: string } {
  const keyFile = path.join(dir, `${name}-key.pem`);
  const certFile = path.join(dir, `${name}.pem`);
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', keyFile, '-out', certFile, '-days', '2', '-subj', `/CN=${HOST} (${name})`,
    '-addext', `subjectAltName=DNS:${HOST}`,
  ], { stdio: 'ignore' });
  return { key: readFileSync(keyFile, 'utf8'), cert: readFileSync(certFile, 'utf8'), certFile };
}

function listen(server: http.Server | https.Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)));
}

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-gh-example-'));
  const originTls = selfSigned('origin', tmp);
  const proxyTls = selfSigned('proxy', tmp);

  origin = https.createServer({ key: originTls.key, cert: originTls.cert }, (req, res) => {
    originSaw.push(req.headers);
    if (req.headers.authorization !== `Bearer ${SECRET}`) {
      res.writeHead(401, { 'content-type': 'application/json' }).end('{"message":"Requires authentication"}');
      return;
    }
    if (req.url === '/repos/octocat/Hello-World') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({ full_name: 'octocat/Hello-World', description: 'My first repository on GitHub!', stargazers_count: 42, language: null }),
      );
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' }).end('{"message":"Not Found"}');
  });
  const originPort = await listen(origin);

  // Requests arriving inside an intercepted tunnel: add the credential, forward to the origin.
  inner = http.createServer((req, res) => {
    const headers = { ...req.headers };
    if (inject) headers.authorization = `Bearer ${SECRET}`;
    const up = https.request(
      { host: '127.0.0.1', port: originPort, servername: HOST, ca: originTls.cert, method: req.method, path: req.url, headers },
      (ur) => {
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        ur.pipe(res);
      },
    );
    up.on('error', () => res.writeHead(502).end());
    req.pipe(up);
  });
  proxy = http.createServer((_req, res) => res.writeHead(400).end());
  proxy.on('connect', (req, socket) => {
    connects.push(req.url ?? '');
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    const tlsSocket = new tls.TLSSocket(socket, { isServer: true, key: proxyTls.key, cert: proxyTls.cert });
    tlsSocket.on('error', () => socket.destroy());
    inner.emit('connection', tlsSocket);
  });
  const proxyPort = await listen(proxy);

  app = await startCli(['app', 'serve', '--app', path.join(REPO_ROOT, 'examples/github-agent'), '--listen', '127.0.0.1:0'], {
    env: {
      KEYGATE_API_KEY: 'test-key',
      HTTPS_PROXY: `http://127.0.0.1:${proxyPort}`,
      HTTP_PROXY: `http://127.0.0.1:${proxyPort}`,
      // Empty lower-case variables must not hide the upper-case ones (undici alone would go
      // direct here, around the proxy; ctx.fetch treats empty as unset, as curl does).
      https_proxy: '',
      http_proxy: '',
      NO_PROXY: '',
      no_proxy: '',
      NODE_EXTRA_CA_CERTS: proxyTls.certFile,
      GITHUB_API_URL: `https://${HOST}`,
    },
  });
});

afterAll(async () => {
  await app?.stop('SIGKILL');
  for (const s of [proxy, inner, origin]) {
    s?.closeAllConnections?.();
    await new Promise((r) => (s ? s.close(() => r(null)) : r(null)));
  }
  rmSync(tmp, { recursive: true, force: true });
});

describe('examples/github-agent through HTTPS_PROXY', () => {
  it('gets the repository with the credential the proxy injected, holding none itself', async () => {
    inject = true;
    const r = await streamRun(app.url, {
      assistant_id: 'repo',
      input: { messages: [{ role: 'user', content: 'Tell me about octocat/Hello-World' }] },
      stream_mode: ['updates', 'messages-tuple', 'custom'],
    });
    expect(r.status).toBe(200);
    expect(names(r)[0]).toBe('metadata');
    expect(names(r).at(-1)).toBe('end');
    expect(names(r), JSON.stringify(r.events)).not.toContain('error');
    expect(r.events[1]).toMatchObject({ event: 'updates', data: { fetch: { repository: 'octocat/Hello-World', status: 200 } } });
    const text = r.events
      .filter((e) => e.event === 'messages')
      .map((e) => (e.data as [{ content: string }])[0].content)
      .join('');
    expect(text).toBe('octocat/Hello-World: My first repository on GitHub! (42 stars)');
    expect(r.events.find((e) => e.event === 'custom')?.data).toEqual({ stars: 42 });

    expect(connects).toContain(`${HOST}:443`);
    const seen = originSaw.at(-1)!;
    expect(seen.authorization).toBe(`Bearer ${SECRET}`);
    expect(seen['user-agent']).toBe('keygate-example-github-agent');
    expect(app.output()).not.toContain(SECRET);
  });

  it('without the injected credential the API refuses and the run ends with error then end', async () => {
    inject = false;
    try {
      const r = await streamRun(app.url, {
        assistant_id: 'repo',
        input: { messages: [{ role: 'human', content: 'octocat/Hello-World' }] },
        stream_mode: 'updates',
      });
      expect(names(r)).toEqual(['metadata', 'updates', 'error', 'end']);
      expect(r.events[1].data).toEqual({ fetch: { repository: 'octocat/Hello-World', status: 401 } });
      expect(r.events[2].data).toEqual({ error: 'UpstreamError', message: 'GitHub answered 401 for octocat/Hello-World' });
      expect(originSaw.at(-1)!.authorization).toBeUndefined();
    } finally {
      inject = true;
    }
  });

  it('a message without owner/name fails with a clear error', async () => {
    const r = await streamRun(app.url, { assistant_id: 'repo', input: { messages: [{ role: 'user', content: 'hello' }] } });
    expect(names(r)).toEqual(['metadata', 'values', 'error', 'end']);
    expect(r.events[2].data).toMatchObject({ error: 'Error', message: expect.stringContaining('owner/name') });
  });
});
