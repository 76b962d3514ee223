/**
 * Signals or kills the process tree under one host process, found in the host's /proc
 * (proc-tree.ts): how the local driver takes an execution down where no cgroup holds it.
 *
 * The tree stays findable because the execution runs under a subreaper (tini -s): a process whose
 * parent dies, even one that called setsid, is reparented to the nearest living subreaper above it,
 * which is in the tree. So the subreaper, and the root above it, are "anchors": stopped like the
 * rest, but killed only once nothing is left below them, so that nothing can be reparented out of
 * sight (to the box's pid 1) while the tree is being killed.
 *
 * Pid reuse: every process is known by pid and start time; a signal goes to a pid only right after
 * its start time was read back unchanged. (Node has no pidfd; the window left is between that read
 * and kill(2), and a stopped process cannot exit by itself in it.)
 */
import { listProcesses, readProcStat } from '../proc.js';
import { isDead, processTree, type ProcNode, type TreeMember } from './proc-tree.js';

/** Every process of the host as /proc shows it now (a process may exit meanwhile: then it is not there). */
export function procSnapshot(): ProcNode[] {
  return [...listProcesses().values()];
}

/** Whether `p` (pid and start time) is still alive: there, the same process, and not a zombie. */
function alive(p: { pid: number; startTime: string }): boolean {
  const now = readProcStat(p.pid);
  return now !== null && now.startTime === p.startTime && !isDead(now);
}

/** Sends `signal` to `p` if it still is the same, living process; true if sent. */
function signalSame(p: { pid: number; startTime: string }, signal: NodeJS.Signals): boolean {
  if (!alive(p)) return false;
  try {
    process.kill(p.pid, signal);
    return true;
  } catch {
    return false;
  }
}

export interface TreeKillOptions {
  /** Members at this depth or less (0 = the root) are the anchors: see the module comment. */
  anchorDepth: number;
  /** Give up after this long (default 10 s); the result says whether the tree is gone. */
  deadlineMs?: number;
}

/** How long the root is given to collect its killed child once continued (see killProcessTree). */
const ROOT_COLLECT_MS = 1000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A signal other than SIGKILL goes to every process of the tree below the anchors (the command
 * and whatever it started), which may handle it; nothing waits. SIGKILL takes the whole tree down,
 * anchors last, and resolves once every process of it is dead (true), or false at the deadline.
 */
export async function killProcessTree(root: { pid: number; startTime: string }, signal: NodeJS.Signals, opts: TreeKillOptions): Promise<boolean> {
  if (signal !== 'SIGKILL') {
    for (const m of processTree(procSnapshot(), root)) if (m.depth > opts.anchorDepth) signalSame(m, signal);
    return true;
  }
  const until = Date.now() + (opts.deadlineMs ?? 10_000);
  const members = new Map<string, TreeMember>();
  const key = (m: ProcNode) => `${m.pid}:${m.startTime}`;
  // 1. Freeze: stop every process of the tree, parents before children, until a scan finds none
  // new (a child forked before its parent stopped shows up in the next scan). Stopped processes
  // cannot fork; a stopped subreaper still adopts orphans, but can neither exit nor collect them.
  for (;;) {
    let added = 0;
    for (const m of processTree(procSnapshot(), root)) {
      if (members.has(key(m))) continue;
      members.set(key(m), m);
      added++;
      signalSame(m, 'SIGSTOP');
    }
    if (added === 0 || Date.now() > until) break;
  }
  // 2. Kill everything below the anchors until nothing is left there. Whatever slipped through
  // (a process woken by another's SIGCONT that forked) is under the stopped subreaper, in the tree.
  let converged = false;
  for (;;) {
    for (const m of processTree(procSnapshot(), root)) if (!members.has(key(m))) members.set(key(m), m);
    // Sent again to any still alive: it may not have died yet (or was not known last round).
    let left = 0;
    for (const m of members.values()) if (m.depth > opts.anchorDepth && signalSame(m, 'SIGKILL')) left++;
    if (left === 0) {
      converged = true;
      break;
    }
    if (Date.now() > until) break;
    await sleep(5);
  }
  // 3. The anchors below the root, deepest first. The root is the caller's child, outside the box:
  // killed at once, its killed child would be left to the host's init to collect (which may be
  // slow, or never do it). Continued instead, it collects that child and exits by itself (nsenter
  // does), and is killed only then, or at once if it has no child (it could go on to start one).
  const anchors = [...members.values()].filter((m) => m.depth > 0 && m.depth <= opts.anchorDepth).sort((a, b) => b.depth - a.depth);
  for (const m of anchors) signalSame(m, 'SIGKILL');
  const top = [...members.values()].find((m) => m.depth === 0);
  if (top && anchors.length > 0) {
    const collected = Math.min(until, Date.now() + ROOT_COLLECT_MS);
    // Again and again: nsenter stops itself when it sees its child stopped (as a shell's job), and
    // may see that only after the first SIGCONT.
    while (anchors.some((m) => readProcStat(m.pid)?.startTime === m.startTime) && Date.now() < collected) {
      signalSame(top, 'SIGCONT');
      await sleep(2);
    }
  }
  if (top) signalSame(top, 'SIGKILL');
  // Then wait until all are dead (zombies count: they hold nothing and run nothing).
  while ([...members.values()].some(alive)) {
    if (Date.now() > until) return false;
    await sleep(5);
  }
  return converged;
}
