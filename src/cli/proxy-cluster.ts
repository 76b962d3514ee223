/**
 * `keygate proxy --workers N`: N worker processes sharing one listening port (node:cluster with
 * Node's default scheduling: the primary accepts and hands connections round-robin on Linux).
 * Each worker is a complete proxy built by startFromOptions from the same flags; the primary only
 * checks the start-up once, forks, supervises, relays output and forwards signals. It never sees
 * a request, and no secret value crosses the IPC channel (workers read the stores themselves).
 *
 * IPC messages (JSON over the cluster channel):
 *   worker -> primary  {kg: 'ready', host, port}   listening, configuration applied
 *   primary -> worker  {kg: 'shutdown', signal}    drain within --grace and exit
 * Shutdown goes over IPC, not as a signal: Ctrl-C already delivers SIGINT to every process in the
 * terminal's process group, and a forwarded second SIGINT would make each worker exit at once
 * instead of draining.
 */
import cluster, { type Worker } from 'node:cluster';
import type { Readable } from 'node:stream';
import { pino } from 'pino';
import { createLogger, type Logger } from '../log.js';
import { formatAuthority } from '../rules/host.js';
import type { PreparedStart, ProxyCliOptions, RunningProxy } from './proxy-types.js';
import { untilShutdown } from './shutdown.js';

/** Unexpected worker exits tolerated within CRASH_WINDOW_MS; one more and the primary gives up. */
export const MAX_CRASHES = 5;
export const CRASH_WINDOW_MS = 60_000;
/** Restart delay after the k-th recent crash: 100 ms, 200 ms, 400 ms ... at most 5 s. */
export function restartDelayMs(recentCrashes: number): number {
  return Math.min(100 * 2 ** Math.max(recentCrashes - 1, 0), 5_000);
}
/** Beyond --grace, how long a stopping worker gets before it is killed (it closes by itself at the grace deadline). */
const STOP_MARGIN_MS = 10_000;
/** Output of the primary and every worker: what may be held while stdout's reader is slow. */
const MAX_HELD_BYTES = 8 * 1024 * 1024;
/** A worker line longer than this without a newline is passed on in pieces rather than held. */
const MAX_PARTIAL_LINE = 1024 * 1024;

type ReadyMessage = { kg: 'ready'; host: string; port: number };
type ShutdownMessage = { kg: 'shutdown'; signal: string };

function isMessage<T extends { kg: string }>(m: unknown, kind: T['kg']): m is T {
  return typeof m === 'object' && m !== null && (m as { kg?: unknown }).kg === kind;
}

export function isWorkerProcess(): boolean {
  return cluster.isWorker;
}

// ---- worker ---------------------------------------------------------------------------------

export interface WorkerHooks {
  start(opts: ProxyCliOptions, logger: Logger): Promise<RunningProxy>;
  stop(running: RunningProxy, opts: ProxyCliOptions, signal: string): Promise<void>;
}

/** A worker: today's proxy, with `worker` and `pid` on every log line, stopped by the primary or a signal. */
export async function runWorker(opts: ProxyCliOptions, hooks: WorkerHooks): Promise<number> {
  const id = cluster.worker!.id;
  const logger = createLogger({ name: 'keygate-proxy' }).child({ worker: id, pid: process.pid });
  let onMessage: (m: unknown) => void = () => undefined;
  const stopSignal = new Promise<string>((resolve) => {
    // Signals sent to this process directly (a process-group Ctrl-C, systemd's control-group
    // SIGTERM) behave as in a single process; the primary's request arrives over IPC.
    void untilShutdown((sig) => process.stderr.write(`keygate proxy worker ${id}: ${sig} again: still draining (a second Ctrl-C exits now)\n`)).then(resolve);
    onMessage = (m) => {
      if (isMessage<ShutdownMessage>(m, 'shutdown')) resolve(m.signal);
    };
    process.on('message', onMessage);
  });
  try {
    const running = await hooks.start(opts, logger);
    const { handle } = running;
    process.send!({ kg: 'ready', host: handle.host, port: handle.port } satisfies ReadyMessage);
    logger.info({ url: handle.url }, `worker ${id} ready`);
    await hooks.stop(running, opts, await stopSignal);
    return 0;
  } finally {
    // The cluster channel keeps a worker's event loop alive: let the process end once its work is done.
    process.off('message', onMessage);
    process.channel?.unref();
  }
}

// ---- primary --------------------------------------------------------------------------------

/**
 * Passes a worker's output on whole lines at a time. All processes writing to one pipe could tear
 * each other's JSON lines apart (writes beyond PIPE_BUF are not atomic); here the primary is the
 * only writer.
 */
function relayLines(from: Readable, write: (text: string) => void): Promise<void> {
  from.setEncoding('utf8');
  let partial = '';
  from.on('data', (chunk: string) => {
    const text = partial + chunk;
    const end = text.lastIndexOf('\n');
    if (end < 0) {
      partial = text;
    } else {
      write(text.slice(0, end + 1));
      partial = text.slice(end + 1);
    }
    if (partial.length > MAX_PARTIAL_LINE) {
      write(partial);
      partial = '';
    }
  });
  return new Promise((resolve) => {
    const done = () => {
      if (partial) write(partial + '\n');
      partial = '';
      resolve();
    };
    from.once('end', done);
    from.once('close', done);
  });
}

interface Slot {
  worker: Worker;
  ready: boolean;
  output: Promise<void>;
}

export interface PrimaryResult {
  code: number;
  /** One line for stderr (the command's failure), when there is one. */
  error?: string;
}

/**
 * The primary: checks the start-up (configuration, CA, --upstream-ca) once, forks `count` workers
 * and prints `listening on HOST:PORT` when every one of them listens on the same port; replaces a
 * worker that dies (giving up after MAX_CRASHES within CRASH_WINDOW_MS); forwards SIGHUP; on
 * SIGTERM/SIGINT asks every worker to drain and resolves once all have exited.
 */
export async function runPrimary(opts: ProxyCliOptions, count: number, prepare: (opts: ProxyCliOptions) => Promise<PreparedStart>): Promise<number> {
  const result = await superviseWorkers(opts, count, prepare);
  if (result.error !== undefined) {
    const { CliError } = await import('./errors.js');
    throw new CliError(result.error, result.code);
  }
  return result.code;
}

async function superviseWorkers(opts: ProxyCliOptions, count: number, prepare: (opts: ProxyCliOptions) => Promise<PreparedStart>): Promise<PrimaryResult> {
  const out = pino.destination({ dest: 1, sync: false, minLength: 0, maxLength: MAX_HELD_BYTES });
  let dropped = 0;
  out.on('drop', () => dropped++);
  const write = (text: string) => {
    if (dropped > 0) {
      out.write(`${JSON.stringify({ level: 40, time: new Date().toISOString(), msg: `log output dropped ${dropped} times: nothing was reading stdout fast enough` })}\n`);
      dropped = 0;
    }
    out.write(text);
  };
  const logger = createLogger({ name: 'keygate-proxy', destination: { write } });
  const slots = new Map<number, Slot>();
  // Installed before the checks, so a signal during start-up stops it too.
  const stopRequested = untilShutdown((sig) => {
    if (sig === 'SIGINT') {
      // untilShutdown exits 130 right after this: take the workers along rather than orphan them.
      for (const s of slots.values()) s.worker.process.kill('SIGKILL');
      return;
    }
    logger.info({ signal: sig }, 'still draining: workers are stopping');
  });

  let early: string | undefined;
  void stopRequested.then((sig) => (early ??= sig));
  const prepared = await prepare(opts);
  if (early !== undefined) return { code: 0 }; // stopped before any worker was started
  cluster.setupPrimary({ exec: process.argv[1], args: process.argv.slice(2), silent: true });
  const outputs: Promise<void>[] = [];
  let phase: 'starting' | 'running' | 'stopping' = 'starting';
  let announced: { host: string; port: number } | undefined;
  let final: PrimaryResult = { code: 0 };
  const crashes: number[] = [];
  let restartTimer: NodeJS.Timeout | undefined;
  let pendingRestarts = 0;
  let killTimer: NodeJS.Timeout | undefined;
  let finish!: (r: PrimaryResult) => void;
  const finished = new Promise<PrimaryResult>((r) => (finish = r));

  const fork = () => {
    const worker = cluster.fork();
    const output = Promise.all([relayLines(worker.process.stdout!, write), relayLines(worker.process.stderr!, (t) => process.stderr.write(t))]).then(() => undefined);
    outputs.push(output);
    const slot: Slot = { worker, ready: false, output };
    slots.set(worker.id, slot);
    worker.on('message', (m: unknown) => {
      if (isMessage<ReadyMessage>(m, 'ready')) onReady(slot, m);
    });
    worker.on('exit', (code, signal) => onExit(slot, code, signal));
    // A failed IPC send to a worker that is going away: its exit is handled on its own.
    worker.on('error', () => undefined);
    if (phase === 'stopping') sendShutdown(slot, 'SIGTERM');
  };

  const sendShutdown = (slot: Slot, signal: string) => {
    if (slot.worker.isConnected()) slot.worker.send({ kg: 'shutdown', signal } satisfies ShutdownMessage, () => undefined);
  };

  const stopAll = (signal: string, result: PrimaryResult) => {
    if (phase === 'stopping') return;
    phase = 'stopping';
    final = result;
    clearTimeout(restartTimer);
    pendingRestarts = 0;
    for (const s of slots.values()) sendShutdown(s, signal);
    killTimer = setTimeout(() => {
      for (const s of slots.values()) {
        logger.error({ worker: s.worker.id, worker_pid: s.worker.process.pid }, 'worker did not stop in time: killed');
        s.worker.process.kill('SIGKILL');
      }
      if (final.code === 0) final = { code: 1 };
    }, opts.graceMs + STOP_MARGIN_MS).unref();
    if (slots.size === 0) finish(final);
  };

  const onReady = (slot: Slot, m: ReadyMessage) => {
    slot.ready = true;
    if (phase === 'stopping') return;
    if (announced && m.port !== announced.port) {
      // Only possible with --listen HOST:0 after every worker was down at once: the shared port
      // was released and a new one picked. Clients know the old one: fail rather than move.
      stopAll('SIGTERM', { code: 1, error: `proxy worker ${slot.worker.id} listens on port ${m.port}, not ${announced.port} (every worker had stopped and the port was released)` });
      return;
    }
    if (phase === 'starting' && [...slots.values()].every((s) => s.ready) && slots.size === count) {
      phase = 'running';
      announced = { host: m.host, port: m.port };
      const rules = prepared.initial.compiled.rules.map((r) => r.name);
      const url = `http://${formatAuthority(m.host, m.port)}`;
      logger.info({ url, ca: prepared.ca.certPath, rules, workers: count }, `listening on ${formatAuthority(m.host, m.port)}`);
    }
  };

  const onExit = (slot: Slot, code: number | null, signal: string | null) => {
    slots.delete(slot.worker.id);
    const id = slot.worker.id;
    if (phase === 'stopping') {
      if (slots.size === 0) {
        clearTimeout(killTimer);
        finish(final);
      }
      return;
    }
    if (phase === 'starting') {
      // The worker printed why (a listen error, say); the command fails as a single process would.
      const how = signal ? `signal ${signal}` : `exit code ${code}`;
      stopAll('SIGTERM', { code: code && code > 0 ? code : 1, error: `proxy worker ${id} stopped during start-up (${how})` });
      return;
    }
    const now = Date.now();
    crashes.push(now);
    while (crashes.length && crashes[0] <= now - CRASH_WINDOW_MS) crashes.shift();
    if (crashes.length >= MAX_CRASHES) {
      logger.error({ worker: id, code, signal, crashes: crashes.length, window_s: CRASH_WINDOW_MS / 1000 }, 'workers keep crashing: giving up');
      stopAll('SIGTERM', { code: 1, error: `proxy workers stopped unexpectedly ${crashes.length} times within ${CRASH_WINDOW_MS / 1000} s; giving up` });
      return;
    }
    const delay = restartDelayMs(crashes.length);
    logger.warn({ worker: id, worker_pid: slot.worker.process.pid, code, signal, restart_in_ms: delay }, `worker ${id} exited unexpectedly; starting a replacement`);
    pendingRestarts++;
    // One timer for all pending restarts: a burst of exits waits for the latest back-off.
    clearTimeout(restartTimer);
    restartTimer = setTimeout(() => {
      const n = pendingRestarts;
      pendingRestarts = 0;
      if (phase !== 'running') return;
      for (let i = 0; i < n; i++) fork();
    }, delay);
  };

  const onHup = () => {
    const ready = [...slots.values()].filter((s) => s.ready);
    logger.info({ workers: ready.length }, 'SIGHUP: reloading every worker');
    // Only workers that listen have their SIGHUP handler installed; one still starting reads the files anyway.
    for (const s of ready) s.worker.process.kill('SIGHUP');
  };
  process.on('SIGHUP', onHup);

  void stopRequested.then((signal) => {
    logger.info({ signal, grace_ms: opts.graceMs, workers: slots.size }, 'shutting down: every worker drains its requests in flight');
    stopAll(signal, final);
  });

  for (let i = 0; i < count; i++) fork();
  const result = await finished;
  process.off('SIGHUP', onHup);
  clearTimeout(restartTimer);
  await Promise.all(outputs);
  if (result.error === undefined) logger.info({ code: result.code }, 'stopped');
  await new Promise<void>((resolve) => out.flush(() => resolve()));
  return result;
}
