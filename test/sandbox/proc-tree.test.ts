/**
 * The walk the local driver kills execution trees with where there are no cgroups (proc-tree.ts):
 * everything below the root by parent pid, daemons reparented to the subreaper included; nothing
 * through a reused pid. (/proc/PID/stat itself is parsed by src/proc.ts: test/control-plane/orphans.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import { isDead, processTree, type ProcNode } from '../../src/sandbox/proc-tree.js';
import { procSnapshot } from '../../src/sandbox/tree-kill.js';

const p = (pid: number, ppid: number, start: number, state = 'S'): ProcNode => ({ pid, ppid, state, startTime: String(start) });
const pids = (t: { pid: number }[]) => t.map((m) => m.pid);

describe('processTree', () => {
  it('takes every descendant by parent pid, parents first, with depth, and nothing else', () => {
    // 10 nsenter -> 11 tini -> 12 sh -> 13 sleep; 14 (a setsid daemon, reparented to tini) -> 15.
    const procs = [p(1, 0, 1), p(9, 1, 5), p(10, 9, 100), p(15, 14, 104), p(11, 10, 101), p(12, 11, 102), p(13, 12, 103), p(14, 11, 103), p(20, 1, 50), p(21, 20, 200)];
    const tree = processTree(procs, { pid: 10, startTime: '100' });
    expect(tree.map((m) => [m.pid, m.depth])).toEqual([[10, 0], [11, 1], [12, 2], [14, 2], [13, 3], [15, 3]]);
  });

  it('is empty when the root is gone or its pid now belongs to another process', () => {
    expect(processTree([p(11, 10, 101)], { pid: 10, startTime: '100' })).toEqual([]);
    expect(processTree([p(10, 1, 999), p(11, 10, 1000)], { pid: 10, startTime: '100' })).toEqual([]);
  });

  it('never adopts, through a reused pid, a process that started before that pid was taken', () => {
    // 12 died and its pid went to a new child of the tree (start 300); 40 is an older process
    // whose parent was the old 12: it is not the new 12's child.
    const procs = [p(10, 1, 100), p(11, 10, 101), p(12, 11, 300), p(40, 12, 150), p(41, 12, 301)];
    expect(pids(processTree(procs, { pid: 10, startTime: '100' }))).toEqual([10, 11, 12, 41]);
  });

  it('keeps zombies (they are in the tree until collected) and survives a cycle in a torn snapshot', () => {
    const procs = [p(10, 1, 100), p(11, 10, 101, 'Z'), p(12, 13, 101), p(13, 12, 101), p(14, 10, 100)];
    expect(pids(processTree(procs, { pid: 10, startTime: '100' }))).toEqual([10, 11, 14]);
    expect(pids(processTree([p(10, 10, 100)], { pid: 10, startTime: '100' }))).toEqual([10]);
  });

  it('isDead: zombies and missing processes are dead, stopped ones are not', () => {
    expect(isDead(undefined)).toBe(true);
    expect(isDead(p(1, 0, 1, 'Z'))).toBe(true);
    expect(isDead(p(1, 0, 1, 'X'))).toBe(true);
    expect(isDead(p(1, 0, 1, 'T'))).toBe(false);
    expect(isDead(p(1, 0, 1, 'R'))).toBe(false);
  });

  it("finds this process's own children in the host's /proc", () => {
    const me = procSnapshot().find((x) => x.pid === process.pid)!;
    expect(me).toMatchObject({ ppid: process.ppid, state: 'R' });
    expect(pids(processTree(procSnapshot(), me))).toContain(process.pid);
  });
});
