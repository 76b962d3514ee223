/**
 * The seccomp filter and its helper, on the host itself (no box): the helper is machine code
 * keygate writes, so it is run for real here; the policy's names are checked against the tables.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ENTER_ALLOWED } from '../../src/sandbox/local-seccomp.js';
import { ARCH_AARCH64, ARCH_X86_64, filterBytes, filterProgram, seccompHelperElf } from '../../src/sandbox/seccomp-bpf.js';
import { ARG_DENIED, DENIED } from '../../src/sandbox/syscall-policy.js';
import { GENERIC_SYSCALLS, X86_64_SYSCALLS as NR } from '../../src/sandbox/syscall-tables.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-seccomp-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function helper(name: string, allowed: string[] = []): string {
  const f = path.join(dir, name);
  writeFileSync(f, seccompHelperElf(filterBytes(ARCH_X86_64, allowed)));
  chmodSync(f, 0o755);
  return f;
}

describe('syscall policy', () => {
  it('names only calls of the tables (x86_64 or the generic table)', () => {
    for (const d of DENIED) for (const n of d.names) expect(n in NR || n in GENERIC_SYSCALLS, n).toBe(true);
    for (const r of ARG_DENIED) expect(r.name in NR && r.name in GENERIC_SYSCALLS, r.name).toBe(true);
  });

  it('builds for aarch64 too, checking the architecture first', () => {
    const p = filterProgram(ARCH_AARCH64);
    expect(p[0]).toEqual([0x20, 0, 0, 4]);
    expect(p[1][3]).toBe(0xc00000b7);
    expect(p.some(([c, , , k]) => c === 0x15 && k === GENERIC_SYSCALLS.io_uring_setup)).toBe(true);
  });
});

const PERL = `
$! = 0; print "io_uring=", (syscall(${NR.io_uring_setup}, 8, 0) == -1 ? $!+0 : "ok"), "\\n";
print "vsock=", (socket(my $v, 40, 1, 0) ? "ok" : $!+0), "\\n";
print "inet=", (socket(my $i, 2, 1, 0) ? "ok" : $!+0), "\\n";
$! = 0; print "setns=", (syscall(${NR.setns}, -1, 0) == -1 ? $!+0 : "ok"), "\\n";
`;

describe.skipIf(process.arch !== 'x64' || !existsSync('/usr/bin/perl'))('the x86_64 helper', () => {
  it('installs the filter and execs its arguments with their environment', () => {
    const r = spawnSync(helper('full'), ['/usr/bin/perl', '-e', `print "$ENV{KG_X}\\n"; ${PERL}`], { encoding: 'utf8', env: { KG_X: 'kept' } });
    expect(r.stderr).toBe('');
    // setns: EPERM from the filter (unfiltered: EBADF for fd -1).
    expect(r.stdout).toBe('kept\nio_uring=1\nvsock=1\ninet=ok\nsetns=1\n');
    expect(r.status).toBe(0);
  });

  it("the host side's filter lets nsenter's calls through and nothing else", () => {
    const r = spawnSync(helper('enter', ENTER_ALLOWED), ['/usr/bin/perl', '-e', PERL], { encoding: 'utf8' });
    expect(r.stdout).toBe('io_uring=1\nvsock=1\ninet=ok\nsetns=9\n');
  });

  it('with nothing to run, or a program that cannot run, it fails with a message and runs nothing', () => {
    const h = helper('full2');
    for (const args of [[], ['/nonexistent']]) {
      const r = spawnSync(h, args, { encoding: 'utf8' });
      expect(r.status).toBe(126);
      expect(r.stderr).toBe('keygate: seccomp helper: cannot install the filter or run the program\n');
    }
  });
});

describe.skipIf(process.arch !== 'x64')('waitFiltered (the probe fails closed without a filter on the box)', () => {
  it('is false for a process without a filter, true for one with it', async () => {
    const { waitFiltered } = await import('../../src/sandbox/local-seccomp.js');
    expect(await waitFiltered(process.pid, 50)).toBe(false);
    const { spawn } = await import('node:child_process');
    const c = spawn(helper('sleeper'), ['/bin/sleep', '5'], { stdio: 'ignore' });
    try {
      expect(await waitFiltered(c.pid!, 5000)).toBe(true);
    } finally {
      c.kill('SIGKILL');
    }
  });
});
