/**
 * Local driver, after a crash (sandbox.md "States" and property 5): a server SIGKILLed with boxes
 * running leaves nothing behind once `reapOrphans` ran, and reaping finds and kills boxes from the
 * records alone (a second driver over the same run directory), keeping their /workspace.
 * The crashed server is a real child process using the built driver (`npm run build` first).
 */
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it, onTestFinished } from 'vitest';
import { LocalDriver } from '../../src/sandbox/local.js';
import { REPO_ROOT } from '../helpers/proxy.js';
import { cleanupTmp, eventually, hostProcessesOf, localProbe, pidNamespace, run, RUN_DIR, spec } from './local-helpers.js';

const probe = await localProbe();

/** Every cgroup directory named `id` under this machine's cgroup mounts. */
function cgroupDirsNamed(id: string): string[] {
  const found: string[] = [];
  const walk = (d: string, depth: number) => {
    if (depth > 7) return;
    let entries;
    try {
      entries = readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      const p = path.join(d, e.name);
      if (e.name === id) found.push(p);
      else walk(p, depth + 1);
    }
  };
  walk('/sys/fs/cgroup', 0);
  return found;
}

describe.skipIf(!probe.ok)(`local driver: orphans after a crash (${probe.why})`, () => {
  afterAll(() => cleanupTmp());

  it('a SIGKILLed server leaves no process, record or cgroup once reapOrphans ran; /workspace is kept; nothing it inherited reached the box', async () => {
    const s = spec({ id: `crashed-${process.pid}` });
    const child = spawn(process.execPath, [path.join(REPO_ROOT, 'test/sandbox/fixtures/box-server.mjs'), path.join(REPO_ROOT, 'dist/sandbox/local.js'), RUN_DIR, s.id, s.stateDir], {
      // fd 20: a socket the "server" inherits without close-on-exec, as from a careless parent (above
      // the descriptors the driver hands its own children).
      stdio: ['ignore', 'pipe', 'inherit', ...Array<'ignore'>(17).fill('ignore'), 'pipe'],
    });
    // Whatever fails below, the stand-in server does not outlive the test.
    onTestFinished(() => void child.kill('SIGKILL'));
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d));
    expect(await eventually(() => out.includes('READY'), 30_000)).toBe(true);
    expect(await eventually(() => out.trim().split('\n').length === 2, 10_000)).toBe(true);
    const ns = /READY (pid:\[\d+\])/.exec(out)![1];
    // Nothing the server inherited reaches the box's processes.
    const { inherited, seen } = JSON.parse(out.trim().split('\n')[1]) as { inherited: number; seen: string[] };
    expect(seen.length).toBeGreaterThan(5);
    expect(seen).not.toContain(`socket:[${inherited}]`);
    expect(seen).not.toContain(`pipe:[${inherited}]`);
    expect(hostProcessesOf(ns, s.id).length).toBeGreaterThanOrEqual(3);
    expect(existsSync(path.join(RUN_DIR, `${s.id}.json`))).toBe(true);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));

    const restarted = new LocalDriver({ runDir: RUN_DIR });
    await restarted.reapOrphans(new Set([s.id]));
    expect(hostProcessesOf(ns, s.id)).toEqual([]);
    expect(existsSync(path.join(RUN_DIR, `${s.id}.json`))).toBe(false);
    expect(cgroupDirsNamed(s.id)).toEqual([]);
    // Its /workspace file system is unmounted on the host (no mount, no loop device left behind)
    // where the server could mount one; its files are kept either way.
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(s.stateDir);
    if (!existsSync(path.join(s.stateDir, 'workspace.img'))) expect(readFileSync(path.join(s.stateDir, 'workspace', 'kept.txt'), 'utf8')).toBe('kept\n');
    // The known box starts again from its record, with its files.
    const box = await restarted.start(s);
    expect((await run(box, 'cat /workspace/kept.txt')).stdout).toBe('kept\n');
    await restarted.destroy(s.id, s.stateDir);
  });

  it('reaping finds boxes from the run directory alone and kills them, known or not', async () => {
    const first = new LocalDriver({ runDir: RUN_DIR });
    const known = spec({ id: `known-${process.pid}` });
    const unknown = spec({ id: `unknown-${process.pid}` });
    const [k, u] = await Promise.all([first.start(known), first.start(unknown)]);
    const nsK = await pidNamespace(k);
    const nsU = await pidNamespace(u);
    await run(u, 'setsid sleep 2002 & nohup sleep 2003 >/dev/null 2>&1 &');
    // A second server over the same run directory: the first one's boxes are not its own.
    await new LocalDriver({ runDir: RUN_DIR }).reapOrphans(new Set([known.id]));
    expect(hostProcessesOf(nsK, known.id)).toEqual([]);
    expect(hostProcessesOf(nsU, unknown.id)).toEqual([]);
    expect(cgroupDirsNamed(known.id)).toEqual([]);
    expect(cgroupDirsNamed(unknown.id)).toEqual([]);
    expect(existsSync(path.join(known.stateDir, 'workspace'))).toBe(true);
    await first.close();
  });
});
