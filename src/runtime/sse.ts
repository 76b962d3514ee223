import type { ServerResponse } from 'node:http';

/**
 * One server-sent event: `event: NAME\ndata: JSON\n\n`. JSON.stringify escapes every line break, so
 * the data is always a single `data:` line. Throws (TypeError) on data that cannot be serialised.
 */
export function formatEvent(event: string, data: unknown, id?: number): string {
  if (/[\r\n]/.test(event)) throw new TypeError('event name must not contain line breaks');
  const json = JSON.stringify(data === undefined ? null : data);
  return `${id !== undefined ? `id: ${id}\n` : ''}event: ${event}\ndata: ${json}\n\n`;
}

export const HEARTBEAT_FRAME = ': heartbeat\n\n';

export interface SseOptions {
  /** A `: heartbeat` comment goes out after this long without any other write. */
  heartbeatMs: number;
  /**
   * Bytes allowed to queue for a client that does not read; beyond that the client is treated as
   * gone (memory stays bounded whatever the assistant produces).
   */
  maxQueuedBytes?: number;
}

/**
 * Writes an event stream to a response, unbuffered: every frame is handed to the socket as it is
 * produced (Node sends each `write` as its own chunk; Nagle is off), nothing is compressed, and
 * the headers tell intermediaries not to buffer (`X-Accel-Buffering: no`) or cache.
 */
export class SseStream {
  private timer: NodeJS.Timeout | undefined;
  private gone = false;
  private ended = false;
  private readonly maxQueued: number;

  constructor(
    private readonly res: ServerResponse,
    private readonly opts: SseOptions,
  ) {
    this.maxQueued = opts.maxQueuedBytes ?? 64 * 1024 * 1024;
    res.on('close', () => {
      if (!this.ended) this.gone = true;
      this.stopHeartbeat();
    });
  }

  /** Sends the status line and headers at once, so the client sees 200 before the first event. */
  open(extraHeaders: Record<string, string>): void {
    this.res.socket?.setNoDelay(true);
    this.res.writeHead(200, {
      // SSE is UTF-8 by definition, so no charset parameter. No Connection header: Node says
      // keep-alive where the connection stays open, and close where it will not (the request said
      // close, HTTP/1.0); setting keep-alive here kept a connection the client asked to close.
      'Content-Type': 'text/event-stream',
      'Cache-Control': 'no-cache',
      'X-Accel-Buffering': 'no',
      'X-Content-Type-Options': 'nosniff',
      ...extraHeaders,
    });
    this.res.flushHeaders();
    this.timer = setTimeout(() => this.beat(), this.opts.heartbeatMs);
    this.timer.unref();
  }

  /** True while the client is connected and the stream has not been ended. */
  get writable(): boolean {
    return !this.gone && !this.ended && !this.res.destroyed;
  }

  /** True once the client went away before `end()`. */
  get disconnected(): boolean {
    return this.gone;
  }

  send(event: string, data: unknown): void {
    this.write(formatEvent(event, data));
  }

  /** Sends an already formatted frame (callers that serialise first to report errors). */
  write(frame: string): void {
    if (!this.writable) return;
    this.res.write(frame);
    this.timer?.refresh();
    if (this.res.writableLength > this.maxQueued) this.res.destroy();
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.stopHeartbeat();
    if (!this.gone && !this.res.destroyed) this.res.end();
  }

  private beat(): void {
    if (!this.writable) return;
    this.res.write(HEARTBEAT_FRAME);
    this.timer?.refresh();
  }

  private stopHeartbeat(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
