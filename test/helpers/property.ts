/**
 * Settings for property-based tests (fast-check): the same cases on every run unless asked.
 *
 * CI must be deterministic, so a property runs with a fixed seed and a bounded number of cases by
 * default. `npm run fuzz` (or KEYGATE_FUZZ_SEED=random KEYGATE_FUZZ_RUNS=N) explores new cases;
 * a failure prints its seed and shrunk counterexample, and KEYGATE_FUZZ_SEED=<seed> replays it.
 */
import type { Parameters as FcParameters } from 'fast-check';

const FIXED_SEED = 20261127;

function seedFromEnv(): number | undefined {
  const s = process.env.KEYGATE_FUZZ_SEED;
  if (s === 'random') return undefined;
  if (s !== undefined && s !== '') {
    const n = Number(s);
    if (!Number.isInteger(n)) throw new Error(`KEYGATE_FUZZ_SEED must be an integer or "random", got ${JSON.stringify(s)}`);
    return n;
  }
  return FIXED_SEED;
}

/** fast-check parameters: `runs` cases by default, scaled by KEYGATE_FUZZ_RUNS when set. */
export function propertyParams<T>(runs: number, extra: FcParameters<T> = {}): FcParameters<T> {
  const env = Number(process.env.KEYGATE_FUZZ_RUNS);
  const numRuns = Number.isInteger(env) && env > 0 ? env : runs;
  const seed = seedFromEnv();
  return { numRuns, ...(seed === undefined ? {} : { seed }), ...extra };
}
