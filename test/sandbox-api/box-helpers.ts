import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { expect } from 'vitest';
import { startEchoOrigin, type EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { boxImageUnavailableReason } from '../helpers/box-image.js';
import { runCli } from '../helpers/cli.js';
import { engineUnavailableReason } from '../helpers/docker-engine.js';
import { api, tmp, waitFor, type ApiResult } from './helpers.js';

export interface ServeSetup {
  origin: EchoOrigin;
  dataDir: string;
  /** The environment of `keygate serve` (and of its CLI commands on the same data). */
  env: NodeJS.ProcessEnv;
  /** An API key of a second workspace (team-b, user bob). */
  keyB: string;
}

/**
 * What a real `keygate serve` on SQLite needs for the sandbox API tests, short of starting it: a
 * real HTTPS origin for `originHost` with its own CA, which the sandbox proxy resolves to loopback
 * and trusts; a data directory; the API key `key` (in the environment); a second workspace's key.
 */
export async function setUpServe(key: string, originHost: string, extraEnv: NodeJS.ProcessEnv = {}): Promise<ServeSetup> {
  const originDir = tmp();
  const origin = await startEchoOrigin({ caDir: originDir, hosts: [originHost] });
  const dataDir = tmp();
  const env: NodeJS.ProcessEnv = {
    DATABASE_URL: '',
    KEYGATE_API_KEY: key,
    KEYGATE_SANDBOX_PROXY_RESOLVE: `${originHost}:${origin.port}:127.0.0.1`,
    KEYGATE_SANDBOX_PROXY_CA_FILE: path.join(originDir, 'ca.pem'),
    ...extraEnv,
  };
  const created = runCli(['serve', 'keys', 'create', '--workspace', 'team-b', '--user', 'bob', '--data', dataDir], { env });
  expect(created.status, created.stderr).toBe(0);
  return { origin, dataDir, env, keyB: created.stdout.trim() };
}

/**
 * Why the `local` driver cannot run boxes on this machine (bubblewrap missing, or the kernel refuses
 * user namespaces), or null. A test that needs real boxes is skipped with this reason, visibly.
 */
export function localBoxesUnavailable(): string | null {
  try {
    execFileSync('bwrap', ['--unshare-all', '--die-with-parent', '--ro-bind', '/', '/', 'true'], { stdio: 'pipe', timeout: 10_000 });
    return null;
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer };
    if (e.code === 'ENOENT') return 'bubblewrap is not installed (apt-get install bubblewrap)';
    return `the kernel refuses bubblewrap's namespaces: ${e.stderr?.toString().trim() || e.message}`;
  }
}

export interface Exec {
  stdout: string;
  stderr: string;
  exit_code: number;
  signal: string | null;
  timed_out: boolean;
  truncated: boolean;
  duration_ms: number;
}

/** Runs a shell command line in the box through POST .../execute; fails the test on a non-200. */
export async function execIn(base: string, key: string, box: string, command: string | string[], extra: Record<string, unknown> = {}): Promise<Exec> {
  const r = await api(base, key, 'POST', `/api/v2/sandboxes/boxes/${box}/execute`, { command, timeout_seconds: 30, ...extra });
  if (r.status !== 200) throw new Error(`execute in ${box}: ${r.status} ${r.text}`);
  return r.body as Exec;
}

/** Host processes whose command line contains `marker` (the host's own process table). */
export function hostProcesses(marker: string): string[] {
  const out = execFileSync('ps', ['-eo', 'pid=,args='], { encoding: 'utf8' });
  return out
    .split('\n')
    .filter((l) => l.includes(marker) && !l.includes('ps -eo'))
    .map((l) => l.trim());
}

export async function noProcessesLeft(marker: string, ms = 10_000): Promise<void> {
  await waitFor(async () => hostProcesses(marker).length === 0, `no host process with '${marker}' (left: ${hostProcesses(marker).join('; ')})`, ms);
}

export async function waitStatus(base: string, key: string, box: string, status: string, ms = 30_000): Promise<ApiResult> {
  return waitFor(async () => {
    const r = await api(base, key, 'GET', `/api/v2/sandboxes/boxes/${box}`);
    return r.body?.status === status ? r : undefined;
  }, `box ${box} to be ${status}`, ms);
}

/**
 * Why each real driver cannot run boxes here (null: it can), with a warning naming the tests
 * that are skipped for it.
 */
export async function driversUnavailable(tests: string): Promise<{ local: string | null; docker: string | null }> {
  const why = { local: localBoxesUnavailable(), docker: (await engineUnavailableReason()) ?? boxImageUnavailableReason() };
  for (const [d, reason] of Object.entries(why)) if (reason) console.warn(`SKIPPED ${tests} (${d} driver): ${reason}`);
  return why;
}
