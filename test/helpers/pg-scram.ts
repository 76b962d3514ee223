// A throw-away PostgreSQL cluster that asks for a password (scram-sha-256 for every connection),
// for the tests of what keygate says when DATABASE_URL's password is wrong or missing. The shared
// cluster (pg-cluster.ts) trusts every login, so it cannot tell. As there, `initdb` refuses to run
// as root: the cluster then belongs to the `postgres` user.
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { findBin, freePort } from './pg-cluster.js';

export interface ScramCluster {
  host: string;
  port: number;
  user: string;
  password: string;
  stop(): void;
}

/** Starts the cluster, or returns why it cannot (no binaries, initdb failed). */
export async function startScramCluster(password: string): Promise<ScramCluster | string> {
  const initdb = findBin('initdb');
  const pgCtl = findBin('pg_ctl');
  if (!initdb || !pgCtl) return 'PostgreSQL binaries (initdb, pg_ctl) not found';
  const asRoot = process.getuid?.() === 0;
  const ids = asRoot ? { uid: Number(execFileSync('id', ['-u', 'postgres']).toString().trim()), gid: Number(execFileSync('id', ['-g', 'postgres']).toString().trim()) } : undefined;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-pg-scram-'));
  chmodSync(dir, 0o755);
  if (ids) chownSync(dir, ids.uid, ids.gid);
  const run = (cmd: string, args: string[]) => spawnSync(cmd, args, { encoding: 'utf8', cwd: dir, ...(ids ?? {}) });
  const pwfile = path.join(dir, 'pw');
  writeFileSync(pwfile, password + '\n', { mode: 0o600 });
  if (ids) chownSync(pwfile, ids.uid, ids.gid);
  const dataDir = path.join(dir, 'data');
  const init = run(initdb, ['-D', dataDir, '-A', 'scram-sha-256', '--pwfile', pwfile, '-U', 'keygate', '--no-sync', '-E', 'UTF8']);
  rmSync(pwfile, { force: true });
  if (init.status !== 0) {
    rmSync(dir, { recursive: true, force: true });
    return `initdb failed: ${init.stderr.split('\n')[0]}`;
  }
  const port = await freePort();
  const start = run(pgCtl, ['-D', dataDir, '-l', path.join(dir, 'log'), '-w', '-t', '60', '-o', `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`, 'start']);
  if (start.status !== 0) {
    rmSync(dir, { recursive: true, force: true });
    return `pg_ctl start failed: ${(start.stderr + start.stdout).split('\n')[0]}`;
  }
  return {
    host: '127.0.0.1',
    port,
    user: 'keygate',
    password,
    stop() {
      run(pgCtl, ['-D', dataDir, '-m', 'immediate', 'stop']);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
