/**
 * Local driver, fail closed (sandbox.md property 2): when bubblewrap is missing or the kernel refuses
 * user namespaces, probe() says precisely what is missing and how to get it, and start() rejects with
 * BoxStartError: never a box with open network. The refused kernel is real: the driver runs inside a
 * user namespace where no further one may be made (bwrap --disable-userns).
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { BoxStartError } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { REPO_ROOT } from '../helpers/proxy.js';
import { cleanupTmp, localProbe, spec, TMP } from './local-helpers.js';

const outer = await localProbe();
afterAll(() => cleanupTmp());

describe('local driver: fail closed', () => {
  it('no bubblewrap: says to install it, and start rejects', async () => {
    const driver = new LocalDriver({ runDir: path.join(TMP, 'nobwrap'), bwrap: path.join(TMP, 'no-such-bwrap') });
    const p = await driver.probe();
    expect(p).toEqual({ ok: false, reason: 'bubblewrap (bwrap) is not installed', hint: 'install bubblewrap (apt-get install bubblewrap)' });
    const e = await driver.start(spec()).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(BoxStartError);
    expect((e as Error).message).toMatch(/apt-get install bubblewrap/);
  });

  /** Runs the built driver's probe and a start under `wrapper` (a real, more confined environment). */
  function probeUnder(wrapper: string[], runDir: string) {
    const r = spawnSync(wrapper[0], [...wrapper.slice(1), process.execPath, path.join(REPO_ROOT, 'test/sandbox/fixtures/probe.mjs'), path.join(REPO_ROOT, 'dist/sandbox/local.js'), runDir], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(r.status, r.stderr).toBe(0);
    return JSON.parse(r.stdout) as { probe: { ok: boolean; reason: string; hint: string }; start: { started: boolean; name: string; message: string } };
  }

  it.skipIf(!outer.ok)('user namespaces disabled by sysctl: names the sysctl, and start rejects', () => {
    // A user namespace of our own whose user.max_user_namespaces is 0: the kernel refuses any more.
    const { probe, start } = probeUnder(['unshare', '-U', '-r', 'sh', '-c', 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', 'sh'], path.join(TMP, 'sysctl0'));
    expect(probe.ok).toBe(false);
    expect(probe.reason).toMatch(/^user namespaces are disabled \(sysctl user\.max_user_namespaces = 0\)/);
    expect(probe.hint).toBe('sysctl -w user.max_user_namespaces=15000');
    expect(start).toMatchObject({ started: false, name: 'BoxStartError' });
    expect(start.message).toMatch(/max_user_namespaces = 0/);
  });

  it.skipIf(!outer.ok)('inside a sandbox that allows no nested user namespace: says so, and start rejects', () => {
    const { probe, start } = probeUnder(['bwrap', '--unshare-user', '--disable-userns', '--die-with-parent', '--dev-bind', '/', '/', '--proc', '/proc', '--'], path.join(TMP, 'nested'));
    expect(probe.ok).toBe(false);
    expect(probe.reason).toMatch(/no user namespace can be made here: the nesting depth or sysctl user\.max_user_namespaces limit is reached/);
    expect(start).toMatchObject({ started: false, name: 'BoxStartError' });
  });

  // This machine runs cgroup v1: memory, pids and cpu are bound to v1 hierarchies (the engine's
  // and keygate's own boxes use them), so no cgroup2 mount can carry them, and the v2 limits
  // themselves cannot be exercised here. What can: a server that sees a cgroup2 hierarchy at
  // /sys/fs/cgroup (a real one, mounted in a mount namespace of its own) without those
  // controllers says so and falls back to rlimits. As root that was refused while a box's
  // processes were host root (the kernel exempts uid 0 from RLIMIT_NPROC); its boxes now have
  // host ids of their own, which the limit counts (local-nocgroup.test.ts checks it binds), so
  // the probe accepts and a box starts.
  it.skipIf(!outer.ok || process.getuid?.() !== 0 || existsSync('/sys/fs/cgroup/cgroup.controllers'))('cgroup v2 that does not hand out memory, pids and cpu, as root: boxes on rlimits, each a host uid of its own', () => {
    const cgroup2 = ['unshare', '-m', '--propagation', 'private', 'sh', '-c', 'mount -t cgroup2 none /sys/fs/cgroup && exec "$@"', 'sh'];
    const { probe, start } = probeUnder(cgroup2, path.join(TMP, 'cgroup2'));
    const detail = (probe as unknown as { detail: string }).detail;
    expect(probe.ok, JSON.stringify(probe)).toBe(true);
    expect(detail).toMatch(/each box a host uid of its own/);
    expect(detail).toMatch(/limits through rlimits \(cgroup v2 not delegated here \(ENOENT\)\)/);
    expect(start, JSON.stringify(start)).toEqual({ started: true });
    // The cgroup2 hierarchy is the machine's, whichever namespace mounts it: nothing left in it.
    const left = spawnSync(cgroup2[0], [...cgroup2.slice(1), 'ls', '/sys/fs/cgroup'], { encoding: 'utf8' });
    expect(left.status, left.stderr).toBe(0);
    expect(left.stdout.split('\n').filter((n) => n.startsWith('keygate-'))).toEqual([]);
  });

  // Without cgroups, only tini keeps an execution's setsid daemons within reach of its timeout
  // (local-nocgroup.test.ts): no tini there, no boxes.
  it.skipIf(!outer.ok)('no cgroups and no static tini: says to install tini, and start rejects; with cgroups tini is not needed', async () => {
    const driver = new LocalDriver({ runDir: path.join(TMP, 'notini'), cgroups: false, tini: path.join(TMP, 'no-such-tini') });
    const p = await driver.probe();
    expect(p).toEqual({
      ok: false,
      reason: 'no cgroups (cgroups turned off) and no static tini: an execution timeout could not kill what the execution started with setsid',
      hint: 'install tini (apt-get install tini), or run where cgroups can be created',
    });
    await expect(driver.start(spec())).rejects.toThrow(BoxStartError);
    await expect(driver.start(spec())).rejects.toThrow(/apt-get install tini/);

    // Where cgroups work (a root server here), they kill execution trees: no tini needed.
    if (/execution trees killed through their cgroup$/.test(outer.why)) {
      const withCgroups = await new LocalDriver({ runDir: path.join(TMP, 'notini-cg'), tini: path.join(TMP, 'no-such-tini') }).probe();
      expect(withCgroups).toMatchObject({ ok: true });
      expect((withCgroups as { detail: string }).detail).toMatch(/; execution trees killed through their cgroup$/);
    }
  });

  it.skipIf(!outer.ok)('a template whose root file system is not there: BoxStartError, nothing left running', async () => {
    const driver = new LocalDriver({ runDir: path.join(TMP, 'badroot') });
    const s = spec({ template: { name: 'ghost', rootfs: path.join(TMP, 'no-such-root'), environment: {} } });
    await expect(driver.start(s)).rejects.toThrow(BoxStartError);
    await expect(driver.start(spec({ template: { name: 'rel', rootfs: 'relative/root', environment: {} } }))).rejects.toThrow(/absolute directory/);
    await expect(driver.start(spec({ id: '../escape' }))).rejects.toThrow(BoxStartError);
    await driver.close();
  });
});
