/**
 * The process tree under one process, from a snapshot of /proc (pure: the caller reads /proc).
 * The local driver kills an execution's tree with it where no cgroup holds the execution
 * (tree-kill.ts): the execution runs under a subreaper tini, so whatever it forks, however it
 * detaches (setsid, double fork), stays below the execution's first process by parent pid.
 */
import type { ProcStat } from '../proc.js';

/** What the walk needs of one process: its /proc/PID/stat as src/proc.ts reads it. */
export type ProcNode = Pick<ProcStat, 'pid' | 'ppid' | 'state' | 'startTime'>;

export interface TreeMember extends ProcNode {
  /** 0 for the root, 1 for its children, ... */
  depth: number;
}

/** Whether a process no longer runs: exited (a zombie until collected) or gone. */
export function isDead(p: ProcNode | null | undefined): boolean {
  return !p || p.state === 'Z' || p.state === 'X' || p.state === 'x';
}

/**
 * The root (when it still is the process that started at `root.startTime`) and every process below it
 * by parent pid, parents before children. A process is taken as the child of a tree member only if
 * it started no earlier than that member: a child never starts before its parent, so a pid reused
 * by a newer process (between two reads of the snapshot) cannot adopt older processes into the tree.
 */
export function processTree(procs: Iterable<ProcNode>, root: { pid: number; startTime: string }): TreeMember[] {
  const children = new Map<number, ProcNode[]>();
  let top: ProcNode | undefined;
  for (const p of procs) {
    if (p.pid === root.pid) top = p;
    const siblings = children.get(p.ppid);
    if (siblings) siblings.push(p);
    else children.set(p.ppid, [p]);
  }
  if (!top || top.startTime !== root.startTime) return [];
  const tree: TreeMember[] = [{ ...top, depth: 0 }];
  const seen = new Set([top.pid]);
  for (let i = 0; i < tree.length; i++) {
    const parent = tree[i];
    for (const c of children.get(parent.pid) ?? []) {
      if (seen.has(c.pid) || Number(c.startTime) < Number(parent.startTime)) continue;
      seen.add(c.pid);
      tree.push({ ...c, depth: parent.depth + 1 });
    }
  }
  return tree;
}
