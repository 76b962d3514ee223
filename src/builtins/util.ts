import { createRequire } from 'node:module';
import type * as Util from 'node:util';

/**
 * `node:util` through `require`, for the modules a sidecar loads (see src/builtins/fs.ts): the ES
 * facade of node:util reads its lazy exports, which load Node's worker, locks, diff and colour
 * code (`util.diff`, `MIMEType`, `transferableAbortSignal` ...) that keygate never uses.
 */
const util = createRequire(import.meta.url)('node:util') as typeof Util;

export type { ParseArgsConfig } from 'node:util';
export const { inspect, parseArgs } = util;
