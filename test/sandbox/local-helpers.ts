/**
 * Shared by the local driver's tests: real boxes only. `localProbe` is checked once per file; when
 * the kernel refuses namespaces the files skip and print why (never silently).
 */
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'vitest';
import type { Box, BoxResources, BoxSpec, ExecOptions, ExecResult } from '../../src/sandbox/driver.js';
import { LocalDriver, type LocalDriverOptions } from '../../src/sandbox/local.js';

export const TMP = mkdtempSync(path.join(os.tmpdir(), 'kg-box-test-'));
/** Where the driver's records live: like the data directory's `sandboxes/run`. */
export const RUN_DIR = path.join(TMP, 'data', 'run');

export async function localProbe(opts: Omit<LocalDriverOptions, 'runDir'> = {}): Promise<{ ok: boolean; why: string }> {
  const p = await new LocalDriver({ runDir: path.join(TMP, 'probe-run'), ...opts }).probe();
  if (!p.ok) {
    console.warn(`SKIPPING local driver tests: ${p.reason} (${p.hint})`);
    return { ok: false, why: p.reason };
  }
  return { ok: true, why: p.detail };
}

/** Starts, in the background and detached every way a shell can, processes that would outlive their parent. */
export const SCATTER = `sleep 1000 & setsid sleep 1001 & nohup sh -c 'sleep 1002 & sleep 1003' >/dev/null 2>&1 & (sh -c 'sleep 1004 &' &) ; echo started`;

let n = 0;
export function spec(over: Omit<Partial<BoxSpec>, 'resources'> & { proxyPort?: number; resources?: Partial<BoxResources> } = {}): BoxSpec {
  const id = over.id ?? `t${process.pid}-${++n}`;
  return {
    id,
    template: { name: 'host', rootfs: 'host', environment: {} },
    env: {},
    caPem: '-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n',
    caBundlePem: '-----BEGIN CERTIFICATE-----\nBUNDLE\n-----END CERTIFICATE-----\n',
    stateDir: path.join(TMP, 'data', 'sandboxes', id),
    ...over,
    proxy: over.proxy ?? { host: '127.0.0.1', port: over.proxyPort ?? 9 },
    resources: { memory_mb: 256, cpus: 1, pids: 128, disk_mb: 64, ...over.resources } as BoxResources,
  };
}

export interface Ran extends ExecResult {
  stdout: string;
  stderr: string;
}

/** Runs a command to the end and collects its output. */
export async function run(box: Box, command: string | string[], opts: Omit<ExecOptions, 'command'> = {}): Promise<Ran> {
  const p = await box.exec({ timeoutMs: 30_000, ...opts, command });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const r = await p.done;
  return { ...r, stdout, stderr };
}

/** The inode of the box's PID namespace, as the box itself sees it. */
export async function pidNamespace(box: Box): Promise<string> {
  const r = await run(box, ['readlink', '/proc/self/ns/pid']);
  const ns = r.stdout.trim();
  if (!/^pid:\[\d+\]$/.test(ns)) throw new Error(`no pid namespace: ${JSON.stringify(r)}`);
  return ns;
}

/** Host pids of every process in that PID namespace, or in a cgroup of the box `id`. */
export function hostProcessesOf(pidNs: string, id: string): number[] {
  const out: number[] = [];
  const inBoxCgroup = new RegExp(`/keygate-[0-9a-f]+/${id.replace(/[.]/g, '\\.')}(/|$)`);
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const ns = readlinkSync(`/proc/${e}/ns/pid`);
      const cg = readFileSync(`/proc/${e}/cgroup`, 'utf8');
      if (ns === pidNs || cg.split('\n').some((l) => inBoxCgroup.test(l))) out.push(Number(e));
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

export async function eventually(check: () => boolean, ms = 5000): Promise<boolean> {
  const until = Date.now() + ms;
  while (!check()) {
    if (Date.now() > until) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}

export function cleanupTmp(): void {
  rmSync(TMP, { recursive: true, force: true });
}

/**
 * A signal sent to an execution reaches the command, which may handle it (a shell's trap): the
 * execution then ends when the command does, with its exit code; a command that does not handle
 * it ends by it. The same in both local modes (cgroups, and tini without them).
 */
export async function expectSignalsPassThrough(box: Box): Promise<void> {
  const term = await box.exec({ command: `trap 'echo got TERM; exit 3' TERM; echo ready; sleep 1020 & wait` });
  let said = '';
  term.stdout.on('data', (d: Buffer) => (said += d));
  term.stderr.resume();
  expect(await eventually(() => said === 'ready\n')).toBe(true);
  term.kill('SIGTERM');
  expect(await term.done).toEqual({ exitCode: 3, signal: null, timedOut: false });
  expect(said).toBe('ready\ngot TERM\n');
  const plain = await box.exec({ command: 'echo ready; exec sleep 1021' });
  let ready = '';
  plain.stdout.on('data', (d: Buffer) => (ready += d));
  plain.stderr.resume();
  expect(await eventually(() => ready === 'ready\n')).toBe(true);
  plain.kill('SIGTERM');
  expect(await plain.done).toEqual({ exitCode: null, signal: 'SIGTERM', timedOut: false });
}

/** stdin reaches the command and the command's output comes back, exit code included. */
export async function expectStdinPassThrough(box: Box): Promise<void> {
  const cat = await box.exec({ command: ['cat'], stdin: true });
  let out = '';
  cat.stdout.on('data', (d: Buffer) => (out += d));
  cat.stderr.resume();
  cat.stdin!.end('through stdin');
  expect((await cat.done).exitCode).toBe(0);
  expect(out).toBe('through stdin');
}

/**
 * A command in the box holds no descriptor but its stdio (not the server's handles on the box's
 * namespaces and root): ls's own table is what it was started with, then 3, the directory it reads.
 */
export async function expectOnlyStdio(box: Box): Promise<void> {
  expect((await run(box, ['ls', '/proc/self/fd'])).stdout).toBe('0\n1\n2\n3\n');
}
