// Spawns the real `keygate` binary (dist/, built by `npm test` before vitest runs) and waits for
// its `listening on HOST:PORT` line. Every server test goes through this, so what is tested is
// what an operator runs.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const CLI = path.join(REPO_ROOT, 'dist/cli/main.js');

export interface RunningCli {
  proc: ChildProcess;
  /** `HOST:PORT` from the `listening on` line. */
  address: string;
  /** `http://HOST:PORT`. */
  url: string;
  /** Everything the process wrote to stdout and stderr so far. */
  output(): string;
  /** Sends `signal` (default SIGTERM) and resolves with the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

export interface StartOptions {
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  timeoutMs?: number;
  /** First capture group is the address; default `listening on (HOST:PORT)`. */
  ready?: RegExp;
}

const LISTENING = /listening on (\[[0-9a-fA-F:.]+\]:\d+|[^\s:,)]+:\d+)/;

export function startCli(args: string[], opts: StartOptions = {}): Promise<RunningCli> {
  const proc = spawn(process.execPath, [CLI, ...args], {
    cwd: opts.cwd ?? REPO_ROOT,
    env: { ...process.env, KEYGATE_LOG_LEVEL: 'info', ...opts.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const ready = opts.ready ?? LISTENING;
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`keygate ${args.join(' ')} did not become ready in time; output:\n${out}`));
    }, opts.timeoutMs ?? 30_000);
    const onData = (chunk: Buffer) => {
      out += chunk.toString('utf8');
      const m = ready.exec(out);
      if (m && timer) {
        clearTimeout(timer);
        const address = m[1];
        resolve({
          proc,
          address,
          url: `http://${address}`,
          output: () => out,
          stop: async (signal = 'SIGTERM') => {
            // A process the test already signalled is only awaited: a second signal could land in
            // Node's exit teardown, after the JS handlers are gone, and turn a clean exit into a kill.
            if (!proc.killed && proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
            return exited;
          },
        });
      }
    };
    proc.stdout!.on('data', onData);
    proc.stderr!.on('data', onData);
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`keygate ${args.join(' ')} exited with ${code} before it was ready; output:\n${out}`));
    });
  });
}

/**
 * Waits until a line of the process's output satisfies `match` (log lines cross a pipe, so they can
 * arrive after the HTTP answer that caused them). Rejects with the output so far after `timeoutMs`.
 */
export async function waitForLine(cli: Pick<RunningCli, 'output'>, match: (line: string) => boolean, timeoutMs = 5_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const line = cli.output().split('\n').find(match);
    if (line !== undefined) return line;
    if (Date.now() > deadline) throw new Error(`no matching output line within ${timeoutMs} ms; output:\n${cli.output()}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Runs the CLI to completion (stdin optional) and returns its exit status and output. */
export function runCli(args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; input?: string; timeoutMs?: number } = {}) {
  const r = spawnSync(process.execPath, [CLI, ...args], {
    cwd: opts.cwd ?? REPO_ROOT,
    env: { ...process.env, ...opts.env },
    input: opts.input ?? '',
    encoding: 'utf8',
    timeout: opts.timeoutMs ?? 60_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}
