import { createRequire } from 'node:module';
import type * as Fs from 'node:fs';

/**
 * `node:fs` through `require`, for the modules a sidecar loads (as src/node-http.ts does for
 * `node:http`). An ES import builds the module's ES facade by reading every export, lazy getters
 * included, and `fs.promises` is one: the first `import ... from 'node:fs'` in the process loads
 * fs/promises with Node's readline interface and REPL history code and the web streams behind
 * them, none of which keygate uses (bench/README.md, issue #20). `import type` from 'node:fs' is
 * fine (erased at build). test/cli/proxy-imports.test.ts checks what `keygate proxy` loads.
 */
const fs = createRequire(import.meta.url)('node:fs') as typeof Fs;

export type { FSWatcher } from 'node:fs';
export const {
  chmodSync,
  closeSync,
  constants,
  existsSync,
  fstatSync,
  fsyncSync,
  linkSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  realpathSync,
  renameSync,
  statSync,
  unlinkSync,
  utimesSync,
  watch,
  writeSync,
} = fs;

/**
 * A text file's contents, or '' when it cannot be read (gone, no permission): for files of the
 * kernel and of other processes (/proc) that may vanish between a look and a read.
 */
export function readFileOrEmpty(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
