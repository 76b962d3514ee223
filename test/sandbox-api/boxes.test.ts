import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import type { EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { findKeytool } from '../../src/certs/env.js';
import { DockerEngine } from '../../src/docker/engine.js';
import { ensureBoxImage } from '../helpers/box-image.js';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { dockerSocket } from '../helpers/docker-engine.js';
import { execIn, hostProcesses, driversUnavailable, noProcessesLeft, setUpServe, waitStatus } from './box-helpers.js';
import { api, cleanTmp, tmp, waitFor } from './helpers.js';

// Real boxes behind a real `keygate serve`, on both real drivers (local: bubblewrap; docker: a real
// engine, with an image imported from a root filesystem, no registry), a real HTTPS origin on
// loopback, everything through the HTTP API. Each security property of sandbox.md has a test here
// that fails when the property is broken. Commands inside are busybox-portable (the docker image
// has busybox and curl only).

const UNAVAILABLE = await driversUnavailable('real-box API tests');
const RESOURCES = { memory_mb: 1024, cpus: 1, pids: 512 };

const KEY = 'boxes-test-key-0123456789abcdef';
const SECRET = 'ghp_box-secret-VALUE-7777';
const ORIGIN_HOST = 'api.example.test';

let origin: EchoOrigin;
let dataDir: string;
let server: RunningCli;
let keyB: string;
let env: NodeJS.ProcessEnv;
let driver: 'local' | 'docker';
let serveArgs: string[];

const A = (method: string, url: string, body?: unknown) => api(server.url, KEY, method, url, body);
const B = (method: string, url: string, body?: unknown) => api(server.url, keyB, method, url, body);
const run = (box: string, command: string | string[], extra?: Record<string, unknown>) => execIn(server.url, KEY, box, command, extra);

const proxyConfig = () => ({
  rules: [{ name: 'example', match_hosts: [ORIGIN_HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GH_TOKEN}' }] }],
});

async function createBox(name: string, extra: Record<string, unknown> = {}) {
  const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name, wait_for_ready: true, proxy_config: proxyConfig(), ...extra });
  expect(r.status, r.text).toBe(201);
  expect(r.body.status, r.text).toBe('ready');
  return r.body;
}

const startServer = () => startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, ...serveArgs], { env });

/** A config directory whose template `box` this driver builds, with the shipped host template's resources. */
async function configFor(d: 'local' | 'docker'): Promise<string> {
  const dir = tmp();
  const image = d === 'docker' ? await ensureBoxImage(new DockerEngine(dockerSocket()!)) : undefined;
  const template = { name: 'box', description: `real ${d} box`, ...(image ? { image } : { rootfs: 'host' }), environment: { FROM_TEMPLATE: 'yes' }, resources: RESOURCES };
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, 'templates.json'), JSON.stringify([template]));
  return dir;
}

describe.each(['local', 'docker'] as const)('real boxes through the API (%s driver)', (which) => {
 describe.skipIf(UNAVAILABLE[which])(`${which}`, () => {
  beforeAll(async () => {
    driver = which;
    serveArgs = ['--sandbox-driver', which, '--config-dir', await configFor(which)];
    ({ origin, dataDir, env, keyB } = await setUpServe(KEY, ORIGIN_HOST, { KEYGATE_SANDBOX_MAX_FILE_BYTES: String(4 * 1024 * 1024) }));
    server = await startServer();
    await waitForLine(server, (l) => l.startsWith(`sandbox driver ${which}`));
    const s = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: SECRET }]);
    expect(s.status).toBe(200);
    await createBox('main');
  }, 60_000);

  afterAll(async () => {
    // Stopped boxes keep /workspace (a docker volume): delete every box so nothing is left behind.
    if (server) for (const b of (await A('GET', '/api/v2/sandboxes/boxes?limit=100')).body.resources) await A('DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
    if (server) expect(await server.stop(), server.output().slice(-3000)).toBe(0);
    await origin?.close();
    cleanTmp();
  });

  describe('property 1: the proxy is the only way out', () => {
    it('through the proxy (its env, no extra step) the request succeeds with the header injected', async () => {
      const r = await run('main', `curl -sS --max-time 10 https://${ORIGIN_HOST}:${origin.port}/api/user`);
      expect(r.exit_code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout).headers.authorization).toBe(`Bearer ${SECRET}`);
      // ... and the secret never was in the box: only the origin's echo shows it.
      const envOut = await run('main', 'env');
      expect(envOut.stdout).not.toContain(SECRET);
      expect(envOut.stdout).toContain('HTTPS_PROXY=http://127.0.0.1:3128');
    });

    it('a direct TCP connection to the same origin gets no connection at all', async () => {
      const direct = await run('main', `curl -sS --noproxy '*' --max-time 5 -k https://127.0.0.1:${origin.port}/api/user`);
      expect(direct.exit_code).not.toBe(0);
      expect(direct.stdout).toBe('');
      const hostAddrs = Object.values(os.networkInterfaces()).flat().filter((a) => a && a.family === 'IPv4' && !a.internal).map((a) => a!.address);
      const tries = await run('main', ['sh', '-c', `for h in "$@"; do curl -sS --noproxy '*' --max-time 3 -k -o /dev/null "https://$h:${origin.port}/" && echo "CONNECTED $h"; done; true`, 'sh', '127.0.0.1', 'localhost', ...hostAddrs]);
      expect(tries.stdout).toBe('');
      expect(tries.stderr).toMatch(/Failed to connect|Couldn't connect|Could not resolve/);
      const ifaces = await run('main', 'cat /proc/net/dev');
      const names = ifaces.stdout.split('\n').slice(2).map((l) => l.split(':')[0].trim()).filter(Boolean);
      expect(names).toEqual(['lo']);
    });

    it("DNS reveals nothing useful: the origin's name does not resolve inside", async () => {
      for (const name of [ORIGIN_HOST, 'example.com']) {
        const r = await run('main', `curl -sS --noproxy '*' --max-time 5 https://${name}:${origin.port}/`);
        expect(r.exit_code, name).toBe(6); // CURLE_COULDNT_RESOLVE_HOST
      }
      const hosts = await run('main', 'cat /etc/hosts /etc/resolv.conf 2>/dev/null');
      expect(hosts.stdout).not.toContain(ORIGIN_HOST);
    });

    it("property 6: through its proxy a box cannot reach keygate's API", async () => {
      const port = new URL(server.url).port;
      const r = await run('main', `curl -sS --max-time 5 -x http://127.0.0.1:3128 --noproxy '' -o /dev/null -w '%{http_code}' http://127.0.0.1:${port}/healthz; echo " rc=$?"`);
      expect(r.stdout).not.toMatch(/^200/);
    });
  });

  describe('property 3: nothing of keygate inside', () => {
    it('the data directory, CA key, master key, API key and Docker socket are not readable', async () => {
      const paths = [dataDir, path.join(dataDir, 'ca', 'ca-key.pem'), path.join(dataDir, 'master.key'), path.join(dataDir, 'keygate.db'), '/var/run/docker.sock', '/run/docker.sock'];
      for (const p of paths.slice(1, 3)) expect(existsSync(p), `${p} exists on the host (the test must look for real files)`).toBe(true);
      const r = await run('main', ['sh', '-c', 'for p in "$@"; do if [ -e "$p" ]; then echo "VISIBLE $p"; fi; if cat "$p" >/dev/null 2>&1; then echo "READABLE $p"; fi; done', 'sh', ...paths]);
      expect(r.stdout).toBe('');
      const envOut = await run('main', 'env; cat /proc/1/environ 2>/dev/null | tr "\\0" "\\n"');
      expect(envOut.stdout).not.toContain(KEY);
      expect(envOut.stdout).not.toContain(SECRET);
      expect(envOut.stdout).not.toMatch(/KEYGATE_API_KEY|KEYGATE_MASTER_KEY/);
      const ca = await run('main', 'cat /etc/keygate/ca.pem');
      expect(ca.stdout).toContain('BEGIN CERTIFICATE');
      expect(ca.stdout).not.toContain('PRIVATE KEY');
    });
  });

  describe('property 4: files stay in the box', () => {
    it('upload and download stream the bytes as the box sees them', async () => {
      const payload = Buffer.alloc(3 * 1024 * 1024 + 7, 'k');
      const put = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=/workspace/dir/in.bin`, { method: 'PUT', headers: { 'x-api-key': KEY, 'content-type': 'application/octet-stream' }, body: payload });
      expect(put.status, await put.clone().text()).toBe(201);
      expect(await put.json()).toEqual({ path: '/workspace/dir/in.bin', size: payload.length });
      const size = await run('main', 'wc -c < /workspace/dir/in.bin');
      expect(size.stdout.trim()).toBe(String(payload.length));
      await run('main', 'printf "made in the box" > /workspace/out.txt');
      const get = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=/workspace/out.txt`, { headers: { 'x-api-key': KEY } });
      expect(get.status).toBe(200);
      expect(await get.text()).toBe('made in the box');
    });

    it('a symlink or .. planted in the box never lets the files API touch a host path', async () => {
      const hostFile = path.join(dataDir, 'host-only.txt');
      writeFileSync(hostFile, 'HOST-ONLY-CONTENT');
      const victim = path.join(dataDir, 'victim.txt');
      writeFileSync(victim, 'untouched');
      await run('main', `ln -sf ${hostFile} /workspace/link-read; ln -sf ${victim} /workspace/link-write; ln -sfn ${dataDir} /workspace/dirlink; ln -sf /etc/passwd /workspace/passwd-link`);
      for (const p of ['/workspace/link-read', '/workspace/dirlink/host-only.txt', `/workspace/../..${hostFile}`]) {
        const r = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=${encodeURIComponent(p)}`, { headers: { 'x-api-key': KEY } });
        const text = await r.text();
        expect(text, p).not.toContain('HOST-ONLY-CONTENT');
        expect(r.status, p).toBeGreaterThanOrEqual(400);
      }
      for (const p of ['/workspace/link-write', '/workspace/dirlink/victim.txt', `/workspace/../..${victim}`]) {
        const r = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=${encodeURIComponent(p)}`, { method: 'PUT', headers: { 'x-api-key': KEY, 'content-type': 'application/octet-stream' }, body: 'OVERWRITTEN' });
        await r.text();
        expect(readFileSync(victim, 'utf8'), p).toBe('untouched');
      }
      // A symlink to a path that exists inside the box is the box's own view: allowed.
      const passwd = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=/workspace/passwd-link`, { headers: { 'x-api-key': KEY } });
      const inBox = await run('main', 'cat /etc/passwd');
      if (passwd.status === 200) expect(await passwd.text()).toBe(inBox.stdout);
      else await passwd.text();
    });

    it('sizes are bounded: a too-large upload is 413 and leaves nothing', async () => {
      const r = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=/workspace/big.bin`, {
        method: 'PUT',
        headers: { 'x-api-key': KEY, 'content-type': 'application/octet-stream' },
        body: Buffer.alloc(5 * 1024 * 1024),
      });
      expect(r.status).toBe(413);
      expect(((await r.json()) as { detail: string }).detail).toMatch(/limit/);
      const ls = await run('main', 'ls /workspace/big.bin 2>&1; echo rc=$?');
      expect(ls.stdout).toMatch(/rc=[1-9]/);
    });

    it('a file that grows while it is downloaded: 200 with the bytes it had when opened, Content-Length true', async () => {
      // 2 MiB first, then a writer in the background appends (at most 1.7 MiB: under the 4 MiB bound).
      await run('main', 'head -c 2097152 /dev/zero > /workspace/grow.log');
      await run('main', "(i=0; while [ $i -lt 100000 ]; do echo 0123456789abcdef; i=$((i+1)); done >> /workspace/grow.log) >/dev/null 2>&1 &");
      try {
        let grew = false;
        for (let i = 0; i < 4; i++) {
          const r = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=/workspace/grow.log`, { headers: { 'x-api-key': KEY } });
          expect(r.status).toBe(200);
          const declared = Number(r.headers.get('content-length'));
          const body = Buffer.from(await r.arrayBuffer());
          expect(body.length).toBe(declared);
          expect(body.subarray(0, 2097152).every((b) => b === 0)).toBe(true);
          const now = Number((await run('main', 'wc -c < /workspace/grow.log')).stdout.trim());
          if (now > declared) grew = true;
        }
        // The file did grow across the reads, so at least one read raced the writer.
        expect(grew).toBe(true);
      } finally {
        await run('main', 'pkill -f "0123456789abcdef" ; true');
      }
    });

    it('a client that leaves in the middle of a download ends the read in the box: the box is deleted at once, nothing left reading', async () => {
      await createBox('dl-left');
      await run('dl-left', 'head -c 3670016 /dev/zero > /workspace/big.bin');
      const ac = new AbortController();
      const r = await fetch(`${server.url}/api/v2/sandboxes/boxes/dl-left/files?path=/workspace/big.bin`, { headers: { 'x-api-key': KEY }, signal: ac.signal });
      expect(r.status).toBe(200);
      const reader = r.body!.getReader();
      await reader.read();
      ac.abort();
      await reader.read().catch(() => undefined);
      // Left unread, the engine's archiver (docker-tar) blocked for good and held the container:
      // even `docker rm -f` hung, and so did this DELETE.
      const t0 = Date.now();
      const del = await A('DELETE', '/api/v2/sandboxes/boxes/dl-left');
      expect(del.status, del.text).toBe(204);
      expect(Date.now() - t0).toBeLessThan(15_000);
      // (docker-tar itself is not looked for: other test files read docker box files meanwhile.)
      await waitFor(async () => hostProcesses('head -c 3670016').length === 0, 'the reader in the box to end', 10_000);
    });

    it('a bad path is a 422 at query.path', async () => {
      const r = await A('GET', '/api/v2/sandboxes/boxes/main/files?path=relative.txt');
      expect(r.status).toBe(422);
      expect(r.body.detail[0].loc).toEqual(['query', 'path']);
    });
  });

  describe('property 5: processes stay in the box', () => {
    it('an execute timeout kills the whole tree, no process left on the host', async () => {
      const marker = `sleep 31${Math.floor(Math.random() * 10000)}`;
      const r = await run('main', `sh -c '${marker} & ${marker}'`, { timeout_seconds: 1 });
      expect(r.timed_out).toBe(true);
      expect(r.exit_code).toBe(137);
      await noProcessesLeft(marker);
    });

    it('output is capped at 10 MiB per stream, truncated: true', async () => {
      const r = await run('main', 'yes aaaaaaa | head -c 12582912; echo err >&2');
      expect(r.exit_code).toBe(0);
      expect(r.stdout.length).toBe(10 * 1024 * 1024);
      expect(r.truncated).toBe(true);
      expect(r.stderr).toBe('err\n');
      const small = await run('main', 'echo hi');
      expect(small).toMatchObject({ stdout: 'hi\n', truncated: false, exit_code: 0 });
    });

    it('the box has its own PID namespace and no privilege', async () => {
      const r = await run('main', 'ls /proc | grep -c "^[0-9]"; id -u; grep CapEff /proc/self/status');
      const [count, uid, cap] = r.stdout.trim().split('\n');
      expect(Number(count)).toBeLessThan(10);
      expect(uid).not.toBe('0');
      expect(cap).toMatch(/CapEff:\s+0+$/);
    });

    it('stop kills every process; files in /workspace survive; start brings the box back', async () => {
      await createBox('stopper');
      const marker = `sleep 32${Math.floor(Math.random() * 10000)}`;
      await run('stopper', 'echo kept > /workspace/keep.txt');
      const bg = A('POST', '/api/v2/sandboxes/boxes/stopper/execute', { command: marker, timeout_seconds: 60 });
      await waitFor(async () => hostProcesses(marker).length > 0, 'the command to run');
      const stopped = await A('POST', '/api/v2/sandboxes/boxes/stopper/stop');
      expect(stopped.status).toBe(200);
      expect(stopped.body.status).toBe('stopped');
      await noProcessesLeft(marker);
      expect((await bg).status).toBe(200);
      const refused = await A('POST', '/api/v2/sandboxes/boxes/stopper/execute', { command: 'true' });
      expect(refused.status).toBe(409);
      expect(refused.body.detail).toMatch(/stopped/);
      const started = await A('POST', '/api/v2/sandboxes/boxes/stopper/start');
      expect(started.body.status).toBe('ready');
      expect((await run('stopper', 'cat /workspace/keep.txt')).stdout).toBe('kept\n');
    });

    it('DELETE kills every process and removes every trace', async () => {
      const box = await createBox('doomed');
      const marker = `sleep 33${Math.floor(Math.random() * 10000)}`;
      const bg = A('POST', '/api/v2/sandboxes/boxes/doomed/execute', { command: `${marker} & ${marker}`, timeout_seconds: 60 });
      await waitFor(async () => hostProcesses(marker).length > 0, 'the command to run');
      expect((await A('DELETE', '/api/v2/sandboxes/boxes/doomed')).status).toBe(204);
      await noProcessesLeft(marker);
      await bg;
      expect(existsSync(path.join(dataDir, 'sandboxes', box.id))).toBe(false);
      expect((await A('GET', '/api/v2/sandboxes/boxes/doomed')).status).toBe(404);
    });

    it('idle_ttl_seconds stops a box with no execution for that long (and never one running a command)', async () => {
      await createBox('idler', { idle_ttl_seconds: 2 });
      const marker = `sleep 34${Math.floor(Math.random() * 10000)}`;
      // A command longer than the TTL keeps the box alive ...
      const r = await run('idler', `${marker.replace(/sleep \d+/, 'sleep 3')}; echo done`, { timeout_seconds: 10 });
      expect(r.stdout).toBe('done\n');
      expect((await A('GET', '/api/v2/sandboxes/boxes/idler')).body.status).toBe('ready');
      // ... then, idle, it stops, and its processes (a background one too) are gone. (docker ends
      // an execution's whole tree with it, so there a background process never outlives its exec.)
      await run('idler', `nohup ${marker} >/dev/null 2>&1 &`);
      if (driver === 'local') expect(hostProcesses(marker).length).toBeGreaterThan(0);
      const stopped = await waitStatus(server.url, KEY, 'idler', 'stopped', 15_000);
      expect(stopped.body.status_reason).toMatch(/idle_ttl_seconds/);
      await noProcessesLeft(marker);
      const patched = await A('PATCH', '/api/v2/sandboxes/boxes/idler', { idle_ttl_seconds: 0 });
      expect(patched.body.idle_ttl_seconds).toBe(0);
    });
  });

  describe('property 6: one workspace cannot act on another\'s box', () => {
    it('404 for every operation with another workspace\'s key', async () => {
      const calls: [string, string, unknown?][] = [
        ['GET', '/api/v2/sandboxes/boxes/main'],
        ['POST', '/api/v2/sandboxes/boxes/main/execute', { command: 'true' }],
        ['GET', '/api/v2/sandboxes/boxes/main/files?path=/workspace/out.txt'],
        ['POST', '/api/v2/sandboxes/boxes/main/stop'],
        ['POST', '/api/v2/sandboxes/boxes/main/start'],
        ['PATCH', '/api/v2/sandboxes/boxes/main', { idle_ttl_seconds: 1 }],
        ['DELETE', '/api/v2/sandboxes/boxes/main'],
      ];
      for (const [m, u, b] of calls) expect((await B(m, u, b)).status, `${m} ${u}`).toBe(404);
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/main/execute/ws`, { headers: { 'x-api-key': keyB } });
      const got = await new Promise<string>((resolve) => {
        ws.on('message', (m) => resolve(m.toString()));
        ws.on('open', () => ws.send(JSON.stringify({ command: 'true' })));
        ws.on('unexpected-response', (_q, res) => resolve(`http ${res.statusCode}`));
      });
      ws.on('error', () => undefined); // refused before the upgrade: closing reports that
      ws.terminate();
      expect(got).toBe('http 404');
      expect((await A('GET', '/api/v2/sandboxes/boxes/main')).body.status).toBe('ready');
    });
  });

  describe('streaming execute (WebSocket)', () => {
    function open(): WebSocket {
      return new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/main/execute/ws`, { headers: { 'x-api-key': KEY } });
    }
    function collect(ws: WebSocket): Promise<{ msgs: any[]; stdout: string }> {
      const msgs: any[] = [];
      return new Promise((resolve, reject) => {
        ws.on('message', (m) => msgs.push(JSON.parse(m.toString())));
        ws.on('close', () => resolve({ msgs, stdout: msgs.filter((m) => m.type === 'stdout').map((m) => m.data).join('') }));
        ws.on('error', reject);
      });
    }

    it('stdin in, output as it comes, the exit code at the end', async () => {
      const ws = open();
      const done = collect(ws);
      ws.on('open', () => {
        ws.send(JSON.stringify({ command: 'cat; echo bye >&2; exit 3', stdin: true }));
        ws.send(JSON.stringify({ type: 'stdin', data: 'hello from stdin\n' }));
        ws.send(JSON.stringify({ type: 'stdin_close' }));
      });
      const { msgs, stdout } = await done;
      expect(msgs[0]).toEqual({ type: 'started' });
      expect(stdout).toBe('hello from stdin\n');
      expect(msgs.filter((m) => m.type === 'stderr').map((m) => m.data).join('')).toBe('bye\n');
      expect(msgs.at(-1)).toMatchObject({ type: 'exit', exit_code: 3, signal: null, timed_out: false, truncated: false });
    });

    it('kill ends the command tree; no process left', async () => {
      const marker = `sleep 35${Math.floor(Math.random() * 10000)}`;
      const ws = open();
      const done = collect(ws);
      ws.on('open', () => ws.send(JSON.stringify({ command: `echo started; ${marker}` })));
      ws.on('message', (m) => {
        const msg = JSON.parse(m.toString());
        if (msg.type === 'stdout' && msg.data.includes('started')) ws.send(JSON.stringify({ type: 'kill', signal: 'SIGKILL' }));
      });
      const { msgs } = await done;
      expect(msgs.at(-1)).toMatchObject({ type: 'exit', exit_code: 137 });
      await noProcessesLeft(marker);
    });

    it('a bad first frame is a 422-shaped error; a missing key is refused before the upgrade', async () => {
      const ws = open();
      const done = collect(ws);
      ws.on('open', () => ws.send(JSON.stringify({ command: 42 })));
      const { msgs } = await done;
      expect(msgs[0].type).toBe('error');
      expect(msgs[0].detail[0].loc).toEqual(['body', 'command']);
      const anon = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/main/execute/ws`);
      const status = await new Promise<number | string>((resolve) => {
        anon.on('unexpected-response', (_q, res) => resolve(res.statusCode ?? 0));
        anon.on('open', () => resolve('opened'));
        anon.on('error', (e) => resolve(e.message));
      });
      expect(status).toBe(401);
    });
  });

  describe('records, paging and restarts', () => {
    it('the record says driver, status, resources, idle TTL and the env inside the box', async () => {
      const r = await A('GET', '/api/v2/sandboxes/boxes/main');
      expect(r.body).toMatchObject({ driver, status: 'ready', idle_ttl_seconds: 600, resources: RESOURCES });
      expect((await run('main', 'echo $FROM_TEMPLATE')).stdout).toBe('yes\n');
      expect(r.body.proxy.env).toMatchObject({ HTTPS_PROXY: 'http://127.0.0.1:3128', SSL_CERT_FILE: '/etc/keygate/ca-bundle.pem', NODE_EXTRA_CA_CERTS: '/etc/keygate/ca.pem', NODE_USE_ENV_PROXY: '1' });
      expect(r.text).not.toContain(SECRET);
    });

    it.skipIf(!findKeytool())('Java: a PKCS12 truststore (roots and the CA) at /etc/keygate/truststore.p12, and JAVA_TOOL_OPTIONS naming it and the proxy', async () => {
      const env = (await A('GET', '/api/v2/sandboxes/boxes/main')).body.proxy.env;
      for (const opt of ['-Dhttps.proxyHost=127.0.0.1', '-Dhttps.proxyPort=3128', '-Dhttp.proxyHost=127.0.0.1', '-Dhttp.nonProxyHosts=localhost|127.0.0.1|::1', '-Djavax.net.ssl.trustStore=/etc/keygate/truststore.p12', '-Djavax.net.ssl.trustStoreType=PKCS12']) {
        expect(env.JAVA_TOOL_OPTIONS.split(' ')).toContain(opt);
      }
      // The box's own environment says the same, and the file is there, read-only.
      expect((await run('main', 'echo "$JAVA_TOOL_OPTIONS"')).stdout.trim()).toBe(env.JAVA_TOOL_OPTIONS);
      expect((await run('main', 'test -r /etc/keygate/truststore.p12 && ! test -w /etc/keygate/truststore.p12 && echo ok')).stdout).toBe('ok\n');
      // Read back through the files API: keytool finds the CA in it and the JDK's roots beside it.
      const res = await fetch(`${server.url}/api/v2/sandboxes/boxes/main/files?path=/etc/keygate/truststore.p12`, { headers: { 'x-api-key': KEY } });
      expect(res.status).toBe(200);
      const store = path.join(tmp(), 'truststore.p12');
      writeFileSync(store, Buffer.from(await res.arrayBuffer()));
      const keytool = findKeytool()!;
      const ca = execFileSync(keytool, ['-exportcert', '-rfc', '-alias', 'keygate-proxy-ca', '-keystore', store, '-storetype', 'PKCS12', '-storepass', 'changeit'], { encoding: 'utf8' });
      const pemBody = (pem: string) => pem.replace(/-----[A-Z ]+-----|\s/g, '');
      expect(pemBody(ca)).toBe(pemBody(readFileSync(path.join(dataDir, 'ca', 'ca.pem'), 'utf8')));
      const entries = execFileSync(keytool, ['-list', '-keystore', store, '-storetype', 'PKCS12', '-storepass', 'changeit'], { encoding: 'utf8' });
      expect(Number(/contains (\d+) entr/.exec(entries)?.[1])).toBeGreaterThan(50);
    });

    it('GET /boxes pages with limit and offset', async () => {
      const all = (await A('GET', '/api/v2/sandboxes/boxes?limit=100')).body;
      expect(all.resources.length).toBeGreaterThanOrEqual(3);
      const p1 = (await A('GET', '/api/v2/sandboxes/boxes?limit=2')).body;
      expect(p1.resources.map((b: any) => b.name)).toEqual(all.resources.slice(0, 2).map((b: any) => b.name));
      expect(p1.offset).toBe(2);
      const p2 = (await A('GET', `/api/v2/sandboxes/boxes?limit=2&offset=${p1.offset}`)).body;
      expect(p2.resources.map((b: any) => b.name)).toEqual(all.resources.slice(2, 4).map((b: any) => b.name));
      expect((await A('GET', '/api/v2/sandboxes/boxes?limit=0')).status).toBe(422);
    });

    it('a restart (SIGTERM, then SIGKILL) brings boxes back with their files and leaves no orphan', async () => {
      await run('main', 'echo survives > /workspace/restart.txt');
      for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
        const marker = `sleep 36${Math.floor(Math.random() * 10000)}`;
        // A command still running when the server goes down (its answer never comes).
        const inFlight = A('POST', '/api/v2/sandboxes/boxes/main/execute', { command: marker, timeout_seconds: 120 }).catch(() => undefined);
        await waitFor(async () => hostProcesses(marker).length > 0, 'the command to run');
        await server.stop(signal);
        await inFlight;
        if (signal === 'SIGTERM') await noProcessesLeft(marker);
        server = await startServer();
        await noProcessesLeft(marker, 20_000);
        await waitStatus(server.url, KEY, 'main', 'ready');
        expect((await run('main', 'cat /workspace/restart.txt')).stdout).toBe('survives\n');
        const through = await run('main', `curl -sS --max-time 10 https://${ORIGIN_HOST}:${origin.port}/api/user`);
        expect(JSON.parse(through.stdout).headers.authorization).toBe(`Bearer ${SECRET}`);
        expect((await A('GET', '/api/v2/sandboxes/boxes/stopper')).body.status).not.toBe('provisioning');
      }
    }, 120_000);
  });
});
});
