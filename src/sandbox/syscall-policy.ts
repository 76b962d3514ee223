/**
 * The syscalls a box may not make, whatever its driver (data only: seccomp-bpf.ts turns it into the
 * local driver's filter, docker-seccomp.ts into the engine's profile). A box's user has no
 * capabilities, so most of these already fail; the filter takes the kernel code behind them out of
 * reach altogether (a bug there is a way out of the box), and closes what no capability guards:
 * io_uring, AF_VSOCK sockets (a path to the hypervisor that no network namespace covers), nested
 * namespaces, and tracing the box's other processes.
 */

/** What a denied call returns. */
export type Errno = 'EPERM' | 'ENOSYS';
export const ERRNO: Readonly<Record<Errno, number>> = { EPERM: 1, ENOSYS: 38 };

export interface Denial {
  names: readonly string[];
  why: string;
  /** Default EPERM. */
  errno?: Errno;
}

/** Denied whatever their arguments. */
export const DENIED: readonly Denial[] = [
  { names: ['io_uring_setup', 'io_uring_enter', 'io_uring_register'], why: 'a large, often-patched kernel surface that bypasses seccomp for the I/O it queues (Docker >= 25 denies it)' },
  { names: ['unshare', 'setns'], why: 'no namespaces of its own: nested namespaces open kernel code (user namespaces) only root needs' },
  { names: ['mount', 'umount2', 'pivot_root', 'chroot'], why: 'the box file system is built once by keygate; the box never changes it' },
  { names: ['open_tree', 'open_tree_attr', 'move_mount', 'fsopen', 'fsconfig', 'fsmount', 'fspick', 'mount_setattr'], why: 'the new mount API: the same as mount' },
  { names: ['keyctl', 'add_key', 'request_key'], why: 'the kernel keyring is not namespaced: keys could be shared with, or exhaust, the host' },
  { names: ['bpf'], why: 'eBPF programs: verifier bugs are a classic kernel escape' },
  { names: ['userfaultfd'], why: 'lets an exploit pause the kernel mid-copy (race widening)' },
  { names: ['perf_event_open'], why: 'performance counters: kernel surface, and side channels on the host' },
  { names: ['ptrace', 'process_vm_readv', 'process_vm_writev'], why: 'no tracing of other processes: the box pid 1 and helpers run unfiltered or before their filter' },
  { names: ['kexec_load', 'kexec_file_load'], why: 'loading a new kernel' },
  { names: ['init_module', 'finit_module', 'delete_module', 'create_module', 'query_module', 'get_kernel_syms'], why: 'kernel modules' },
  { names: ['reboot'], why: 'rebooting the host (or its PID namespace)' },
  { names: ['swapon', 'swapoff'], why: 'the host swap' },
  { names: ['acct'], why: 'process accounting of the host' },
  { names: ['quotactl', 'quotactl_fd'], why: 'disk quotas of host file systems' },
  { names: ['syslog'], why: "the kernel log holds the host's addresses and messages" },
  { names: ['settimeofday', 'clock_settime', 'clock_adjtime'], why: 'the clock is not namespaced: it is the host clock' },
  { names: ['iopl', 'ioperm'], why: 'raw I/O port access' },
  { names: ['modify_ldt'], why: 'x86 segment descriptors: old, exploited surface no program of today needs' },
  { names: ['lookup_dcookie'], why: 'a profiling call that reveals host paths' },
  { names: ['open_by_handle_at'], why: 'opens a file by handle, past the box mount view (the shocker escape)' },
  { names: ['nfsservctl', 'vhangup', 'uselib', '_sysctl'], why: 'obsolete calls of the host administrator' },
  { names: ['clone3'], why: 'its flags are in memory a filter cannot read (namespace flags); ENOSYS makes libc fall back to clone', errno: 'ENOSYS' },
];

/** The clone flags of a new namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET). */
export const CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000;
export const AF_VSOCK = 40;
/**
 * personality values a box may set: PER_LINUX, UNAME26, ADDR_NO_RANDOMIZE (setarch -R, its own
 * processes), both, and 0xffffffff (a query). Others (READ_IMPLIES_EXEC, MMAP_PAGE_ZERO ...) weaken
 * the box's memory protections, the kind of help a kernel exploit looks for.
 */
export const PERSONALITY_ALLOWED = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff] as const;

/**
 * Denied for some arguments only (EPERM). `arg` is the index of the argument tested; its low 32
 * bits are compared (each is an int or flags word the kernel truncates to 32 bits).
 */
export type ArgDenial =
  | { name: string; arg: number; kind: 'maskAny'; mask: number; why: string }
  | { name: string; arg: number; kind: 'equals'; value: number; why: string }
  | { name: string; arg: number; kind: 'notIn'; values: readonly number[]; why: string };

export const ARG_DENIED: readonly ArgDenial[] = [
  { name: 'clone', arg: 0, kind: 'maskAny', mask: CLONE_NAMESPACE_FLAGS, why: 'a new namespace: as unshare' },
  { name: 'socket', arg: 0, kind: 'equals', value: AF_VSOCK, why: 'AF_VSOCK is not network-namespaced: it reaches the hypervisor, past the proxy' },
  { name: 'personality', arg: 0, kind: 'notIn', values: PERSONALITY_ALLOWED, why: 'see PERSONALITY_ALLOWED' },
];

/** Every name denied outright, with its errno number. */
export function deniedNames(): Map<string, number> {
  const m = new Map<string, number>();
  for (const d of DENIED) for (const n of d.names) m.set(n, ERRNO[d.errno ?? 'EPERM']);
  return m;
}
