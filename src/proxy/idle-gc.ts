import v8 from 'node:v8';
import { switchSetting } from '../settings.js';
import { collector } from './buffer-gc.js';

/**
 * Gives memory back once a server goes quiet: one memory-reducing full collection after start-up
 * and after each busy spell, once the process has used almost no CPU for a whole check interval.
 *
 * V8 has its own "memory reducer" for exactly this, but on Node 24 (V8 13.6) it never starts in
 * a quiet process: `--trace-memory-reducer` says "high alloc" every 8 s, in keygate and in a bare
 * script alike, so the young generation that start-up grew (two 2 MiB semi-spaces) and the pages
 * V8 keeps pooled stay resident: keygate proxy sat at 74.8 MiB from 1.5 s to 20 s after start.
 * Node 20's reducer does run (61.6 -> 56.6 MiB); there this collection finds little left to do.
 * bench/README.md has the figures.
 *
 * The collection is V8's "last resort" flavour (what LowMemoryNotification does: full
 * collections that shrink the young generation and release pooled pages), run synchronously:
 * a few ms on an idle sidecar's heap, at a moment the process has nothing else to do. V8 11
 * (Node 20) has no flavours and takes any options object for a young-generation collection,
 * so there it is a plain full one. A busy process is never interrupted: a check only reads the
 * CPU clock. KEYGATE_IDLE_GC=0 turns it off.
 *
 * The first collection, the one after start-up, also drops all bytecode (V8's
 * `--stress-flush-code`, on for that one collection only): what start-up compiled (the CLI,
 * config and CA loading, module resolution) is never run again, and V8 would otherwise age it out
 * only over many collections that a quiet sidecar never has. Anything needed later is compiled
 * again from its source on first use. Later collections keep the code: after a busy spell it is
 * the request path, and flushing it would make the next request after every quiet spell pay for
 * compiling it again. (Node 24: 0.6-0.8 MiB of settled RSS, bench/README.md.)
 *
 * The collection after start-up does not wait for the check interval: a server says when it
 * listens (`serverReady`), and if the process stays quiet for 300 ms after that, start-up's
 * garbage and bytecode go then, so a sidecar is at its settled size within a second of listening
 * instead of after two check intervals (Node 24: 64 MiB at 1.5 s before, bench/README.md). A
 * request arriving in that moment makes it busy: the regular checks take over.
 */
const V8_MAJOR = Number(process.versions.v8.split('.')[0]);

export function reduceMemory(flushCode = false): void {
  const gc = collector();
  if (!gc) return;
  if (flushCode) v8.setFlagsFromString('--stress-flush-code');
  try {
    if (V8_MAJOR >= 12) gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
    else (gc as unknown as () => void)();
  } finally {
    if (flushCode) v8.setFlagsFromString('--no-stress-flush-code');
  }
}

export interface IdleGcOptions {
  /** How often the CPU clock is read (ms). */
  intervalMs?: number;
  /** CPU time (us) within one interval below which the process counts as quiet. Default 1 % of it. */
  quietUs?: number;
  /** The collection (default: V8's, a memory-reducing full one); `afterStartup` is true for the first. */
  collect?: (afterStartup: boolean) => void;
  /** The CPU clock (default process.cpuUsage). */
  cpu?: () => NodeJS.CpuUsage;
  /** How long the process must stay quiet after `ready()` for the collection after start-up (ms). */
  settleMs?: number;
}

export interface IdleGc {
  /** One check (what the timer runs): true when it collected. */
  tick(): boolean;
  /** Start-up is over (the server listens): the collection after it runs once the process stays quiet for `settleMs`. */
  ready(): void;
  /** The check `ready()` schedules (what its timer runs): true when it collected. */
  settled(): boolean;
  stop(): void;
}

export function idleGc(opts: IdleGcOptions = {}): IdleGc {
  const intervalMs = opts.intervalMs ?? 4000;
  const quietUs = opts.quietUs ?? intervalMs * 10;
  const collect = opts.collect ?? reduceMemory;
  const cpu = opts.cpu ?? (() => process.cpuUsage());
  const settleMs = opts.settleMs ?? 300;
  // Start-up is the first busy spell.
  let dirty = true;
  let startup = true;
  let last = cpu();
  let readyAt: NodeJS.CpuUsage | undefined;
  let settleTimer: NodeJS.Timeout | undefined;
  /** CPU time (us) used from `a` to `b`. */
  const spent = (a: NodeJS.CpuUsage, b: NodeJS.CpuUsage): number => b.user - a.user + (b.system - a.system);
  const collectNow = (): true => {
    dirty = false;
    collect(startup);
    startup = false;
    // The collection's own CPU time is not a busy spell.
    last = cpu();
    return true;
  };
  const settled = (): boolean => {
    if (!startup || !readyAt) return false;
    const used = spent(readyAt, cpu());
    readyAt = undefined;
    // Busy already (requests): the regular checks collect once it goes quiet. The bar is higher
    // than theirs (10 % of the moment, not 1 %): right after listening, V8's compiler threads and
    // the first log write use a few ms of CPU in any sidecar (5-6 ms in 500 ms, measured), which
    // is not traffic.
    if (used >= settleMs * 100) return false;
    return collectNow();
  };
  const ready = (): void => {
    if (!startup || readyAt) return;
    readyAt = cpu();
    settleTimer = setTimeout(settled, settleMs).unref();
  };
  const tick = (): boolean => {
    const now = cpu();
    const used = spent(last, now);
    last = now;
    if (used >= quietUs) {
      dirty = true;
      return false;
    }
    if (!dirty) return false;
    return collectNow();
  };
  const timer = setInterval(tick, intervalMs).unref();
  return {
    tick,
    ready,
    settled,
    stop: () => {
      clearInterval(timer);
      clearTimeout(settleTimer);
    },
  };
}

let running: IdleGc | undefined;

/** Starts the checks for this process (the server commands), once. */
export function startIdleGc(env: NodeJS.ProcessEnv = process.env): boolean {
  if (running || switchSetting(env, 'KEYGATE_IDLE_GC') === false) return false;
  running = idleGc();
  return true;
}

/** A server of this process listens: start-up is over (see `IdleGc.ready`). A no-op without the checks. */
export function serverReady(): void {
  running?.ready();
}
