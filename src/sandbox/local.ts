/**
 * The `local` driver (sandbox.md, "Drivers"): a box is a bubblewrap sandbox on this machine with
 * new user, PID, IPC, UTS, mount, cgroup and network namespaces, whose only way out is the relay to
 * its own proxy (relay.ts). A box is long-lived: bwrap's init is pid 1 in the box, and every
 * execution enters the box's namespaces with `nsenter`, as the box's unprivileged user, without
 * capabilities and with no_new_privs. Every process of a box is in the box's cgroup (limits.ts),
 * which is how stop, timeouts and reaping find all of them. Where there are no cgroups, stop still
 * kills them all (pid 1 going takes the box's PID namespace), and an execution runs under a static
 * tini as subreaper, so that its timeout and kill() find its whole tree in /proc (tree-kill.ts).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { constants as osConstants } from 'node:os';
import { closeSync, existsSync, lstatSync, openSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import {
  BoxFileError,
  BoxNotRunningError,
  BoxStartError,
  type Box,
  type BoxSpec,
  type DriverProbe,
  type ExecOptions,
  type ExecProcess,
  type ExecResult,
  type SandboxDriver,
} from './driver.js';
import { BOX_TRUSTSTORE_PATH } from '../certs/env.js';
import { readFileOrEmpty } from '../builtins/fs.js';
import { readProcStat } from '../proc.js';
import { BOX_DEVICES, BOX_MAIN, BOX_NAMESPACES, BOX_USERNS_FD, bwrapArgs, deviceRemountOptions, enterArgs, HOST_ETC_JDK, HOST_ETC_SHARED, hostEtc, PROC_MASKED_FILES, tmpfsSizes, type RootEntry } from './bwrap.js';
import { readBoxFile, writeBoxFile } from './box-files.js';
import { BoxIds, boxIdsUnavailable, boxUserns, stageWorkspace, unstageWorkspace } from './box-uid.js';
import { adoptWorkspace, DiskWatch, hostDiskUse, mountWorkspace, unmountWorkspace, WORKSPACE_DIR, workspaceBoundUnavailable } from './disk.js';
import { BOX_RUNTIME_DIR, BOX_TINI, findTini } from './docker-relay.js';
import { cgroupLayout, createCgroup, existingCgroup, cgroupHasProcesses, killCgroup, listBoxCgroups, procsFiles, removeCgroup, removeLayoutIfEmpty, rlimitArgs, type Cgroup, type CgroupLayout } from './limits.js';
import { openRelay, type Relay } from './relay.js';
import { defaultRelayLimits, RelayBudget, type RelayLimits } from './relay-budget.js';
import { killProcessTree } from './tree-kill.js';
import { BOX_SECCOMP, filterDetail, localFilter, openFilterFiles, waitFiltered, writeEnterHelper } from './local-seccomp.js';

export interface LocalDriverOptions {
  /**
   * A directory of this server's own (under the data directory, never inside a box) where the
   * driver records the boxes it runs, so that a server restarted after a SIGKILL finds them again.
   */
  runDir: string;
  /** bubblewrap; default `bwrap` on PATH. */
  bwrap?: string;
  /**
   * `false`: never use cgroups, even where they can be made: limits through rlimits (`prlimit`),
   * as on a machine without delegated cgroups. Default: cgroups where this process can create them.
   * For testing that fallback where cgroups work. A root server's boxes have host ids of their
   * own (box-uid.ts), which RLIMIT_NPROC counts; one that cannot give them any would run them as
   * host root, which the limit exempts: without this option, the probe refuses that server.
   */
  cgroups?: false;
  /**
   * A static tini, which executions run under where there are no cgroups (see LocalBox.exec);
   * default: the host's (`findTini`: tini-static, or the engine's docker-init).
   */
  tini?: string;
  /**
   * `false`: never a sized /workspace file system, even where one can be mounted: the disk watch
   * instead (disk.ts), as on a server that is not root. For testing that fallback.
   */
  workspaceFs?: false;
  /** Bounds of the relays' connections (relay-budget.ts); default from this process's descriptor limit. */
  relayLimits?: RelayLimits;
}

/** Host directories the `host` template shares, read-only, when they exist. */
const HOST_ROOT = ['usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32'];
const START_TIMEOUT_MS = 15_000;
/** How long bwrap is given to collect the box's killed pid 1 and exit by itself (see doStop). */
const BWRAP_EXIT_GRACE_MS = 1000;
/** How long an execution's output may stay open after the command itself has exited. */
const OUTPUT_GRACE_MS = 250;
/**
 * Without cgroups, an execution's tree as the host sees it: depth 0 is the process spawned (the
 * wrapper, which execs prlimit, setpriv, then nsenter: one pid), depth 1 nsenter's child in the
 * box, tini. Both are kept until the rest of the tree is dead (tree-kill.ts).
 */
const TINI_DEPTH = 1;
/**
 * Runs on the host before anything else (bash: it can close any descriptor): closes every
 * descriptor above $1 that this server inherited without close-on-exec (whatever its own parent
 * left open must not reach a box), joins the cgroups named before `--`, then becomes the rest.
 */
const ENTER_WRAPPER = [
  'keep=$1; shift',
  'for f in /proc/$$/fd/*; do n=${f##*/}; if [ "$n" -gt "$keep" ] 2>/dev/null; then eval "exec $n>&-" 2>/dev/null; fi; done',
  'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift',
  'exec "$@"',
].join('\n');
/** The whole environment of the host-side helpers an execution goes through. */
const HOST_HELPER_ENV = { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' };
const ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

interface RunRecord {
  id: string;
  stateDir: string;
  /** bwrap's init (pid 1 in the box) and its start time, so a reused pid is never killed. */
  pid1: number;
  pid1Start: string;
}

/** The start time of `pid` (/proc/PID/stat field 22): it tells a pid from a later reuse of it. */
function startTime(pid: number): string | null {
  return readProcStat(pid)?.startTime ?? null;
}

function which(cmd: string): string | null {
  if (cmd.includes('/')) return existsSync(cmd) ? cmd : null;
  for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(':')) {
    const p = path.join(dir || '.', cmd);
    if (existsSync(p)) return p;
  }
  return null;
}

function readSysctl(p: string): string | null {
  try {
    return readFileSync(p, 'utf8').trim();
  } catch {
    return null;
  }
}

/**
 * Entries of a directory of a root file system, as bwrap must recreate them: directories (and, with
 * `files`, regular files) bound, symlinks recreated as symlinks (never followed on the host: see
 * RootEntry), anything else left out.
 */
function rootEntries(dir: string, only?: string[], files = false): RootEntry[] {
  const names = only ?? readdirSync(dir);
  const out: RootEntry[] = [];
  for (const name of names) {
    const p = path.join(dir, name);
    let st;
    try {
      st = lstatSync(p);
    } catch {
      continue;
    }
    if (st.isSymbolicLink()) out.push({ name, kind: 'symlink', target: readlinkSync(p) });
    else if (st.isDirectory()) out.push({ name, kind: 'dir' });
    else if (files && st.isFile()) out.push({ name, kind: 'file' });
  }
  return out;
}

/**
 * Files and directories of the host's /proc that only root may read (no read bit for group or
 * others), as paths relative to /proc: the box masks them (BwrapPlan.procRootOnly). Process
 * directories are the box's own in its /proc; /proc/sys/net answers for the reader's network
 * namespace (the box's own settings). A directory found is masked whole, not walked.
 */
export function procRootOnly(base = '/proc'): { path: string; dir: boolean }[] {
  const out: { path: string; dir: boolean }[] = [];
  const walk = (rel: string) => {
    let names: string[];
    try {
      names = readdirSync(path.join(base, rel));
    } catch {
      return;
    }
    for (const name of names) {
      const r = rel ? `${rel}/${name}` : name;
      if (!rel && (/^[0-9]+$/.test(name) || name === 'self' || name === 'thread-self')) continue;
      if (r === 'sys/net') continue;
      let st;
      try {
        st = lstatSync(path.join(base, r));
      } catch {
        continue;
      }
      if (st.isSymbolicLink()) continue;
      const rootOnly = (st.mode & 0o400) !== 0 && (st.mode & 0o044) === 0;
      if (st.isDirectory()) {
        if (rootOnly) out.push({ path: r, dir: true });
        else walk(r);
      } else if (rootOnly) out.push({ path: r, dir: false });
    }
  };
  walk('');
  return out;
}

async function waitGone(pid: number, start: string | null, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  while (start !== null && startTime(pid) === start) {
    if (Date.now() > until) return false;
    await new Promise((r) => setTimeout(r, 10));
  }
  return true;
}

function killIfSame(pid: number, start: string | null): void {
  if (start !== null && startTime(pid) === start) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}

export class LocalDriver implements SandboxDriver {
  readonly name = 'local' as const;
  private readonly runDir: string;
  private readonly bwrapCmd: string;
  private readonly useCgroups: boolean;
  private readonly tiniOpt: string | undefined;
  private readonly boxes = new Map<string, LocalBox>();
  private probed: Promise<DriverProbe> | null = null;
  private tools: { bwrap: string; nsenter: string; setpriv: string; bash: string; prlimit: string | null; tini: string | null; mount: string | null; unshare: string | null; enterFilter: string | null } | null = null;
  private layout: { ok: true; layout: CgroupLayout } | { ok: false; why: string } | null = null;
  /** /workspace is a sized file system of its own (disk.ts); else see LocalBox's disk watch. */
  readonly diskBound: boolean;
  /** Every box's relay draws on it. */
  readonly relayBudget: RelayBudget;
  /** What of this kernel's /proc only root may read (procRootOnly), found once. */
  private rootOnlyProc: { path: string; dir: boolean }[] | null = null;
  /**
   * A root server's: every box runs under a host uid and gid of its own (box-uid.ts). Null where
   * the server cannot map them (not root): a box's user is then the server's uid outside.
   */
  readonly boxIds: BoxIds | null;

  constructor(opts: LocalDriverOptions) {
    this.runDir = path.resolve(opts.runDir);
    this.bwrapCmd = opts.bwrap ?? 'bwrap';
    this.useCgroups = opts.cgroups !== false;
    this.tiniOpt = opts.tini;
    this.diskBound = opts.workspaceFs !== false && workspaceBoundUnavailable() === null;
    this.relayBudget = new RelayBudget(opts.relayLimits ?? defaultRelayLimits());
    this.boxIds = boxIdsUnavailable() === null ? new BoxIds(this.runDir) : null;
  }

  probe(): Promise<DriverProbe> {
    this.probed ??= this.doProbe();
    return this.probed;
  }

  private cgroups(): CgroupLayout | null {
    // Not even looked for when turned off: cgroupLayout creates the parent directories it tries.
    if (!this.useCgroups) this.layout ??= { ok: false, why: 'cgroups turned off' };
    this.layout ??= cgroupLayout(createHash('sha256').update(this.runDir).digest('hex').slice(0, 12));
    return this.layout.ok ? this.layout.layout : null;
  }

  private async doProbe(): Promise<DriverProbe> {
    if (process.platform !== 'linux') return { ok: false, reason: 'the local driver needs Linux namespaces', hint: 'use --sandbox-driver docker' };
    const bwrap = which(this.bwrapCmd);
    if (!bwrap) return { ok: false, reason: 'bubblewrap (bwrap) is not installed', hint: 'install bubblewrap (apt-get install bubblewrap)' };
    const nsenter = which('nsenter');
    const setpriv = which('setpriv');
    if (!nsenter || !setpriv) return { ok: false, reason: 'nsenter or setpriv is missing', hint: 'install util-linux (apt-get install util-linux)' };
    const bash = which('bash');
    if (!bash) return { ok: false, reason: 'bash is missing', hint: 'install bash (apt-get install bash)' };
    const tini = this.tiniOpt === undefined ? findTini() : existsSync(this.tiniOpt) ? path.resolve(this.tiniOpt) : null;
    // A root server seals the host device nodes it binds into a box (sealDevices): fail closed without mount.
    const mount = which('mount');
    if (!mount && process.getuid?.() === 0) return { ok: false, reason: 'mount is missing (a root server makes the device nodes of a box read-only with it)', hint: 'install util-linux (apt-get install util-linux)' };
    // A root server makes each box's user namespace itself (box-uid.ts): fail closed without unshare.
    const unshare = which('unshare');
    if (!unshare && this.boxIds) return { ok: false, reason: "unshare is missing (a root server makes each box's user namespace, with a host uid of its own, with it)", hint: 'install util-linux (apt-get install util-linux)' };
    const filter = localFilter();
    let enterFilter: string | null = null;
    try {
      if (filter) enterFilter = writeEnterHelper(this.runDir, filter);
    } catch (e) {
      return { ok: false, reason: `cannot write the seccomp helper into ${this.runDir}: ${(e as NodeJS.ErrnoException).code ?? 'error'}`, hint: 'make the data directory writable by keygate' };
    }
    this.tools = { bwrap, nsenter, setpriv, bash, prlimit: which('prlimit'), tini, mount, unshare, enterFilter };
    const tried = spawnSync(bwrap, ['--unshare-all', '--unshare-user', '--die-with-parent', '--ro-bind', '/', '/', '--', 'true'], {
      encoding: 'utf8',
      timeout: 10_000,
      env: {},
    });
    if (tried.status !== 0) return { ok: false, ...namespaceTrouble((tried.stderr || tried.error?.message || '').trim()) };
    const cg = this.cgroups();
    const noCgroups = `no cgroups (${this.layout && !this.layout.ok ? this.layout.why : ''})`;
    if (!cg && !this.tools.prlimit) return { ok: false, reason: `${noCgroups} and no prlimit for resource limits`, hint: 'install util-linux, or run where cgroups can be created' };
    // Fail closed: without cgroups, only tini keeps a daemon that left its process group (setsid)
    // findable by an execution's timeout and kill().
    if (!cg && !tini) {
      return { ok: false, reason: `${noCgroups} and no static tini: an execution timeout could not kill what the execution started with setsid`, hint: 'install tini (apt-get install tini), or run where cgroups can be created' };
    }
    // Fail closed: the kernel exempts a real uid 0 from RLIMIT_NPROC, so a box whose processes are
    // host root could not have them capped without cgroups (one fork bomb would take every pid of
    // the host). A root server's boxes run under host ids of their own (box-uid.ts), which the
    // limit counts (local-nocgroup.test.ts: a fork loop stops at `pids`); only a root server that
    // cannot give them one is refused. `cgroups: false` (tests only) says so below.
    const root = process.getuid?.() === 0;
    const uncapped = root && !this.boxIds;
    if (!cg && uncapped && this.useCgroups) {
      return { ok: false, reason: `${noCgroups}, and this server runs as root: rlimits cannot cap a box's processes (the kernel exempts root from RLIMIT_NPROC)`, hint: 'run keygate serve as a non-root user, or where it can create cgroups (cgroup v2 delegated to it)' };
    }
    // The real thing, end to end: a box, an execution in it, its relay, then gone again.
    const dir = path.join(this.runDir, `probe-${process.pid}`);
    try {
      const box = await this.startBox(probeSpec(dir), true);
      try {
        const p = await box.exec({ command: ['true'], timeoutMs: 10_000 });
        p.stdout.resume();
        p.stderr.resume();
        const r = await p.done;
        if (r.exitCode !== 0) return { ok: false, reason: `a command could not run inside a box (${cg ? 'nsenter' : 'nsenter or tini'} refused)`, hint: 'run keygate as root, or allow unprivileged user namespaces' };
        // Fail closed: bwrap must have installed the syscall filter (local-seccomp.ts).
        if (localFilter() && !(await waitFiltered(box.pid1, 2000))) return { ok: false, reason: 'bubblewrap did not apply the seccomp filter (--seccomp) to the box', hint: 'install a bubblewrap that supports --seccomp (0.3 or later)' };
      } finally {
        await box.stop();
      }
    } catch (e) {
      return { ok: false, reason: (e as Error).message, hint: 'see the reason; the docker driver is the alternative' };
    } finally {
      rmSync(dir, { recursive: true, force: true });
      rmSync(path.join(this.runDir, `probe-${process.pid}.json`), { force: true });
      this.boxIds?.release(`probe-${process.pid}`);
      if (cg && this.boxes.size === 0) this.dropLayout(cg);
    }
    const limits = cg ? `cgroup v${cg.version}` : `rlimits (${this.layout && !this.layout.ok ? this.layout.why : ''}${uncapped ? '; as root: no process limit' : ''})`;
    const trees = cg ? 'their cgroup' : `a subreaper tini (${tini}) and the host's /proc`;
    const users = this.boxIds ? 'each box a host uid of its own' : "boxes run as this server's uid";
    return { ok: true, detail: `bubblewrap ${bwrap}: new user, pid, ipc, uts, mount, cgroup and network namespaces; ${users}; ${filterDetail()}; limits through ${limits}; execution trees killed through ${trees}` };
  }

  async start(spec: BoxSpec): Promise<Box> {
    const probe = await this.probe();
    if (!probe.ok) throw new BoxStartError(`${probe.reason}; ${probe.hint}`);
    return this.startBox(spec);
  }

  private async startBox(spec: BoxSpec, probing = false): Promise<LocalBox> {
    if (!ID_RE.test(spec.id) || spec.id.startsWith('probe-') !== probing) throw new BoxStartError('box id must be 1-128 letters, digits, "_", "." or "-"');
    const running = this.boxes.get(spec.id);
    if (running) return running;
    const tools = this.tools!;
    const root = spec.template.rootfs ?? 'host';
    if (root !== 'host' && (!path.isAbsolute(root) || !existsSync(path.join(root, 'bin/sh')))) {
      throw new BoxStartError(`template ${spec.template.name}: root filesystem must be "host" or an absolute directory holding bin/sh`);
    }
    // Whatever a previous run of this box left behind goes first.
    await this.reapOne(spec.id);

    // Who the box's user is on the host: a root server's box, a host id of its own, kept from its
    // first start to its DELETE (box-uid.ts); else this server's uid (bwrap maps it).
    let owner: { uid: number; gid: number };
    try {
      const id = this.boxIds?.idFor(spec.id);
      owner = id === undefined ? { uid: process.getuid!(), gid: process.getgid!() } : { uid: id, gid: id };
    } catch (e) {
      throw new BoxStartError(`could not give the box a host uid: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    mkdirSync(spec.stateDir, { recursive: true, mode: 0o700 });
    const workspace = path.join(spec.stateDir, WORKSPACE_DIR);
    if (!this.diskBound) {
      mkdirSync(workspace, { recursive: true, mode: 0o755 });
      try {
        await adoptWorkspace(workspace, owner);
      } catch (e) {
        throw new BoxStartError(`could not give the box its /workspace: ${(e as Error).message}`);
      }
    }
    const filesDir = path.join(spec.stateDir, 'box-files');
    rmSync(filesDir, { recursive: true, force: true });
    mkdirSync(filesDir, { mode: 0o755 });
    const files: Record<string, string> = {};
    const put = (boxPath: string, content: string | Uint8Array) => {
      const f = path.join(filesDir, boxPath.slice(1).replaceAll('/', '_'));
      writeFileSync(f, content, { mode: 0o644 });
      files[boxPath] = f;
    };
    let etcEntries: RootEntry[];
    if (root === 'host') {
      for (const [name, content] of Object.entries(hostEtc())) put(`/etc/${name}`, content);
      etcEntries = rootEntries('/etc', [...HOST_ETC_SHARED, ...readdirSync('/etc').filter((n) => HOST_ETC_JDK.test(n))], true);
    } else {
      etcEntries = existsSync(path.join(root, 'etc')) ? rootEntries(path.join(root, 'etc'), undefined, true) : [];
    }
    put('/etc/keygate/ca.pem', spec.caPem);
    put('/etc/keygate/ca-bundle.pem', spec.caBundlePem);
    if (spec.javaTrustStore) put(BOX_TRUSTSTORE_PATH, spec.javaTrustStore);

    const layout = this.cgroups();
    // Without cgroups, executions run under the host's static tini (LocalBox.exec), lent read-only:
    // it is the same file for every template, including those with a root file system of their own.
    if (!layout && !tools.tini) throw new BoxStartError('no cgroups and no static tini: execution trees could not be killed (apt-get install tini)');
    // What this start has set up on the host, undone in reverse order if it fails before bwrap
    // runs (after that, the box's own stop undoes it). One list, so no failure path forgets a step.
    const undo: (() => unknown)[] = [];
    const codeOf = (e: unknown) => (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    const failed = async (what: string, detail: string): Promise<BoxStartError> => {
      for (const step of undo.splice(0).reverse()) {
        try {
          await step();
        } catch {
          // Best effort: the next start of this box (reapOne) clears what is left.
        }
      }
      return new BoxStartError(`${what}: ${detail}`);
    };
    // The files are handed to bwrap as descriptors (fd 5 on) that it copies into the box's root.
    const fileFds: number[] = [];
    // A root server's box: its user namespace (made below) is fd 5 of bwrap, the files come after it.
    const nsFd: number[] = [];
    const closeFds = () => {
      for (const fd of [...fileFds.splice(0), ...nsFd.splice(0)]) closeSync(fd);
    };
    undo.push(closeFds);
    const first = this.boxIds ? 6 : 5;
    const fileArgs: Record<string, number> = {};
    let seccomp: { program: number; helper: number } | undefined;
    try {
      for (const [boxPath, hostFile] of Object.entries(files)) {
        fileFds.push(openSync(hostFile, 'r'));
        fileArgs[boxPath] = first - 1 + fileFds.length;
      }
      // The syscall filter (local-seccomp.ts), for the main process and, through the helper, every execution.
      const filter = localFilter();
      if (filter) {
        const { program, helper } = openFilterFiles(filesDir, filter);
        fileFds.push(program, helper);
        seccomp = { program: first - 2 + fileFds.length, helper: first - 1 + fileFds.length };
      }
    } catch (e) {
      throw await failed("could not prepare the box's files", codeOf(e));
    }
    const fdCount = fileFds.length;
    // /workspace is a file system of its own, sized disk_mb (disk.ts): the box's user (`owner`
    // outside) owns it, and everything in it (adopt: a workspace of a version whose box ran as
    // another host uid becomes this one's).
    if (this.diskBound) {
      try {
        await mountWorkspace(spec.stateDir, spec.resources.disk_mb, owner, undefined, true);
      } catch (e) {
        throw await failed(`could not make the box's /workspace (disk_mb ${spec.resources.disk_mb})`, (e as Error).message);
      }
      undo.push(() => unmountWorkspace(spec.stateDir));
    }
    // A root server's box: its user namespace, mapping the box's user to `owner` and nothing else,
    // and its workspace staged where bwrap, building the box as that user, may look it up
    // (box-uid.ts); unstaged once the box is built.
    let staged: { workspace: string; rootfs?: string } | null = null;
    const unstage = async () => {
      if (staged !== null) await unstageWorkspace(this.runDir, spec.id);
      staged = null;
    };
    if (this.boxIds) {
      try {
        staged = await stageWorkspace(this.runDir, spec.id, { workspace, rootfs: root === 'host' ? undefined : root }, owner);
        undo.push(unstage);
        nsFd.push(await boxUserns({ unshare: tools.unshare!, sh: tools.bash }, owner.uid, HOST_HELPER_ENV));
      } catch (e) {
        throw await failed("could not make the box's user namespace", (e as Error).message);
      }
    }
    let args: string[];
    try {
      args = bwrapArgs({
        rootDir: root === 'host' ? '' : (staged?.rootfs ?? root),
        entries: root === 'host' ? rootEntries('/', HOST_ROOT) : rootEntries(root),
        etcEntries,
        files: fileArgs,
        workspace: staged?.workspace ?? workspace,
        infoFd: 3,
        blockFd: first + fdCount,
        disableUserns: process.getuid?.() === 0,
        // A root server's box: the user namespace made above.
        userns: nsFd.length ? BOX_USERNS_FD : undefined,
        lent: layout && !seccomp ? undefined : { dir: BOX_RUNTIME_DIR, files: layout ? {} : { [BOX_TINI]: tools.tini! }, copied: seccomp ? { [BOX_SECCOMP]: seccomp.helper } : {} },
        seccompFd: seccomp?.program,
        tmpfsMb: tmpfsSizes(spec.resources.memory_mb),
        procNames: [...readdirSync('/proc').filter((n) => !/^[0-9]+$/.test(n)), ...PROC_MASKED_FILES.filter((n) => n.includes('/') && existsSync(`/proc/${n}`))],
        procRootOnly: (this.rootOnlyProc ??= procRootOnly()),
      });
    } catch (e) {
      throw await failed("could not lay out the box's root", codeOf(e));
    }
    let cg: Cgroup | null = null;
    let prefix: string[];
    try {
      if (layout) {
        cg = createCgroup(layout, spec.id, spec.resources);
        const made = cg;
        undo.push(() => removeCgroup(made));
      }
      // bwrap keeps fd 3 (its info), 4 (its arguments), 5 (a root server's: the box's user
      // namespace), the files it copies in (from `first` on), then the one it waits on before
      // starting the box's main process.
      prefix = this.wrap(first + fdCount, cg, spec.resources);
    } catch (e) {
      throw await failed('could not apply resource limits', codeOf(e));
    }

    // The arguments go through a pipe (`--args`): the box reads pid 1's command line, and host
    // paths of the data directory have no business there.
    const cmd = [...prefix, tools.bwrap, '--args', '4', '--', ...BOX_MAIN];
    // cwd `/`: bwrap's init is pid 1 in the box, whose environment (PWD) the box reads.
    let child: ChildProcess;
    try {
      child = spawn(cmd[0], cmd.slice(1), { env: HOST_HELPER_ENV, cwd: '/', stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe', ...nsFd, ...fileFds, 'pipe'] });
    } catch (e) {
      throw await failed('could not start bwrap', codeOf(e));
    }
    // Out of processes or descriptors (EAGAIN, EMFILE, ENFILE), spawn returns a child that never
    // ran and emits its error on the next tick: with no listener there, it would end the server.
    if (child.pid === undefined) {
      const err = await new Promise<Error>((resolve) => child.once('error', resolve));
      throw await failed('could not start bwrap', codeOf(err));
    }
    // bwrap holds its own copies; from here the box's stop undoes the rest.
    closeFds();
    undo.length = 0;
    const argsPipe = child.stdio[4] as NodeJS.WritableStream;
    argsPipe.on('error', () => undefined);
    argsPipe.end(args.map((a) => `${a}\0`).join(''));
    const box = new LocalBox(this, spec, child, cg, child.stdio[first + fdCount] as NodeJS.WritableStream);
    try {
      try {
        await box.boot();
      } finally {
        // Built (or failed): the box holds its own mount of the workspace.
        await unstage();
      }
      this.boxes.set(spec.id, box);
      mkdirSync(this.runDir, { recursive: true, mode: 0o700 });
      const rec: RunRecord = { id: spec.id, stateDir: spec.stateDir, pid1: box.pid1, pid1Start: box.pid1Start };
      writeFileSync(this.recordPath(spec.id), JSON.stringify(rec), { mode: 0o600 });
      await box.openRelay();
      // Where /workspace cannot be a sized file system: its use is measured from the host (as the
      // box's user, never seen from the box), and the box stopped past disk_mb.
      if (!this.diskBound) box.watchDisk(workspace);
      return box;
    } catch (e) {
      await box.stop();
      throw e instanceof BoxStartError ? e : new BoxStartError((e as Error).message);
    }
  }

  private recordPath(id: string): string {
    return path.join(this.runDir, `${id}.json`);
  }

  /** @internal The command line that runs `argv` inside the box (namespaces, cgroup or rlimits, no privileges). */
  enterCommand(box: LocalBox, cwd: string, argv: string[], cg: Cgroup | null, res: BoxSpec['resources']): string[] {
    const t = this.tools!;
    // Nothing past stdio is kept: nsenter opens the box's namespaces and root from this server's
    // own descriptors (enterArgs).
    const join = this.wrap(2, cg, res);
    // The host side of the syscall filter (local-seccomp.ts) before setpriv and nsenter.
    // A root server's box (its own host uid): setpriv drops the server's supplementary groups on
    // the host, and nsenter becomes the box's user once inside (enterArgs).
    const own = this.boxIds !== null;
    return [...join, ...(t.enterFilter ? [t.enterFilter] : []), t.setpriv, ...(own ? ['--clear-groups'] : []), '--no-new-privs', t.nsenter, ...enterArgs(process.pid, box.namespaceFds(), cwd, own), ...argv];
  }

  /** The host-side start of every command line that ends in a box: clean descriptors, then cgroup or rlimits. */
  private wrap(keepFd: number, cg: Cgroup | null, res: BoxSpec['resources']): string[] {
    const t = this.tools!;
    // --norc: bash reads ~/.bashrc of the server's user when its stdin is a socket (Node's pipes are socketpairs), the rshd rule.
    const w = [t.bash, '--norc', '--noprofile', '-c', ENTER_WRAPPER, 'keygate-box', String(keepFd), ...(cg ? procsFiles(cg) : []), '--'];
    return cg ? w : [...w, t.prlimit!, ...rlimitArgs(res), '--'];
  }

  /**
   * @internal As root: the host device nodes bound into the box become read-only mounts (see
   * deviceRemountOptions), in the box's mount namespace, before any command runs there. `mount`
   * is the host's, started on the host; it enters only the mount namespace (through the
   * descriptor the server holds), keeps its host credentials, and reads no configuration of the
   * box's (`--options-source=disable`). Fails closed.
   */
  async sealDevices(pid1: number, mntFd: number): Promise<void> {
    const mountinfo = readFileOrEmpty(`/proc/${pid1}/mountinfo`).split('\n').map((l) => l.split(' '));
    for (const d of BOX_DEVICES) {
      const target = `/dev/${d}`;
      const current = mountinfo.find((f) => f[4] === target)?.[5]?.split(',');
      if (!current) throw new BoxStartError(`the box has no ${target} mount to make read-only`);
      const args = ['-N', '/proc/self/fd/3', '--options-source=disable', '--no-canonicalize', '-o', deviceRemountOptions(current), target];
      const said = await new Promise<string | null>((resolve) => {
        const p = spawn(this.tools!.mount!, args, { env: HOST_HELPER_ENV, cwd: '/', stdio: ['ignore', 'ignore', 'pipe', mntFd] });
        let err = '';
        p.stderr!.on('data', (b: Buffer) => (err = (err + b.toString()).slice(0, 1000)));
        p.on('error', (e) => resolve(e.message));
        p.on('close', (code) => resolve(code === 0 ? null : err.trim().split('\n')[0] || `exit ${code}`));
      });
      if (said !== null) throw new BoxStartError(`could not make the box's ${target} read-only: ${said}`);
    }
  }

  /**
   * @internal The relay's helper (relay.ts) enters the box's user and network namespaces keeping
   * this server's uid: for a root server, one the box's namespace does not map (no capability
   * there once it execs). Not the box's host uid: that uid may not be able to run this server's
   * Node (installed under a directory only root may enter, as under /root).
   */
  netEnter(userFd: number, netFd: number): string[] {
    return [this.tools!.nsenter, `--user=/proc/self/fd/${userFd}`, `--net=/proc/self/fd/${netFd}`, '--preserve-credentials', '--'];
  }

  /** @internal */
  execCgroup(id: string, n: number): Cgroup | null {
    const layout = this.cgroups();
    return layout ? createCgroup(layout, id, undefined, `exec-${n}`) : null;
  }

  /** @internal Called by a box once it is stopped. */
  forget(box: LocalBox): void {
    if (this.boxes.get(box.id) === box) this.boxes.delete(box.id);
    rmSync(this.recordPath(box.id), { force: true });
  }

  /** Kills a box this server does not run (any more), from its record and its cgroup. */
  private async reapOne(id: string): Promise<void> {
    let rec: RunRecord | null = null;
    try {
      rec = JSON.parse(readFileSync(this.recordPath(id), 'utf8')) as RunRecord;
    } catch {
      /* none */
    }
    if (rec) killIfSame(rec.pid1, rec.pid1Start);
    const layout = this.cgroups();
    const cg = layout ? existingCgroup(layout, id) : null;
    if (cg) {
      await killCgroup(cg);
      removeCgroup(cg);
    }
    if (rec) await waitGone(rec.pid1, rec.pid1Start, 5000);
    // A start cut short by a crash may have left its workspace staged (box-uid.ts).
    if (this.boxIds) await unstageWorkspace(this.runDir, id);
    if (rec) await unmountWorkspace(rec.stateDir);
    rmSync(this.recordPath(id), { force: true });
  }

  async destroy(id: string, stateDir: string): Promise<void> {
    const box = this.boxes.get(id);
    if (box) await box.stop();
    else if (ID_RE.test(id)) await this.reapOne(id);
    rmSync(stateDir, { recursive: true, force: true });
    // Its files gone with it, its host uid may be another box's.
    if (ID_RE.test(id)) this.boxIds?.release(id);
  }

  async reapOrphans(knownIds: ReadonlySet<string>): Promise<void> {
    void knownIds; // Known or not, a box this server does not run is stopped; the service starts known ones again.
    const ids = new Set<string>();
    try {
      for (const f of readdirSync(this.runDir)) if (f.endsWith('.json')) ids.add(f.slice(0, -5));
    } catch {
      /* no run directory yet */
    }
    const layout = this.cgroups();
    if (layout) for (const id of listBoxCgroups(layout)) ids.add(id);
    for (const id of ids) if (!this.boxes.has(id) && (ID_RE.test(id) || id.startsWith('probe-'))) await this.reapOne(id);
    if (layout && this.boxes.size === 0) this.dropLayout(layout);
  }

  /** Removes the (empty) parent cgroups; the next box makes them again. */
  private dropLayout(layout: CgroupLayout): void {
    removeLayoutIfEmpty(layout);
    this.layout = null;
  }

  async close(): Promise<void> {
    await Promise.all([...this.boxes.values()].map((b) => b.stop()));
    const layout = this.layout?.ok ? this.layout.layout : null;
    if (layout && this.boxes.size === 0) this.dropLayout(layout);
  }
}

function probeSpec(dir: string): BoxSpec {
  return {
    id: `probe-${process.pid}`,
    template: { name: 'probe', rootfs: 'host', environment: {} },
    resources: { memory_mb: 64, cpus: 0.5, pids: 32, disk_mb: 16 },
    env: {},
    caPem: '',
    caBundlePem: '',
    // Nothing listens on port 9 (discard) for the probe's relay; it is never used.
    proxy: { host: '127.0.0.1', port: 9 },
    stateDir: dir,
  };
}

/** Turns bwrap's complaint into what is missing and how to allow it. */
export function namespaceTrouble(stderr: string): { reason: string; hint: string } {
  const said = bwrapSaid(stderr);
  if (readSysctl('/proc/sys/user/max_user_namespaces') === '0') {
    return { reason: `user namespaces are disabled (sysctl user.max_user_namespaces = 0)${said ? `: ${said}` : ''}`, hint: 'sysctl -w user.max_user_namespaces=15000' };
  }
  if (/ENOSPC/.test(stderr)) {
    return { reason: `no user namespace can be made here: the nesting depth or sysctl user.max_user_namespaces limit is reached: ${said}`, hint: 'raise sysctl user.max_user_namespaces, or run keygate outside a nested sandbox' };
  }
  const uid = process.getuid?.() ?? 0;
  if (uid !== 0 && readSysctl('/proc/sys/kernel/unprivileged_userns_clone') === '0') {
    return { reason: `unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone = 0)${said ? `: ${said}` : ''}`, hint: 'sysctl -w kernel.unprivileged_userns_clone=1' };
  }
  if (uid !== 0 && readSysctl('/proc/sys/kernel/apparmor_restrict_unprivileged_userns') === '1') {
    return { reason: `AppArmor restricts unprivileged user namespaces (sysctl kernel.apparmor_restrict_unprivileged_userns = 1)${said ? `: ${said}` : ''}`, hint: 'allow bwrap in an AppArmor profile, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0' };
  }
  return { reason: `bubblewrap cannot create namespaces here${said ? `: ${said}` : ''}`, hint: 'run keygate as root, or where unprivileged user namespaces are allowed (not inside an unprivileged container)' };
}

/** bwrap's own error line (not its usage text). */
function bwrapSaid(stderr: string): string {
  const lines = stderr.trim().split('\n');
  return (lines.find((l) => l.startsWith('bwrap:')) ?? lines[0] ?? '').slice(0, 300) || 'no reason given';
}

let execCounter = 0;

class LocalBox implements Box {
  readonly id: string;
  pid1 = 0;
  pid1Start = '';
  /** The box's namespaces and root, held open from start to stop (see BOX_NAMESPACES). */
  private nsFds: number[] = [];

  /** @internal The descriptors of the box's namespaces and root that this server holds (see nsFds). */
  namespaceFds(): readonly number[] {
    return this.nsFds;
  }
  private relay: Relay | null = null;
  private stopped = false;
  private stopping: Promise<void> | null = null;
  private readonly exited: Promise<void>;
  private markEnded!: () => void;
  readonly ended = new Promise<void>((resolve) => (this.markEnded = resolve));
  private readonly execs = new Set<() => Promise<void>>();
  endReason: string | null = null;
  private diskWatch: DiskWatch | null = null;

  constructor(
    private readonly driver: LocalDriver,
    private readonly spec: BoxSpec,
    private readonly child: ChildProcess,
    private readonly cg: Cgroup | null,
    /** Written once the box is finished: bwrap then starts its main process (BwrapPlan.blockFd). */
    private readonly release: NodeJS.WritableStream,
  ) {
    this.id = spec.id;
    release.on('error', () => undefined);
    this.exited = new Promise((r) => {
      if (child.exitCode !== null || child.signalCode !== null) r();
      else child.once('exit', () => r());
    });
    child.on('error', () => undefined);
  }

  /** Waits for bwrap to report the box's pid 1, then checks the isolation it must have. */
  async boot(): Promise<void> {
    let err = '';
    this.child.stderr!.on('data', (d: Buffer) => (err = (err + d.toString()).slice(0, 4000)));
    const info = await new Promise<string>((resolve, reject) => {
      let buf = '';
      const timer = setTimeout(() => reject(new BoxStartError('bubblewrap did not start the box in time')), START_TIMEOUT_MS);
      this.child.stdio[3]!.on('data', (d: Buffer) => (buf += d.toString()));
      this.child.stdio[3]!.on('end', () => {
        clearTimeout(timer);
        resolve(buf);
      });
      this.child.once('error', (e) => {
        clearTimeout(timer);
        reject(new BoxStartError(`bubblewrap: ${e.message}`));
      });
    });
    let pid: unknown;
    try {
      pid = (JSON.parse(info) as Record<string, unknown>)['child-pid'];
    } catch {
      await this.exited;
      throw new BoxStartError(`bubblewrap could not start the box: ${bwrapSaid(err)}`);
    }
    if (typeof pid !== 'number') throw new BoxStartError('bubblewrap did not report the box');
    this.pid1 = pid;
    this.pid1Start = startTime(pid) ?? '';
    if (!this.pid1Start) throw new BoxStartError(`the box exited at once: ${bwrapSaid(err)}`);
    // bwrap reports pid 1 before it has built the box's root. Once built (root in place, the box's
    // user namespace final), it drops its last capabilities (it builds with a full permitted set,
    // which a new user namespace starts with), and waits on the block fd before it starts the
    // box's main process: no box code runs until the server releases it below.
    const until = Date.now() + START_TIMEOUT_MS;
    const waitFor = async (done: () => boolean) => {
      while (!done()) {
        if (startTime(pid) !== this.pid1Start) throw new BoxStartError(`the box exited at once: ${bwrapSaid(err)}`);
        if (Date.now() > until) throw new BoxStartError('bubblewrap did not finish building the box in time');
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    await waitFor(() => {
      const status = readFileOrEmpty(`/proc/${pid}/status`);
      return /^CapPrm:\s*0+$/m.test(status) && /^CapEff:\s*0+$/m.test(status);
    });
    try {
      this.nsFds = [...BOX_NAMESPACES.map(([kind]) => openSync(`/proc/${pid}/ns/${kind}`, 'r')), openSync(`/proc/${pid}/root`, 'r')];
    } catch (e) {
      throw new BoxStartError(`cannot hold the box's namespaces: ${(e as NodeJS.ErrnoException).code ?? 'error'}`);
    }
    // Opened from the right process: it still is the box's pid 1.
    if (startTime(pid) !== this.pid1Start) throw new BoxStartError('the box exited while starting');
    this.assertIsolated();
    // A root server binds host device nodes that are root's: sealed read-only all the same
    // (defence in depth; its box's user is a host uid of its own, which owns none of them).
    if (process.getuid?.() === 0) await this.driver.sealDevices(pid, this.nsFds[BOX_NAMESPACES.findIndex(([k]) => k === 'mnt')]);
    this.release.end('1');
    await waitFor(() => readFileOrEmpty(`/proc/${pid}/task/${pid}/children`).trim() !== '');
    // bwrap's stderr is needed only to say why a start failed. Its write end is held by the box's
    // pid 1, which box code can ptrace (same uid, no Yama): left open, box code could feed this
    // server an endless stream through it. Closed, such writes fail in the box.
    this.child.stderr!.removeAllListeners('data');
    this.child.stderr!.destroy();
    // pid 1 gone (stopped, or killed from outside): the box is over; its descriptors stay until stop.
    this.child.once('exit', () => void this.stop());
  }

  /** Fail closed: a box whose network namespace is the host's, or has any interface but lo, never runs. */
  private assertIsolated(): void {
    const ns = (p: string) => {
      try {
        return readlinkSync(p);
      } catch {
        return null;
      }
    };
    for (const kind of ['net', 'pid', 'mnt', 'user', 'ipc', 'uts']) {
      const mine = ns(`/proc/self/ns/${kind}`);
      const its = ns(`/proc/${this.pid1}/ns/${kind}`);
      if (!its || its === mine) throw new BoxStartError(`the box did not get its own ${kind} namespace`);
    }
    let dev: string;
    try {
      dev = readFileSync(`/proc/${this.pid1}/net/dev`, 'utf8');
    } catch {
      throw new BoxStartError('cannot inspect the box network namespace');
    }
    const ifaces = dev.split('\n').slice(2).map((l) => l.split(':')[0].trim()).filter(Boolean);
    if (ifaces.length !== 1 || ifaces[0] !== 'lo') throw new BoxStartError(`the box network namespace has interfaces other than lo: ${ifaces.join(', ')}`);
  }

  watchDisk(workspace: string): void {
    this.diskWatch = new DiskWatch(() => hostDiskUse(workspace), this.spec.resources.disk_mb, (why) => {
      this.endReason = `Stopped: ${why}.`;
      void this.stop();
    });
  }

  async openRelay(): Promise<void> {
    try {
      const fd = (kind: string) => this.nsFds[BOX_NAMESPACES.findIndex(([k]) => k === kind)];
      this.relay = await openRelay(this.driver.netEnter(4, 5), [fd('user'), fd('net')], this.spec.proxy, this.driver.relayBudget);
    } catch (e) {
      throw new BoxStartError(`the relay to the proxy could not be set up: ${(e as Error).message}`);
    }
  }

  private env(extra?: Record<string, string>): Record<string, string> {
    return {
      PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: '/workspace',
      USER: 'box',
      LOGNAME: 'box',
      ...this.spec.template.environment,
      ...this.spec.env,
      ...extra,
    };
  }

  async exec(opts: ExecOptions): Promise<ExecProcess> {
    if (this.stopped) throw new BoxNotRunningError();
    try {
      return this.startExec(opts);
    } catch (e) {
      // What failed because the box went meanwhile (its cgroup removed under a new execution's) says so.
      if (this.stopped) throw new BoxNotRunningError('the box was stopped while the execution was starting');
      throw e;
    }
  }

  private startExec(opts: ExecOptions): ExecProcess {
    const argv = typeof opts.command === 'string' ? ['/bin/sh', '-c', opts.command] : opts.command;
    if (argv.length === 0) throw new Error('empty command');
    const cwd = opts.cwd ?? '/workspace';
    if (!cwd.startsWith('/') || cwd.includes('\0')) throw new Error('cwd must be an absolute path in the box');
    // The box's environment is applied only once inside (`env -i` in the box): the helpers that run
    // on the host first (sh, prlimit, setpriv, nsenter, as this server's user until nsenter becomes the box's) must never see
    // LD_PRELOAD or the like from a request, which could name a host path the box wrote to.
    const env = Object.entries(this.env(opts.env));
    if (env.some(([k, v]) => !/^[^=\0]+$/.test(k) || v.includes('\0'))) throw new Error('environment names must not hold "=" or NUL, nor values NUL');
    if (argv[0].includes('=')) throw new Error('the program name must not hold "="');
    // With cgroups, the execution's own cgroup holds its whole tree. Without, tini as subreaper
    // does: whatever the command forks, however it detaches, is reparented to tini (not to the box's
    // pid 1) while the command runs, so the host finds it below the spawned process by parent pid.
    // tini comes before `env -i`: its own environment is the helpers', never the request's.
    const cg = this.cg ? this.driver.execCgroup(this.id, ++execCounter) : null;
    if (this.cg && !cg) throw new Error('the box cgroup layout is gone');
    const underTini = !cg;
    // The seccomp helper first (local-seccomp.ts): nothing of the box runs before the filter is on.
    const inBox = [...(localFilter() ? [BOX_SECCOMP] : []), ...(underTini ? [BOX_TINI, '-s', '--'] : []), '/usr/bin/env', '-i', ...env.map(([k, v]) => `${k}=${v}`), ...argv];
    const cmd = this.driver.enterCommand(this, cwd, inBox, cg, this.spec.resources);
    let child: ChildProcess;
    try {
      child = spawn(cmd[0], cmd.slice(1), {
        env: HOST_HELPER_ENV,
        stdio: [opts.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
        // Its own process group: no signal sent to the server's group reaches it.
        detached: true,
      });
    } catch (e) {
      // Refused before anything ran (an argument Node cannot pass): the execution's cgroup, made
      // above, would otherwise stay behind, one more per such request.
      if (cg) removeCgroup(cg);
      throw e;
    }
    // The spawned process, known by its start time (its pid is reused once Node has collected it).
    // Read at once: Node collects it no earlier than on a later turn of the event loop.
    const rootStart = underTini && child.pid ? startTime(child.pid) : null;
    const root = child.pid && rootStart !== null ? { pid: child.pid, startTime: rootStart } : null;
    let timedOut = false;
    let sent: NodeJS.Signals | null = null;
    const killTree = async (signal: NodeJS.Signals) => {
      sent = signal;
      if (!cg) {
        if (!root) return;
        // Fail closed: a tree that would not die (still forking at the deadline) takes the box.
        if (!(await killProcessTree(root, signal, { anchorDepth: TINI_DEPTH }))) void this.stop();
        return;
      }
      if (signal === 'SIGKILL') {
        await killCgroup(cg);
        return;
      }
      // Any other signal goes to the command and whatever it started (the execution's cgroup), not
      // to the host-side nsenter (child.pid, in the cgroup too): nsenter reports how the command
      // ended, so a command that handles the signal (a shell's trap) is still waited for.
      for (const f of procsFiles(cg).slice(0, 1)) {
        for (const p of readFileSync(f, 'utf8').split('\n').filter(Boolean)) {
          if (Number(p) === child.pid) continue;
          try {
            process.kill(Number(p), signal);
          } catch {
            /* gone */
          }
        }
      }
    };
    const timer = opts.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          void killTree('SIGKILL');
        }, opts.timeoutMs)
      : null;
    const stopper = () => killTree('SIGKILL');
    this.execs.add(stopper);
    // Processes the command left running in the background may hold its output open: once the
    // command itself has exited, its output ends after a short grace instead of waiting for them
    // (they go on writing to a closed pipe; stop, a timeout or kill() still takes them down).
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    child.stdout!.pipe(stdout);
    child.stderr!.pipe(stderr);
    const done = new Promise<ExecResult>((resolve) => {
      let exit: { code: number | null; signal: NodeJS.Signals | null } | null = null;
      let grace: NodeJS.Timeout | null = null;
      const finish = () => {
        if (grace) clearTimeout(grace);
        if (timer) clearTimeout(timer);
        this.execs.delete(stopper);
        if (cg) removeCgroup(cg);
        const e = exit ?? { code: 127, signal: null };
        // tini reports a command killed by signal N as exit code 128+N: when that is the signal
        // sent, say so as nsenter does when the command is its own child.
        const s = sent as NodeJS.Signals | null;
        if (underTini && s && !e.signal && e.code === 128 + osConstants.signals[s]) return resolve({ exitCode: null, signal: s, timedOut });
        resolve({ exitCode: e.signal ? null : e.code, signal: e.signal, timedOut });
      };
      let ended = 0;
      for (const [from, to] of [[child.stdout!, stdout], [child.stderr!, stderr]] as const) {
        to.on('end', () => {
          if (++ended === 2 && exit) finish();
        });
        from.on('error', () => to.end());
      }
      child.on('error', () => {
        exit ??= { code: 127, signal: null };
        stdout.end();
        stderr.end();
      });
      child.on('exit', (code, signal) => {
        exit ??= { code, signal };
        if (ended === 2) return finish();
        // Only processes left behind can keep the output open (with none left, it ends once read,
        // at the reader's pace); cut it then, after a grace.
        if (cg && !cgroupHasProcesses(cg)) return;
        grace = setTimeout(() => {
          for (const [from, to] of [[child.stdout!, stdout], [child.stderr!, stderr]] as const) {
            if (!to.writableEnded) {
              from.unpipe(to);
              from.destroy();
              to.end();
            }
          }
        }, OUTPUT_GRACE_MS);
      });
    });
    return {
      stdout,
      stderr,
      stdin: child.stdin ?? null,
      kill: (signal: NodeJS.Signals = 'SIGKILL') => void killTree(signal),
      done,
    };
  }

  private running(): void {
    if (this.stopped) throw new BoxFileError('not_running', 'box is not running');
  }

  async readFile(boxPath: string, maxBytes: number): Promise<{ size: number; stream: Readable }> {
    this.running();
    return readBoxFile((o) => this.exec(o), boxPath, maxBytes);
  }

  async writeFile(boxPath: string, body: Readable, maxBytes: number): Promise<{ size: number }> {
    this.running();
    return writeBoxFile((o) => this.exec(o), boxPath, body, maxBytes);
  }

  stop(): Promise<void> {
    this.stopping ??= this.doStop();
    return this.stopping;
  }

  private async doStop(): Promise<void> {
    this.stopped = true;
    this.diskWatch?.stop();
    this.relay?.close();
    // pid 1 gone takes every process of the box's PID namespace with it; the cgroup catches the
    // rest (executions' nsenter parents on the host side). bwrap outside the box is pid 1's
    // parent: given a moment, it collects pid 1 and exits. Killed at the same time, it would
    // leave pid 1 to the host's init, and the wait below for pid 1 to be gone would last until
    // init collects it: 1 to 2 s per stop where init reaps in passes (as here), 5 s (the
    // deadline) where it never does (keygate as a container's pid 1).
    if (this.pid1) {
      killIfSame(this.pid1, this.pid1Start);
      let grace: NodeJS.Timeout | undefined;
      await Promise.race([this.exited, new Promise((r) => (grace = setTimeout(r, BWRAP_EXIT_GRACE_MS)))]);
      clearTimeout(grace);
    }
    try {
      if (this.child.exitCode === null && this.child.signalCode === null && this.child.pid) process.kill(this.child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    await Promise.all([...this.execs].map((k) => k()));
    if (this.cg) await killCgroup(this.cg);
    await this.exited;
    if (this.pid1) await waitGone(this.pid1, this.pid1Start, 5000);
    if (this.cg) removeCgroup(this.cg);
    for (const fd of this.nsFds) closeSync(fd);
    this.nsFds = [];
    // The workspace's file system is mounted while the box runs only (a start mounts it again).
    await unmountWorkspace(this.spec.stateDir);
    this.driver.forget(this);
    this.markEnded();
  }
}
