// Process identity from Linux's /proc: a pid alone is not an identity (pids are recycled), a pid
// plus its start time (in clock ticks since boot) within one boot is.
import { readdirSync, readFileSync } from './builtins/fs.js';

export interface ProcStat {
  pid: number;
  /** R, S, D, Z (zombie: already dead, waiting to be reaped), T, ... */
  state: string;
  ppid: number;
  pgrp: number;
  session: number;
  /** Field 22, `starttime`, clock ticks after boot, kept as the kernel's digits. */
  startTime: string;
}

/**
 * Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself hold
 * spaces and parentheses, so the fields are counted from the LAST `)`.
 */
export function parseProcStat(text: string): ProcStat | null {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) return null;
  const pid = Number(text.slice(0, open).trim());
  // After ")": field 3 (state) onwards; starttime is field 22, i.e. index 22 - 3 here.
  const rest = text.slice(close + 1).trim().split(/\s+/);
  if (!Number.isInteger(pid) || rest.length < 20) return null;
  const [state, ppid, pgrp, session] = rest;
  const startTime = rest[22 - 3];
  if (!/^\d+$/.test(startTime)) return null;
  return { pid, state, ppid: Number(ppid), pgrp: Number(pgrp), session: Number(session), startTime };
}

export function readProcStat(pid: number | 'self'): ProcStat | null {
  try {
    return parseProcStat(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return null;
  }
}

/** Every process visible in /proc, by pid (a snapshot: processes come and go while it is taken). */
export function listProcesses(): Map<number, ProcStat> {
  const out = new Map<number, ProcStat>();
  let names: string[];
  try {
    names = readdirSync('/proc');
  } catch {
    return out;
  }
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    const st = readProcStat(Number(name));
    if (st) out.set(st.pid, st);
  }
  return out;
}

/** This boot's id: start times only compare within one boot. */
export function bootId(): string | null {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim() || null;
  } catch {
    return null;
  }
}

/**
 * Whether the process's environment holds exactly `NAME=value`. Only processes of our own user
 * are readable; anything else (and a process that is gone) answers false.
 */
export function environHas(pid: number, entry: string): boolean {
  let raw: Buffer;
  try {
    raw = readFileSync(`/proc/${pid}/environ`);
  } catch {
    return false;
  }
  return raw.toString('utf8').split('\0').includes(entry);
}

/** The process is this very one (pid and start time), still running (not a zombie). */
export function isSameProcess(pid: number, startTime: string, procs?: Map<number, ProcStat>): boolean {
  const st = procs ? procs.get(pid) : readProcStat(pid);
  return Boolean(st && st.startTime === startTime && st.state !== 'Z');
}

/** Whether a process of this pid exists (EPERM: it does, and is another user's). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
