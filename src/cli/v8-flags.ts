import v8 from 'node:v8';
import { switchSetting } from '../settings.js';

/**
 * V8 settings for the long-running servers (`proxy`, `serve`, `start`) and how they reach the
 * process however it was started.
 *
 * Heap sizing: a sidecar's memory is mostly V8's young generation, which grows to 2 x 16 MiB
 * semi-spaces under load by default; 2 MiB semi-spaces and a slower old-generation growth keep
 * peak RSS near idle at a small CPU cost (bench/README.md). V8 sizes the heap when the isolate
 * is created, so these are read only from node's command line: `v8.setFlagsFromString` after
 * start-up changes the flag but not the heap (checked on Node 20 and 24).
 */
export const SERVER_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2', '--heap-growing-percent=20'];

/** The name of a node option (`--max_semi_space_size=4` -> `max-semi-space-size`). */
function optionName(arg: string): string {
  return arg.replace(/^--?/, '').split('=')[0].replace(/_/g, '-');
}

/**
 * The server flags not already on node's command line or in NODE_OPTIONS: a value the user
 * chose (say `--max-semi-space-size=8`) is kept rather than overridden.
 */
export function missingServerFlags(execArgv: readonly string[], nodeOptions = ''): string[] {
  const given = new Set([...execArgv, ...nodeOptions.split(/\s+/).filter(Boolean)].map(optionName));
  return SERVER_NODE_FLAGS.filter((f) => !given.has(optionName(f)));
}

export type ServerFlagsState = 'present' | 'disabled' | 'unavailable';

/**
 * The C library allocator's settings for the sidecar (`keygate proxy`). glibc gives threads that
 * allocate their own malloc arenas (up to 8 per core): V8's worker threads, the libuv pool and
 * the main thread each keep free memory the others never reuse, so a sidecar's RSS after the
 * benchmark's bulk and h2 phases stayed 4-9 MiB above what one arena needs, at the same CPU per
 * request and per GiB (interleaved A/B, bench/README.md "Session 6"). glibc reads it only from
 * the environment when the process starts, so it comes with the re-execution below; musl and
 * other C libraries ignore it. A value the user set (any value, e.g. MALLOC_ARENA_MAX=8) is
 * kept. Not for `serve` and `start`: their children (deployed applications, box tooling)
 * would inherit it.
 */
export const SIDECAR_ENV: Readonly<Record<string, string>> = { MALLOC_ARENA_MAX: '1' };

/** The SIDECAR_ENV settings not already in `env`. */
export function missingSidecarEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  return Object.fromEntries(Object.entries(SIDECAR_ENV).filter(([k]) => env[k] === undefined || env[k] === ''));
}

/**
 * Makes sure the heap flags are in effect before the server starts.
 *
 * The `keygate` bin carries them in its shebang (`#!/usr/bin/env -S node --max-semi...`), which
 * covers `node_modules/.bin/keygate`, `npx keygate`, a global install and the `--workers`
 * processes (node:cluster forks with the primary's execArgv). Started any other way
 * (`node dist/cli/main.js proxy`), the process replaces itself with the same command plus the
 * missing flags through `process.execve` (Node >= 22.15): same pid, same stdio and terminal,
 * same environment (nothing from it is put into argv), so signals, exit codes and supervisors
 * see one process. It runs before anything is read or written, and the new process has the
 * flags on its command line, so it cannot loop. Node 20 has no execve: there the flags stay as
 * started ('unavailable'); a second process just to hold the flags would cost more memory than
 * they save.
 *
 * With `sidecar` (`keygate proxy`), SIDECAR_ENV is ensured the same way: a sidecar started
 * through the bin (flags present) without MALLOC_ARENA_MAX re-executes once with it added to
 * its environment (about 40 ms more start-up on Node >= 22.15; none on Node 20, which keeps
 * glibc's default).
 *
 * KEYGATE_NODE_FLAGS=0 keeps node's and the C library's defaults (e.g. to compare, or under a
 * profiler that must keep its own process).
 */
export function ensureServerFlags(env: NodeJS.ProcessEnv = process.env, opts: { sidecar?: boolean } = {}): ServerFlagsState {
  if (switchSetting(env, 'KEYGATE_NODE_FLAGS') === false) return 'disabled';
  const missing = missingServerFlags(process.execArgv, env.NODE_OPTIONS);
  const missingEnv = opts.sidecar ? missingSidecarEnv(env) : {};
  if (missing.length === 0 && Object.keys(missingEnv).length === 0) return 'present';
  const execve = (process as { execve?: (file: string, args: string[], env: NodeJS.ProcessEnv) => never }).execve;
  if (typeof execve !== 'function' || process.argv[1] === undefined) return 'unavailable';
  try {
    // The new process has the flags on its command line and the settings in its environment,
    // so it finds nothing missing and cannot loop.
    execve.call(process, process.execPath, [process.execPath, ...missing, ...process.execArgv, process.argv[1], ...process.argv.slice(2)], { ...env, ...missingEnv });
  } catch {
    // The binary could not be executed again (removed, no permission): run as started.
  }
  return 'unavailable';
}

/**
 * undici parses HTTP/1.1 responses with llhttp compiled to WebAssembly. V8 runs it first as
 * baseline (Liftoff) code and, once hot, recompiles the parser function with TurboFan; that one
 * compilation took about 35 MiB of compiler memory for a moment (heaptrack: Zone::Expand under
 * wasm::CompileLazy), which alone set a sidecar's peak RSS under its first burst of requests and
 * left it 8 MiB larger afterwards. Baseline code only: no spike, and the proxy's CPU per request
 * measured the same within noise (bench/README.md). Wasm compiler flags are read when a module
 * is compiled, so this one works at run time, unlike the heap sizing flags above.
 *
 * KEYGATE_V8_WASM_TIERUP=1 leaves V8's default.
 */
export function leanServerFlags(env: NodeJS.ProcessEnv = process.env): boolean {
  if (switchSetting(env, 'KEYGATE_V8_WASM_TIERUP')) return false;
  v8.setFlagsFromString('--liftoff-only');
  return true;
}

/** Node options that say what the user wants of V8's optimizing compiler: left alone then. */
const OPTIMIZER_OPTIONS = /^--(no-)?(turbofan|opt|maglev|jitless|always-turbofan|always-opt|max-opt)(=|$)/;
/** Maglev, V8's mid-tier optimizer, is on by default from V8 12 (Node 22); on Node 20 it is off and stays off. */
const HOLDS = Number(process.versions.v8.split('.')[0]) >= 12 ? ['turbofan', 'maglev'] : ['turbofan'];

let optimizerHeld = false;

/**
 * No optimizing compiler while a server starts. Start-up runs hot for a moment in code it never
 * runs again (module resolution: path normalisation for ~150 modules made `normalizeString` hot
 * enough for TurboFan), and the first TurboFan compilation maps in about 5 MiB of the node
 * binary's compiler code: a sidecar that then sits idle kept those pages resident for nothing
 * (`keygate proxy` settled at 67.7 MiB on Node 24 with, 62.4 without; 55.0 and 50.9 on Node 20;
 * bench/README.md). Maglev, Node 24's mid tier, is held the same way (its code is 1.5 MiB
 * more); the interpreter and Sparkplug still run. The server re-enables both once it listens
 * (`releaseOptimizer`), so the code that serves requests is optimized as before; under load the
 * compilers' pages come back. A command that never calls it gets them back after 15 s. V8
 * reads these flags when it decides to optimize a function, so they work at run time (checked
 * with --trace-opt on Node 20 and 24: test/cli/v8-flags.test.ts). Untouched when node was given
 * an optimizer option; KEYGATE_STARTUP_TURBOFAN=1 leaves V8's default.
 */
export function holdOptimizer(env: NodeJS.ProcessEnv = process.env, execArgv: readonly string[] = process.execArgv): boolean {
  if (optimizerHeld || switchSetting(env, 'KEYGATE_STARTUP_TURBOFAN')) return false;
  const given = [...execArgv, ...(env.NODE_OPTIONS ?? '').split(/\s+/)].map((a) => a.replace(/_/g, '-'));
  if (given.some((a) => OPTIMIZER_OPTIONS.test(a))) return false;
  for (const f of HOLDS) v8.setFlagsFromString(`--no-${f}`);
  optimizerHeld = true;
  setTimeout(releaseOptimizer, 15_000).unref();
  return true;
}

/** The optimizing compilers back on (the server listens): a no-op unless holdOptimizer turned them off. */
export function releaseOptimizer(): void {
  if (!optimizerHeld) return;
  optimizerHeld = false;
  for (const f of HOLDS) v8.setFlagsFromString(`--${f}`);
}
