import { parseArgs, type ParseArgsConfig } from '../builtins/util.js';
import { CliError } from './errors.js';

/**
 * `parseArgs` with strict options, where a usage error (unknown flag, missing value) becomes a
 * one-line CliError followed by the command's usage, exit status 2.
 */
export function parseCliArgs<T extends ParseArgsConfig>(config: T, usage: string): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs<T>({ strict: true, ...config });
  } catch (err) {
    throw new CliError(`${(err as Error).message}\n${usage}`, 2);
  }
}
