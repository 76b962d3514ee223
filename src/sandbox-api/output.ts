import type { Readable } from 'node:stream';

/** Most bytes of one output stream (stdout or stderr) an execution returns (sandbox.md, property 5). */
export const OUTPUT_CAP_BYTES = 10 * 1024 * 1024;

/**
 * Keeps the first `cap` bytes of a stream and counts the rest without holding it: the process is
 * never blocked by a full pipe, and memory stays bounded whatever it prints.
 */
export class CappedOutput {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  total = 0;

  constructor(private readonly cap: number = OUTPUT_CAP_BYTES) {}

  /** Adds a chunk; returns the part of it within the cap (empty once the cap is reached). */
  add(chunk: Buffer): Buffer {
    this.total += chunk.length;
    const room = this.cap - this.kept;
    if (room <= 0) return chunk.subarray(0, 0);
    const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.kept += part.length;
    this.chunks.push(part);
    return part;
  }

  get truncated(): boolean {
    return this.total > this.cap;
  }

  /** The kept bytes as UTF-8 (a multi-byte character cut by the cap becomes U+FFFD). */
  text(): string {
    return Buffer.concat(this.chunks, this.kept).toString('utf8');
  }

  /** Consumes `stream` to its end. */
  static collect(stream: Readable, cap?: number): { output: CappedOutput; ended: Promise<void> } {
    const output = new CappedOutput(cap);
    const ended = new Promise<void>((resolve) => {
      stream.on('data', (c: Buffer) => output.add(c));
      stream.once('end', resolve);
      stream.once('close', resolve);
      stream.once('error', () => resolve());
    });
    return { output, ended };
  }
}
