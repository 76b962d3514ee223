/**
 * Resource limits for local boxes: a cgroup per box (and one per execution inside it) where this
 * process may create them, rlimits (`prlimit`) otherwise. The cgroups are also how a box is found
 * and killed again: every process of a box, however it forked or daemonised, stays in its cgroup.
 *
 * Cgroups are created under this process's own cgroup (per hierarchy), never at the root, so that
 * whatever accounts for this server keeps accounting for its boxes.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { BoxResources } from './driver.js';

const CGROUP_ROOT = '/sys/fs/cgroup';
/** v1 hierarchies a box needs; `pids` is the one that lists processes. */
const V1_CONTROLLERS = ['pids', 'memory', 'cpu'] as const;
const CPU_PERIOD_US = 100_000;

/** One cgroup, as a directory in each hierarchy it spans (v1: one per controller; v2: one). */
export interface Cgroup {
  /** Every directory of this cgroup; the first one's cgroup.procs lists its processes. */
  dirs: string[];
}

export interface CgroupLayout {
  version: 1 | 2;
  /** Per hierarchy: the parent directory boxes are created in (`.../keygate-<tag>`). */
  bases: { controller: string; dir: string }[];
}

/**
 * Finds where this process may create box cgroups, or says why it cannot (then rlimits apply).
 * `tag` keeps servers with different data directories apart on one machine.
 */
export function cgroupLayout(tag: string): { ok: true; layout: CgroupLayout } | { ok: false; why: string } {
  let self: string;
  try {
    self = readFileSync('/proc/self/cgroup', 'utf8');
  } catch {
    return { ok: false, why: 'no /proc/self/cgroup' };
  }
  const lines = self.trim().split('\n').map((l) => l.split(':'));
  if (existsSync(path.join(CGROUP_ROOT, 'cgroup.controllers'))) {
    const own = lines.find((l) => l[0] === '0')?.[2] ?? '/';
    const dir = path.join(CGROUP_ROOT, own, `keygate-${tag}`);
    try {
      mkdirSync(dir, { recursive: true });
      // v2 allows no processes in a cgroup that hands controllers down, so the own cgroup must be
      // the (namespace) root or already delegate them; if not, writing subtree_control fails here.
      writeFileSync(path.join(CGROUP_ROOT, own, 'cgroup.subtree_control'), '+memory +pids +cpu');
      writeFileSync(path.join(dir, 'cgroup.subtree_control'), '+memory +pids +cpu');
    } catch (e) {
      // Not left behind: the hierarchy outlives this server (and any mount namespace it is seen in).
      try {
        rmdirSync(dir);
      } catch {
        /* not made, or not empty */
      }
      return { ok: false, why: `cgroup v2 not delegated here (${(e as NodeJS.ErrnoException).code ?? 'error'})` };
    }
    return { ok: true, layout: { version: 2, bases: [{ controller: 'unified', dir }] } };
  }
  const bases: CgroupLayout['bases'] = [];
  for (const controller of V1_CONTROLLERS) {
    const line = lines.find((l) => l[1]?.split(',').includes(controller));
    const mount = path.join(CGROUP_ROOT, controller);
    if (!line || !existsSync(path.join(mount, 'cgroup.procs'))) return { ok: false, why: `no cgroup v1 ${controller} hierarchy` };
    const dir = path.join(mount, line[2], `keygate-${tag}`);
    try {
      mkdirSync(dir, { recursive: true });
    } catch (e) {
      return { ok: false, why: `cannot create cgroups (${(e as NodeJS.ErrnoException).code ?? 'error'})` };
    }
    bases.push({ controller, dir });
  }
  return { ok: true, layout: { version: 1, bases } };
}

/** The box's cgroup (created with its limits) or one of its executions' (`sub`, no own limits). */
export function createCgroup(layout: CgroupLayout, id: string, res?: BoxResources, sub?: string): Cgroup {
  const dirs = layout.bases.map((b) => path.join(b.dir, id, ...(sub ? [sub] : [])));
  for (const d of dirs) mkdirSync(d, { recursive: true });
  if (res) {
    const mem = String(Math.max(16, Math.floor(res.memory_mb)) * 1024 * 1024);
    const pids = String(Math.max(8, Math.floor(res.pids)));
    const quota = Math.max(1000, Math.round(res.cpus * CPU_PERIOD_US));
    for (const [i, b] of layout.bases.entries()) {
      const d = dirs[i];
      if (layout.version === 2) {
        writeFileSync(path.join(d, 'memory.max'), mem);
        writeFileSync(path.join(d, 'memory.swap.max'), '0');
        writeFileSync(path.join(d, 'pids.max'), pids);
        writeFileSync(path.join(d, 'cpu.max'), `${quota} ${CPU_PERIOD_US}`);
      } else if (b.controller === 'memory') {
        writeFileSync(path.join(d, 'memory.limit_in_bytes'), mem);
        // With swap accounting, swap must be limited too or the box pages out instead of being killed.
        if (existsSync(path.join(d, 'memory.memsw.limit_in_bytes'))) writeFileSync(path.join(d, 'memory.memsw.limit_in_bytes'), mem);
      } else if (b.controller === 'pids') {
        writeFileSync(path.join(d, 'pids.max'), pids);
      } else if (b.controller === 'cpu') {
        writeFileSync(path.join(d, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
        writeFileSync(path.join(d, 'cpu.cfs_quota_us'), String(quota));
      }
    }
  }
  return { dirs };
}

/** The box cgroup (and its executions') as they exist now, e.g. after a restart of the server. */
export function existingCgroup(layout: CgroupLayout, id: string): Cgroup | null {
  const dirs = layout.bases.map((b) => path.join(b.dir, id));
  return dirs.every((d) => existsSync(d)) ? { dirs } : null;
}

/** Ids of every box cgroup under this layout (for reaping). */
export function listBoxCgroups(layout: CgroupLayout): string[] {
  try {
    return readdirSync(layout.bases[0].dir).filter((n) => statSync(path.join(layout.bases[0].dir, n)).isDirectory());
  } catch {
    return [];
  }
}

/** The `cgroup.procs` files a process must write its pid to, to join this cgroup in every hierarchy. */
export function procsFiles(cg: Cgroup): string[] {
  return cg.dirs.map((d) => path.join(d, 'cgroup.procs'));
}

function pidsIn(dir: string): number[] {
  const out: number[] = [];
  const walk = (d: string) => {
    try {
      for (const p of readFileSync(path.join(d, 'cgroup.procs'), 'utf8').split('\n')) if (p) out.push(Number(p));
      for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(path.join(d, e.name));
    } catch {
      /* gone meanwhile */
    }
  };
  walk(dir);
  return out;
}

export function cgroupHasProcesses(cg: Cgroup): boolean {
  return pidsIn(cg.dirs[0]).length > 0;
}

/**
 * SIGKILLs every process in the cgroup and its children until none is left. A process forked
 * between a read and the kills is the child of one just killed and shows up on the next read, so
 * this converges; the pids limit bounds each round.
 */
export async function killCgroup(cg: Cgroup, deadlineMs = 10_000): Promise<boolean> {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const pids = pidsIn(cg.dirs[0]);
    if (pids.length === 0) return true;
    for (const p of pids) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }
    if (Date.now() > until) return false;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Removes the (empty) cgroup directories, children first. Leaves a directory that still has processes. */
export function removeCgroup(cg: Cgroup): void {
  const rm = (d: string) => {
    try {
      for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) rm(path.join(d, e.name));
      rmdirSync(d);
    } catch {
      /* gone, or busy: the next stop or reap removes it */
    }
  };
  for (const d of cg.dirs) rm(d);
}

/** Removes this server's parent cgroup directories once no box is left in them. */
export function removeLayoutIfEmpty(layout: CgroupLayout): void {
  for (const b of layout.bases) {
    try {
      rmdirSync(b.dir);
    } catch {
      /* boxes still there, or gone already */
    }
  }
}

/** `prlimit` arguments when no cgroup can be made: address space, processes, and CPU seconds per process. */
export function rlimitArgs(res: BoxResources): string[] {
  const as = Math.max(16, Math.floor(res.memory_mb)) * 1024 * 1024;
  // No CPU share without cgroups: each process gets ten minutes of CPU per CPU granted.
  const cpu = Math.max(1, Math.ceil(res.cpus * 600));
  return [`--as=${as}`, `--nproc=${Math.max(8, Math.floor(res.pids))}`, `--cpu=${cpu}`];
}
