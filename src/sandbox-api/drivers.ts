import { createHash } from 'node:crypto';
import path from 'node:path';
import { chooseDriver, DriverUnusableError, type DriverChoice } from '../sandbox/choose.js';
import { DRIVER_NAMES, type DriverName } from '../sandbox/driver.js';

export { DriverUnusableError };

/** Parses `--sandbox-driver` (or KEYGATE_SANDBOX_DRIVER); undefined = choose. */
export function parseDriverName(value: string | undefined): DriverName | undefined {
  const v = value?.trim();
  if (!v) return undefined;
  if (!(DRIVER_NAMES as readonly string[]).includes(v)) throw new DriverUnusableError(`unknown sandbox driver '${v}'; use one of ${DRIVER_NAMES.join(', ')}`);
  return v as DriverName;
}

/**
 * The driver this server runs boxes with: the one asked for (refusing to start when it cannot
 * isolate), else the best that works here. Driver state lives under the data directory, where
 * no box ever sees it.
 */
export function selectSandboxDriver(requested: DriverName | undefined, dataDir: string): Promise<DriverChoice> {
  // Each driver's module is loaded only when it is tried: `keygate serve` starts the probe before
  // it loads the rest of the server (see serve.ts), so this module stays small.
  return chooseDriver(requested, {
    local: async () => new (await import('../sandbox/local.js')).LocalDriver({ runDir: path.join(dataDir, 'boxes', 'local') }),
    // One scope per data directory: servers sharing an engine never reap each other's boxes.
    docker: async () => new (await import('../sandbox/docker.js')).DockerBoxDriver({ scope: `keygate-box-${createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 10)}` }),
    none: async () => new (await import('../sandbox/none.js')).NoneDriver(),
  });
}
