// The Dockerfile built on a real engine (base images from scripts/build-images.sh, nothing pulled)
// and every role run from the image: non-root, with the V8 settings `npm start` uses, nothing
// secret baked in.
import http from 'node:http';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';
import { announceSkip, engineUnavailableReason } from '../helpers/docker-engine.js';
import { docker, ensureKeygateImage, KEYGATE_IMAGE, removeByPrefix, uniqueName } from '../helpers/docker-images.js';
import { runStream, replyOf } from '../control-plane/helpers.js';

const skip = announceSkip('the image tests (real Docker engine)', await engineUnavailableReason());
const prefix = uniqueName('image');
const tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-image-'));
// A secret where the compose example keeps them: the build context must not carry it into the image.
const canary = path.join(REPO_ROOT, 'config/compose/secrets', `${prefix}-CANARY`);

afterAll(() => {
  if (!skip) removeByPrefix(prefix);
  rmSync(tmp, { recursive: true, force: true });
  rmSync(canary, { force: true });
});

/** The V8 flags of `npm start`, the reference the image must stay in step with. */
function startFlags(): string[] {
  const start: string = JSON.parse(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8')).scripts.start;
  return start.split(/\s+/).filter((a) => a.startsWith('--'));
}

/** A detached container of the image, its port published on loopback; returns its name and host port. */
function runDetached(what: string, args: string[], opts: { port?: number; env?: Record<string, string>; volumes?: string[] } = {}): { name: string; port: number } {
  const name = `${prefix}-${what}`;
  const flags = ['run', '-d', '--name', name, '--label', `keygate.test=${prefix}`];
  if (opts.port) flags.push('-p', `127.0.0.1::${opts.port}`);
  for (const [k, v] of Object.entries(opts.env ?? {})) flags.push('-e', `${k}=${v}`);
  for (const v of opts.volumes ?? []) flags.push('-v', v);
  docker([...flags, KEYGATE_IMAGE, ...args]);
  const port = opts.port ? Number(docker(['port', name, `${opts.port}/tcp`]).stdout.trim().split(':').pop()) : 0;
  return { name, port };
}

async function untilLog(name: string, re: RegExp, timeoutMs = 30_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  let logs = '';
  while (Date.now() < deadline) {
    const r = docker(['logs', name], { allowFail: true });
    logs = r.stdout + r.stderr;
    if (re.test(logs)) return logs;
    if (docker(['inspect', '-f', '{{.State.Running}}', name], { allowFail: true }).stdout.trim() === 'false') break;
    await sleep(200);
  }
  throw new Error(`${name}: no ${re} in its output:\n${logs}`);
}

/** The uid and the command line of the container's first process, as the kernel sees them. */
/** One variable of the container's main process environment (what glibc read at its start). */
function mainEnv(name: string, key: string): string | undefined {
  const environ = docker(['exec', name, 'cat', '/proc/1/environ']).stdout.split('\0');
  return environ.find((kv) => kv.startsWith(`${key}=`))?.slice(key.length + 1);
}

function mainProcess(name: string): { uid: string; argv: string[] } {
  const status = docker(['exec', name, 'cat', '/proc/1/status']).stdout;
  const argv = docker(['exec', name, 'cat', '/proc/1/cmdline']).stdout.split('\0').filter(Boolean);
  return { uid: /^Uid:\s+(\d+)/m.exec(status)![1], argv };
}

describe.skipIf(skip)('the keygate image on a real engine', () => {
  let size = 0;
  beforeAll(async () => {
    mkdirSync(path.dirname(canary), { recursive: true });
    writeFileSync(canary, 'kg-canary-value-must-not-be-in-the-image');
    const { seconds } = await ensureKeygateImage();
    size = Number(docker(['image', 'inspect', '-f', '{{.Size}}', KEYGATE_IMAGE]).stdout.trim());
    console.info(`[keygate tests] ${KEYGATE_IMAGE}: ${(size / 1e6).toFixed(0)} MB, built or found in ${seconds} s`);
  }, 40 * 60_000);

  it('is built on Node 24, runs as node (uid 1000) and starts with the V8 settings of npm start', () => {
    expect(size).toBeGreaterThan(50e6);
    const cfg = JSON.parse(docker(['image', 'inspect', '-f', '{{json .Config}}', KEYGATE_IMAGE]).stdout);
    expect(cfg.User).toBe('node');
    expect(cfg.Entrypoint).toEqual(['node', ...startFlags(), '/app/dist/cli/main.js']);
    expect(startFlags()).toEqual(['--max-semi-space-size=2', '--heap-growing-percent=20']);
    const r = docker(['run', '--rm', '--entrypoint', 'sh', KEYGATE_IMAGE, '-c', 'node --version; id -u; id -un']);
    const [version, uid, user] = r.stdout.trim().split('\n');
    expect(version).toMatch(/^v24\./);
    expect([uid, user]).toEqual(['1000', 'node']);
  });

  it('holds no secret of the build context: neither the compose secrets nor a CA key', () => {
    const found = docker(['run', '--rm', '--entrypoint', 'sh', KEYGATE_IMAGE, '-c', 'ls /app/config/compose/secrets; ls /app/certs 2>/dev/null; grep -rl kg-canary /app/config || true']).stdout;
    expect(found.trim().split('\n')).toEqual(['README.md']);
  });

  it('runs the proxy role: listening, answering, its V8 settings applied to the running process', async () => {
    const secrets = path.join(tmp, 'secrets');
    mkdirSync(secrets, { recursive: true });
    writeFileSync(path.join(secrets, 'GITHUB_TOKEN'), 'image-test-token');
    const { name, port } = runDetached('proxy', ['proxy', '--config=/app/config/compose/proxy.json', '--listen=0.0.0.0:3128', '--certs=/tmp/certs', '--secrets-dir=/run/keygate-secrets', '--data=/tmp/data'], {
      port: 3128,
      volumes: [`${secrets}:/run/keygate-secrets:ro`],
    });
    const logs = await untilLog(name, /listening on 0\.0\.0\.0:3128/);
    expect(logs).not.toContain('image-test-token');
    // A plain-HTTP request for a host that a rule injects into is refused by the proxy itself
    // (credentials only go over TLS), without any connection to that host.
    const res = await new Promise<http.IncomingMessage>((resolve, reject) =>
      http.get({ host: '127.0.0.1', port, path: 'http://api.github.com/user', headers: { host: 'api.github.com' } }, resolve).once('error', reject),
    );
    res.resume();
    expect(res.statusCode).toBe(403);
    expect(String(res.headers['proxy-status'])).toMatch(/^keygate/);
    // The proxy re-executed itself (same pid 1, node's full path as argv[0]) to run with one
    // malloc arena, which glibc reads only at start (src/cli/v8-flags.ts SIDECAR_ENV).
    expect(mainProcess(name)).toEqual({ uid: '1000', argv: ['/usr/local/bin/node', ...startFlags(), '/app/dist/cli/main.js', 'proxy', '--config=/app/config/compose/proxy.json', '--listen=0.0.0.0:3128', '--certs=/tmp/certs', '--secrets-dir=/run/keygate-secrets', '--data=/tmp/data'] });
    expect(mainEnv(name, 'MALLOC_ARENA_MAX')).toBe('1');
  });

  it('runs the serve role (the default command) with its data in the /data volume', async () => {
    const key = 'kg_image_test_key_0123456789';
    const { name, port } = runDetached('serve', [], { port: 8080, env: { KEYGATE_API_KEY: key } });
    await untilLog(name, /listening on/);
    const health = await fetch(`http://127.0.0.1:${port}/healthz`);
    expect(health.status).toBe(200);
    const denied = await fetch(`http://127.0.0.1:${port}/v2/deployments`);
    expect(denied.status).toBe(401);
    const listed = await fetch(`http://127.0.0.1:${port}/v2/deployments`, { headers: { 'x-api-key': key } });
    expect(listed.status).toBe(200);
    expect(mainProcess(name).uid).toBe('1000');
    expect(docker(['exec', name, 'sh', '-c', 'stat -c "%U %a" /data /data/*.db 2>/dev/null | sort -u']).stdout).toContain('node');
    expect(docker(['logs', name]).stdout + docker(['logs', name]).stderr).not.toContain(key);
  });

  it('runs the app serve role on the shipped example, streaming a reply', async () => {
    const key = 'kg_image_app_key_0123456789';
    const { name, port } = runDetached('app', ['app', 'serve', '--app', '/app/examples/echo-agent', '--listen', '0.0.0.0:8000'], { port: 8000, env: { KEYGATE_API_KEY: key } });
    await untilLog(name, /listening on/);
    const run = await runStream(`http://127.0.0.1:${port}`, key, 'hello from the image');
    expect(run.status).toBe(200);
    expect(replyOf(run)).toContain('hello from the image');
    expect(mainProcess(name).uid).toBe('1000');
  });

  it('runs the ca role: the key is created 0600 and owned by node in the /certs volume', () => {
    const volume = `${prefix}-certs`;
    docker(['run', '--rm', '--name', `${prefix}-ca`, '-v', `${volume}:/certs`, KEYGATE_IMAGE, 'ca', 'init', '--certs', '/certs']);
    const modes = docker(['run', '--rm', '--name', `${prefix}-ca-stat`, '-v', `${volume}:/certs`, '--entrypoint', 'stat', KEYGATE_IMAGE, '-c', '%n %U %a', '/certs/ca.pem', '/certs/ca-key.pem']).stdout;
    expect(modes.trim().split('\n').sort()).toEqual(['/certs/ca-key.pem node 600', '/certs/ca.pem node 644']);
    const pem = docker(['run', '--rm', '--name', `${prefix}-ca-show`, '-v', `${volume}:/certs`, KEYGATE_IMAGE, 'ca', 'env', '--certs', '/certs', '--proxy', 'http://keygate-proxy:3128', '--format', 'dotenv']).stdout;
    expect(pem).not.toContain('PRIVATE KEY');
  });
});
