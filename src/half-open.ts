import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';

/**
 * How long a joined pair may stay half-open with nothing moving in the direction still open:
 * Linux's own bound for a half-closed connection nobody holds (tcp_fin_timeout, 60 s).
 */
export const HALF_OPEN_IDLE_MS = 60_000;

/**
 * Closes `other` after its peer side failed with `err`: a reset goes on as a reset (RST),
 * anything else as a close. A relay of raw bytes sees only bytes, so how a connection ended is
 * all it can pass on of it: destroy() alone would send a FIN, the sign of a clean end, for a
 * connection that was reset (TLS inside cannot tell the two apart for the other side: Node,
 * browsers and curl all take a FIN without close_notify for the end).
 */
export function passOnFailure(other: Duplex, err: NodeJS.ErrnoException): void {
  if (err.code === 'ECONNRESET' && !other.destroyed && typeof (other as Socket).resetAndDestroy === 'function') {
    try {
      (other as Socket).resetAndDestroy();
      return;
    } catch {
      // Not a TCP socket (Node throws ERR_INVALID_HANDLE_TYPE): there is no RST to send, only a close.
    }
  }
  other.destroy();
}

/**
 * Pipes `a` and `b` into each other, as every relay of raw bytes must (a box's way to its proxy,
 * a spliced WebSocket): each side's end (FIN) is passed on alone, so that a program which sends
 * its request and then shuts its sending side still gets the answer that follows; an error, or a
 * close with no end before it, ends both at once, and a reset goes on as a reset
 * (passOnFailure): a cut stays visible as a cut. Both sockets
 * must allow half-open connections (`allowHalfOpen`), or Node ends a socket's sending side
 * itself when its reading side ends. `gone` runs once, when both sockets are closed.
 *
 * Once one side has ended, the pair is cut after `halfOpenIdleMs` with no byte either way. A FIN
 * looks the same whether its sender still reads or has closed for good (a proxy that ended an
 * idle connection), so without a bound a peer that never sends its own FIN (an idle pooled
 * connection in the box) would hold the pair, and its place in the relay's budget, for ever.
 */
export function joinHalfOpen(a: Duplex, b: Duplex, gone: () => void, halfOpenIdleMs = HALF_OPEN_IDLE_MS): void {
  let closed = 0;
  let clock: NodeJS.Timeout | undefined;
  const cut = () => {
    a.destroy();
    b.destroy();
  };
  const failed = (src: Duplex, dst: Duplex) => (err: NodeJS.ErrnoException) => {
    passOnFailure(dst, err);
    src.destroy();
  };
  const halfOpen = () => {
    if (clock) return;
    clock = setTimeout(cut, halfOpenIdleMs);
    clock.unref();
    const moved = () => clock?.refresh();
    a.on('data', moved);
    b.on('data', moved);
  };
  const wire = (src: Duplex, dst: Duplex) => {
    let ended = false;
    src.once('end', () => {
      ended = true;
      halfOpen();
    });
    src.on('error', failed(src, dst));
    src.once('close', () => {
      // After a clean end, pipe() ends dst once its queue is written; destroying it here would
      // drop that queue.
      if (!ended) dst.destroy();
      if (++closed === 2) {
        clearTimeout(clock);
        gone();
      }
    });
    src.pipe(dst);
  };
  wire(a, b);
  wire(b, a);
}
