/**
 * The Node binaries this machine has, for tests that check behaviour per Node version: the one
 * running the tests, /usr/bin/node, /usr/local/bin/node and the Node 24 that scripts/node24.sh
 * installs into .tools/ (CI runs the suite on Node 24 and on the machine's Node 20).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { REPO_ROOT } from './cli.js';

export interface NodeBin {
  name: string;
  bin: string;
  major: number;
  /** process.execve exists (Node >= 22.15). */
  execve: boolean;
}

/** Every Node binary on this machine worth checking, once each (by real path). */
export function machineNodes(): NodeBin[] {
  const candidates = [process.execPath, '/usr/bin/node', '/usr/local/bin/node', path.join(REPO_ROOT, '.tools/node24/bin/node')];
  const seen = new Set<string>();
  const out: NodeBin[] = [];
  for (const c of candidates) {
    if (!existsSync(c)) continue;
    const bin = realpathSync(c);
    if (seen.has(bin)) continue;
    seen.add(bin);
    const [version, execve] = execFileSync(bin, ['-p', 'process.versions.node + " " + typeof process.execve'], { encoding: 'utf8' }).trim().split(' ');
    out.push({ name: `Node ${version}`, bin, major: Number(version.split('.')[0]), execve: execve === 'function' });
  }
  return out;
}
