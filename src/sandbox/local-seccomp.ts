/**
 * The local driver's seccomp filter (syscall-policy.ts, assembled by seccomp-bpf.ts): bwrap installs
 * it for the box's main process (`--seccomp`; its init, pid 1, gets it too), and every execution,
 * which enters the box from the host with nsenter and inherits nothing of pid 1, runs under
 * BOX_SECCOMP, the helper that installs the same filter before it execs the command. The helper is
 * copied into the box's read-only /.keygate (bwrap.ts, `lent`): box code can neither replace nor
 * skip it.
 *
 * Before that, on the host, the same helper (ENTER_ALLOWED left out of its filter) runs in front
 * of setpriv and nsenter: an execution is never unfiltered inside the box. Without it, box code
 * could write into the new process through /proc/PID/mem (same uid, dumpable once it has exec'd
 * the helper) between its exec and its seccomp call, and run code there with no filter at all;
 * with it, such code could only add setns and chroot, which need capabilities no box process has.
 */
import { closeSync, mkdirSync, openSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { BOX_RUNTIME_DIR } from './docker-relay.js';
import { filterBytes, hostFilterArch, seccompHelperElf } from './seccomp-bpf.js';

export const BOX_SECCOMP = `${BOX_RUNTIME_DIR}/seccomp`;

export interface LocalFilter {
  arch: string;
  /** The BPF program (struct sock_filter[]). */
  program: Buffer;
  /** The static helper executable with the program embedded. */
  helper: Buffer;
  /** The helper of the host side, whose filter lets nsenter through (ENTER_ALLOWED). */
  enterHelper: Buffer;
}

/** What nsenter needs, left out of the host-side filter (both need capabilities a box never has). */
export const ENTER_ALLOWED = ['setns', 'chroot'];

let made: LocalFilter | null | undefined;

/** This machine's filter, or null where none can be built (not x86_64: see the probe's detail). */
export function localFilter(): LocalFilter | null {
  if (made === undefined) {
    const arch = hostFilterArch();
    if (!arch) made = null;
    else {
      const program = filterBytes(arch);
      made = { arch: arch.name, program, helper: seccompHelperElf(program), enterHelper: seccompHelperElf(filterBytes(arch, ENTER_ALLOWED)) };
    }
  }
  return made;
}

/** What the probe says of it. */
export function filterDetail(): string {
  const f = localFilter();
  return f
    ? `seccomp filter (${f.arch}, ${f.program.length / 8} instructions) on the main process and every execution`
    : `NO seccomp filter: keygate builds its helper for x86_64 only, and this machine is ${process.arch}; boxes are limited by namespaces and capabilities alone`;
}

/**
 * Writes the filter's program and helper into `dir` (a directory of the box's own on the host) and
 * opens them for bwrap, which copies them (program: `--seccomp`, helper: into /.keygate).
 */
export function openFilterFiles(dir: string, filter: LocalFilter): { program: number; helper: number } {
  const open = (name: string, content: Buffer) => {
    const f = path.join(dir, name);
    writeFileSync(f, content, { mode: 0o600 });
    return openSync(f, 'r');
  };
  const program = open('seccomp.bpf', filter.program);
  try {
    return { program, helper: open('seccomp', filter.helper) };
  } catch (e) {
    closeSync(program);
    throw e;
  }
}

/**
 * The host-side helper, written once into `runDir` (the server's own directory, never in a box) as
 * an executable of the server's user only; its path.
 */
export function writeEnterHelper(runDir: string, filter: LocalFilter): string {
  const f = path.join(runDir, 'seccomp-enter');
  mkdirSync(runDir, { recursive: true, mode: 0o700 });
  const tmp = `${f}.${process.pid}.tmp`;
  writeFileSync(tmp, filter.enterHelper, { mode: 0o500 });
  renameSync(tmp, f);
  return f;
}

/**
 * Whether the process `pid` (the box's pid 1, seen from the host) runs under a seccomp filter,
 * waiting up to `ms` for it (bwrap's init installs it after forking the main process). The probe
 * fails closed without it: a bwrap that ignored `--seccomp` would leave the box's own processes
 * unfiltered.
 */
export async function waitFiltered(pid: number, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  for (;;) {
    let status = '';
    try {
      status = readFileSync(`/proc/${pid}/status`, 'utf8');
    } catch {
      return false;
    }
    if (/^Seccomp:\s*2$/m.test(status)) return true;
    if (Date.now() > until) return false;
    await new Promise((r) => setTimeout(r, 10));
  }
}
