/**
 * Set-up shared by the driver tests that run the same cases on a real local box and a real
 * container (disk-watch, exec-race): why each driver cannot run here (null when it can), and a
 * bare box spec with no proxy behind it (port 9: nothing listens) and no CA.
 */
import path from 'node:path';
import { DockerEngine } from '../../src/docker/engine.js';
import type { BoxResources, BoxSpec } from '../../src/sandbox/driver.js';
import { boxImageUnavailableReason, ensureBoxImage } from '../helpers/box-image.js';
import { dockerSocket, engineUnavailableReason } from '../helpers/docker-engine.js';
import { localProbe } from './local-helpers.js';

export type DriverKind = 'local' | 'docker';

/** Each driver with why it cannot run on this machine (null: it can). */
export async function bothDrivers(): Promise<(readonly [DriverKind, string | null])[]> {
  const localWhy = (await localProbe()).ok ? null : 'no local boxes here';
  const dockerWhy = (await engineUnavailableReason()) ?? boxImageUnavailableReason() ?? null;
  return [
    ['local', localWhy],
    ['docker', dockerWhy],
  ];
}

/** A box of `which` driver: the host's root (local) or the test box image (docker), state under `dir`. */
export async function bareSpec(which: DriverKind, id: string, dir: string, resources: Partial<BoxResources>): Promise<BoxSpec> {
  const image = which === 'docker' ? await ensureBoxImage(new DockerEngine(dockerSocket()!)) : undefined;
  return {
    id,
    template: { name: 't', ...(image ? { image } : { rootfs: 'host' }), environment: {} },
    resources: { memory_mb: 256, cpus: 1, pids: 128, disk_mb: 32, ...resources },
    env: {},
    caPem: '',
    caBundlePem: '',
    proxy: { host: '127.0.0.1', port: 9 },
    stateDir: path.join(dir, which, id),
  };
}
