/**
 * A server killed while it makes a box's sized /workspace (disk.ts; found by the lifecycle property,
 * test/sandbox-api/property-lifecycle-suite.ts, on a create followed by a hard restart): the next
 * start must still mount a /workspace. Before, the image was made under its own name and filled
 * by mkfs afterwards, so a kill in between left `workspace.img` of zeros, which no later start could
 * mount ("wrong fs type, bad superblock"): the box was `failed` for good. The server is the built
 * module in a process of its own (`npm run build` first), killed with its mkfs the moment the
 * image file appears.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, watch, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { mountWorkspace, unmountWorkspace, workspaceBoundUnavailable } from '../../src/sandbox/disk.js';
import { REPO_ROOT } from '../helpers/cli.js';
import { cleanupTmp, TMP } from './local-helpers.js';

const why = workspaceBoundUnavailable();
if (why) console.warn(`SKIPPED disk-crash: ${why}`);

afterAll(() => cleanupTmp());

/** Starts mountWorkspace in a process group of its own and SIGKILLs the group once an image file shows up in `stateDir`. */
async function killedWhileMaking(stateDir: string): Promise<string[]> {
  mkdirSync(stateDir, { recursive: true });
  const code = `import(${JSON.stringify(path.join(REPO_ROOT, 'dist/sandbox/disk.js'))}).then((m) => m.mountWorkspace(${JSON.stringify(stateDir)}, 32, { uid: 0, gid: 0 }))`;
  const seen = new Promise<void>((resolve) => {
    const w = watch(stateDir, () => {
      if (readdirSync(stateDir).some((f) => f.startsWith('workspace.img'))) {
        w.close();
        resolve();
      }
    });
  });
  const child = spawn(process.execPath, ['-e', code], { detached: true, stdio: 'ignore' });
  const exited = new Promise((r) => child.once('exit', r));
  await Promise.race([seen, exited]);
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {
    /* done already */
  }
  await exited;
  return readdirSync(stateDir);
}

describe.skipIf(why)('a sized /workspace whose making was cut short', () => {
  it('mounts at the next start, every time', async () => {
    for (let i = 0; i < 5; i++) {
      const stateDir = path.join(TMP, `crash-${i}`);
      const left = await killedWhileMaking(stateDir);
      try {
        const dir = await mountWorkspace(stateDir, 32, { uid: 0, gid: 0 });
        writeFileSync(path.join(dir, 'x'), 'y');
        expect(readdirSync(stateDir).sort(), `left by the kill: ${left.join(', ')}`).toEqual(['workspace', 'workspace.img']);
      } finally {
        await unmountWorkspace(stateDir);
      }
      expect(existsSync(path.join(stateDir, 'workspace', 'x'))).toBe(false);
    }
  }, 60_000);
});
