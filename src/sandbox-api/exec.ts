import { constants } from 'node:os';
import type { ExecProcess, ExecResult } from '../sandbox/driver.js';
import { CappedOutput, OUTPUT_CAP_BYTES } from './output.js';

/** The shell's convention: a process killed by signal N exits 128+N. */
export function exitCodeOf(result: ExecResult): number {
  if (result.exitCode !== null) return result.exitCode;
  const n = result.signal ? (constants.signals as Record<string, number>)[result.signal] : undefined;
  return 128 + (n ?? constants.signals.SIGKILL);
}

export interface ExecuteResult {
  stdout: string;
  stderr: string;
  exit_code: number;
  signal: string | null;
  timed_out: boolean;
  duration_ms: number;
  truncated: boolean;
}

/** Waits for an execution and returns its capped output (the JSON form of execute). */
export async function runToCompletion(proc: ExecProcess, startedAt: number, cap = OUTPUT_CAP_BYTES): Promise<ExecuteResult> {
  const out = CappedOutput.collect(proc.stdout, cap);
  const err = CappedOutput.collect(proc.stderr, cap);
  const [result] = await Promise.all([proc.done, out.ended, err.ended]);
  return {
    stdout: out.output.text(),
    stderr: err.output.text(),
    exit_code: exitCodeOf(result),
    signal: result.signal,
    timed_out: result.timedOut,
    duration_ms: Math.round(Date.now() - startedAt),
    truncated: out.output.truncated || err.output.truncated,
  };
}
