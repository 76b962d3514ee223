/**
 * Local driver, the host uid of a box (sandbox.md, "The host's kernel, from a root server's box"):
 * a root server runs every box under a host uid and gid of its own, unprivileged, so that whatever
 * a box reaches on the host (a file, a socket, a kernel interface that checks the uid) sees that
 * id, never root. Inside, the box's user stays uid 1000. Checked from the host's /proc and the
 * host's view of /workspace, with real boxes.
 */
import { chownSync, existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box, BoxSpec } from '../../src/sandbox/driver.js';
import { stageWorkspace } from '../../src/sandbox/box-uid.js';
import { isMountPoint } from '../../src/sandbox/disk.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { cleanupTmp, eventually, hostProcessesOf, localProbe, pidNamespace, run, RUN_DIR, spec } from './local-helpers.js';

const probe = await localProbe();
const root = process.getuid?.() === 0;

/** Real, effective, saved and filesystem uid (then gid) of a host process, from its status. */
function ids(pid: number): { uid: number[]; gid: number[] } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const line = (k: string) => (status.match(new RegExp(`^${k}:\\s*(.*)$`, 'm'))?.[1] ?? '').split(/\s+/).filter(Boolean).map(Number);
  return { uid: line('Uid'), gid: line('Gid') };
}

/** Host uid and gid shared by every process inside the box's PID namespace (they must all agree), and those processes. */
async function boxIds(box: Box, id: string): Promise<{ uid: number; gid: number; pids: number[] }> {
  const ns = await pidNamespace(box);
  // bwrap outside the box (its monitor, in the box's cgroup) is the server's: only what is inside
  // the box's PID namespace counts.
  const inside = hostProcessesOf(ns, id).filter((p) => {
    try {
      return readlinkSync(`/proc/${p}/ns/pid`) === ns;
    } catch {
      return false;
    }
  });
  expect(inside.length).toBeGreaterThan(0);
  const all = inside.map(ids);
  const uid = all[0].uid[0];
  const gid = all[0].gid[0];
  for (const i of all) {
    expect(i.uid).toEqual([uid, uid, uid, uid]);
    expect(i.gid).toEqual([gid, gid, gid, gid]);
  }
  // Never host root, whatever else a test looks at.
  expect(uid).not.toBe(0);
  expect(gid).not.toBe(0);
  return { uid, gid, pids: inside };
}

/** Host pids of every process with this host uid (real, effective, saved or filesystem). */
function processesOfUid(uid: number): number[] {
  return readdirSync('/proc')
    .filter((e) => /^\d+$/.test(e))
    .filter((e) => {
      try {
        return ids(Number(e)).uid.includes(uid);
      } catch {
        return false;
      }
    })
    .map(Number);
}

/** Host pids of every process in the user namespace of host process `pid`. */
function inUserNamespaceOf(pid: number): number[] {
  const ns = readlinkSync(`/proc/${pid}/ns/user`);
  return readdirSync('/proc')
    .filter((e) => /^\d+$/.test(e))
    .filter((e) => {
      try {
        return readlinkSync(`/proc/${e}/ns/user`) === ns;
      } catch {
        return false;
      }
    })
    .map(Number);
}

describe.skipIf(!probe.ok || !root)(`local driver: a root server's box runs under a host uid of its own (${probe.why})`, () => {
  let driver: LocalDriver;
  const started: { box: Box; s: BoxSpec }[] = [];

  beforeAll(() => {
    driver = new LocalDriver({ runDir: RUN_DIR });
  });

  afterAll(async () => {
    await driver?.close();
    cleanupTmp();
  });

  async function start(s: BoxSpec, d = driver): Promise<Box> {
    const box = await d.start(s);
    started.push({ box, s });
    return box;
  }

  it('the box and its executions are an unprivileged host uid and gid, not root nor the server, and 1000 inside', async () => {
    const s = spec({ id: 'uid-a' });
    const box = await start(s);
    // A long-lived process of an execution, next to the box's own pid 1 and main process.
    const bg = await box.exec({ command: 'echo ready; exec sleep 1030' });
    let said = '';
    bg.stdout.on('data', (d: Buffer) => (said += d));
    bg.stderr.resume();
    expect(await eventually(() => said === 'ready\n')).toBe(true);
    const { uid, gid, pids } = await boxIds(box, s.id);
    expect(uid).not.toBe(0);
    expect(uid).not.toBe(process.getuid!());
    expect(gid).not.toBe(0);
    expect(uid).toBeGreaterThanOrEqual(2_000_000_000);
    // The execution's sleep is among them, with the box's ids.
    const sleeper = pids.find((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8') === 'sleep\u00001030\u0000');
    expect(sleeper).toBeDefined();
    expect(ids(sleeper!).uid[0]).toBe(uid);
    // No supplementary group of the server's (root) reaches the box.
    expect(readFileSync(`/proc/${sleeper}/status`, 'utf8')).toMatch(/^Groups:\s*$/m);
    // Inside, the box's user is still 1000, and its map names only that host id.
    const inside = await run(box, ['sh', '-c', 'id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map']);
    expect(inside.exitCode, inside.stderr).toBe(0);
    const lines = inside.stdout.trim().split('\n').map((l) => l.trim().split(/\s+/).join(' '));
    expect(lines).toEqual(['1000', '1000', `1000 ${uid} 1`, `1000 ${gid} 1`]);
    // No descriptor of the box's processes is a namespace or a directory of the host (bwrap was
    // handed the box's user namespace by one), but bwrap's init's of its own user namespace.
    const pid1 = pids.find((p) => readFileSync(`/proc/${p}/status`, 'utf8').match(/^NSpid:.*\s1$/m));
    expect(pid1).toBeDefined();
    const own = readlinkSync(`/proc/${pid1}/ns/user`);
    for (const p of pids) {
      for (const fd of readdirSync(`/proc/${p}/fd`)) {
        let target = '';
        try {
          target = readlinkSync(`/proc/${p}/fd/${fd}`);
        } catch {
          continue;
        }
        if (p === pid1 && target === own) continue;
        expect(target).not.toMatch(/^(user|mnt|pid|net|ipc|uts|cgroup|time):\[/);
        expect(target.startsWith('/')).toBe(target === '/dev/null');
      }
    }
    bg.kill('SIGKILL');
    await bg.done;
    // Nothing made for the start outlives it: no process in the box's user namespace but the
    // box's own and bwrap outside it (pid 1's parent; the helper that held the namespace while
    // its maps were written is gone), and the staging bind of its workspace is gone.
    const now = (await boxIds(box, s.id)).pids;
    const parents = new Set(now.map((p) => Number(readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1].split(' ')[1])));
    const others = inUserNamespaceOf(pids[0]).filter((p) => !now.includes(p));
    expect(others.map((p) => [parents.has(p), readFileSync(`/proc/${p}/comm`, 'utf8').trim()])).toEqual([[true, 'bwrap']]);
    expect(readdirSync('/run/keygate-stage').filter((n) => n.endsWith(`-${s.id}`))).toEqual([]);
  });

  it("what the box writes in /workspace, by itself or through the files API, is its host uid's, and stays its own to change", async () => {
    const s = spec({ id: 'uid-files' });
    const box = await start(s);
    const { uid, gid } = await boxIds(box, s.id);
    const ws = path.join(s.stateDir, 'workspace');
    expect(statSync(ws)).toMatchObject({ uid, gid });
    expect((await run(box, ['sh', '-c', 'echo made > /workspace/made.txt'])).exitCode).toBe(0);
    expect(statSync(path.join(ws, 'made.txt'))).toMatchObject({ uid, gid });
    await box.writeFile('/workspace/up.txt', Readable.from([Buffer.from('uploaded\n')]), 1024);
    expect(statSync(path.join(ws, 'up.txt'))).toMatchObject({ uid, gid });
    const r = await run(box, ['sh', '-c', 'echo more >> /workspace/up.txt && cat /workspace/up.txt && ls -ln /workspace/up.txt']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^uploaded\nmore\n-rw-r--r-- 1 1000 1000 /);
  });

  it('two boxes get different host uids', async () => {
    const a = spec({ id: 'uid-b1' });
    const b = spec({ id: 'uid-b2' });
    const boxA = await start(a);
    const boxB = await start(b);
    const ia = await boxIds(boxA, a.id);
    const ib = await boxIds(boxB, b.id);
    expect(ia.uid).not.toBe(ib.uid);
    expect(ia.gid).not.toBe(ib.gid);
  });

  it('the host uid survives stop/start and a restarted server, and the box can still change its files', async () => {
    const s = spec({ id: 'uid-keep' });
    let box = await start(s);
    const first = await boxIds(box, s.id);
    expect((await run(box, ['sh', '-c', 'echo one > /workspace/keep.txt'])).exitCode).toBe(0);
    await box.stop();
    box = await start(s);
    expect((await boxIds(box, s.id)).uid).toBe(first.uid);
    expect((await run(box, ['sh', '-c', 'echo two >> /workspace/keep.txt'])).exitCode).toBe(0);
    await box.stop();
    // Stopped: no process of its host uid is left.
    expect(processesOfUid(first.uid)).toEqual([]);
    // A new server on the same data directory (keygate serve restarted).
    const restarted = new LocalDriver({ runDir: RUN_DIR });
    try {
      await restarted.reapOrphans(new Set([s.id]));
      box = await start(s, restarted);
      expect(await boxIds(box, s.id)).toMatchObject({ uid: first.uid, gid: first.gid });
      const r = await run(box, ['sh', '-c', 'echo three >> /workspace/keep.txt && cat /workspace/keep.txt']);
      expect(r.exitCode, r.stderr).toBe(0);
      expect(r.stdout).toBe('one\ntwo\nthree\n');
    } finally {
      await restarted.close();
    }
  });

  it("a workspace an earlier version left as the server's (root's) files becomes the box's own", async () => {
    // Without the sized file system, /workspace is a plain directory of the state directory: as
    // an earlier version left it, every file root's on the host (its box ran as host uid 0).
    const plain = new LocalDriver({ runDir: `${RUN_DIR}-plain`, workspaceFs: false });
    try {
      const s = spec({ id: 'uid-old' });
      const ws = path.join(s.stateDir, 'workspace');
      mkdirSync(path.join(ws, 'dir'), { recursive: true });
      writeFileSync(path.join(ws, 'dir', 'old.txt'), 'old\n');
      chownSync(ws, 0, 0);
      const box = await start(s, plain);
      const { uid, gid } = await boxIds(box, s.id);
      for (const p of ['', 'dir', 'dir/old.txt']) expect(statSync(path.join(ws, p))).toMatchObject({ uid, gid });
      const r = await run(box, ['sh', '-c', 'echo new >> /workspace/dir/old.txt && cat /workspace/dir/old.txt && touch /workspace/dir/x']);
      expect(r.exitCode, r.stderr).toBe(0);
      expect(r.stdout).toBe('old\nnew\n');
    } finally {
      await plain.close();
    }
  });

  it('DELETE gives the id back; a staging a crashed start left is removed by reaping', async () => {
    const s = spec({ id: 'uid-del' });
    const box = await start(s);
    const { uid } = await boxIds(box, s.id);
    const record = path.join(RUN_DIR, 'uids', s.id);
    expect(readFileSync(record, 'utf8').trim()).toBe(String(uid));
    await driver.destroy(s.id, s.stateDir);
    expect(existsSync(record)).toBe(false);
    expect(processesOfUid(uid)).toEqual([]);
    // A server killed while a box was starting leaves its workspace bound at the staging place;
    // the next server's reaping (by the box's cgroup or run record) takes it away.
    const left = spec({ id: 'uid-left' });
    const ws = path.join(left.stateDir, 'workspace');
    mkdirSync(ws, { recursive: true });
    const staged = await stageWorkspace(RUN_DIR, left.id, { workspace: ws }, { uid, gid: uid });
    expect(isMountPoint(staged.workspace)).toBe(true);
    writeFileSync(path.join(RUN_DIR, `${left.id}.json`), JSON.stringify({ id: left.id, stateDir: left.stateDir, pid1: 1, pid1Start: 'never' }));
    await new LocalDriver({ runDir: RUN_DIR }).reapOrphans(new Set());
    expect(isMountPoint(staged.workspace)).toBe(false);
    expect(existsSync(path.dirname(staged.workspace))).toBe(false);
  });
});
