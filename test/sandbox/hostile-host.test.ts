/**
 * Local driver, an attacker inside a real box going for the host's kernel settings and devices.
 * A root server's box was host uid 0 outside before it had a host uid of its own (box-uid.ts,
 * `local-uid`): capabilities dropped, but plain file permissions (DAC) passed for uid 0 on every
 * procfs file owned by global root, so whatever the box's mounts left writable, the box wrote on
 * the host (`/proc/sys/kernel/core_pattern` = `|/prog` runs a program as host root on the next
 * crash; `/proc/bus/pci/*` is PCI configuration space). Likewise for reading root-only host-global
 * files, and for changing the modes of host inodes bound in (`/dev/null`). The mounts that fence
 * them stay (defence in depth), and are checked here still.
 *
 * SAFETY: every write here is harmless if it succeeds (the current value written back), or only
 * opens a file for writing without writing; the host's values are compared before and after.
 */
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { cleanupTmp, localProbe, run, RUN_DIR, spec, TMP } from './local-helpers.js';

const probe = await localProbe();
const root = process.getuid?.() === 0;

/** Host-global procfs places a box must not write (Docker's read-only paths). */
const READ_ONLY = ['/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs'];
/** Root-only or host-wide files a box must get nothing from (Docker's masked paths and the root-only rest). */
const MASKED_FILES = [
  'kcore',
  'keys',
  'latency_stats',
  'timer_list',
  'timer_stats',
  'sched_debug',
  'kpagecount',
  'kpageflags',
  'kpagecgroup',
  'slabinfo',
  'vmallocinfo',
  'pagetypeinfo',
  'kmsg',
].filter((n) => existsSync(`/proc/${n}`));
const MASKED_DIRS = ['acpi', 'asound', 'scsi'].filter((n) => existsSync(`/proc/${n}`));

/**
 * Opens every file under the read-only places for writing, without writing a byte (an open has no
 * effect on a sysctl, an IRQ's affinity or a PCI device's configuration): prints those it could.
 */
const OPEN_FOR_WRITE = `
import os, sys
for top in sys.argv[1:]:
    for dirpath, dirs, files in os.walk(top) if os.path.isdir(top) else [(os.path.dirname(top), [], [os.path.basename(top)])]:
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                fd = os.open(p, os.O_WRONLY)
            except OSError:
                continue
            os.close(fd)
            print("OPEN", p)
print("walked")
`;

/** Syscalls that change the host itself, each called so that it would change nothing if allowed. */
const PRIVILEGED_CALLS = `
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
def call(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, "allowed" if r >= 0 else errno.errorcode[ctypes.get_errno()])
# x86_64 numbers. Invalid flags (kexec), a bad magic (reboot), no module (delete_module), a bad fd
# (finit_module): with the capability they fail with EINVAL/ENOENT/EBADF, not EPERM.
call("kexec_load", 246, 0, 0, 0, ctypes.c_ulong(0xdead0000))
call("reboot", 169, 0, 0, 0, 0)
call("finit_module", 313, -1, b"", 0)
call("delete_module", 176, b"kg_no_such_module", 0)
call("ioperm", 173, 0x80, 1, 1)
try:
    time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME))
    print("clock_settime allowed")
except OSError as e:
    print("clock_settime", errno.errorcode[e.errno])
`;

/**
 * Every file of /proc outside the process directories that opens for writing ("w"), or reads at
 * least a byte ("r", never blocking), for the user that runs it.
 */
const PROC_ENUM = `
import os, sys
mode = sys.argv[1]
def usable(p):
    try:
        fd = os.open(p, os.O_WRONLY if mode == "w" else os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if mode == "w":
            return True
        try:
            return bool(os.read(fd, 1))
        except OSError:
            return False
    finally:
        os.close(fd)
def walk():
    for root, dirs, files in os.walk("/proc"):
        if root == "/proc":
            dirs[:] = [d for d in dirs if not d.isdigit() and d not in ("self", "thread-self")]
        for f in files:
            yield os.path.join(root, f)
# With "stdin": only the paths given there (one per line), instead of the walk.
paths = [p for p in sys.stdin.read().split("\\n") if p] if sys.argv[2:] == ["stdin"] else walk()
print("\\n".join(sorted(p for p in paths if usable(p))))
`;

describe.skipIf(!probe.ok)(`local driver: the host's kernel settings and devices stay out of reach (${probe.why}${root ? '; as root' : ''})`, () => {
  let driver: LocalDriver;
  let box: Box;

  beforeAll(async () => {
    driver = new LocalDriver({ runDir: RUN_DIR });
    box = await driver.start(spec({ id: 'hostile-host' }));
  });

  afterAll(async () => {
    await driver?.close();
    cleanupTmp();
  });

  it('host-global sysctls cannot be written, not even with the value they already hold', async () => {
    const before = { core: readFileSync('/proc/sys/kernel/core_pattern', 'utf8'), printk: readFileSync('/proc/sys/kernel/printk', 'utf8') };
    const r = await run(box, [
      'sh',
      '-c',
      'for f in kernel/core_pattern kernel/printk; do v=$(cat /proc/sys/$f) || exit 9; printf "%s\\n" "$v" > /proc/sys/$f && echo "WROTE $f"; done; true',
    ]);
    expect(r.stdout).not.toContain('WROTE');
    expect(r.stderr).toMatch(/core_pattern: Read-only file system/);
    expect(r.stderr).toMatch(/printk: Read-only file system/);
    expect(readFileSync('/proc/sys/kernel/core_pattern', 'utf8')).toBe(before.core);
    expect(readFileSync('/proc/sys/kernel/printk', 'utf8')).toBe(before.printk);
  });

  it.skipIf(!existsSync('/usr/bin/python3'))('no file under /proc/sys, /proc/sysrq-trigger, /proc/irq, /proc/bus or /proc/fs opens for writing', async () => {
    const places = READ_ONLY.filter((p) => existsSync(p));
    const r = await run(box, ['python3', '-c', OPEN_FOR_WRITE, ...places]);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.trim().split('\n')).toEqual(['walked']);
    // The walk saw them: the box has these places, read-only.
    const seen = await run(box, ['sh', '-c', 'ls /proc/sys/kernel | wc -l; ls /proc/irq | wc -l']);
    expect(seen.stdout.trim().split('\n').map(Number).every((n) => n > 0)).toBe(true);
  });

  it.skipIf(!existsSync('/proc/irq/default_smp_affinity'))("an IRQ's affinity cannot be written back either", async () => {
    const before = readFileSync('/proc/irq/default_smp_affinity', 'utf8');
    const r = await run(box, ['sh', '-c', 'v=$(cat /proc/irq/default_smp_affinity) || exit 9; printf "%s\\n" "$v" > /proc/irq/default_smp_affinity && echo WROTE; true']);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(/Read-only file system/);
    expect(readFileSync('/proc/irq/default_smp_affinity', 'utf8')).toBe(before);
  });

  it("the box's own per-namespace sysctls still read as the box's", async () => {
    const r = await run(box, ['sh', '-c', 'ls /proc/sys/net/ipv4/conf | tr "\\n" " "; echo; cat /proc/sys/kernel/hostname /proc/sys/net/core/somaxconn /proc/sys/kernel/core_pattern']);
    expect(r.exitCode, r.stderr).toBe(0);
    const [ifaces, hostname, somaxconn, core] = r.stdout.split('\n');
    // The box's network namespace (only lo), not the host's interfaces; its own UTS name.
    expect(ifaces.trim().split(' ').sort()).toEqual(['all', 'default', 'lo']);
    expect(hostname).toBe('box');
    expect(Number(somaxconn)).toBeGreaterThan(0);
    expect(core).toBe(readFileSync('/proc/sys/kernel/core_pattern', 'utf8').trim());
  });

  it.skipIf(MASKED_FILES.length === 0)(`root-only host-wide files give nothing: ${MASKED_FILES.join(', ')}; ${MASKED_DIRS.join(', ')} are empty`, async () => {
    // A read that the kernel would allow (as for timer_list, kpageflags, slabinfo to a root server's
    // box) prints its first bytes; `timeout` only guards against a file that blocks (kmsg).
    const files = MASKED_FILES.map((n) => `/proc/${n}`).join(' ');
    const dirs = MASKED_DIRS.map((n) => `/proc/${n}`).join(' ');
    const r = await run(box, ['sh', '-c', `for f in ${files}; do n=$(timeout 5 head -c 64 "$f" 2>/dev/null | wc -c); [ "$n" -gt 0 ] && echo "READ $f"; done; for d in ${dirs}; do [ -n "$(ls -A "$d" 2>/dev/null)" ] && echo "LISTED $d"; done; echo checked`]);
    expect(r.stdout).toBe('checked\n');
  });

  // The whole class at once: nothing in the box's /proc opens for writing, or reads, that the
  // host's /proc would not give an unprivileged host user (nobody).
  it.skipIf(!root || !existsSync('/usr/bin/python3'))("the box's /proc gives its user no more than the host's gives nobody", async () => {
    // The given files nobody can open (and read a byte of) right now.
    const asNobodyNow = (mode: string, files: string[]) => {
      const r = spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', '/usr/bin/python3', '-c', PROC_ENUM, mode, 'stdin'], { encoding: 'utf8', input: files.join('\n'), env: { PATH: '/usr/bin:/bin' } });
      expect(r.status, r.stderr).toBe(0);
      return new Set(r.stdout.trim().split('\n'));
    };
    const asNobody = (mode: string) => {
      const r = spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', '/usr/bin/python3', '-c', PROC_ENUM, mode], { encoding: 'utf8', env: { PATH: '/usr/bin:/bin' } });
      expect(r.status, r.stderr).toBe(0);
      return new Set(r.stdout.trim().split('\n'));
    };
    for (const mode of ['w', 'r']) {
      const nobody = asNobody(mode);
      const inBox = await run(box, ['python3', '-c', PROC_ENUM, mode]);
      expect(inBox.exitCode, inBox.stderr).toBe(0);
      const files = inBox.stdout.trim().split('\n').filter(Boolean);
      if (mode === 'r') expect(files).toContain('/proc/sys/kernel/core_pattern'); // the walk reached it
      // /proc changes while the walks run (another suite's box mounts its workspace: a new
      // /proc/fs/ext4/loopN appears): what only the box got is asked again of nobody, now.
      const extra = files.filter((f) => !nobody.has(f));
      const again = extra.length ? asNobodyNow(mode, extra) : new Set<string>();
      expect(extra.filter((f) => !again.has(f) && existsSync(f)), mode).toEqual([]);
    }
  });

  it('the host device nodes bound in cannot be changed (mode, times), and still work', async () => {
    const devs = ['null', 'zero', 'full', 'random', 'urandom'];
    const before = devs.map((d) => statSync(`/dev/${d}`));
    // chmod to the mode it already has: harmless on the host if allowed, but it still changes the
    // host inode's ctime, which is compared below.
    const r = await run(box, [
      'sh',
      '-c',
      `for d in ${devs.join(' ')}; do m=$(stat -c %a /dev/$d); chmod "$m" /dev/$d 2>/dev/null && echo "CHMOD $d"; touch -c /dev/$d 2>/dev/null && echo "TOUCH $d"; done; echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c`,
    ]);
    expect(r.stdout).toBe('4\n4\n');
    if (root) {
      // Sealed by the server: read-only mounts that still allow devices.
      const m = await run(box, ['sh', '-c', `awk '$5 ~ "^/dev/" && $5 != "/dev/shm" {print $5, $6}' /proc/self/mountinfo`]);
      const lines = m.stdout.trim().split('\n');
      expect(lines.map((l) => l.split(' ')[0]).sort()).toEqual(devs.map((d) => `/dev/${d}`).sort());
      for (const l of lines) expect(l).toMatch(/ ro,nosuid,noexec,relatime$/);
    }
    devs.forEach((d, i) => {
      const now = statSync(`/dev/${d}`);
      expect(now.mode, d).toBe(before[i].mode);
      expect(now.ctimeMs, d).toBe(before[i].ctimeMs);
      expect(now.mtimeMs, d).toBe(before[i].mtimeMs);
    });
  });

  // The whole class for mounts: every mount that is not the box's own is read-only, so no host
  // inode in it (owned by the box's user for a root server) can be changed.
  it("the only writable mounts are the box's own (/proc, /dev/shm, /tmp, /workspace); bound host files cannot be changed", async () => {
    const m = await run(box, ['sh', '-c', `awk '$6 ~ /^rw/ {print $5}' /proc/self/mountinfo`]);
    expect(m.stdout.trim().split('\n').sort()).toEqual(['/dev/shm', '/proc', '/tmp', '/workspace']);
    const targets = ['/usr/bin/env', '/usr/lib', '/etc/ld.so.cache', '/etc/keygate/ca.pem', '/etc/passwd', '/', '/proc/sys/kernel/core_pattern', '/proc/kmsg'].filter((t) => t.startsWith('/etc/keygate') || t === '/etc/passwd' || t === '/' || existsSync(t));
    const before = statSync('/usr/bin/env');
    const r = await run(box, ['sh', '-c', `for t in ${targets.join(' ')}; do m=$(stat -c %a "$t"); chmod "$m" "$t" 2>/dev/null && echo "CHMOD $t"; touch -c "$t" 2>/dev/null && echo "TOUCH $t"; done; echo checked`]);
    expect(r.stdout).toBe('checked\n');
    expect(statSync('/usr/bin/env').ctimeMs).toBe(before.ctimeMs);
  });

  // A template's root file system is the box's own code from the first moment: its `sleep` is the
  // box's main process. It must find the devices sealed already.
  it.skipIf(!root || !existsSync('/bin/busybox'))("a template's own main process finds the device nodes sealed already", async () => {
    const rootfs = path.join(TMP, 'early-root');
    for (const d of ['bin', 'usr/bin', 'tmp']) mkdirSync(path.join(rootfs, d), { recursive: true });
    copyFileSync('/bin/busybox', path.join(rootfs, 'bin/busybox'));
    chmodSync(path.join(rootfs, 'bin/busybox'), 0o755);
    for (const applet of ['sh', 'cat', 'chmod', 'stat']) symlinkSync('busybox', path.join(rootfs, 'bin', applet));
    symlinkSync('../../bin/busybox', path.join(rootfs, 'usr/bin/env'));
    writeFileSync(
      path.join(rootfs, 'bin/sleep'),
      '#!/bin/sh\nfor d in null zero full random urandom; do chmod "$(stat -c %a /dev/$d)" /dev/$d 2>/dev/null && echo "CHMOD $d" >>/tmp/early; done\necho tried >>/tmp/early\nexec /bin/busybox sleep "$@"\n',
      { mode: 0o755 },
    );
    const before = statSync('/dev/null');
    const early = await driver.start(spec({ template: { name: 'early-root', rootfs, environment: {} } }));
    try {
      const r = await run(early, ['/bin/sh', '-c', 'cat /tmp/early']);
      expect(r.stdout).toBe('tried\n');
      expect(statSync('/dev/null').ctimeMs).toBe(before.ctimeMs);
    } finally {
      await early.stop();
    }
  });

  it("the box sees no cgroup file system and cannot mount one: it cannot raise its own limits", async () => {
    const r = await run(box, ['sh', '-c', `ls /sys 2>&1; awk '{print $9}' /proc/self/mountinfo | sort -u | tr "\\n" " "; echo; mkdir -p /tmp/cg; mount -t cgroup2 none /tmp/cg 2>&1; echo "mount=$?"; mount -t cgroup -o pids none /tmp/cg 2>&1; echo "mount1=$?"; mount -t sysfs none /tmp/cg 2>&1; echo "sysfs=$?"`]);
    expect(r.stdout).toMatch(/ls: cannot access '\/sys': No such file or directory/);
    expect(r.stdout).not.toMatch(/cgroup|sysfs /);
    for (const m of ['mount', 'mount1', 'sysfs']) expect(r.stdout).toMatch(new RegExp(`\\b${m}=[1-9]`));
  });

  it.skipIf(!existsSync('/usr/bin/python3'))('the clock, kernel modules, kexec, reboot and I/O ports are refused', async () => {
    const r = await run(box, ['python3', '-c', PRIVILEGED_CALLS]);
    expect(r.exitCode, r.stderr).toBe(0);
    const said = Object.fromEntries(r.stdout.trim().split('\n').map((l) => l.split(' ')));
    expect(Object.keys(said)).toEqual(['kexec_load', 'reboot', 'finit_module', 'delete_module', 'ioperm', 'clock_settime']);
    // ENOSYS: a kernel built without it (kexec, modules and ioperm here).
    for (const [call, errno] of Object.entries(said)) expect(errno, call).toMatch(/^(EPERM|ENOSYS)$/);
    expect(said.reboot).toBe('EPERM');
    expect(said.clock_settime).toBe('EPERM');
  });

  it('an execution sees the same read-only and masked /proc as the box (one mount namespace)', async () => {
    const r = await run(box, ['sh', '-c', `awk '$5 ~ "^/proc/" {print $5, $6}' /proc/self/mountinfo`]);
    const mounts = new Map(r.stdout.trim().split('\n').map((l) => l.split(' ') as [string, string]));
    for (const p of READ_ONLY.filter((x) => existsSync(x))) expect(mounts.get(p), p).toMatch(/^ro,/);
    for (const n of [...MASKED_FILES, ...MASKED_DIRS]) expect(mounts.get(`/proc/${n}`), n).toMatch(/^ro,/);
    // pid 1 (bwrap's init) is in it too.
    const one = await run(box, ['sh', '-c', 'readlink /proc/1/ns/mnt /proc/self/ns/mnt | uniq | wc -l']);
    expect(one.stdout.trim()).toBe('1');
  });
});
