/** What pumpChunks writes to: anything that says when it is full (a socket, an HTTP/2 stream, a response). */
export interface Pumped {
  write(chunk: Buffer): boolean;
  once(event: 'drain', listener: () => void): unknown;
  end(): unknown;
  readonly destroyed: boolean;
}

/**
 * Writes `chunk` again and again with backpressure (waiting for 'drain' whenever the writable is
 * full, never queueing more): `times` chunks and then the end, or, without `times`, for as long
 * as it is not stopped or destroyed (a peer that never stops sending). Returns the stop.
 */
export function pumpChunks(w: Pumped, chunk: Buffer, times = Infinity): () => void {
  let left = times;
  let stopped = false;
  const pump = () => {
    while (left > 0 && !stopped && !w.destroyed) {
      left--;
      if (!w.write(chunk)) return void w.once('drain', pump);
    }
    if (left === 0 && !stopped && !w.destroyed) w.end();
  };
  pump();
  return () => {
    stopped = true;
  };
}
