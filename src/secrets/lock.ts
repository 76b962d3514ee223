import { randomBytes } from 'node:crypto';
import { closeSync, linkSync, openSync, readFileSync, renameSync, statSync, unlinkSync, utimesSync, writeSync } from '../builtins/fs.js';
import os from 'node:os';
import { pidAlive } from '../proc.js';
import { removeLeftoverTemps } from './envelope.js';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * An exclusive lock file (O_CREAT|O_EXCL) guarding a read-modify-write of a small file shared by
 * several processes (the CLI and a running `keygate serve` both write the secrets file).
 *
 * The lock holds `host pid nonce`. A lock left behind by a crash is broken when its process is
 * gone (same host) or when it is older than `staleMs` (another host or PID namespace sharing the
 * volume; locks are held for milliseconds). Breaking renames the lock aside first and checks it is
 * still the stale one, so two processes breaking at once cannot delete a fresh lock.
 */
export interface LockOptions {
  /** Give up after this long (default 10 s). */
  timeoutMs?: number;
  /** A lock older than this is considered abandoned (default 30 s). */
  staleMs?: number;
}

export class LockTimeoutError extends Error {
  constructor(lockFile: string, holder: string) {
    super(`could not lock ${lockFile} (held by ${holder || 'another process'}); if no keygate process is running, remove the file`);
    this.name = 'LockTimeoutError';
  }
}

function readLock(lockFile: string): { content: string; mtimeMs: number } | undefined {
  try {
    const mtimeMs = statSync(lockFile).mtimeMs;
    return { content: readFileSync(lockFile, 'utf8'), mtimeMs };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/**
 * How old a lock file without a `host pid nonce` content must be to be broken: keygate writes a
 * lock whole (tryAcquire), so such a file was left by an older keygate killed between creating
 * and writing it, or by something else; nobody is in the middle of writing it.
 */
const UNREADABLE_LOCK_GRACE_MS = 2_000;

function isStale(lock: { content: string; mtimeMs: number }, staleMs: number): boolean {
  const [host, pidText, nonce] = lock.content.split(' ');
  if (!host || !pidText || !nonce) return Date.now() - lock.mtimeMs > Math.min(staleMs, UNREADABLE_LOCK_GRACE_MS);
  const pid = Number(pidText);
  // Same host: the holder's liveness is the answer, however long it has held the lock.
  if (host === os.hostname() && Number.isInteger(pid) && pid > 0) return !pidAlive(pid);
  // Another host: only age can tell; holders refresh the mtime.
  return Date.now() - lock.mtimeMs > staleMs;
}

function breakStale(lockFile: string, staleContent: string): void {
  const aside = `${lockFile}.breaking.${randomBytes(6).toString('hex')}`;
  try {
    renameSync(lockFile, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return; // someone else broke it
    throw err;
  }
  try {
    if (readFileSync(aside, 'utf8') !== staleContent) {
      // We moved a fresh lock taken after our check: put it back unless a new one exists already.
      try {
        linkSync(aside, lockFile);
      } catch {
        /* a new holder exists; the one we moved has finished or will find its file gone */
      }
    }
  } finally {
    unlinkSync(aside);
  }
}

/**
 * Takes the lock by hard-linking a file that already holds our content: the lock file exists
 * whole or not at all. (Creating it with O_EXCL and then writing left an empty lock behind a
 * process killed between the two, which nobody could attribute: every writer waited `staleMs`.)
 */
function tryAcquire(lockFile: string, contentFile: string): boolean {
  try {
    linkSync(contentFile, lockFile);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  }
}

function writeContentFile(lockFile: string, content: string): string {
  const file = `${lockFile}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  const fd = openSync(file, 'wx', 0o600);
  try {
    writeSync(fd, content);
  } finally {
    closeSync(fd);
  }
  return file;
}

export async function withFileLock<T>(lockFile: string, fn: () => Promise<T> | T, opts: LockOptions = {}): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const staleMs = opts.staleMs ?? 30_000;
  const content = `${os.hostname()} ${process.pid} ${randomBytes(8).toString('hex')}`;
  const deadline = Date.now() + timeoutMs;
  let delay = 2;
  const contentFile = writeContentFile(lockFile, content);
  try {
    for (;;) {
      if (tryAcquire(lockFile, contentFile)) break;
      const held = readLock(lockFile);
      if (held && isStale(held, staleMs)) {
        breakStale(lockFile, held.content);
        continue;
      }
      if (Date.now() >= deadline) throw new LockTimeoutError(lockFile, held ? held.content.split(' ').slice(0, 2).join(' pid ') : '');
      await sleep(delay + Math.random() * delay);
      delay = Math.min(delay * 2, 50);
    }
  } finally {
    unlinkSync(contentFile);
  }
  // The content file was written before the wait: the lock is as fresh as its taking.
  const taken = new Date();
  utimesSync(lockFile, taken, taken);
  removeLeftoverTemps(lockFile, false); // content files of lockers killed while waiting
  // A long critical section (a key rotation over a large database) keeps its lock fresh, so
  // a process on another host sharing the volume does not take it for abandoned.
  const heartbeat = setInterval(() => {
    try {
      const now = new Date();
      utimesSync(lockFile, now, now);
    } catch {
      /* gone: the release below notices */
    }
  }, Math.max(100, Math.min(staleMs / 3, 10_000)));
  heartbeat.unref();
  try {
    return await fn();
  } finally {
    clearInterval(heartbeat);
    // Only remove our own lock: if it was (wrongly) broken, the file now belongs to someone else.
    const held = readLock(lockFile);
    if (held?.content === content) unlinkSync(lockFile);
  }
}
