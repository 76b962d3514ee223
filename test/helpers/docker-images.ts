// The images the real-engine tests run: the local base images (scripts/build-images.sh, cached by
// label) and keygate's own image from the repository's Dockerfile (cached by the engine's layer
// cache). Both are built on first use and kept, so later test files and runs take seconds.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { REPO_ROOT } from './cli.js';

/** The keygate image the Dockerfile builds, under the name docker-compose.yml uses. */
export const KEYGATE_IMAGE = 'keygate:latest';
/** The Debian image with curl that stands in for the compose example's sandbox. */
export const DEBIAN_IMAGE = 'keygate-local/debian:bookworm';
/** Every container, network and volume a test creates is named with this prefix (cleanup by name). */
export const TEST_PREFIX = 'kgtest';

export function uniqueName(what: string): string {
  return `${TEST_PREFIX}-${what}-${randomBytes(3).toString('hex')}`;
}

/** `docker ARGS`, synchronously; throws with docker's own message when it fails. */
export function docker(args: string[], opts: { input?: string; timeoutMs?: number; allowFail?: boolean } = {}): { code: number; stdout: string; stderr: string } {
  const r = spawnSync('docker', args, { encoding: 'utf8', input: opts.input, timeout: opts.timeoutMs ?? 60_000, maxBuffer: 64 * 1024 * 1024 });
  const out = { code: r.status ?? -1, stdout: r.stdout ?? '', stderr: r.stderr ?? '' };
  if (!opts.allowFail && out.code !== 0) throw new Error(`docker ${args.join(' ')}: ${r.error?.message ?? (out.stderr.trim() || `exit ${out.code}`)}`);
  return out;
}

/** Runs a long command without blocking the test worker; resolves with its output, rejects on failure. */
export function runAsync(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs: number }): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: opts.cwd ?? REPO_ROOT, env: opts.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    child.stderr.on('data', (c: Buffer) => (out += c.toString('utf8')));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs);
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(`${cmd} ${args.join(' ')} ${signal ? `was killed (${signal})` : `exited ${code}`}:\n${out.slice(-4000)}`));
    });
  });
}

let based: Promise<string> | undefined;
let built: Promise<{ seconds: number; log: string }> | undefined;

/** The local base images (scripts/build-images.sh: seconds when they are current). */
export function ensureBaseImages(): Promise<string> {
  based ??= runAsync(path.join(REPO_ROOT, 'scripts/build-images.sh'), [], { timeoutMs: 20 * 60_000 });
  return based;
}

/**
 * The base images, then keygate's image from the Dockerfile as it is in the tree
 * (scripts/build-images.sh --keygate). A fresh machine pays for debootstrap, node, `npm ci` and the
 * SQLite addon's compile once (minutes); afterwards only changed layers are rebuilt.
 */
export function ensureKeygateImage(): Promise<{ seconds: number; log: string }> {
  built ??= (async () => {
    const started = Date.now();
    const log = await runAsync(path.join(REPO_ROOT, 'scripts/build-images.sh'), ['--keygate'], { timeoutMs: 30 * 60_000 });
    return { seconds: Math.round((Date.now() - started) / 1000), log };
  })();
  return built;
}

/** Removes the containers, networks and volumes whose names start with `prefix` (only ours). */
export function removeByPrefix(prefix: string): void {
  const ids = (kind: 'ps' | 'network' | 'volume') => {
    const args = kind === 'ps' ? ['ps', '-aq', '--filter', `name=${prefix}`] : [kind, 'ls', '-q', '--filter', `name=${prefix}`];
    return docker(args, { allowFail: true }).stdout.split('\n').filter(Boolean);
  };
  const containers = ids('ps');
  if (containers.length) docker(['rm', '-f', '-v', ...containers], { allowFail: true });
  const networks = ids('network');
  if (networks.length) docker(['network', 'rm', ...networks], { allowFail: true });
  const volumes = ids('volume');
  if (volumes.length) docker(['volume', 'rm', '-f', ...volumes], { allowFail: true });
}
