/**
 * The process tree under one process, from a snapshot of /proc (pure: the caller reads /proc).
 * The local driver kills an execution's tree with it where no cgroup holds the execution
 * (tree-kill.ts): the execution runs under a subreaper tini, so whatever it forks, however it
 * detaches (setsid, double fork), stays below the execution's first process by parent pid.
 */

/** What the walk needs of one process (read from /proc/PID/stat by src/proc.ts). */
export interface ProcNode {
  pid: number;
  ppid: number;
  /** R, S, D, T, t, Z, X, ... (`man 5 proc`). */
  state: string;
  /** Start time (clock ticks after boot): tells a process from a later one that reuses its pid. */
  start: number;
}

export interface TreeMember extends ProcNode {
  /** 0 for the root, 1 for its children, ... */
  depth: number;
}

/** Whether a process no longer runs: exited (a zombie until collected) or gone. */
export function isDead(p: ProcNode | null | undefined): boolean {
  return !p || p.state === 'Z' || p.state === 'X' || p.state === 'x';
}

/**
 * The root (when it still is the process that started at `root.start`) and every process below it
 * by parent pid, parents before children. A process is taken as the child of a tree member only if
 * it started no earlier than that member: a child never starts before its parent, so a pid reused
 * by a newer process (between two reads of the snapshot) cannot adopt older processes into the tree.
 */
export function processTree(procs: Iterable<ProcNode>, root: { pid: number; start: number }): TreeMember[] {
  const children = new Map<number, ProcNode[]>();
  let top: ProcNode | undefined;
  for (const p of procs) {
    if (p.pid === root.pid) top = p;
    const siblings = children.get(p.ppid);
    if (siblings) siblings.push(p);
    else children.set(p.ppid, [p]);
  }
  if (!top || top.start !== root.start) return [];
  const tree: TreeMember[] = [{ ...top, depth: 0 }];
  const seen = new Set([top.pid]);
  for (let i = 0; i < tree.length; i++) {
    const parent = tree[i];
    for (const c of children.get(parent.pid) ?? []) {
      if (seen.has(c.pid) || c.start < parent.start) continue;
      seen.add(c.pid);
      tree.push({ ...c, depth: parent.depth + 1 });
    }
  }
  return tree;
}
