import { Pool } from 'undici';
import { describeExit } from './drivers/local.js';
import { DeployError, failureReason, type Replica, type RuntimeDriver, type StartSpec } from './drivers/types.js';

export interface ReplicaSetOptions {
  driver: RuntimeDriver;
  count: number;
  /** Everything `driver.start` needs except the replica number. */
  spec: Omit<StartSpec, 'replica'>;
  /** Supervisor events (deploy log). */
  event(level: 'info' | 'warn' | 'error', line: string): void;
  /** Restart backoff: first delay and cap, ms. */
  backoffMs?: number;
  maxBackoffMs?: number;
}

/** One replica slot: the process in it may be replaced (restart) while the slot stays. */
export class Slot {
  replica: Replica | null = null;
  healthy = false;
  inflight = 0;
  pool: Pool | null = null;
  restarts = 0;
  startedAt = 0;
  timer: NodeJS.Timeout | null = null;
  constructor(readonly n: number) {}
}

/**
 * The replicas of one revision, kept at `count`: a replica that exits on its own is taken out of
 * rotation at once and restarted with exponential backoff (reset after a minute of good health).
 */
export class ReplicaSet {
  readonly slots: Slot[];
  private stopping = false;
  private rr = 0;
  private readonly drainWaiters = new Set<() => void>();

  constructor(readonly o: ReplicaSetOptions) {
    this.slots = Array.from({ length: o.count }, (_, i) => new Slot(i + 1));
  }

  get revisionId(): string {
    return this.o.spec.revisionId;
  }

  /** Starts every replica; if one cannot start, all are stopped and the error is thrown. */
  async start(): Promise<void> {
    const results = await Promise.allSettled(this.slots.map((s) => this.startSlot(s)));
    const failed = results.find((r) => r.status === 'rejected') as PromiseRejectedResult | undefined;
    if (failed) {
      await this.stop(2000);
      throw failed.reason instanceof DeployError ? failed.reason : new DeployError(String((failed.reason as Error)?.message ?? failed.reason));
    }
  }

  private async startSlot(slot: Slot): Promise<void> {
    const replica = await this.o.driver.start({ ...this.o.spec, replica: slot.n });
    if (this.stopping) {
      await this.o.driver.stop(replica, 2000);
      return;
    }
    slot.replica = replica;
    slot.pool = new Pool(`http://${replica.host}:${replica.port}`, { connections: 64, pipelining: 1, keepAliveTimeout: 10_000 });
    slot.healthy = true;
    slot.startedAt = Date.now();
    this.o.event('info', `replica ${slot.n} is up (pid ${replica.pid ?? 'n/a'}, port ${replica.port})`);
    void replica.exited.then((e) => this.onExit(slot, replica, describeExit(e)));
  }

  private onExit(slot: Slot, replica: Replica, how: string): void {
    if (slot.replica !== replica) return;
    slot.healthy = false;
    void slot.pool?.destroy().catch(() => undefined);
    slot.pool = null;
    slot.replica = null;
    if (this.stopping) return;
    if (Date.now() - slot.startedAt > 60_000) slot.restarts = 0;
    const delay = Math.min((this.o.backoffMs ?? 500) * 2 ** slot.restarts, this.o.maxBackoffMs ?? 30_000);
    slot.restarts++;
    this.o.event('error', `replica ${slot.n} exited unexpectedly (${how}); restarting in ${(delay / 1000).toFixed(1)} s`);
    this.scheduleRestart(slot, delay);
  }

  private scheduleRestart(slot: Slot, delay: number): void {
    slot.timer = setTimeout(() => {
      slot.timer = null;
      if (this.stopping) return;
      this.startSlot(slot).catch((err: Error) => {
        if (this.stopping) return;
        const next = Math.min((this.o.backoffMs ?? 500) * 2 ** slot.restarts, this.o.maxBackoffMs ?? 30_000);
        slot.restarts++;
        this.o.event('error', `replica ${slot.n} failed to restart (${failureReason(err)}); retrying in ${(next / 1000).toFixed(1)} s`);
        this.scheduleRestart(slot, next);
      });
    }, delay);
  }

  /** The next healthy replica, round robin; `exclude` skips slots that just refused a connection. */
  pick(exclude: Set<Slot> = new Set()): Slot | null {
    for (let i = 0; i < this.slots.length; i++) {
      const s = this.slots[(this.rr + i) % this.slots.length];
      if (s.healthy && s.pool && !exclude.has(s)) {
        this.rr = (this.rr + i + 1) % this.slots.length;
        return s;
      }
    }
    return null;
  }

  enter(slot: Slot): void {
    slot.inflight++;
  }

  leave(slot: Slot): void {
    slot.inflight--;
    if (this.inflight() === 0) for (const w of this.drainWaiters) w();
  }

  inflight(): number {
    return this.slots.reduce((n, s) => n + s.inflight, 0);
  }

  /** Resolves once no request is in flight, or after `timeoutMs`. */
  async drain(timeoutMs: number): Promise<boolean> {
    if (this.inflight() === 0) return true;
    return new Promise((resolve) => {
      const done = (ok: boolean) => {
        clearTimeout(t);
        this.drainWaiters.delete(w);
        resolve(ok);
      };
      const w = () => done(true);
      const t = setTimeout(() => done(false), timeoutMs);
      this.drainWaiters.add(w);
    });
  }

  pids(): number[] {
    return this.slots.map((s) => s.replica?.pid).filter((p): p is number => typeof p === 'number');
  }

  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    await Promise.all(
      this.slots.map(async (s) => {
        if (s.timer) clearTimeout(s.timer);
        s.healthy = false;
        const r = s.replica;
        const pool = s.pool;
        s.replica = null;
        s.pool = null;
        if (r) await this.o.driver.stop(r, graceMs);
        await pool?.destroy().catch(() => undefined);
      }),
    );
  }
}
