import v8 from 'node:v8';
import { switchSetting } from '../settings.js';
import vm from 'node:vm';

/**
 * Bounds the memory that relayed body chunks hold between garbage collections.
 *
 * Every chunk Node reads from a socket (16 KiB of decrypted TLS, up to 64 KiB of TCP) is a new
 * ArrayBuffer outside the JS heap, freed only when the small JS object holding it is collected.
 * A bulk transfer allocates almost nothing else, so young-generation collections, which V8
 * starts when the JS heap fills, come rarely, and V8's own trigger for external memory allows
 * 64 MiB between collections: a 100 MiB transfer through the proxy held 20-30 MiB of dead
 * chunks and raised its RSS by about 35 MiB (bench/README.md). After every STEP bytes relayed,
 * a young-generation collection is asked for (asynchronously: V8 runs it at its next
 * opportunity). It costs well under a millisecond each time with the small young generation the
 * image configures (--max-semi-space-size=2), i.e. under 1 % of the CPU of a 250 MiB/s relay.
 *
 * The collector is reached the way --expose-gc would expose it, without the flag on the
 * command line: the flag is set at run time and read when a new context is created. If that
 * ever stops working, relaying simply goes on without it. KEYGATE_RELAY_GC=0 turns it off.
 */
const STEP = 8 * 1024 * 1024;

type Gc = (options: { type: 'minor' | 'major'; execution: 'sync' | 'async'; flavor?: 'regular' | 'last-resort' }) => void;

let gc: Gc | null | undefined;
let relayGc: boolean | undefined;
let relayed = 0;

/** V8's collector, reached once (also used by idle-gc.ts); null where that does not work. */
export function collector(): Gc | null {
  if (gc === undefined) {
    try {
      v8.setFlagsFromString('--expose-gc');
      const fn: unknown = vm.runInNewContext('typeof gc === "function" ? gc : null');
      gc = typeof fn === 'function' ? (fn as Gc) : null;
    } catch {
      gc = null;
    }
  }
  return gc;
}

/** KEYGATE_RELAY_GC=0 turns the collections off (read once; the proxy reads it at start). */
export function relayGcSetting(): boolean {
  return (relayGc ??= switchSetting(process.env, 'KEYGATE_RELAY_GC') !== false);
}

/** Counts bytes a relay passed on; asks for a young-generation collection every STEP bytes. */
export function chunkRelayed(bytes: number): void {
  relayed += bytes;
  if (relayed < STEP) return;
  relayed = 0;
  if (relayGcSetting()) collector()?.({ type: 'minor', execution: 'async' });
}
