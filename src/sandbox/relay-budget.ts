/**
 * How many connections the relays (relay.ts, docker-relay.ts) carry at once, per box and for the
 * whole server. Every relayed connection holds about four descriptors of this process (the box's
 * side, the way to the proxy, and the proxy's own two when it runs in-process), and the proxy's
 * own cap is per client, while every box is one client to it: without a bound here, a handful of
 * boxes opening connections as fast as they can exhausted the server's descriptors (about seven
 * at the proxy's 1024 each, under a 20,000 limit), and with them its API, its database and every
 * other box. A connection past either bound is answered `503` by the relay, saying which bound,
 * and closed: the box's client sees why, and nothing reaches the proxy.
 */
import { readFileSync } from 'node:fs';
import type net from 'node:net';
import { intSetting } from '../settings.js';

/** Most connections one box's relay carries at once. */
export const RELAY_CONNECTIONS_PER_BOX = 256;
/** Descriptors each relayed connection may hold in this process. */
const FDS_PER_CONNECTION = 4;
/** Descriptors kept for everything else (the API, the database, logs, box start-up). */
const FD_RESERVE = 2048;

export interface RelayLimits {
  perBox: number;
  total: number;
}

/** This process's soft limit of open descriptors, or null when unknown. */
function openFileLimit(): number | null {
  try {
    const m = /^Max open files\s+(\d+|unlimited)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    if (!m) return null;
    return m[1] === 'unlimited' ? null : Number(m[1]);
  } catch {
    return null;
  }
}

/**
 * The default bounds: per box, RELAY_CONNECTIONS_PER_BOX; for the server, what its descriptor
 * limit leaves once FD_RESERVE is kept aside (at least 64). `KEYGATE_SANDBOX_RELAY_CONNECTIONS`
 * sets the server's total.
 */
export function defaultRelayLimits(env: NodeJS.ProcessEnv = process.env): RelayLimits {
  if (env.KEYGATE_SANDBOX_RELAY_CONNECTIONS?.trim()) {
    const n = intSetting(env, 'KEYGATE_SANDBOX_RELAY_CONNECTIONS', 0, { min: 1 });
    return { perBox: Math.min(RELAY_CONNECTIONS_PER_BOX, n), total: n };
  }
  const nofile = openFileLimit() ?? 65536;
  return { perBox: RELAY_CONNECTIONS_PER_BOX, total: Math.max(64, Math.floor((nofile - FD_RESERVE) / FDS_PER_CONNECTION)) };
}

/**
 * One box's relay's share of the budget: its own count against the per-box bound, and the
 * refusals it answers.
 */
export interface RelayGate {
  /**
   * Takes a place for `socket`, and gives back the function that returns it (once, however often
   * it is called: a relayed connection ends through several events). Past either bound, answers
   * `socket` with a 503 that says which, and gives back null.
   */
  admit(socket: net.Socket): (() => void) | null;
}

/** The server's count of relayed connections, shared by every box of a driver. */
export class RelayBudget {
  private used = 0;
  constructor(readonly limits: RelayLimits) {}

  /** A gate for one box's relay. */
  gate(): RelayGate {
    const refusals = new Refusals();
    let mine = 0;
    return {
      admit: (socket) => {
        const why = this.refusal(mine);
        if (why) {
          refusals.refuse(socket, why);
          return null;
        }
        mine++;
        this.used++;
        let given = false;
        return () => {
          if (given) return;
          given = true;
          mine--;
          this.used--;
        };
      },
    };
  }

  /** The sentence that says which bound refuses one more connection of a box holding `mine`, if one does. */
  private refusal(mine: number): string | undefined {
    if (mine >= this.limits.perBox) return `this sandbox has reached its limit of ${this.limits.perBox} connections through its proxy at once; close some first`;
    if (this.used >= this.limits.total) return `keygate has reached its limit of ${this.limits.total} sandbox proxy connections at once (KEYGATE_SANDBOX_RELAY_CONNECTIONS); retry later`;
    return undefined;
  }

  get inUse(): number {
    return this.used;
  }
}

/** Refused connections being answered at once, per relay: past it, one is closed without a word. */
const MAX_ANSWERING = 16;

/**
 * Answers refused connections with a 503 that says why, then closes them. A box opening
 * connections faster than they are answered holds at most MAX_ANSWERING of this process's
 * descriptors that way; the rest are closed at once.
 */
class Refusals {
  private answering = 0;

  refuse(socket: net.Socket, why: string): void {
    socket.on('error', () => undefined);
    if (this.answering >= MAX_ANSWERING) {
      socket.destroy();
      return;
    }
    this.answering++;
    socket.once('close', () => this.answering--);
    const body = `keygate: ${why}\n`;
    socket.end(`HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    // A client that never reads must not keep the descriptor.
    setTimeout(() => socket.destroy(), 1000).unref();
  }
}
