/**
 * The docker driver's seccomp profile, built from syscall-policy.ts (data: nothing copied from the
 * engine's own default). A custom profile replaces the engine's default, so this one is an
 * allow-list: every name of the kernel tables (syscall-tables.ts) but the denied ones, clone,
 * socket and personality allowed for harmless arguments only, clone3 answered ENOSYS (libc falls
 * back to clone), anything else EPERM. runc answers ENOSYS to a call newer than every name in the
 * profile, so a libc probing a new call falls back too.
 */
import { ARG_DENIED, deniedNames, ERRNO } from './syscall-policy.js';
import { GENERIC_SYSCALLS, X86_64_SYSCALLS } from './syscall-tables.js';

interface Arg {
  index: number;
  value: number;
  valueTwo?: number;
  op: 'SCMP_CMP_NE' | 'SCMP_CMP_EQ' | 'SCMP_CMP_MASKED_EQ';
}

interface Rule {
  names: string[];
  action: 'SCMP_ACT_ALLOW' | 'SCMP_ACT_ERRNO';
  errnoRet?: number;
  args?: Arg[];
}

export interface SeccompProfile {
  defaultAction: 'SCMP_ACT_ERRNO';
  defaultErrnoRet: number;
  archMap: { architecture: string; subArchitectures: string[] }[];
  syscalls: Rule[];
}

export function dockerSeccompProfile(): SeccompProfile {
  const denied = deniedNames();
  const special = new Set(ARG_DENIED.map((r) => r.name));
  const all = new Set([...Object.keys(X86_64_SYSCALLS), ...Object.keys(GENERIC_SYSCALLS)]);
  const allowed = [...all].filter((n) => !denied.has(n) && !special.has(n)).sort();
  const syscalls: Rule[] = [{ names: allowed, action: 'SCMP_ACT_ALLOW' }];
  for (const r of ARG_DENIED) {
    // Each rule allows the call; the arguments not allowed fall to the default (EPERM).
    if (r.kind === 'maskAny') syscalls.push({ names: [r.name], action: 'SCMP_ACT_ALLOW', args: [{ index: r.arg, value: r.mask, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }] });
    else if (r.kind === 'equals') syscalls.push({ names: [r.name], action: 'SCMP_ACT_ALLOW', args: [{ index: r.arg, value: r.value, op: 'SCMP_CMP_NE' }] });
    else for (const v of r.values) syscalls.push({ names: [r.name], action: 'SCMP_ACT_ALLOW', args: [{ index: r.arg, value: v, op: 'SCMP_CMP_EQ' }] });
  }
  const other = [...denied].filter(([, e]) => e !== ERRNO.EPERM);
  for (const [name, errno] of other) syscalls.push({ names: [name], action: 'SCMP_ACT_ERRNO', errnoRet: errno });
  return {
    defaultAction: 'SCMP_ACT_ERRNO',
    defaultErrnoRet: ERRNO.EPERM,
    archMap: [
      { architecture: 'SCMP_ARCH_X86_64', subArchitectures: ['SCMP_ARCH_X86', 'SCMP_ARCH_X32'] },
      { architecture: 'SCMP_ARCH_AARCH64', subArchitectures: ['SCMP_ARCH_ARM'] },
    ],
    syscalls,
  };
}

/** The HostConfig.SecurityOpt entry that applies it. */
export function dockerSeccompOpt(): string {
  return `seccomp=${JSON.stringify(dockerSeccompProfile())}`;
}
