/**
 * The idle collection (src/proxy/idle-gc.ts): one memory-reducing full collection after start-up
 * and after each busy spell, once a whole check interval passed with almost no CPU used; never
 * while the process is busy, and not again while it stays quiet. The timer-driven behaviour is
 * checked with a fake CPU clock and collector; the real collector with the flavour the module
 * asks for runs on this Node. That a real idle `keygate proxy` collects: test/cli/v8-flags.test.ts.
 */
import v8 from 'node:v8';
import { describe, expect, it } from 'vitest';
import { collector } from '../../src/proxy/buffer-gc.js';
import { idleGc, reduceMemory } from '../../src/proxy/idle-gc.js';

function fakeClock() {
  let us = 0;
  return { spend: (n: number) => (us += n), cpu: () => ({ user: us, system: 0 }) };
}

describe('idle collection', () => {
  it('collects once after start-up when quiet, not again while quiet, again after a busy spell', () => {
    const clock = fakeClock();
    let collected = 0;
    const afterStartup: boolean[] = [];
    const g = idleGc({ intervalMs: 60_000, quietUs: 1000, collect: (first) => (collected++, afterStartup.push(first)), cpu: clock.cpu });
    try {
      clock.spend(10); // quiet interval right after start-up: start-up was the busy spell
      expect(g.tick()).toBe(true);
      expect(collected).toBe(1);
      clock.spend(10);
      expect(g.tick()).toBe(false); // still quiet: nothing new to give back
      clock.spend(5000); // busy: never interrupted
      expect(g.tick()).toBe(false);
      clock.spend(5000);
      expect(g.tick()).toBe(false);
      expect(collected).toBe(1);
      clock.spend(999); // quiet again
      expect(g.tick()).toBe(true);
      expect(collected).toBe(2);
      expect(g.tick()).toBe(false);
      // Only the collection after start-up drops the compiled code; the request path's stays.
      expect(afterStartup).toEqual([true, false]);
    } finally {
      g.stop();
    }
  });

  it('once the server listens, the collection after start-up runs as soon as the process stays quiet for a moment', () => {
    const clock = fakeClock();
    const afterStartup: boolean[] = [];
    const g = idleGc({ intervalMs: 60_000, quietUs: 1000, settleMs: 60_000, collect: (first) => afterStartup.push(first), cpu: clock.cpu });
    try {
      clock.spend(500_000); // start-up itself
      g.ready();
      clock.spend(5_000); // compiler threads and the first log write: not traffic (under 10 % of the moment)
      expect(g.settled()).toBe(true);
      expect(afterStartup).toEqual([true]);
      // The regular checks then find nothing new while it stays quiet.
      clock.spend(10);
      expect(g.tick()).toBe(false);
      // ready() again (a second server in the process) does not collect again.
      g.ready();
      expect(g.settled()).toBe(false);
      expect(afterStartup).toEqual([true]);
    } finally {
      g.stop();
    }
  });

  it('traffic right after listening defers the collection after start-up to the regular checks', () => {
    const clock = fakeClock();
    const afterStartup: boolean[] = [];
    const g = idleGc({ intervalMs: 60_000, quietUs: 1000, settleMs: 1_000, collect: (first) => afterStartup.push(first), cpu: clock.cpu });
    try {
      g.ready();
      clock.spend(100_000); // requests: 10 % of the moment
      expect(g.settled()).toBe(false);
      expect(afterStartup).toEqual([]);
      clock.spend(100_000);
      expect(g.tick()).toBe(false); // still busy
      clock.spend(10);
      expect(g.tick()).toBe(true); // quiet: the collection after start-up, bytecode flush included
      expect(afterStartup).toEqual([true]);
    } finally {
      g.stop();
    }
  });

  it('without ready() nothing is collected before the regular checks', () => {
    const clock = fakeClock();
    let collected = 0;
    const g = idleGc({ intervalMs: 60_000, quietUs: 1000, collect: () => collected++, cpu: clock.cpu });
    try {
      expect(g.settled()).toBe(false);
      expect(collected).toBe(0);
    } finally {
      g.stop();
    }
  });

  it("the collection's own CPU time does not count as a busy spell", () => {
    const clock = fakeClock();
    let collected = 0;
    const g = idleGc({ intervalMs: 60_000, quietUs: 1000, collect: () => (collected++, clock.spend(50_000)), cpu: clock.cpu });
    try {
      expect(g.tick()).toBe(true);
      expect(g.tick()).toBe(false);
      expect(g.tick()).toBe(false);
      expect(collected).toBe(1);
    } finally {
      g.stop();
    }
  });

  it('the flushing collection drops the bytecode compiled before it; the flushed functions still run', () => {
    const bytecode = () => v8.getHeapCodeStatistics().bytecode_and_metadata_size;
    reduceMemory();
    const before = bytecode();
    // Start-up-like work: many functions, each run once and kept reachable.
    const fns = Array.from({ length: 2000 }, (_, i) => new Function('a', `let s = ${i}; for (let j = 0; j < 3; j++) s += a * j; return s;`) as (a: number) => number);
    let sum = 0;
    for (const f of fns) sum += f(2);
    const theirs = bytecode() - before; // the 2,000 functions' bytecode
    reduceMemory(true);
    expect(theirs).toBeGreaterThan(200_000);
    expect(bytecode() - before).toBeLessThan(theirs * 0.1);
    // Flushed functions still run: compiled again from their source.
    expect(fns.reduce((s, f) => s + f(2), 0)).toBe(sum);
  });

  it("V8's collector is reachable on this Node", () => {
    expect(typeof collector()).toBe('function');
  });
});
