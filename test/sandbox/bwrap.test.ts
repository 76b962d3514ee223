/**
 * The bubblewrap planner (pure): what a box's /proc covers. The real boxes are in hostile-host.
 */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { bwrapArgs, deviceRemountOptions, enterArgs, PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READ_ONLY, type BwrapPlan } from '../../src/sandbox/bwrap.js';
import { procRootOnly } from '../../src/sandbox/local.js';

function plan(procNames: string[], procRootOnly: BwrapPlan['procRootOnly'] = []): BwrapPlan {
  return { rootDir: '', entries: [], etcEntries: [], files: {}, workspace: '/w', infoFd: 3, blockFd: 9, disableUserns: true, tmpfsMb: { tmp: 8, shm: 8 }, procNames, procRootOnly };
}

/** The arguments between `--proc /proc` and the next top-level mount (/dev). */
function procPart(a: string[]): string[] {
  const from = a.indexOf('--proc');
  return a.slice(from, a.indexOf('/dev', from) - 1);
}

describe('bwrapArgs: /proc', () => {
  it('binds the host-global places read-only and masks root-only files and directories, right after mounting /proc', () => {
    const all = [...PROC_READ_ONLY, ...PROC_MASKED_FILES, ...PROC_MASKED_DIRS, 'cpuinfo', 'self'];
    const p = procPart(bwrapArgs(plan(all)));
    expect(p.slice(0, 2)).toEqual(['--proc', '/proc']);
    const s = p.join(' ');
    expect(s).toContain('--ro-bind /proc/sys /proc/sys');
    expect(s).toContain('--ro-bind /proc/sysrq-trigger /proc/sysrq-trigger');
    for (const n of ['irq', 'bus', 'fs']) expect(s).toContain(`--ro-bind /proc/${n} /proc/${n}`);
    for (const n of ['kcore', 'keys', 'timer_list', 'sched_debug', 'kpageflags', 'kmsg']) expect(s).toContain(`--ro-bind /dev/null /proc/${n}`);
    for (const n of ['acpi', 'asound', 'scsi']) expect(s).toContain(`--tmpfs /proc/${n} --remount-ro /proc/${n}`);
    expect(s).not.toMatch(/cpuinfo|self/);
    // Never bound writable, never from anywhere but the host's /proc and /dev/null.
    expect(p).not.toContain('--bind');
    expect(p).not.toContain('--dev-bind');
  });

  it('covers only what the kernel has (bwrap cannot mount on a missing path)', () => {
    const s = procPart(bwrapArgs(plan(['sys', 'irq', 'kcore']))).join(' ');
    expect(s).toBe('--proc /proc --ro-bind /proc/sys /proc/sys --ro-bind /proc/irq /proc/irq --ro-bind /dev/null /proc/kcore');
  });

  it('masks what the caller found root-only, over the read-only binds, once', () => {
    const s = procPart(bwrapArgs(plan(['sys', 'kmsg'], [{ path: 'kmsg', dir: false }, { path: 'sys/kernel/cad_pid', dir: false }, { path: 'tty/driver', dir: true }]))).join(' ');
    expect(s).toBe(
      '--proc /proc --ro-bind /proc/sys /proc/sys --ro-bind /dev/null /proc/kmsg --ro-bind /dev/null /proc/sys/kernel/cad_pid --perms 0555 --size 4096 --tmpfs /proc/tty/driver --remount-ro /proc/tty/driver',
    );
  });

  it("fails closed without the host's /proc/sys to bind: the box's is an empty read-only tmpfs", () => {
    const s = procPart(bwrapArgs(plan(['irq']))).join(' ');
    expect(s).toBe('--proc /proc --perms 0555 --tmpfs /proc/sys --remount-ro /proc/sys --ro-bind /proc/irq /proc/irq');
  });
});

describe('deviceRemountOptions', () => {
  it('read-only, nosuid and noexec, never nodev unless the mount already is (a locked flag must be kept)', () => {
    expect(deviceRemountOptions(['rw', 'nosuid', 'relatime'])).toBe('remount,bind,ro,nosuid,noexec');
    expect(deviceRemountOptions(['rw', 'nosuid', 'nodev', 'noexec', 'relatime'])).toBe('remount,bind,ro,nosuid,noexec,nodev');
  });
});

describe('procRootOnly', () => {
  it('finds what only root may read, masks a root-only directory whole, skips process directories and /proc/sys/net', () => {
    const base = mkdtempSync(path.join(os.tmpdir(), 'kg-proc-'));
    try {
      const put = (rel: string, mode: number) => {
        mkdirSync(path.dirname(path.join(base, rel)), { recursive: true });
        writeFileSync(path.join(base, rel), 'x');
        chmodSync(path.join(base, rel), mode);
      };
      put('kmsg', 0o400);
      put('cpuinfo', 0o444);
      put('sys/kernel/cad_pid', 0o600);
      put('sys/kernel/core_pattern', 0o644);
      put('sys/vm/drop_caches', 0o200);
      put('sys/net/ipv4/tcp_fastopen_key', 0o600);
      put('123/environ', 0o400);
      put('tty/driver/serial', 0o400);
      chmodSync(path.join(base, 'tty/driver'), 0o500);
      symlinkSync('123', path.join(base, 'self'));
      const found = procRootOnly(base).sort((a, b) => a.path.localeCompare(b.path));
      expect(found).toEqual([
        { path: 'kmsg', dir: false },
        { path: 'sys/kernel/cad_pid', dir: false },
        { path: 'tty/driver', dir: true },
      ]);
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });
});

describe('bwrapArgs and enterArgs: the user namespace', () => {
  it("a root server's box is built in the namespace it is given: no --unshare-user, no nested one of bwrap's, the descriptor kept by init only", () => {
    const given = bwrapArgs({ ...plan([]), userns: 5 });
    expect(given.slice(0, 4)).toEqual(['--userns', '5', '--sync-fd', '5']);
    for (const ns of ['ipc', 'pid', 'net', 'uts', 'cgroup']) expect(given).toContain(`--unshare-${ns}`);
    expect(given).not.toContain('--unshare-user');
    expect(given).not.toContain('--unshare-all');
    expect(given).not.toContain('--disable-userns');
    const own = bwrapArgs(plan([]));
    expect(own.slice(0, 2)).toEqual(['--unshare-all', '--unshare-user']);
    expect(own).toContain('--disable-userns');
    expect(own).not.toContain('--userns');
  });

  it('an execution of a root server becomes the box user inside; otherwise it keeps its uid (bwrap mapped it)', () => {
    const fds = [10, 11, 12, 13, 14, 15, 16, 17];
    const asBox = enterArgs(42, fds, '/workspace', true);
    expect(asBox.slice(-4)).toEqual(['--wdns=/workspace', '--setuid=1000', '--setgid=1000', '--']);
    expect(asBox).not.toContain('--preserve-credentials');
    expect(enterArgs(42, fds, '/workspace').slice(-3)).toEqual(['--wdns=/workspace', '--preserve-credentials', '--']);
  });
});
