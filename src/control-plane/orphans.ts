// Replica processes (and build commands) outlive a `keygate serve` that is killed outright
// (SIGKILL, the OOM killer): they run in their own process groups so that a Ctrl-C aimed at the
// server does not hit them. Each one is recorded in a file under the data directory while it runs,
// so the next serve can find those left behind and stop them before it starts their replacements.
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { writeFileAtomic } from '../secrets/envelope.js';
import { bootId, environHas, isSameProcess, listProcesses, readProcStat, type ProcStat } from '../proc.js';

/** Set in every replica's environment; inherited by whatever the replica starts. */
export const REPLICA_TOKEN_ENV = 'KEYGATE_REPLICA_TOKEN';

export interface ProcessIdentity {
  pid: number;
  /** /proc/<pid>/stat field 22. */
  start_time: string;
}

export interface ReplicaRecord extends ProcessIdentity {
  v: 1;
  /** Random, also in the replica's environment as {@link REPLICA_TOKEN_ENV}. */
  token: string;
  boot_id: string;
  /** The serve process that started it: while that one runs, its replicas are not orphans. */
  owner: ProcessIdentity;
  deployment_id: string;
  revision_id: string;
  /** 1-based replica number; 0 for a build command. */
  replica: number;
  kind?: 'replica' | 'build';
  recorded_at: string;
}

export interface ReapResult {
  /** Processes stopped, with how (SIGTERM was enough, or SIGKILL was needed). */
  stopped: { pid: number; how: 'SIGTERM' | 'SIGKILL' }[];
  /** Records dropped (their replicas stopped now, or already gone). */
  records: number;
}

const TOKEN = /^[A-Za-z0-9_-]{16,64}$/;

function isRecord(v: unknown): v is ReplicaRecord {
  const r = v as ReplicaRecord;
  return (
    Boolean(r) &&
    r.v === 1 &&
    typeof r.token === 'string' &&
    TOKEN.test(r.token) &&
    Number.isInteger(r.pid) &&
    r.pid > 1 &&
    typeof r.start_time === 'string' &&
    /^\d+$/.test(r.start_time) &&
    typeof r.boot_id === 'string' &&
    Boolean(r.owner) &&
    Number.isInteger(r.owner.pid) &&
    typeof r.owner.start_time === 'string'
  );
}

/**
 * The records of running local replicas, one file each (`<dir>/<token>.json`, 0600), host-local by
 * nature: a pid means nothing on another machine, so they are not in the (possibly shared) database.
 */
export class ReplicaRecords {
  /** Tokens of replicas this process started and has not seen exit. */
  private readonly live = new Set<string>();
  private readonly self: ProcessIdentity | null;
  private readonly boot: string | null;

  constructor(
    readonly dir: string,
    private readonly log: (level: 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void = () => undefined,
  ) {
    const me = readProcStat('self');
    this.self = me ? { pid: me.pid, start_time: me.startTime } : null;
    this.boot = bootId();
  }

  /** Whether records can identify processes here (Linux /proc); elsewhere nothing is recorded or reaped. */
  get supported(): boolean {
    return this.self !== null && this.boot !== null;
  }

  static newToken(): string {
    return randomBytes(18).toString('base64url');
  }

  /**
   * Records a freshly spawned replica. Returns false when it cannot be identified (no /proc, or it
   * is already gone); a failed write is logged and the replica runs unrecorded rather than not at all.
   */
  add(token: string, pid: number, meta: { deploymentId: string; revisionId: string; replica: number; kind?: 'replica' | 'build' }): boolean {
    if (!this.self || !this.boot) return false;
    const st = readProcStat(pid);
    if (!st) return false;
    const rec: ReplicaRecord = {
      v: 1,
      token,
      pid,
      start_time: st.startTime,
      boot_id: this.boot,
      owner: this.self,
      deployment_id: meta.deploymentId,
      revision_id: meta.revisionId,
      replica: meta.replica,
      kind: meta.kind ?? 'replica',
      recorded_at: new Date().toISOString(),
    };
    try {
      writeFileAtomic(this.file(token), JSON.stringify(rec) + '\n', 0o600);
      this.live.add(token);
      return true;
    } catch (err) {
      this.log('error', 'could not record a replica process; it would survive a crash of this server', { pid, err: { message: (err as Error).message } });
      return false;
    }
  }

  /** The replica is gone (it exited, or was stopped). */
  remove(token: string): void {
    this.live.delete(token);
    rmSync(this.file(token), { force: true });
  }

  list(): ReplicaRecord[] {
    let names: string[];
    try {
      names = readdirSync(this.dir);
    } catch {
      return [];
    }
    const out: ReplicaRecord[] = [];
    for (const name of names) {
      if (!name.endsWith('.json')) continue;
      const file = path.join(this.dir, name);
      let rec: unknown;
      try {
        rec = JSON.parse(readFileSync(file, 'utf8'));
      } catch {
        rec = undefined;
      }
      if (isRecord(rec) && name === `${rec.token}.json`) out.push(rec);
      else {
        this.log('warn', 'removing an unreadable replica record', { file });
        rmSync(file, { force: true });
      }
    }
    return out;
  }

  private file(token: string): string {
    return path.join(this.dir, `${token}.json`);
  }

  /**
   * Stops every recorded replica left behind by a server that is no longer running, and whatever
   * those replicas started, then drops their records. A process is stopped only when it is provably
   * ours: the recorded pid with the recorded start time in this boot (and, while that leader is
   * alive, the members of its process group: it is a session leader, so only its descendants can
   * join), or any process carrying the replica's token in its environment. SIGTERM first, SIGKILL
   * after `graceMs`; each signal is preceded by the identity check, so a recycled pid is never hit.
   */
  async reap(graceMs: number): Promise<ReapResult> {
    const result: ReapResult = { stopped: [], records: 0 };
    if (!this.supported) return result;
    const records = this.list().filter((r) => !this.live.has(r.token));
    if (records.length === 0) return result;
    const procs = listProcesses();
    const targets = new Map<number, ProcStat>();
    const done: ReplicaRecord[] = [];
    for (const rec of records) {
      if (rec.boot_id !== this.boot) {
        done.push(rec); // a reboot ended them all
        continue;
      }
      const ownerIsMe = this.self && rec.owner.pid === this.self.pid && rec.owner.start_time === this.self.start_time;
      if (!ownerIsMe && isSameProcess(rec.owner.pid, rec.owner.start_time, procs)) continue; // another live server's
      done.push(rec);
      const leaderAlive = isSameProcess(rec.pid, rec.start_time, procs);
      const entry = `${REPLICA_TOKEN_ENV}=${rec.token}`;
      const since = BigInt(rec.start_time);
      for (const p of procs.values()) {
        if (p.state === 'Z' || targets.has(p.pid) || p.pid === this.self?.pid) continue;
        if (leaderAlive && (p.pid === rec.pid || p.pgrp === rec.pid)) targets.set(p.pid, p);
        else if (BigInt(p.startTime) >= since && environHas(p.pid, entry)) targets.set(p.pid, p);
      }
    }
    if (targets.size > 0) {
      this.log('warn', `stopping ${targets.size} replica process(es) left running by a previous server`, { pids: [...targets.keys()] });
      const signal = (p: ProcStat, s: NodeJS.Signals): boolean => {
        if (!isSameProcess(p.pid, p.startTime)) return false;
        try {
          process.kill(p.pid, s);
          return true;
        } catch {
          return false;
        }
      };
      const alive = () => [...targets.values()].filter((p) => isSameProcess(p.pid, p.startTime));
      for (const p of targets.values()) signal(p, 'SIGTERM');
      const deadline = Date.now() + graceMs;
      while (alive().length && Date.now() < deadline) await sleep(50);
      const stubborn = new Set(alive().map((p) => p.pid));
      for (const p of targets.values()) {
        if (stubborn.has(p.pid)) signal(p, 'SIGKILL');
        result.stopped.push({ pid: p.pid, how: stubborn.has(p.pid) ? 'SIGKILL' : 'SIGTERM' });
      }
      const killDeadline = Date.now() + 5000;
      while (alive().length && Date.now() < killDeadline) await sleep(20);
      const left = alive();
      if (left.length) this.log('error', 'replica processes of a previous server did not stop', { pids: left.map((p) => p.pid) });
    }
    for (const rec of done) rmSync(this.file(rec.token), { force: true });
    result.records = done.length;
    return result;
  }
}
