import { StringDecoder } from 'node:string_decoder';
import type { Db } from '../store/db.js';
import type { LogEntry, LogLevel, LogType } from './types.js';

export const MAX_LOG_LINE = 16 * 1024;
const FLUSH_MS = 100;
const FLUSH_BATCH = 200;

let lastMicros = 0;
/**
 * Log timestamps are ISO-8601 with microseconds and strictly increasing within this process, so
 * `next_since = last + 1µs` continues a listing without skipping or repeating a line.
 */
export function monotonicIso(): string {
  lastMicros = Math.max(Date.now() * 1000, lastMicros + 1);
  return microsToIso(lastMicros);
}

export function microsToIso(micros: number): string {
  const ms = Math.floor(micros / 1000);
  const base = new Date(ms).toISOString(); // ...T..:..:..mmmZ
  return `${base.slice(0, -1)}${String(micros % 1000).padStart(3, '0')}Z`;
}

/** Parses an ISO time (any precision) to microseconds; NaN when invalid. */
export function isoToMicros(iso: string): number {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)$/.exec(iso);
  if (!m) return NaN;
  const frac = (m[2] ?? '').padEnd(6, '0').slice(0, 6);
  const ms = Date.parse(`${m[1]}.${frac.slice(0, 3)}${m[3]}`);
  if (Number.isNaN(ms)) return NaN;
  return ms * 1000 + Number(frac.slice(3));
}

/**
 * `since`: an ISO time, or a duration back from now (`30s`, `10m`, `2h`, `1d`, or bare seconds).
 * Returns the normalised ISO lower bound, or null when the value means nothing.
 */
export function parseSince(since: string, nowMs = Date.now()): string | null {
  const d = /^(\d{1,9})([smhd]?)$/.exec(since.trim());
  if (d) {
    const mult = { '': 1, s: 1, m: 60, h: 3600, d: 86400 }[d[2] as '' | 's' | 'm' | 'h' | 'd'];
    return microsToIso((nowMs - Number(d[1]) * mult * 1000) * 1000);
  }
  const micros = isoToMicros(since.trim());
  return Number.isNaN(micros) ? null : microsToIso(micros);
}

// The redactor lives with the secrets (the runtime uses it too); re-exported for the control plane's users.
export { makeRedactor, secretForms } from '../secrets/redact.js';

/**
 * Turns a byte stream into lines (UTF-8 safe across chunk boundaries). An over-long line is
 * redacted whole before it is cut, so a cut can never split a secret out of the redactor's reach.
 */
export class LineSplitter {
  private buf = '';
  private readonly decoder = new StringDecoder('utf8');
  private dropping = false;
  constructor(
    private readonly emit: (line: string) => void,
    private readonly redact: (s: string) => string = (s) => s,
  ) {}

  write(chunk: Buffer | string): void {
    this.buf += typeof chunk === 'string' ? chunk : this.decoder.write(chunk);
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).replace(/\r$/, '');
      this.buf = this.buf.slice(nl + 1);
      if (this.dropping) {
        this.dropping = false;
        continue;
      }
      this.out(line);
    }
    if (this.buf.length > MAX_LOG_LINE * 4) {
      if (!this.dropping) this.out(this.redact(this.buf).slice(0, MAX_LOG_LINE) + ' [line truncated]', true);
      this.dropping = true;
      this.buf = '';
    }
  }

  end(): void {
    this.buf += this.decoder.end();
    if (this.buf && !this.dropping) this.out(this.buf);
    this.buf = '';
  }

  private out(line: string, redacted = false): void {
    const r = redacted ? line : this.redact(line);
    this.emit(r.length > MAX_LOG_LINE ? r.slice(0, MAX_LOG_LINE) + ' [line truncated]' : r);
  }
}

interface Pending extends LogEntry {
  deploymentId: string;
}

export interface LogQuery {
  type?: LogType;
  revisionId?: string;
  /** Inclusive lower bound (normalised ISO). Without it the newest `limit` lines are returned. */
  since?: string;
  limit: number;
}

export type LogListener = (entry: LogEntry) => void;

/**
 * Build and deploy logs per deployment, in the database (table cp_logs). Lines are batched and
 * written by one serial writer in timestamp order, so a reader always sees a prefix of the log;
 * listeners (the SSE stream) get lines only once they are committed.
 */
export class LogStore {
  private queue: Pending[] = [];
  private timer: NodeJS.Timeout | null = null;
  private writing: Promise<void> = Promise.resolve();
  private readonly listeners = new Map<string, Set<LogListener>>();
  private readonly deleted = new Set<string>();

  constructor(private readonly db: Db) {}

  append(deploymentId: string, revisionId: string | null, type: LogType, level: LogLevel, message: string): void {
    if (this.deleted.has(deploymentId)) return;
    this.queue.push({ deploymentId, revision_id: revisionId, type, level, message: message.slice(0, MAX_LOG_LINE), timestamp: monotonicIso() });
    if (this.queue.length >= FLUSH_BATCH) void this.flush();
    else if (!this.timer) this.timer = setTimeout(() => void this.flush(), FLUSH_MS);
  }

  /** Writes everything queued so far; resolves once it is committed. */
  flush(): Promise<void> {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    const batch = this.queue.filter((e) => !this.deleted.has(e.deploymentId));
    this.queue = [];
    this.writing = this.writing.then(async () => {
      if (batch.length === 0) return;
      try {
        await this.db.tx(async (tx) => {
          for (let i = 0; i < batch.length; i += 50) {
            const part = batch.slice(i, i + 50);
            await tx.run(
              `INSERT INTO cp_logs (deployment_id, revision_id, type, level, message, ts) VALUES ${part.map(() => '(?, ?, ?, ?, ?, ?)').join(', ')}`,
              part.flatMap((e) => [e.deploymentId, e.revision_id, e.type, e.level, e.message, e.timestamp]),
            );
          }
        });
      } catch {
        // The database is gone (shutdown) or the write failed: losing log lines must not take the
        // runtime down with it.
        return;
      }
      for (const e of batch) {
        const set = this.listeners.get(e.deploymentId);
        if (!set) continue;
        const { deploymentId: _d, ...entry } = e;
        for (const l of set) l(entry);
      }
    });
    return this.writing;
  }

  subscribe(deploymentId: string, l: LogListener): () => void {
    let set = this.listeners.get(deploymentId);
    if (!set) this.listeners.set(deploymentId, (set = new Set()));
    set.add(l);
    return () => {
      set!.delete(l);
      if (set!.size === 0) this.listeners.delete(deploymentId);
    };
  }

  /** Stops accepting lines for a deployment being deleted (its rows are removed by the store). */
  forget(deploymentId: string): void {
    this.deleted.add(deploymentId);
    this.listeners.delete(deploymentId);
  }

  async query(deploymentId: string, q: LogQuery): Promise<LogEntry[]> {
    const where = ['deployment_id = ?'];
    const params: unknown[] = [deploymentId];
    if (q.type) {
      where.push('type = ?');
      params.push(q.type);
    }
    if (q.revisionId) {
      where.push('revision_id = ?');
      params.push(q.revisionId);
    }
    if (q.since) {
      where.push('ts >= ?');
      params.push(q.since);
    }
    const newestFirst = !q.since;
    const rows = await this.db.all<{ ts: string; type: LogType; revision_id: string | null; level: LogLevel; message: string }>(
      `SELECT ts, type, revision_id, level, message FROM cp_logs WHERE ${where.join(' AND ')} ORDER BY ts ${newestFirst ? 'DESC' : 'ASC'} LIMIT ?`,
      [...params, q.limit],
    );
    if (newestFirst) rows.reverse();
    return rows.map((r) => ({ timestamp: r.ts, type: r.type, revision_id: r.revision_id, level: r.level, message: r.message }));
  }

  async close(): Promise<void> {
    await this.flush();
  }
}
