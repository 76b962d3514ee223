/**
 * A request body read once from the client, kept while an HTTP/2 origin may still say it did not
 * process the stream (RFC 9113 8.7: REFUSED_STREAM, or a GOAWAY below the stream), so that the
 * request can be sent again on another stream (upstream.ts Exchange). Such a request may be sent
 * again whatever its method: the origin guarantees it did nothing with it. An origin recycling its
 * connections (nginx closes one after `keepalive_requests`, 1,000 by default) refuses the streams
 * that raced its GOAWAY, and before, every such request with a body was the client's 502.
 *
 * Bounded: only the first REPLAY_MAX bytes are kept. A body read past them is no longer
 * replayable (the origin's refusal is then the client's 502, as before), and what was kept is
 * dropped at once. The origin's answer head (it processed the stream) drops it too.
 */

/** What a refused stream's body may have been read of and still be sent again. */
export const REPLAY_MAX = 64 * 1024;

export class ReplayBody implements AsyncIterable<Buffer> {
  private kept: Buffer[] = [];
  private keptBytes = 0;
  /** The next kept chunk the current attempt reads. */
  private at = 0;
  /** Read past REPLAY_MAX, or no longer needed: cannot be sent again. */
  private spent = false;

  constructor(private readonly source: AsyncIterator<Buffer>) {}

  static of(body: AsyncIterable<Buffer>): ReplayBody {
    return body instanceof ReplayBody ? body : new ReplayBody(body[Symbol.asyncIterator]());
  }

  /**
   * The next chunk for the current attempt (the kept ones first, then the client's), or null at
   * the body's end. One reader at a time: an attempt hands over only once its read settled.
   */
  async next(): Promise<Buffer | null> {
    if (this.at < this.kept.length) {
      const kept = this.kept[this.at++];
      if (this.spent && this.at === this.kept.length) this.release();
      return kept;
    }
    const r = await this.source.next();
    if (r.done) return null;
    const chunk = r.value;
    if (!this.spent) {
      this.keptBytes += chunk.length;
      if (this.keptBytes > REPLAY_MAX) this.release();
      else {
        this.kept.push(chunk);
        this.at++;
      }
    }
    return chunk;
  }

  /** Whether what was read so far can all be sent again. */
  get replayable(): boolean {
    return !this.spent;
  }

  /** The next attempt starts from the first byte; false when that is no longer possible. */
  rewind(): boolean {
    if (this.spent) return false;
    this.at = 0;
    return true;
  }

  /**
   * Nothing will be sent again (the origin answered, or the body outgrew the bound): the kept
   * bytes go, but for those the current attempt has not sent yet (an answer can come while a
   * retry is still sending what was kept).
   */
  release(): void {
    this.spent = true;
    this.kept = this.kept.slice(this.at);
    this.at = 0;
  }

  /** For a dispatcher that takes an iterable (the HTTP/1.1 pool, for an origin that chose http/1.1). */
  async *[Symbol.asyncIterator](): AsyncIterator<Buffer> {
    for (;;) {
      const chunk = await this.next();
      if (chunk === null) return;
      yield chunk;
    }
  }
}
