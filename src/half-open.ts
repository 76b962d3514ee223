import type { Duplex } from 'node:stream';

/**
 * Pipes `a` and `b` into each other, as every relay of raw bytes must (a box's way to its proxy,
 * a spliced WebSocket): each side's end (FIN) is passed on alone, so that a program which sends
 * its request and then shuts its sending side still gets the answer that follows; an error, or a
 * close with no end before it, ends both at once (a cut stays visible as a cut). Both sockets
 * must allow half-open connections (`allowHalfOpen`), or Node ends a socket's sending side
 * itself when its reading side ends. `gone` runs once, when both sockets are closed.
 */
export function joinHalfOpen(a: Duplex, b: Duplex, gone: () => void): void {
  let closed = 0;
  const cut = () => {
    a.destroy();
    b.destroy();
  };
  const wire = (src: Duplex, dst: Duplex) => {
    let ended = false;
    src.once('end', () => (ended = true));
    src.on('error', cut);
    src.once('close', () => {
      // After a clean end, pipe() ends dst once its queue is written; destroying it here would
      // drop that queue.
      if (!ended) dst.destroy();
      if (++closed === 2) gone();
    });
    src.pipe(dst);
  };
  wire(a, b);
  wire(b, a);
}
