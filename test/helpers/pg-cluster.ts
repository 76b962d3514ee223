// Starts one throw-away PostgreSQL cluster for the whole test run (vitest globalSetup), so the
// PostgreSQL variants of storage tests run against a real server. `initdb` refuses to run as
// root, so the cluster belongs to the `postgres` user when we are root. Where no server can start
// (no binaries), tests that need it report a visible skip instead of silently passing.
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { TestProject } from 'vitest/node';

export const BIN_DIRS = ['/usr/lib/postgresql/17/bin', '/usr/lib/postgresql/16/bin', '/usr/lib/postgresql/15/bin', '/usr/local/bin', '/usr/bin'];

/** A PostgreSQL program from the usual places (Debian's versioned directories first). */
export function findBin(name: string): string | undefined {
  for (const dir of BIN_DIRS) {
    const p = path.join(dir, name);
    if (existsSync(p)) return p;
  }
  return undefined;
}

/** A loopback port nothing listens on right now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

export default async function setup(project: TestProject): Promise<() => void> {
  if (process.env.KEYGATE_TEST_PG_URL) {
    project.provide('pgUrl', process.env.KEYGATE_TEST_PG_URL);
    return () => undefined;
  }
  const initdb = findBin('initdb');
  const pgCtl = findBin('pg_ctl');
  if (!initdb || !pgCtl) {
    project.provide('pgUrl', '');
    project.provide('pgSkipReason', 'PostgreSQL binaries (initdb, pg_ctl) not found');
    return () => undefined;
  }
  const asRoot = process.getuid?.() === 0;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-pg-'));
  chmodSync(dir, 0o755);
  const run = (cmd: string, args: string[]) => {
    if (asRoot) {
      const uid = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
      const gid = Number(execFileSync('id', ['-g', 'postgres']).toString().trim());
      return spawnSync(cmd, args, { uid, gid, encoding: 'utf8', cwd: dir });
    }
    return spawnSync(cmd, args, { encoding: 'utf8', cwd: dir });
  };
  try {
    if (asRoot) {
      const uid = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
      const gid = Number(execFileSync('id', ['-g', 'postgres']).toString().trim());
      chownSync(dir, uid, gid);
    }
    const dataDir = path.join(dir, 'data');
    const init = run(initdb, ['-D', dataDir, '-A', 'trust', '-U', 'keygate', '--no-sync', '-E', 'UTF8']);
    if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr}`);
    const port = await freePort();
    const start = run(pgCtl, ['-D', dataDir, '-l', path.join(dir, 'log'), '-w', '-t', '60', '-o', `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200`, 'start']);
    if (start.status !== 0) throw new Error(`pg_ctl start failed: ${start.stderr}${start.stdout}`);
    project.provide('pgUrl', `postgres://keygate@127.0.0.1:${port}/postgres`);
    return () => {
      run(pgCtl, ['-D', dataDir, '-m', 'immediate', 'stop']);
      rmSync(dir, { recursive: true, force: true });
    };
  } catch (err) {
    project.provide('pgUrl', '');
    project.provide('pgSkipReason', (err as Error).message.split('\n')[0]);
    rmSync(dir, { recursive: true, force: true });
    return () => undefined;
  }
}

declare module 'vitest' {
  export interface ProvidedContext {
    pgUrl: string;
    pgSkipReason: string;
  }
}
