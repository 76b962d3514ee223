/**
 * The host uid of a local box (sandbox.md, "The host's kernel, from a root server's box"). bwrap's
 * own user namespace maps the box's user (BOX_UID) to the server's uid: for a root server, host
 * root, which every plain file permission of the host lets through. A root server instead gives
 * each box a host uid and gid of its own, unprivileged and unused on the host, and builds the
 * box's user namespace itself with only `BOX_UID <that id> 1` mapped (uid and gid): outside its
 * namespaces, every process of the box, and every file it makes, is that id.
 *
 * - Ids: `BoxIds`, one per server (its run directory). A box keeps its id from its first start to
 *   its DELETE (recorded in `<runDir>/uids/<box id>`), so that its /workspace files stay its own
 *   across stop/start and a restarted server; no two boxes of the server share one. Ids come from
 *   a block of 65536 below 2^31 (ids past it read as negative to some tools) chosen by the run
 *   directory (another keygate server on the host takes another block), skipping any id of the
 *   host's /etc/passwd or /etc/group and any uid a running process has.
 * - The namespace: `boxUserns` starts a holder (`unshare --user --keep-caps`) in a new user
 *   namespace, which (with the capabilities it has there) sets that namespace's
 *   `user.max_user_namespaces` to 0 (no box process may make a nested one: what bwrap's
 *   `--disable-userns` did, which cannot be combined with `--userns`); the server then writes the
 *   maps (`setgroups` denied), holds the namespace by a descriptor for bwrap's `--userns`, and
 *   kills the holder before bwrap starts: no process of it outlives the set-up.
 * - The workspace: bwrap builds the box in that namespace as the box's user (it switches to the
 *   mapped uid before it mounts anything), so it can look up no path of the data directory (0700,
 *   root's), not even through `/proc/self/fd` (`--bind-fd`: the switch makes it non-dumpable).
 *   `stageWorkspace` binds the workspace (and a template's root file system, wherever it lies), for
 *   the box's start only, at `/run/keygate-stage/<server>-<box>/{workspace,root}`
 *   (`/run/keygate-stage` root's, 0711; the directory of the box the box's host uid's, 0700: no
 *   one else may look in), where bwrap binds them from; `unstageWorkspace` removes them once the
 *   box is built (the box's own mounts stay).
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, chownSync, closeSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, readlinkSync, rmdirSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BOX_UID } from './bwrap.js';
import { readFileOrEmpty } from '../builtins/fs.js';
import { isMountPoint, run, TOOL_ENV, TOOL_TIMEOUT_MS } from './disk.js';

/** The first host id of box ids; blocks of BLOCK ids from here to 2^31 - 1. */
export const BOX_ID_BASE = 2_000_000_000;
const BLOCK = 65_536;
const BLOCKS = Math.floor((2 ** 31 - 1 - BOX_ID_BASE) / BLOCK);
const SET_UP_TIMEOUT_MS = 10_000;

/** The run directory's digest: it picks the server's block of ids and names its staged workspaces. */
function runDirDigest(runDir: string): string {
  return createHash('sha256').update(path.resolve(runDir)).digest('hex');
}

/** Whether `id` is mapped in this process's own user namespace (`/proc/self/{uid,gid}_map`), for both maps. */
function mappedHere(first: number, count: number): boolean {
  for (const f of ['/proc/self/uid_map', '/proc/self/gid_map']) {
    let map: string;
    try {
      map = readFileSync(f, 'utf8');
    } catch {
      return false;
    }
    const ok = map
      .split('\n')
      .map((l) => l.trim().split(/\s+/).map(Number))
      .some(([inside, , n]) => Number.isSafeInteger(inside) && Number.isSafeInteger(n) && inside <= first && first + count <= inside + n);
    if (!ok) return false;
  }
  return true;
}

/**
 * Null when boxes of this server get host ids of their own (root, with the ids of the range
 * mapped in its user namespace), else why not (they are the server's uid, as bwrap maps it).
 */
export function boxIdsUnavailable(): string | null {
  if (process.getuid?.() !== 0) return 'the server is not root (it can map no uid but its own)';
  if (!mappedHere(BOX_ID_BASE, BLOCK * BLOCKS)) return `host ids ${BOX_ID_BASE} and up are not mapped in the server's user namespace`;
  return null;
}

/** Ids the host already gives to someone: its /etc/passwd and /etc/group entries, and the uids of its processes. */
function hostIdsInUse(): Set<number> {
  const used = new Set<number>();
  for (const [f, field] of [['/etc/passwd', 2], ['/etc/group', 2]] as const) {
    try {
      for (const l of readFileSync(f, 'utf8').split('\n')) {
        const n = Number(l.split(':')[field]);
        if (Number.isSafeInteger(n)) used.add(n);
      }
    } catch {
      /* none */
    }
  }
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const status = readFileSync(`/proc/${e}/status`, 'utf8');
      for (const k of ['Uid', 'Gid']) for (const n of status.match(new RegExp(`^${k}:(.*)$`, 'm'))?.[1].trim().split(/\s+/) ?? []) used.add(Number(n));
    } catch {
      /* gone */
    }
  }
  return used;
}

/** The host ids of one server's boxes, recorded under its run directory (see the top of this file). */
export class BoxIds {
  private readonly dir: string;
  private readonly first: number;

  constructor(runDir: string) {
    this.dir = path.join(runDir, 'uids');
    const block = parseInt(runDirDigest(runDir).slice(0, 8), 16) % BLOCKS;
    this.first = BOX_ID_BASE + block * BLOCK;
  }

  private recorded(): Map<string, number> {
    const out = new Map<string, number>();
    let names: string[] = [];
    try {
      names = readdirSync(this.dir);
    } catch {
      /* none yet */
    }
    for (const name of names) {
      const n = Number(readFileOrEmpty(path.join(this.dir, name)).trim());
      if (Number.isSafeInteger(n) && n >= this.first && n < this.first + BLOCK) out.set(name, n);
    }
    return out;
  }

  /** The box's id: the one recorded for it, else the lowest free one, recorded now. */
  idFor(boxId: string): number {
    const all = this.recorded();
    const mine = all.get(boxId);
    if (mine !== undefined) return mine;
    const taken = new Set(all.values());
    const host = hostIdsInUse();
    for (let n = this.first; n < this.first + BLOCK; n++) {
      if (taken.has(n) || host.has(n)) continue;
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      writeFileSync(path.join(this.dir, boxId), `${n}\n`, { mode: 0o600 });
      return n;
    }
    throw new Error(`no free host uid left for a box (${BLOCK} in use from ${this.first})`);
  }

  /** The box is gone for good (DELETE): its id may be given again. */
  release(boxId: string): void {
    rmSync(path.join(this.dir, boxId), { force: true });
  }
}

// Runs in the new user namespace with its capabilities there (--keep-caps: kept across exec as
// ambient ones). Says `ready` once the namespace may make no further one, then waits for stdin to end.
const HOLDER = 'echo 0 >/proc/sys/user/max_user_namespaces || exit 3; echo ready; exec cat >/dev/null';

/**
 * A new user namespace mapping BOX_UID (uid and gid) to `hostId` and nothing else, in which no
 * further user namespace can be made; returned as an open descriptor (the caller closes it once
 * bwrap holds it). The holder process is dead when this returns, either way.
 */
export async function boxUserns(tools: { unshare: string; sh: string }, hostId: number, env: Record<string, string>): Promise<number> {
  const holder = spawn(tools.unshare, ['--user', '--keep-caps', '--', tools.sh, '-c', HOLDER], { env, cwd: '/', stdio: ['pipe', 'pipe', 'pipe'] });
  const exited = new Promise<void>((r) => holder.once('close', () => r()));
  holder.on('error', () => undefined);
  holder.stdin!.on('error', () => undefined);
  let err = '';
  holder.stderr!.on('data', (d: Buffer) => (err = (err + d.toString()).slice(0, 1000)));
  try {
    await new Promise<void>((resolve, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error('the user namespace helper did not start in time')), SET_UP_TIMEOUT_MS);
      holder.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        if (out === 'ready\n') {
          clearTimeout(timer);
          resolve();
        }
      });
      holder.once('error', (e) => {
        clearTimeout(timer);
        reject(new Error(`unshare: ${e.message}`));
      });
      holder.once('exit', (code) => {
        clearTimeout(timer);
        setTimeout(() => reject(new Error(`could not make the box's user namespace (exit ${code})${err.trim() ? `: ${err.trim().split('\n')[0]}` : ''}`)), 20);
      });
    });
    // One synchronous stretch: Node collects an exited child only on a later turn of its loop, so
    // this pid is still the holder's (alive, or a zombie whose namespace links are gone).
    const pid = holder.pid!;
    if (holder.exitCode !== null || holder.signalCode !== null) throw new Error('the user namespace helper exited');
    if (readlinkSync(`/proc/${pid}/ns/user`) === readlinkSync('/proc/self/ns/user')) throw new Error('the user namespace helper is in the server\'s user namespace');
    writeProcFile(`/proc/${pid}/setgroups`, 'deny');
    writeProcFile(`/proc/${pid}/uid_map`, `${BOX_UID} ${hostId} 1\n`);
    writeProcFile(`/proc/${pid}/gid_map`, `${BOX_UID} ${hostId} 1\n`);
    const fd = openSync(`/proc/${pid}/ns/user`, 'r');
    if (readFileOrEmpty(`/proc/${pid}/uid_map`).trim().split(/\s+/).join(' ') !== `${BOX_UID} ${hostId} 1`) {
      closeSync(fd);
      throw new Error("the box's user namespace did not take its uid map");
    }
    return fd;
  } finally {
    holder.kill('SIGKILL');
    await exited;
  }
}

/** One write(2), as /proc's id maps require. */
function writeProcFile(p: string, content: string): void {
  const fd = openSync(p, 'w');
  try {
    writeSync(fd, content);
  } finally {
    closeSync(fd);
  }
}

/** Where workspaces are staged: a root-owned directory no one else may write to or list. */
function stageRoot(): string {
  for (const parent of ['/run', os.tmpdir()]) {
    const root = path.join(parent, 'keygate-stage');
    try {
      mkdirSync(root, { mode: 0o711 });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') continue;
    }
    // Fail closed on anything another user could have made there (a symlink, their directory).
    const st = lstatSync(root);
    if (!st.isDirectory() || st.uid !== 0 || (st.mode & 0o022) !== 0) continue;
    if ((st.mode & 0o777) !== 0o711) chmodSync(root, 0o711);
    return root;
  }
  throw new Error('no root-owned directory to stage the workspace in (/run/keygate-stage)');
}

function stageDir(runDir: string, boxId: string): string {
  return path.join(stageRoot(), `${runDirDigest(runDir).slice(0, 12)}-${boxId}`);
}

/**
 * Binds `workspace` (and a template's root file system, `rootfs`, which may lie where the box's
 * host uid may not look either) where that uid may look them up (see the top of this file);
 * returns those paths.
 */
export async function stageWorkspace(runDir: string, boxId: string, from: { workspace: string; rootfs?: string }, owner: { uid: number; gid: number }): Promise<{ workspace: string; rootfs?: string }> {
  await unstageWorkspace(runDir, boxId);
  const dir = stageDir(runDir, boxId);
  mkdirSync(dir, { mode: 0o700 });
  chownSync(dir, owner.uid, owner.gid);
  const out: { workspace: string; rootfs?: string } = { workspace: path.join(dir, 'workspace') };
  if (from.rootfs !== undefined) out.rootfs = path.join(dir, 'root');
  try {
    for (const [src, point, how] of [[from.workspace, out.workspace, '--bind'], ...(out.rootfs ? [[from.rootfs!, out.rootfs, '--rbind']] : [])]) {
      mkdirSync(point, { mode: 0o700 });
      await run('mount', [how, '--', src, point], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS });
    }
  } catch (e) {
    await unstageWorkspace(runDir, boxId);
    throw new Error(`cannot stage the workspace: ${((e as { stderr?: string }).stderr ?? (e as Error).message).trim().split('\n')[0]}`);
  }
  return out;
}

/** Undoes stageWorkspace (also what a crashed server left). Never removes anything but the empty directories. */
export async function unstageWorkspace(runDir: string, boxId: string): Promise<void> {
  const dir = stageDir(runDir, boxId);
  const points = [path.join(dir, 'workspace'), path.join(dir, 'root')];
  for (const point of points) {
    for (let i = 0; i < 8 && isMountPoint(point); i++) {
      await run('umount', ['-l', '--', point], { env: TOOL_ENV, timeout: TOOL_TIMEOUT_MS }).catch(() => undefined);
    }
  }
  for (const d of [...points, dir]) {
    try {
      rmdirSync(d);
    } catch {
      /* absent (or, never removed, not empty) */
    }
  }
}
