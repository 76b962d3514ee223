/**
 * A box's `/workspace` as a file system of its own, sized `disk_mb` (sandbox.md: a box must not be
 * able to fill the host's disk under the data directory). Both drivers use it: a sparse ext4 image
 * in the box's state directory, loop-mounted on the host at `<stateDir>/workspace`, which the local
 * driver binds into the box and the docker driver mounts into the container. Writes past the size
 * fail in the box with ENOSPC; the image on the host never grows past it (it is sparse, mounted
 * with `discard`, so a file deleted in the box gives its blocks back to the host too).
 *
 * The box sees a file system whose root is `/workspace` itself: its /proc/self/mountinfo names no
 * path of the host (a bind of a host directory shows that directory's path under the data
 * directory there).
 *
 * Mounting a loop device takes root (CAP_SYS_ADMIN in the host's namespaces). A server without it
 * cannot bound a box's disk this way: `workspaceBound()` says why, and the drivers refuse to start
 * a box that asks for a bound they cannot apply rather than start it unbounded (fail closed), unless
 * the operator asked for none (`disk_mb: 0`).
 */
import { execFile } from 'node:child_process';
import { chownSync, closeSync, existsSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, rmdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';

/** Runs a host tool (mount, mkfs, chown) with TOOL_ENV and a timeout; box-uid.ts runs its mounts the same way. */
export const run = promisify(execFile);

export const WORKSPACE_IMAGE = 'workspace.img';
export const WORKSPACE_DIR = 'workspace';
/** Where a workspace kept by an earlier version (a plain directory) waits to be copied in. */
const LEGACY_DIR = 'workspace.legacy';
export const TOOL_ENV = { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' };
export const TOOL_TIMEOUT_MS = 60_000;

let bound: string | null | undefined;

/** Null when this server can give boxes a sized /workspace, else why not. */
export function workspaceBoundUnavailable(): string | null {
  if (bound !== undefined) return bound;
  if (process.platform !== 'linux') bound = 'a sized /workspace needs Linux loop devices';
  else if (process.getuid?.() !== 0) bound = 'a sized /workspace needs a loop-mounted file system, which only a root server can mount';
  else if (!existsSync('/dev/loop-control')) bound = 'no loop devices on this machine (/dev/loop-control)';
  else if (!['mkfs.ext4', 'mount', 'umount'].every((t) => ['/usr/sbin', '/sbin', '/usr/bin', '/bin'].some((d) => existsSync(path.join(d, t))))) bound = 'mkfs.ext4, mount or umount is missing (apt-get install e2fsprogs mount)';
  else bound = null;
  return bound;
}

/** mountinfo escapes space, tab, newline and backslash as octal. */
function unescapeMountPath(p: string): string {
  return p.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/** Whether `dir` is a mount point in this server's mount namespace. */
export function isMountPoint(dir: string): boolean {
  let info: string;
  try {
    info = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return false;
  }
  const want = path.resolve(dir);
  return info.split('\n').some((l) => l.split(' ')[4] !== undefined && unescapeMountPath(l.split(' ')[4]) === want);
}

/** Unmounts every mount stacked on `dir` (a crashed server may have left one, or two). */
export async function unmountWorkspace(stateDir: string): Promise<void> {
  const dir = path.join(stateDir, WORKSPACE_DIR);
  for (let i = 0; i < 8 && isMountPoint(dir); i++) {
    try {
      await run('umount', [dir], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS });
    } catch {
      // Busy (a process of a box not yet gone holds it): detached now, freed once it lets go.
      await run('umount', ['-l', dir], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS }).catch(() => undefined);
    }
  }
}

function isEmptyDir(dir: string): boolean {
  try {
    return readdirSync(dir).length === 0;
  } catch {
    return true;
  }
}

/**
 * Gives a workspace whose every file is its box's user's to `owner`, the host uid and gid that
 * user has now: when its root is someone else's (a workspace of a version whose box ran as another
 * host uid: a root server's boxes were host root before box-uid.ts), the whole tree is chowned,
 * symlinks themselves and never followed (`chown -R -P -h`); `always`, whoever owns its root. Only
 * while no box runs on it.
 */
export async function adoptWorkspace(dir: string, owner: { uid: number; gid: number }, always = false): Promise<void> {
  const st = statSync(dir);
  if (!always && st.uid === owner.uid && st.gid === owner.gid) return;
  try {
    await run('chown', ['-R', '-P', '-h', `${owner.uid}:${owner.gid}`, '--', dir], { env: TOOL_ENV, timeout: 10 * TOOL_TIMEOUT_MS });
  } catch (e) {
    throw new Error(`cannot give /workspace to the box's user: ${toolError(e)}`);
  }
}

/**
 * Mounts the box's sized workspace at `<stateDir>/workspace` (made on first use, owned by
 * `owner`) and returns that directory. `adopt`: everything in it is the box's user's, given to
 * `owner` if its root is not (adoptWorkspace). `owner` null (the docker driver): made root's, and
 * then left as it is: the engine gives an empty volume the owner of the image's /workspace on the
 * box's first start, and a later mount that gave it back to root left the box's user unable to
 * make a file at the top of its own /workspace. Throws with a sentence saying what failed.
 */
export async function mountWorkspace(stateDir: string, diskMb: number, owner: { uid: number; gid: number } | null, copyFrom?: string, adopt = false): Promise<string> {
  const why = workspaceBoundUnavailable();
  if (why) throw new Error(why);
  if (!Number.isSafeInteger(diskMb) || diskMb < 1) throw new Error('disk_mb must be a positive whole number of MiB');
  const dir = path.join(stateDir, WORKSPACE_DIR);
  const image = path.join(stateDir, WORKSPACE_IMAGE);
  const legacy = path.join(stateDir, LEGACY_DIR);
  // A new image is made under another name and takes its own only once whole (made, mounted, and
  // what it must hold copied in): a server killed meanwhile (mkfs takes a moment) left an image of
  // zeros under the real name, which no later start could mount: the box failed for good.
  const made = path.join(stateDir, `${WORKSPACE_IMAGE}.new`);
  await unmountWorkspace(stateDir);
  let fresh = false;
  if (!existsSync(image)) {
    fresh = true;
    // A workspace of an earlier version (a plain directory, unbounded) is copied into the new file system.
    if (existsSync(dir) && !isEmptyDir(dir)) renameSync(dir, legacy);
    rmSync(made, { force: true });
    const fd = openSync(made, 'wx', 0o600);
    try {
      ftruncateSync(fd, diskMb * 1024 * 1024);
    } finally {
      closeSync(fd);
    }
    try {
      // No blocks reserved for root (the box's user gets all of it); lazy init keeps creation quick.
      await run('mkfs.ext4', ['-q', '-F', '-m', '0', '-L', 'workspace', '-E', `root_owner=${owner?.uid ?? 0}:${owner?.gid ?? 0},lazy_itable_init=1,nodiscard`, made], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS });
    } catch (e) {
      rmSync(made, { force: true });
      throw new Error(`cannot make the /workspace file system: ${toolError(e)}`);
    }
  }
  const source = fresh ? made : image;
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  try {
    await run('mount', ['-t', 'ext4', '-o', 'loop,nosuid,nodev,noatime,discard', source, dir], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS });
  } catch (e) {
    throw new Error(`cannot mount the /workspace file system: ${toolError(e)}`);
  }
  try {
    // mkfs's lost+found is nothing the box's user should find (nor could remove: root's, 0700).
    const lf = path.join(dir, 'lost+found');
    if (existsSync(lf) && isEmptyDir(lf)) rmdirSync(lf);
    if (owner) {
      if (adopt) await adoptWorkspace(dir, owner);
      const st = statSync(dir);
      if (st.uid !== owner.uid || st.gid !== owner.gid) chownSync(dir, owner.uid, owner.gid);
    }
    const fromLegacy = existsSync(legacy);
    if (fromLegacy) {
      try {
        await run('cp', ['-a', '--', `${legacy}/.`, `${dir}/`], { env: TOOL_ENV, timeout: 10 * TOOL_TIMEOUT_MS });
      } catch (e) {
        // Back as it was (the old directory, no image): a later start tries again.
        await unmountWorkspace(stateDir);
        rmSync(source, { force: true });
        rmSync(dir, { recursive: true, force: true });
        renameSync(legacy, dir);
        throw new Error(`the existing /workspace does not fit in disk_mb = ${diskMb} MiB (${toolError(e)})`);
      }
    }
    // The docker driver's earlier /workspace (a volume of the engine) is copied, not moved: the
    // caller removes it once the box runs.
    if (fresh && copyFrom && !isEmptyDir(copyFrom)) {
      try {
        await run('cp', ['-a', '--', `${copyFrom}/.`, `${dir}/`], { env: TOOL_ENV, timeout: 10 * TOOL_TIMEOUT_MS });
      } catch (e) {
        await unmountWorkspace(stateDir);
        rmSync(made, { force: true });
        throw new Error(`the existing /workspace does not fit in disk_mb = ${diskMb} MiB (${toolError(e)})`);
      }
    }
    // Whole: the image takes its name (a loop device follows its file, not the name), and only
    // then is the old directory dropped (killed between the two, the next start copies it again).
    if (fresh) renameSync(made, image);
    if (fromLegacy) {
      rmSync(legacy, { recursive: true, force: true });
      // `cp -a` kept the old owner (the server's uid, as boxes once ran): the box's now.
      if (adopt && owner) await adoptWorkspace(dir, owner, true);
    }
  } catch (e) {
    await unmountWorkspace(stateDir);
    throw e;
  }
  return dir;
}

function toolError(e: unknown): string {
  const err = e as { stderr?: string; message?: string };
  return (err.stderr?.trim() || err.message || 'failed').split('\n')[0].slice(0, 300);
}

/** What a disk watch measures: bytes used, or that the box made part of /workspace unreadable to it. */
export type DiskUse = number | 'unreadable' | null;

const WATCH_MIN_MS = 2000;
const WATCH_MAX_MS = 60_000;

/**
 * The fallback where /workspace cannot be a sized file system (a server that is not root):
 * enforced accounting. `measure` is taken every few seconds (more seldom when it is slow: ten
 * times its own duration, so a huge tree does not keep a core busy); past the limit, or when the
 * box has hidden part of its /workspace from the measure (a directory it made unreadable), `over`
 * is called once with why (the driver stops the box: fail closed). Weaker than a file system of
 * its own: a box can write at disk speed for one interval past its size before it is stopped.
 */
export class DiskWatch {
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;

  constructor(
    private readonly measure: () => Promise<DiskUse>,
    private readonly limitMb: number,
    private readonly over: (why: string) => void,
  ) {
    this.schedule(WATCH_MIN_MS);
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.tick(), ms);
    this.timer.unref();
  }

  private async tick(): Promise<void> {
    const t0 = Date.now();
    let used: DiskUse = null;
    try {
      used = await this.measure();
    } catch {
      used = null;
    }
    if (this.stopped) return;
    if (used === 'unreadable') return this.fire(`its /workspace holds a directory the disk watch cannot read, so its size (disk_mb ${this.limitMb}) cannot be enforced`);
    if (used !== null && used > this.limitMb * 1024 * 1024) return this.fire(`its /workspace holds ${Math.ceil(used / 1024 / 1024)} MiB, more than disk_mb ${this.limitMb}`);
    this.schedule(Math.min(WATCH_MAX_MS, Math.max(WATCH_MIN_MS, 10 * (Date.now() - t0))));
  }

  private fire(why: string): void {
    this.stop();
    this.over(why);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
  }
}

/** Bytes used under a host directory (one file system, as the server's user: `du`). */
export async function hostDiskUse(dir: string): Promise<DiskUse> {
  try {
    const { stdout } = await run('du', ['-sxk', '--', dir], { env: { ...TOOL_ENV, LC_ALL: 'C' }, timeout: WATCH_MAX_MS, maxBuffer: 1 << 20 });
    return Number(stdout.split('\t')[0]) * 1024;
  } catch (e) {
    const err = e as { stderr?: string; killed?: boolean };
    if (/Permission denied/.test(err.stderr ?? '')) return 'unreadable';
    return null;
  }
}

export const RUN_DIR = 'run';

/**
 * The docker driver's per-box files the container binds (the CA, resolv.conf, the relay's socket
 * directory), on a small tmpfs of their own where the server can mount one (root), else in a
 * plain directory. A bind shows its source's path within its file system in the box's
 * /proc/self/mountinfo: from this tmpfs that is `/ca`, never a path under the data directory.
 */
export async function mountRunDir(stateDir: string): Promise<string> {
  const dir = path.join(stateDir, RUN_DIR);
  await unmountRunDir(stateDir);
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  if (workspaceBoundUnavailable() === null) {
    try {
      await run('mount', ['-t', 'tmpfs', '-o', 'size=8m,mode=0755,nosuid,nodev,noexec', 'keygate', dir], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS });
    } catch (e) {
      throw new Error(`cannot mount the box's run directory: ${toolError(e)}`);
    }
  }
  return dir;
}

export async function unmountRunDir(stateDir: string): Promise<void> {
  const dir = path.join(stateDir, RUN_DIR);
  for (let i = 0; i < 8 && isMountPoint(dir); i++) {
    await run('umount', ['-l', dir], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS }).catch(() => undefined);
  }
}
