/**
 * The bubblewrap planner (pure): what a box's /proc covers. The real boxes are in hostile-host.
 */
import { describe, expect, it } from 'vitest';
import { bwrapArgs, deviceRemountOptions, PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READ_ONLY, type BwrapPlan } from '../../src/sandbox/bwrap.js';

function plan(procNames: string[]): BwrapPlan {
  return { rootDir: '', entries: [], etcEntries: [], files: {}, workspace: '/w', infoFd: 3, blockFd: 9, disableUserns: true, tmpfsMb: { tmp: 8, shm: 8 }, procNames };
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
