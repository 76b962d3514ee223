/**
 * Runs `keygate proxy` as a real child process (`node dist/cli/main.js proxy ...`; run
 * `npm run build` first). Everything the process prints is kept, so a test file can assert that
 * a secret never appeared in the proxy's output.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const REPO_ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
export const CLI = path.join(REPO_ROOT, 'dist/cli/main.js');

export interface SpawnProxyOptions {
  /** proxy_config object (written to a temp file) or a path. */
  config: unknown;
  /** `{KEY: value}` written to a temp secrets file. */
  secrets?: Record<string, string>;
  /** `host:port:addr` pins. */
  resolve?: string[];
  /** PEM strings written to temp files and passed as --upstream-ca. */
  upstreamCa?: string[];
  /** Reuse a CA directory (default: a fresh temp one). */
  certsDir?: string;
  extraArgs?: string[];
  env?: NodeJS.ProcessEnv;
  /** How keygate is started: the program and its arguments before `proxy` (default: `node dist/cli/main.js`). */
  command?: [string, ...string[]];
  /** Working directory (default: this process's). */
  cwd?: string;
}

export interface SpawnedProxy {
  child: ChildProcess;
  pid: number;
  host: string;
  port: number;
  /** `http://127.0.0.1:PORT` */
  url: string;
  certsDir: string;
  caPath: string;
  caPem: string;
  /** stdout + stderr so far. */
  output(): string;
  /** JSON log lines parsed (non-JSON lines skipped). */
  logs(): Record<string, unknown>[];
  /** Sends a signal and waits for the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
  dir: string;
}

/** Runs the CLI to completion (for start-up failures): exit code and all output. */
export function runCli(args: string[], env?: NodeJS.ProcessEnv, timeoutMs = 20_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`keygate ${args.join(' ')} did not exit\n${stdout}\n${stderr}`));
    }, timeoutMs);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Writes a temp file and returns its path. */
export function tempFile(dir: string, name: string, content: string): string {
  const f = path.join(dir, name);
  writeFileSync(f, content, { mode: 0o600 });
  return f;
}

export async function spawnProxy(opts: SpawnProxyOptions): Promise<SpawnedProxy> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-proxy-'));
  const certsDir = opts.certsDir ?? path.join(dir, 'certs');
  const configPath = typeof opts.config === 'string' ? opts.config : tempFile(dir, 'config.json', JSON.stringify(opts.config));
  const args = ['proxy', '--config', configPath, '--listen', '127.0.0.1:0', '--certs', certsDir, '--grace', '5'];
  if (opts.secrets) args.push('--secrets', tempFile(dir, 'secrets.json', JSON.stringify(opts.secrets)));
  for (const r of opts.resolve ?? []) args.push('--resolve', r);
  (opts.upstreamCa ?? []).forEach((pem, i) => args.push('--upstream-ca', tempFile(dir, `upstream-ca-${i}.pem`, pem)));
  args.push(...(opts.extraArgs ?? []));
  const [file, ...prefix] = opts.command ?? [process.execPath, CLI];
  const child = spawn(file, [...prefix, ...args], { cwd: opts.cwd, env: { ...process.env, KEYGATE_LOG_LEVEL: 'info', ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`proxy did not start:\n${out}`)), 20_000);
    const check = () => {
      const m = /listening on 127\.0\.0\.1:(\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    };
    child.stdout!.on('data', check);
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`proxy exited with ${code}:\n${out}`));
    });
  });
  const caPath = path.join(certsDir, 'ca.pem');
  return {
    child,
    pid: child.pid!,
    host: '127.0.0.1',
    port,
    url: `http://127.0.0.1:${port}`,
    certsDir,
    caPath,
    caPem: readFileSync(caPath, 'utf8'),
    dir,
    output: () => out,
    logs: () =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => {
          try {
            return JSON.parse(l) as Record<string, unknown>;
          } catch {
            return {};
          }
        }),
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const code = await exited;
      rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** Peak resident memory (VmHWM, kB) and current (VmRSS, kB) of a process, from /proc. */
export function memoryOf(pid: number): { hwmKb: number; rssKb: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string) => Number(new RegExp(`${name}:\\s+(\\d+) kB`).exec(status)?.[1] ?? NaN);
  return { hwmKb: kb('VmHWM'), rssKb: kb('VmRSS') };
}
