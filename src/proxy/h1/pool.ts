import type { TLSSocket } from 'node:tls';

/** How much earlier than an upstream's announced idle timeout a connection stops being reused. */
const KEEP_ALIVE_MARGIN_MS = 1000;

/**
 * How long a connection may stay idle after a response with these headers: the upstream's
 * `Keep-Alive: timeout=N` (seconds) less a margin, so the proxy never sends a request on a
 * connection the upstream is closing at that moment (a request that is not idempotent cannot be
 * retried, and would fail). `max`, the pool's own limit, when there is no hint; 0 means the
 * connection is not to be reused.
 */
export function keepAliveHintMs(rawHeaders: readonly string[], max: number): number {
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (rawHeaders[i].length !== 10 || rawHeaders[i].toLowerCase() !== 'keep-alive') continue;
    const m = /(?:^|[\s,;])timeout\s*=\s*(\d{1,9})/i.exec(rawHeaders[i + 1]);
    if (m) return Math.max(0, Math.min(max, Number(m[1]) * 1000 - KEEP_ALIVE_MARGIN_MS));
  }
  return max;
}

/** Open both ways: a connection that can carry another exchange. */
export function usable(socket: TLSSocket): boolean {
  return !socket.destroyed && socket.writable && socket.readable;
}

/** Opens a verified TLS connection to host:port (Upstream's connector: egress policy, pins, warm connections). */
export type Dial = (host: string, port: number, cb: (err: Error | null, socket: TLSSocket | null) => void) => void;

interface Idle {
  socket: TLSSocket;
  timer: NodeJS.Timeout;
  onGone: () => void;
}

/**
 * Keep-alive upstream connections for the fast path, per origin, most recently used first.
 * An idle connection is watched: any byte, end, error or close from the upstream removes and
 * closes it (an upstream never speaks first, so unexpected bytes mean the connection cannot be
 * trusted for the next exchange), and it is closed after `idleMs`. `clear()` closes every idle
 * connection and makes connections out on loan at that moment close instead of coming back
 * (the egress policy changed: connections opened under the old one must not carry new requests).
 */
export class H1Pool {
  private readonly idle = new Map<string, Idle[]>();
  private generation = 0;
  private readonly born = new WeakMap<TLSSocket, number>();

  constructor(
    private readonly dial: Dial,
    private readonly idleMs: number,
  ) {}

  /**
   * An idle connection (`reused` true) or a new one. A reused connection may still have been
   * closed by the upstream a moment ago: the caller retries a request that got no answer on it.
   */
  acquire(host: string, port: number, cb: (err: Error | null, socket: TLSSocket | null, reused: boolean) => void): void {
    const list = this.idle.get(`${host}:${port}`);
    while (list?.length) {
      const i = list.pop()!;
      this.unwatch(i);
      if (usable(i.socket)) {
        process.nextTick(cb, null, i.socket, true);
        return;
      }
      i.socket.destroy();
    }
    this.dialNew(host, port, (err, socket) => cb(err, socket, false));
  }

  /** A new connection, never an idle one. */
  dialNew(host: string, port: number, cb: (err: Error | null, socket: TLSSocket | null) => void): void {
    const gen = this.generation;
    this.dial(host, port, (err, socket) => {
      if (socket) this.born.set(socket, gen);
      cb(err, socket);
    });
  }

  /** False for a connection opened before the last clear(): it must not carry new requests. */
  isCurrent(socket: TLSSocket): boolean {
    return this.born.get(socket) === this.generation;
  }

  /**
   * Gives a connection back after a complete exchange, to be kept at most `idleMs` (less than
   * the pool's own when the upstream said it closes sooner: see keepAliveHintMs).
   */
  release(host: string, port: number, socket: TLSSocket, idleMs = this.idleMs): void {
    if (!usable(socket) || !this.isCurrent(socket) || idleMs <= 0) {
      socket.destroy();
      return;
    }
    const key = `${host}:${port}`;
    let list = this.idle.get(key);
    if (!list) this.idle.set(key, (list = []));
    const entry: Idle = {
      socket,
      timer: setTimeout(() => gone(), Math.min(idleMs, this.idleMs)),
      onGone: () => gone(),
    };
    const gone = () => {
      this.unwatch(entry);
      const at = list.indexOf(entry);
      if (at >= 0) list.splice(at, 1);
      if (list.length === 0 && this.idle.get(key) === list) this.idle.delete(key);
      socket.destroy();
    };
    entry.timer.unref();
    socket.on('data', entry.onGone);
    socket.on('end', entry.onGone);
    socket.on('error', entry.onGone);
    socket.on('close', entry.onGone);
    list.push(entry);
  }

  private unwatch(i: Idle): void {
    clearTimeout(i.timer);
    i.socket.off('data', i.onGone);
    i.socket.off('end', i.onGone);
    i.socket.off('error', i.onGone);
    i.socket.off('close', i.onGone);
  }

  /** Idle connections now (tests, metrics). */
  get idleCount(): number {
    let n = 0;
    for (const list of this.idle.values()) n += list.length;
    return n;
  }

  clear(): void {
    this.generation++;
    for (const list of this.idle.values()) {
      for (const i of list) {
        this.unwatch(i);
        i.socket.destroy();
      }
    }
    this.idle.clear();
  }
}
