import { mkdirSync } from '../builtins/fs.js';
import path from 'node:path';
import { CliError } from './errors.js';

/**
 * The one data directory every keygate command shares: `--data DIR`, else `KEYGATE_DATA_DIR`,
 * else `./data`. Created with mode 0700 because it holds the master key and encrypted stores.
 */
export function resolveDataDir(flag?: string, env: NodeJS.ProcessEnv = process.env): string {
  const dir = path.resolve(flag ?? env.KEYGATE_DATA_DIR ?? 'data');
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  } catch (err) {
    // An operator's mistake (a file in the way, no permission, a read-only mount): one line.
    throw new CliError(`cannot use data directory ${dir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  return dir;
}
