import { randomBytes } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { Writable } from 'node:stream';
import { constants as osConstants } from 'node:os';
import { demultiplex, engineMessage, type DockerEngine } from '../docker/engine.js';
import type { ExecOptions, ExecProcess, ExecResult } from './driver.js';
import { BOX_TINI, nodeCommand, type HostRuntime } from './docker-relay.js';

/**
 * Executions in a docker box through the Engine API (`POST /containers/{id}/exec`, then
 * `POST /exec/{id}/start` hijacked: one connection carries stdin and the multiplexed output).
 *
 * Every execution runs under the lent static tini as a subreaper, with a marker in its environment:
 * whatever the command forks (even a daemon that double-forks and calls setsid) stays in the tree
 * under that tini. Killing walks that tree inside the box (a second execution, as the same user):
 * it stops every process first, so none can fork while the tree is collected, then kills them all
 * and waits until they are gone.
 */

const MARKER = 'KEYGATE_EXEC';

/** Runs inside the box as the box's user; argv: marker value, signal. Prints `left N`. */
const KILL_TREE_JS = `
const fs = require('fs');
const marker = '${MARKER}=' + process.argv[1];
const sig = process.argv[2];
function scan() {
  const procs = new Map();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const st = fs.readFileSync('/proc/' + d + '/stat', 'latin1');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      let marked = false;
      try { marked = fs.readFileSync('/proc/' + d + '/environ', 'latin1').split('\\0').includes(marker); } catch {}
      procs.set(Number(d), { state: f[0], ppid: Number(f[1]), marked });
    } catch {}
  }
  return procs;
}
function tree() {
  const p = scan();
  const set = new Set([...p].filter(([, v]) => v.marked).map(([k]) => k));
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, v] of p) if (!set.has(pid) && set.has(v.ppid)) { set.add(pid); grew = true; }
  }
  return { set, p };
}
const all = new Set();
if (sig === 'SIGKILL') {
  for (let i = 0; i < 100; i++) {
    let added = 0;
    for (const pid of tree().set) {
      if (!all.has(pid)) { all.add(pid); added++; }
      try { process.kill(pid, 'SIGSTOP'); } catch {}
    }
    if (!added) break;
  }
} else for (const pid of tree().set) all.add(pid);
for (const pid of all) { try { process.kill(pid, sig); } catch {} }
let left = 0;
const deadline = Date.now() + (sig === 'SIGKILL' ? 3000 : 0);
do {
  const p = scan();
  left = [...all].filter((pid) => p.has(pid) && p.get(pid).state !== 'Z').length;
  if (!left) break;
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
} while (Date.now() < deadline);
process.stdout.write('left ' + left + '\\n');
`;

export interface ExecContext {
  engine: DockerEngine;
  containerId: string;
  /** The user executions run as (the image's, when it names a non-root one). */
  user: string;
  env: Record<string, string>;
  runtime: HostRuntime;
  /** Runs `fn` with the box's process limit raised a little (a box at its limit cannot start the killer). */
  withSpareProcesses<T>(fn: () => Promise<T>): Promise<T>;
  /** When killing inside the box is impossible even so: kill the box. */
  killBox(): Promise<void>;
  log(msg: string, err?: unknown): void;
}

function envList(env: Record<string, string>): string[] {
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

async function createExec(ctx: ExecContext, body: Record<string, unknown>): Promise<string> {
  const res = await ctx.engine.json<{ Id?: string; message?: string }>('POST', `/containers/${ctx.containerId}/exec`, body);
  if (res.status !== 201 || !res.body?.Id) throw new Error(`the engine refused the execution: ${engineMessage(res.body, res.status)}`);
  return res.body.Id;
}

/** Runs a short helper in the box and returns its stdout (bounded). */
async function runHelper(ctx: ExecContext, cmd: string[], timeoutMs: number): Promise<string> {
  const id = await createExec(ctx, { AttachStdout: true, AttachStderr: true, Tty: false, User: ctx.user, Cmd: cmd, Env: [] });
  const socket = await ctx.engine.hijack(`/exec/${id}/start`, { Detach: false, Tty: false }, timeoutMs);
  const timer = setTimeout(() => socket.destroy(), timeoutMs);
  const { stdout, stderr, ended } = demultiplex(socket);
  let out = '';
  stdout.on('data', (c: Buffer) => (out = (out + c.toString('utf8')).slice(-4096)));
  stderr.resume();
  await ended;
  clearTimeout(timer);
  return out;
}

/**
 * Signals every process of one execution's tree; true when none is left. Throws when the killer
 * could not run at all (the engine then writes its own error on the stream instead of `left N`).
 */
async function killTree(ctx: ExecContext, marker: string, signal: NodeJS.Signals): Promise<boolean> {
  const out = await runHelper(ctx, nodeCommand(ctx.runtime, KILL_TREE_JS, [marker, signal]), 15_000);
  const left = /^left (\d+)$/m.exec(out);
  if (!left) throw new Error('the tree killer did not run in the box');
  return left[1] === '0';
}

export async function startExec(ctx: ExecContext, opts: ExecOptions): Promise<ExecProcess> {
  const marker = randomBytes(12).toString('hex');
  const argv = typeof opts.command === 'string' ? ['/bin/sh', '-c', opts.command] : opts.command;
  if (argv.length === 0) throw new Error('empty command');
  const id = await createExec(ctx, {
    AttachStdin: Boolean(opts.stdin),
    AttachStdout: true,
    AttachStderr: true,
    Tty: false,
    User: ctx.user,
    WorkingDir: opts.cwd ?? '/workspace',
    Env: envList({ ...ctx.env, ...opts.env, [MARKER]: marker }),
    Cmd: [BOX_TINI, '-s', '-g', '--', ...argv],
  });
  const socket: Duplex = await ctx.engine.hijack(`/exec/${id}/start`, { Detach: false, Tty: false });
  const { stdout, stderr, ended } = demultiplex(socket);

  let killedWith: NodeJS.Signals | null = null;
  let timedOut = false;
  let killing: Promise<void> | null = null;
  const kill = (signal: NodeJS.Signals = 'SIGKILL') => {
    if (killing && signal !== 'SIGKILL') return;
    killedWith = signal;
    const run = async () => {
      let gone = false;
      try {
        gone = await killTree(ctx, marker, signal);
      } catch {
        // Most likely the box is at its process limit (a fork bomb): no process can start in it.
        try {
          gone = await ctx.withSpareProcesses(() => killTree(ctx, marker, signal));
        } catch (err) {
          ctx.log('killing an execution inside the box failed', err);
        }
      }
      if (!gone && signal === 'SIGKILL') {
        // The tree could not be killed from inside (no process can start, or some survived): the
        // box goes, rather than leaving a process behind that the caller believes dead.
        ctx.log('an execution tree survived its kill: stopping the box');
        await ctx.killBox().catch((err) => ctx.log('stopping the box failed', err));
        socket.destroy();
      }
    };
    killing = (killing ?? Promise.resolve()).then(run);
  };

  const timer = opts.timeoutMs && opts.timeoutMs > 0
    ? setTimeout(() => {
        timedOut = true;
        kill('SIGKILL');
      }, opts.timeoutMs)
    : null;

  let stdin: Writable | null = null;
  if (opts.stdin) {
    // Ending stdin half-closes the connection: the engine then closes the process's stdin.
    stdin = new Writable({
      write(chunk: Buffer, _enc, cb) {
        socket.write(chunk, cb);
      },
      final(cb) {
        socket.end();
        cb();
      },
      // Destroyed (a pipeline into it failed): the process still gets its end of input, as a
      // closed pipe would give it, so it can finish instead of waiting to be killed.
      destroy(err, cb) {
        if (!socket.destroyed) socket.end();
        cb(err);
      },
    });
    stdin.on('error', () => undefined);
  }

  const done = (async (): Promise<ExecResult> => {
    await ended;
    if (timer) clearTimeout(timer);
    if (killing) await killing;
    // The stream can end a moment before the engine records the exit: ask again briefly.
    let info = { status: 0, body: {} as { ExitCode?: number | null; Running?: boolean } };
    for (let i = 0; i < 40; i++) {
      info = await ctx.engine.json<{ ExitCode?: number | null; Running?: boolean }>('GET', `/exec/${id}/json`).catch(() => info);
      if (info.status !== 200 || info.body?.Running !== true) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const code = typeof info.body?.ExitCode === 'number' ? info.body.ExitCode : null;
    const sent = killedWith as NodeJS.Signals | null;
    if (sent && (code === null || code === 128 + (osConstants.signals[sent] ?? 0) || code > 128)) {
      return { exitCode: null, signal: sent, timedOut };
    }
    return { exitCode: code, signal: null, timedOut };
  })();

  return { stdout, stderr, stdin, kill, done };
}
