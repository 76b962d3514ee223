/**
 * The operator's settings in the environment (`KEYGATE_*`), read one way everywhere: a value
 * keygate cannot use stops the command at start with one line naming the variable and what it
 * takes. Never a silent fall-back to the default (a typo in a timeout would go unnoticed until
 * the day it mattered), never a stack trace. An empty value is the default, as if unset (how a
 * compose file or a Kubernetes manifest "unsets" a variable).
 */
import { CliError } from './command-error.js';

/** A setting that cannot be used: a CliError, so every command prints it as one line (exit 1). */
export class SettingError extends CliError {
  constructor(message: string) {
    super(message);
    this.name = 'SettingError';
  }
}

export interface IntSetting {
  min: number;
  max?: number;
  /** Said after the range, e.g. `milliseconds`. */
  unit?: string;
}

/** How a value is quoted back: bounded and printable, so a pasted blob cannot flood the line. */
function shown(value: string): string {
  const printable = value.replace(/[^\x20-\x7e]/g, '?');
  return printable.length > 40 ? `${printable.slice(0, 40)}...` : printable;
}

/**
 * `env[name]` as an integer in [min, max], or `dflt` when unset or empty. Only plain decimal
 * integers: `1e3`, `0x10`, `10m` and `1.5` are refused rather than read as something else.
 */
export function intSetting(env: NodeJS.ProcessEnv, name: string, dflt: number, range: IntSetting): number {
  const raw = env[name]?.trim();
  if (!raw) return dflt;
  const max = range.max ?? Number.MAX_SAFE_INTEGER;
  const n = /^-?\d+$/.test(raw) ? Number(raw) : NaN;
  if (Number.isSafeInteger(n) && n >= range.min && n <= max) return n;
  const upper = range.max === undefined ? '' : ` to ${range.max}`;
  const what = range.max === undefined ? `an integer from ${range.min} up` : `an integer from ${range.min}${upper}`;
  throw new SettingError(`${name} must be ${what}${range.unit ? ` (${range.unit})` : ''}, got '${shown(raw)}'`);
}

/**
 * A switch (`0` or `1`): true, false, or undefined when unset or blank (the caller's default).
 * `true`, `yes` or `off` are refused rather than read as whichever the code tests against.
 */
export function switchSetting(env: NodeJS.ProcessEnv, name: string): boolean | undefined {
  const raw = env[name]?.trim();
  if (!raw) return undefined;
  if (raw === '0' || raw === '1') return raw === '1';
  throw new SettingError(`${name} must be 0 or 1, got '${shown(raw)}'`);
}

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

/** `KEYGATE_LOG_LEVEL`, or `dflt` when unset or empty. */
export function logLevelSetting(env: NodeJS.ProcessEnv, dflt: string): string {
  const raw = env.KEYGATE_LOG_LEVEL?.trim();
  if (!raw) return dflt;
  if ((LOG_LEVELS as readonly string[]).includes(raw)) return raw;
  throw new SettingError(`KEYGATE_LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')}, got '${shown(raw)}'`);
}
