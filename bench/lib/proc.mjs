// /proc readings for a process and its descendants (squid forks certificate helpers; the cost of
// a sidecar is all of its processes, so CPU and memory are summed over the tree).
import { readdirSync, readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';

let clkTck = 100;
try {
  clkTck = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
} catch {
  /* 100 is the Linux default */
}

function statOf(pid) {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return { ppid: Number(f[1]), utime: Number(f[11]), stime: Number(f[12]) };
  } catch {
    return null;
  }
}

/** `pid` and every live descendant. */
export function processTree(pid) {
  const children = new Map();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = statOf(name);
    if (!st) continue;
    const list = children.get(st.ppid) ?? [];
    list.push(Number(name));
    children.set(st.ppid, list);
  }
  const out = [];
  const queue = [pid];
  while (queue.length) {
    const p = queue.shift();
    out.push(p);
    for (const c of children.get(p) ?? []) queue.push(c);
  }
  return out;
}

/** CPU seconds (user + system) used so far by the tree. */
export function cpuSeconds(pid) {
  let ticks = 0;
  for (const p of processTree(pid)) {
    const st = statOf(p);
    if (st) ticks += st.utime + st.stime;
  }
  return ticks / clkTck;
}

function statusKb(pid, field) {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** Resident memory of the tree now, MiB. */
export function rssMiB(pid) {
  return processTree(pid).reduce((a, p) => a + statusKb(p, 'VmRSS'), 0) / 1024;
}

/** Peak resident memory (VmHWM) summed over the tree, MiB: an upper bound of the tree's peak. */
export function peakRssMiB(pid) {
  return processTree(pid).reduce((a, p) => a + statusKb(p, 'VmHWM'), 0) / 1024;
}

export function alive(pid) {
  return statOf(pid) !== null;
}
