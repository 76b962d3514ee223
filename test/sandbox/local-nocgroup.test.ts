/**
 * Local driver without cgroups (sandbox.md property 5), the fallback of a server that cannot create
 * cgroups (limits through rlimits), forced here with `cgroups: false`: an execution timeout and
 * kill() still take down that execution's whole tree, daemons that call setsid or double-fork
 * included, while a process an earlier execution left in the background lives on, and so does the
 * box. Checked in the host's /proc. Real boxes only.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { REPO_ROOT } from '../helpers/proxy.js';
import { cleanupTmp, eventually, expectOnlyStdio, expectSignalsPassThrough, expectStdinPassThrough, hostProcessesOf, localProbe, pidNamespace, run, RUN_DIR, SCATTER, spec, TMP } from './local-helpers.js';

const probe = await localProbe({ cgroups: false });
const BUSYBOX = '/bin/busybox';
const NOBODY = 65534;

/**
 * SCATTER (a background child, setsid, nohup, a double fork) plus daemons that leave the session
 * and the process group every other way: double fork + setsid, an `env -i` daemon, nohup + setsid.
 */
const DAEMONS = `${SCATTER}; (setsid sh -c 'sleep 1011 &' &); env -i setsid sleep 1012 & nohup setsid sleep 1013 >/dev/null 2>&1 & echo daemons`;
/** The `sleep N` processes DAEMONS starts (1003 is nohup's `sh -c` own last command). */
const DAEMON_SLEEPS = [1000, 1001, 1002, 1003, 1004, 1011, 1012, 1013].map((n) => `sleep ${n}`);

/** host pid -> command line, of every live `sleep N` in the box (a zombie has no command line). */
function sleepsIn(pidNs: string, id: string): Map<number, string> {
  const out = new Map<number, string>();
  for (const pid of hostProcessesOf(pidNs, id)) {
    let args = '';
    try {
      args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
    } catch {
      continue;
    }
    if (/^sleep \d+$/.test(args)) out.set(pid, args);
  }
  return out;
}

describe.skipIf(!probe.ok)(`local driver without cgroups: execution trees (${probe.why})`, () => {
  let driver: LocalDriver;

  beforeAll(() => {
    driver = new LocalDriver({ runDir: RUN_DIR, cgroups: false });
  });

  afterAll(async () => {
    await driver?.close();
    cleanupTmp();
  });

  it('the probe says limits are rlimits and which mechanism kills execution trees', async () => {
    // A root server's boxes have host ids of their own (box-uid.ts): the process limit binds for them too.
    expect(probe.why).toMatch(/limits through rlimits \(cgroups turned off\)/);
    expect(probe.why).toMatch(/execution trees killed through a subreaper tini \(\/\S+\) and the host's \/proc$/);
  });

  it('an execution timeout and kill() take down that execution tree, setsid daemons included, not the box nor what an earlier execution left', async () => {
    const s = spec();
    const box = await driver.start(s);
    const ns = await pidNamespace(box);
    // An earlier execution leaves a process in the background: it outlives that execution (its
    // normal exit) and every kill below, which are not its.
    expect((await run(box, 'sleep 999 >/dev/null 2>&1 & echo left')).stdout).toBe('left\n');
    const earlier = sleepsIn(ns, s.id);
    expect([...earlier.values()]).toEqual(['sleep 999']);

    /** Starts DAEMONS then `sleep main` in the box; returns once every one of them runs (host /proc). */
    const startDaemons = async (main: number, timeoutMs?: number) => {
      const p = await box.exec({ command: `${DAEMONS}; sleep ${main}`, timeoutMs });
      let out = '';
      p.stdout.on('data', (d: Buffer) => (out += d));
      p.stderr.resume();
      const want = [...DAEMON_SLEEPS, `sleep ${main}`, 'sleep 999'].sort();
      const running = await eventually(() => [...sleepsIn(ns, s.id).values()].sort().join() === want.join(), 5000);
      expect(running, [...sleepsIn(ns, s.id).values()].join()).toBe(true);
      return { p, out: () => out };
    };

    const t0 = Date.now();
    const timed = await startDaemons(1006, 2500);
    const r = await timed.p.done;
    expect(timed.out()).toBe('started\ndaemons\n');
    expect(r.timedOut).toBe(true);
    expect(r.signal).toBe('SIGKILL');
    expect(Date.now() - t0).toBeLessThan(10_000);
    // In the host's /proc: not one daemon left; the earlier execution's process is the same one.
    expect(sleepsIn(ns, s.id)).toEqual(earlier);

    const killed = await startDaemons(1007);
    killed.p.kill();
    const k = await killed.p.done;
    expect(k.timedOut).toBe(false);
    expect(k.signal).toBe('SIGKILL');
    expect(sleepsIn(ns, s.id)).toEqual(earlier);

    // The box itself lives on, and its pid 1 still collects what executions leave.
    expect((await run(box, 'echo alive')).stdout).toBe('alive\n');
    await box.stop();
    expect(hostProcessesOf(ns, s.id)).toEqual([]);
  });

  // The kernel exempts a real uid 0 from RLIMIT_NPROC: before boxes had host ids of their own, a
  // root server's box with `pids: 20` ran 60 processes, and a fork loop took every pid of the host.
  it('the process limit binds (as root too): a box of `pids` 24 cannot hold 60 processes', async () => {
    const box = await driver.start(spec({ resources: { pids: 24 } }));
    const r = await run(box, `i=0; while [ $i -lt 60 ]; do sleep 1040 & i=$((i+1)); done; echo started all`, { timeoutMs: 20_000 });
    const ns = await pidNamespace(box).catch(() => '');
    expect(r.stdout).not.toContain('started all');
    expect(r.stderr).toMatch(/fork/i);
    if (ns) expect(hostProcessesOf(ns, box.id).length).toBeLessThanOrEqual(26);
    await box.stop();
  });

  it('a tree still forking daemons when it is killed goes whole, and leaves no zombie to the host', async () => {
    // Room for all 400 daemons: a root server's box is a host uid of its own (box-uid.ts), so the
    // process limit (RLIMIT_NPROC, 128 by default) binds, and a loop whose forks fail ends early.
    const s = spec({ resources: { pids: 2048 } });
    const box = await driver.start(s);
    const ns = await pidNamespace(box);
    // Forks a setsid daemon every few milliseconds (bounded: 400) until the timeout.
    const r = await run(box, `i=0; while [ $i -lt 400 ]; do (setsid sh -c 'sleep 1030 &' &); i=$((i+1)); sleep 0.005; done`, { timeoutMs: 1500 });
    expect(r.timedOut).toBe(true);
    expect(sleepsIn(ns, s.id)).toEqual(new Map());
    // Left in the box's PID namespace: its pid 1 and main process only.
    expect(hostProcessesOf(ns, s.id)).toHaveLength(2);
    // Not even a zombie: the killed tini is collected by the host-side nsenter, not left to the
    // host's init (which collects late, or never where keygate is a container's pid 1).
    const ps = await run(box, ['ps', '-eo', 'stat=,args=']);
    expect(ps.stdout.split('\n').filter((l) => l.startsWith('Z'))).toEqual([]);
    await box.stop();
  });

  it.skipIf(!existsSync(BUSYBOX))('a template with a root file system of its own gets the tini lent too (busybox-static)', async () => {
    // A root file system with busybox and nothing of the host's /usr: no tini of its own.
    const root = path.join(TMP, 'busybox-root');
    mkdirSync(path.join(root, 'bin'), { recursive: true });
    mkdirSync(path.join(root, 'usr/bin'), { recursive: true });
    copyFileSync(BUSYBOX, path.join(root, 'bin/busybox'));
    chmodSync(path.join(root, 'bin/busybox'), 0o755);
    for (const applet of ['sh', 'sleep', 'setsid', 'ps', 'cat', 'readlink']) symlinkSync('busybox', path.join(root, 'bin', applet));
    symlinkSync('../../bin/busybox', path.join(root, 'usr/bin/env'));
    const s = spec({ template: { name: 'busybox', rootfs: root, environment: {} } });
    const box = await driver.start(s);
    const ns = await pidNamespace(box);
    expect((await run(box, 'ls /usr/bin; echo; cat /proc/$PPID/cmdline | tr "\\0" " "')).stdout).toMatch(/^env\n\n\/\.keygate\/tini -s -- \/usr\/bin\/env -i /);
    const r = await run(box, `setsid sleep 1040 & (setsid sh -c 'sleep 1041 &' &); sleep 1042`, { timeoutMs: 1000 });
    expect(r.timedOut).toBe(true);
    expect(sleepsIn(ns, s.id)).toEqual(new Map());
    await box.stop();
  });

  // The fallback as deployed: a server that is not root cannot create cgroups here, so it picks
  // tini by itself. Needs `npm run build` (the fixture runs the built driver as user nobody).
  it.skipIf(process.getuid?.() !== 0)('an unprivileged server (no cgroups of its own) kills setsid daemons at an execution timeout too', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-nobody-'));
    try {
      chmodSync(dir, 0o755);
      mkdirSync(path.join(dir, 'data'), { mode: 0o700 });
      chownSync(path.join(dir, 'data'), NOBODY, NOBODY);
      const r = spawnSync('setpriv', ['--reuid', String(NOBODY), '--regid', String(NOBODY), '--clear-groups', '--', process.execPath, path.join(REPO_ROOT, 'test/sandbox/fixtures/unprivileged-tree.mjs'), path.join(REPO_ROOT, 'dist/sandbox/local.js'), path.join(dir, 'data/run'), path.join(dir, 'data/box'), `${DAEMONS}; sleep 1006`], { encoding: 'utf8', timeout: 60_000, cwd: dir });
      expect(r.status, r.stderr).toBe(0);
      const out = JSON.parse(r.stdout) as { probe: { ok: boolean; detail?: string; reason?: string }; timedOut: boolean; signal: string; started: string; left: string[] };
      if (!out.probe.ok) return void console.warn(`SKIPPED unprivileged server: ${out.probe.reason}`);
      expect(out.probe.detail).toMatch(/limits through rlimits \(.*\); execution trees killed through a subreaper tini/);
      expect(out).toMatchObject({ timedOut: true, signal: 'SIGKILL', started: 'started\ndaemons\n' });
      // Left in the box: pid 1, its main process, the earlier execution's sleep, and `ps` under its tini.
      expect(out.left.filter((l) => !/ps -eo stat=,args=$/.test(l))).toEqual(['Ss /usr/bin/bwrap --args 4 -- sleep infinity', 'S sleep infinity', 'S sleep 999']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("the box's memory bound holds for its in-memory file systems: /tmp, /dev/shm, /dev and / cannot take the host's memory", async () => {
    // Without cgroups nothing charges a tmpfs page to the box (RLIMIT_AS counts none): each tmpfs
    // must have a size of its own, or be read-only.
    const box = await driver.start(spec({ resources: { memory_mb: 64 } }));
    const MB = 1024 * 1024;
    for (const dir of ['/tmp', '/dev/shm', '/dev', '/', '/run', '/etc']) {
      const f = `${dir === '/' ? '' : dir}/fill`;
      const r = await run(box, `head -c ${200 * MB} /dev/zero > ${f}; echo "rc=$?"; wc -c < ${f} 2>/dev/null; rm -f ${f}`);
      const [rc, written] = r.stdout.trim().split('\n');
      expect(rc, `${dir}: ${r.stdout} ${r.stderr}`).not.toBe('rc=0');
      expect(Number(written ?? 0), dir).toBeLessThanOrEqual(64 * MB);
    }
    // /tmp is still there to use, and /workspace (on disk) is not a tmpfs.
    expect((await run(box, 'echo t > /tmp/t && cat /tmp/t && echo w > /workspace/w && cat /workspace/w')).stdout).toBe('t\nw\n');
    await box.stop();
  });

  it('exit codes, stdin and signals sent pass through', async () => {
    const box: Box = await driver.start(spec());
    // Under tini too, the command holds only its stdio.
    await expectOnlyStdio(box);
    expect((await run(box, 'echo out; echo err >&2; exit 7')).exitCode).toBe(7);
    await expectStdinPassThrough(box);

    // SIGTERM reaches the command (not only the host-side helpers): it can trap it and go on.
    await expectSignalsPassThrough(box);
    await box.stop();
  });
});
