/**
 * The bubblewrap command line of a local box (pure: the caller reads the file system and passes
 * what it found). Every namespace is new (`--unshare-all`, or each one by name in the user
 * namespace a root server made for the box; never `--share-net`), the root is a
 * fresh tmpfs holding only what is bound in here, and the box's one process is `sleep infinity`
 * under bwrap's own init (pid 1 in the box, which reaps orphans and takes the box down with it).
 */

/**
 * The uid and gid every process in a box has. Outside: a root server's box, a host id of its own
 * (box-uid.ts); an unprivileged server's, the server's own uid (bwrap maps it).
 */
export const BOX_UID = 1000;

/**
 * An entry of a root file system (top level, or in its /etc): bound read-only, or recreated as the
 * same symlink. A symlink is never bound: bwrap would resolve it on the host, so that an image's
 * `/etc/localtime -> /usr/share/...`, or a hostile `etc/x -> /var/lib/keygate/master.key`, would
 * bind the host's file; recreated, it resolves inside the box as the image meant.
 */
export type RootEntry = { name: string; kind: 'dir' | 'file' } | { name: string; kind: 'symlink'; target: string };

export interface BwrapPlan {
  /** Host directory of each root entry (the host's `/` for the `host` template, else the rootfs). */
  rootDir: string;
  entries: RootEntry[];
  /** Entries of `<rootDir>/etc` to bind or recreate (a rootfs template; for `host`, the shared few). */
  etcEntries: RootEntry[];
  /**
   * Box path -> a descriptor bwrap is given, whose content it copies into the box's root (minimal
   * /etc, /etc/keygate/*.pem). Copied, not bound: a bind shows its host path (under the data
   * directory) in the box's /proc/self/mountinfo. The root is read-only once built.
   */
  files: Record<string, number>;
  /** Host directory seen read-write at /workspace. */
  workspace: string;

  /** bwrap writes `{"child-pid": N, ...}` to this fd once the box's namespaces exist. */
  infoFd: number;
  /**
   * bwrap builds the box, drops its privileges, then waits for a byte on this fd before it starts
   * the box's main process (a template's own `sleep`: box code). The server finishes the box
   * meanwhile (sealDevices), so that no box code ever sees it unfinished.
   */
  blockFd: number;
  /** `--disable-userns` (see bwrapArgs); not with `userns`. */
  disableUserns: boolean;
  /**
   * A descriptor of the user namespace to build the box in (`--userns`: a root server's, made by
   * box-uid.ts, which maps BOX_UID to the box's own host id and allows no nested namespace);
   * otherwise bwrap makes one (`--unshare-user`) that maps BOX_UID to the server's uid.
   */
  userns?: number;
  /**
   * Host programs lent to the box (the static tini of executions without cgroups): each file bound
   * read-only at its box path in `dir`, a top-level directory of its own that is a read-only tmpfs.
   * Being mount points, neither `dir` nor the files in it can be renamed or replaced by the box's
   * user, who owns the box's root directory (unlike a plain directory such as /etc/keygate).
   * `copied`: box path -> a descriptor whose content bwrap copies there, executable (the seccomp
   * helper, made by the server: copied, not bound, as `files`).
   */
  lent?: { dir: string; files: Record<string, string>; copied?: Record<string, number> };
  /** A compiled seccomp filter (seccomp-bpf.ts) bwrap reads from this fd and installs for the box's main process. */
  seccompFd?: number;
  /** Sizes (MiB) of the box's writable in-memory file systems (see tmpfsSizes). */
  tmpfsMb: { tmp: number; shm: number };
  /**
   * Names at the top of the host's /proc (the same kernel as the box's fresh /proc), and those of
   * the deeper PROC_MASKED_FILES that exist: which of PROC_READ_ONLY and PROC_MASKED_* exist to
   * be covered (bwrap cannot mount on a missing path).
   */
  procNames: readonly string[];
  /**
   * Paths under /proc (relative: `sys/kernel/cad_pid`, `tty/driver`) that only root may read on
   * this kernel, found by the caller (procRootOnly): masked like PROC_MASKED_FILES (a directory
   * like PROC_MASKED_DIRS). A root server's box would read them; an unprivileged user cannot.
   */
  procRootOnly: readonly { path: string; dir: boolean }[];
}

/**
 * Host-global places of /proc that the box sees read-only (Docker's read-only paths). Before boxes
 * of a root server had host ids of their own (box-uid.ts), their user was host uid 0, for which
 * plain file permissions pass on everything procfs gives to root, capabilities or not: writable,
 * these let a box set `kernel.core_pattern` (`|/prog`: a program run as host root on the next
 * crash) or any sysctl, IRQ affinities, or PCI configuration space (`/proc/bus/pci`). Kept as
 * defence in depth (an unprivileged server whose box is its own uid, a box whose host id ever were
 * root again must still find them read-only). bwrap's own cover of some
 * of them skips a directory that is not writable to begin with (mode 0555), which left every file
 * in /proc/sys writable. Bound from the host's /proc: a sysctl file answers for the namespaces of
 * the process that reads it (the box's network, UTS and IPC settings read as the box's).
 */
export const PROC_READ_ONLY = ['sys', 'sysrq-trigger', 'irq', 'bus', 'fs'];
/**
 * Files of /proc a box gets nothing from (the host's /dev/null, bound read-only and so without
 * devices: opening one fails, as for an unprivileged user): Docker's masked files, and every
 * file that only root may read (which a box that were host root could): kernel memory, page
 * and slab layouts, other users' keys, host-wide timers with their processes, the kernel log.
 */
export const PROC_MASKED_FILES = [
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
  // The box's own network namespace's TCP Fast Open key (root-only, like the rest).
  'sys/net/ipv4/tcp_fastopen_key',
];
/** Directories of /proc a box sees empty (a read-only tmpfs; Docker's masked directories). */
export const PROC_MASKED_DIRS = ['acpi', 'asound', 'scsi'];

/**
 * Sizes of /tmp and /dev/shm for a box of `memoryMb`: half of it for /tmp (as the docker driver
 * gives), at most 64 MiB and the other half for /dev/shm (docker's default). A tmpfs page is
 * memory no process limit sees (without cgroups, RLIMIT_AS counts none of it), and an unsized
 * tmpfs may grow to half the host's RAM: every writable in-memory file system of a box is sized,
 * together within the box's memory, and the rest (/, /dev) is read-only.
 */
export function tmpfsSizes(memoryMb: number): { tmp: number; shm: number } {
  const half = Math.max(1, Math.floor(Math.max(16, memoryMb) / 2));
  return { tmp: half, shm: Math.min(64, half) };
}

const MiB = 1024 * 1024;

/** The host device nodes bound into every box's /dev. */
export const BOX_DEVICES = ['null', 'zero', 'full', 'random', 'urandom'];

/** Names never taken from a root file system: made fresh for every box. */
const OWN = new Set(['proc', 'dev', 'tmp', 'workspace', 'etc', 'run', 'sys']);

export function bwrapArgs(plan: BwrapPlan): string[] {
  const a = [
    // The user namespace given (which bwrap then cannot be told to unshare), or a new one: a box must have one.
    // bwrap 0.8 leaves the --userns descriptor open in the box's main process (box code); as
    // --sync-fd too, only its init keeps it (that namespace is the init's own: /proc/1/ns/user).
    ...(plan.userns !== undefined
      ? ['--userns', String(plan.userns), '--sync-fd', String(plan.userns), '--unshare-ipc', '--unshare-pid', '--unshare-net', '--unshare-uts', '--unshare-cgroup']
      : ['--unshare-all', '--unshare-user']),
    '--die-with-parent',
    '--new-session',
    '--cap-drop',
    'ALL',
    // No user namespaces inside the box (less kernel to attack). bwrap does it with a nested user
    // namespace that owns none of the others, which only a root server can still enter them across;
    // without it, a box can still make namespaces, all nested inside its own. A namespace given
    // (`userns`) comes with user.max_user_namespaces = 0 instead (box-uid.ts).
    ...(plan.disableUserns && plan.userns === undefined ? ['--disable-userns'] : []),
    '--uid',
    String(BOX_UID),
    '--gid',
    String(BOX_UID),
    '--hostname',
    'box',
  ];
  const lentName = plan.lent?.dir.slice(1);
  for (const e of plan.entries) {
    if (OWN.has(e.name) || e.name === lentName) continue;
    if (e.kind === 'symlink') a.push('--symlink', e.target, `/${e.name}`);
    else a.push('--ro-bind', `${plan.rootDir}/${e.name}`, `/${e.name}`);
  }
  // The device nodes a program needs, bound one by one: bwrap's `--dev` mounts a devpts, which makes
  // an unprivileged bwrap nest a second user namespace that nsenter could not cross.
  a.push('--proc', '/proc');
  const inProc = new Set(plan.procNames);
  // Without the host's /proc/sys to bind read-only (a /proc mounted with subset=pid), the box's is
  // covered whole: fail closed.
  if (!inProc.has('sys')) a.push('--perms', '0555', '--tmpfs', '/proc/sys', '--remount-ro', '/proc/sys');
  for (const n of PROC_READ_ONLY) if (inProc.has(n)) a.push('--ro-bind', `/proc/${n}`, `/proc/${n}`);
  const maskFiles = new Set(PROC_MASKED_FILES.filter((n) => inProc.has(n)));
  const maskDirs = new Set(PROC_MASKED_DIRS.filter((n) => inProc.has(n)));
  for (const e of plan.procRootOnly) (e.dir ? maskDirs : maskFiles).add(e.path);
  // Mounted over the read-only binds above where they lie inside them (/proc/sys/...).
  for (const n of maskFiles) a.push('--ro-bind', '/dev/null', `/proc/${n}`);
  for (const n of maskDirs) a.push('--perms', '0555', '--size', '4096', '--tmpfs', `/proc/${n}`, '--remount-ro', `/proc/${n}`);
  a.push('--tmpfs', '/dev');
  for (const d of BOX_DEVICES) a.push('--dev-bind', `/dev/${d}`, `/dev/${d}`);
  a.push('--symlink', '/proc/self/fd', '/dev/fd', '--symlink', '/proc/self/fd/0', '/dev/stdin', '--symlink', '/proc/self/fd/1', '/dev/stdout');
  a.push('--symlink', '/proc/self/fd/2', '/dev/stderr', '--size', String(plan.tmpfsMb.shm * MiB), '--tmpfs', '/dev/shm', '--remount-ro', '/dev');
  a.push('--size', String(plan.tmpfsMb.tmp * MiB), '--tmpfs', '/tmp', '--dir', '/run', '--dir', '/etc');
  for (const e of plan.etcEntries) {
    if (e.name === 'keygate') continue;
    if (e.kind === 'symlink') a.push('--symlink', e.target, `/etc/${e.name}`);
    else a.push('--ro-bind', `${plan.rootDir}/etc/${e.name}`, `/etc/${e.name}`);
  }
  for (const [boxPath, fd] of Object.entries(plan.files)) a.push('--perms', '0644', '--file', String(fd), boxPath);
  if (plan.lent) {
    a.push('--tmpfs', plan.lent.dir);
    for (const [boxPath, hostFile] of Object.entries(plan.lent.files)) a.push('--ro-bind', hostFile, boxPath);
    for (const [boxPath, fd] of Object.entries(plan.lent.copied ?? {})) a.push('--perms', '0555', '--file', String(fd), boxPath);
    a.push('--remount-ro', plan.lent.dir);
  }
  a.push('--bind', plan.workspace, '/workspace', '--chdir', '/workspace');
  // Last, once every mount point is made: the root tmpfs (/, /etc, /run) becomes read-only, so the
  // box can neither fill it nor swap what keygate put there (/etc/keygate, /bin).
  a.push('--remount-ro', '/');
  if (plan.seccompFd !== undefined) a.push('--seccomp', String(plan.seccompFd));
  a.push('--info-fd', String(plan.infoFd), '--block-fd', String(plan.blockFd));
  return a;
}

/**
 * `mount` options that make one of BOX_DEVICES, a bind of the host's device node, a read-only
 * mount that still allows devices: `mount -N <box mount ns> -o ... /dev/<name>`, run by a root
 * server once the box is built. A box that were host root (as a root server's were before they
 * had ids of their own, box-uid.ts) would own the host's /dev/null: on a writable bind it could
 * chmod or touch the host's node itself (chmod 0 /dev/null breaks every unprivileged program of
 * the host). Kept as defence in depth: the box's own id owns none of them. bwrap
 * has no read-only bind that keeps devices (its `--remount-ro` adds nodev). A device written
 * through a read-only mount is still written (/dev/null still swallows); only its inode is
 * sealed. `current` are the mount's options now (mountinfo): a flag locked on it (nodev,
 * noexec) must be kept or the kernel refuses the remount; noexec is added, atime is kept.
 */
export function deviceRemountOptions(current: readonly string[]): string {
  return ['remount', 'bind', 'ro', 'nosuid', 'noexec', ...(current.includes('nodev') ? ['nodev'] : [])].join(',');
}

/** The box's one long-lived process (after `--`, on bwrap's own command line: `--args` cannot carry it). */
export const BOX_MAIN = ['sleep', 'infinity'];
/** The descriptor a root server hands bwrap its box's user namespace on (`--userns`). */
export const BOX_USERNS_FD = 5;

/** The `host` template's /etc: who the box's user is, localhost, and no resolver at all. */
export function hostEtc(): Record<string, string> {
  return {
    passwd: `root:x:0:0:root:/root:/usr/sbin/nologin\nbox:x:${BOX_UID}:${BOX_UID}:box:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`,
    group: `root:x:0:\nbox:x:${BOX_UID}:\nnogroup:x:65534:\n`,
    hosts: '127.0.0.1\tlocalhost\n::1\tlocalhost\n',
    'nsswitch.conf': 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n',
  };
}

/** Host /etc entries the `host` template shares (program lookup only; nothing about this machine). */
export const HOST_ETC_SHARED = ['alternatives', 'ld.so.cache', 'ld.so.conf', 'ld.so.conf.d'];
/**
 * Host /etc directories of installed JDKs (`java-17-openjdk`), also shared: Debian's JDK keeps its
 * configuration there (conf/security/java.security is a symlink into it), and java does not start
 * without it. Configuration only: the truststore a box uses is keygate's, not the host's.
 */
export const HOST_ETC_JDK = /^java-[0-9]+-openjdk$/;

/**
 * The namespaces of a box, in the order their descriptors are handed to `nsenter` (from fd 3 on),
 * with nsenter's option for each. Entering through descriptors the server opened while the box's
 * pid 1 was verified, never through `-t PID`, means a reused pid can never send a command into
 * some other process's namespaces.
 */
export const BOX_NAMESPACES = [
  ['user', '--user'],
  ['mnt', '--mount'],
  ['pid', '--pid'],
  ['net', '--net'],
  ['ipc', '--ipc'],
  ['uts', '--uts'],
  ['cgroup', '--cgroup'],
] as const;

/**
 * nsenter options entering every namespace and the root, then `cwd` inside. `fds` are the
 * descriptors the server holds for them (BOX_NAMESPACES order, then the root), opened by nsenter
 * through the server's /proc entry (`holder`: its pid): the helpers, and so the command, inherit
 * none of them (an execution's processes see only their stdio).
 */
export function enterArgs(holder: number, fds: readonly number[], cwd: string, asBoxUser = false): string[] {
  const a: string[] = BOX_NAMESPACES.map(([, opt], i) => `${opt}=/proc/${holder}/fd/${fds[i]}`);
  // asBoxUser (a root server, whose uid the box's namespace does not map): nsenter becomes the
  // box's user inside (its host id outside), dropping supplementary groups; otherwise the caller's
  // uid is the box's user already (bwrap mapped it).
  const creds = asBoxUser ? [`--setuid=${BOX_UID}`, `--setgid=${BOX_UID}`] : ['--preserve-credentials'];
  return [...a, `--root=/proc/${holder}/fd/${fds[BOX_NAMESPACES.length]}`, `--wdns=${cwd}`, ...creds, '--'];
}
