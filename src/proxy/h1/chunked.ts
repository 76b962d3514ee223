/**
 * Finds where a chunked body ends while its bytes stream through unchanged (the fast path
 * relays an upstream's chunked response as it is, so server-sent events keep their timing).
 * Strict (RFC 9112 7.1): hex sizes of at most 12 digits, no whitespace before an extension,
 * extensions and trailer lines of visible bytes within fixed bounds, CRLF everywhere. Any
 * deviation is an error: the response is cut, never guessed at. Pure.
 */

const CRLF = Buffer.from('\r\n', 'latin1');

/** The last chunk with no trailer section: the end of a chunked body. */
export const LAST_CHUNK = Buffer.from('0\r\n\r\n', 'latin1');

/**
 * `data` as one chunk of a chunked body (size line, data, CRLF), for answers the proxy frames
 * itself. Never call it with no data: an empty chunk is the last chunk.
 */
export function chunkOf(data: Uint8Array): Buffer {
  return Buffer.concat([Buffer.from(data.length.toString(16) + '\r\n', 'latin1'), data, CRLF]);
}

const enum S {
  Size,
  SizeOrEnd,
  Ext,
  SizeLf,
  Data,
  DataCr,
  DataLf,
  TrailerStart,
  Trailer,
  TrailerLf,
  FinalLf,
  Done,
}

const MAX_SIZE_DIGITS = 12;
const MAX_EXT_BYTES = 4096;
const MAX_TRAILER_BYTES = 32 * 1024;

function hex(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  if (b >= 0x61 && b <= 0x66) return b - 0x57;
  if (b >= 0x41 && b <= 0x46) return b - 0x37;
  return -1;
}

function lineByte(b: number): boolean {
  return (b >= 0x20 && b <= 0x7e) || b === 0x09 || b >= 0x80;
}

export class ChunkedScanner {
  private state = S.Size;
  private size = 0;
  private digits = 0;
  private left = 0;
  private lineBytes = 0;
  private trailerBytes = 0;
  /** Payload bytes seen (framing excluded). */
  dataBytes = 0;
  /**
   * Where the trailer section (trailer lines and the final CRLF) starts in the buffer of the last
   * scan; -1 when it did not start there (not yet, or in an earlier buffer: see `trailing`).
   */
  trailerAt = -1;
  /** The last chunk has been read: what follows is the trailer section. */
  trailing = false;
  /** Set when the framing is broken; the sentence never quotes the body. */
  error: string | undefined;

  get done(): boolean {
    return this.state === S.Done;
  }

  /**
   * Scans `buf[start..]`. Returns the index just past the body's last byte when the body ends
   * in this buffer, -1 when it needs more, -2 on an error (see `error`).
   */
  scan(buf: Buffer, start = 0): number {
    if (this.error) return -2; // broken framing stays broken
    this.trailerAt = -1;
    let i = start;
    const n = buf.length;
    while (i < n) {
      const b = buf[i];
      switch (this.state) {
        case S.Size:
        case S.SizeOrEnd: {
          const h = hex(b);
          if (h >= 0) {
            if (++this.digits > MAX_SIZE_DIGITS) return this.fail('chunk size too large');
            this.size = this.size * 16 + h;
            this.state = S.SizeOrEnd;
          } else if (this.state === S.SizeOrEnd && b === 0x3b /* ; */) {
            this.state = S.Ext;
            this.lineBytes = 0;
          } else if (this.state === S.SizeOrEnd && b === 0x0d) {
            this.state = S.SizeLf;
          } else {
            return this.fail('malformed chunk size');
          }
          i++;
          break;
        }
        case S.Ext:
          if (b === 0x0d) this.state = S.SizeLf;
          else if (!lineByte(b) || ++this.lineBytes > MAX_EXT_BYTES) return this.fail('malformed chunk extension');
          i++;
          break;
        case S.SizeLf:
          if (b !== 0x0a) return this.fail('malformed chunk size line');
          i++;
          if (this.size === 0) {
            this.state = S.TrailerStart;
            this.trailing = true;
            this.trailerAt = i;
          } else {
            this.left = this.size;
            this.state = S.Data;
          }
          this.size = 0;
          this.digits = 0;
          break;
        case S.Data: {
          const take = Math.min(this.left, n - i);
          this.left -= take;
          this.dataBytes += take;
          i += take;
          if (this.left === 0) this.state = S.DataCr;
          break;
        }
        case S.DataCr:
          if (b !== 0x0d) return this.fail('chunk data longer than its size');
          this.state = S.DataLf;
          i++;
          break;
        case S.DataLf:
          if (b !== 0x0a) return this.fail('chunk data longer than its size');
          this.state = S.Size;
          i++;
          break;
        case S.TrailerStart:
          if (b === 0x0d) {
            this.state = S.FinalLf;
          } else {
            this.state = S.Trailer;
            continue; // the same byte starts a trailer line
          }
          i++;
          break;
        case S.Trailer:
          if (b === 0x0d) this.state = S.TrailerLf;
          else if (!lineByte(b)) return this.fail('malformed trailer');
          if (++this.trailerBytes > MAX_TRAILER_BYTES) return this.fail('trailers too large');
          i++;
          break;
        case S.TrailerLf:
          if (b !== 0x0a) return this.fail('malformed trailer');
          this.state = S.TrailerStart;
          i++;
          break;
        case S.FinalLf:
          if (b !== 0x0a) return this.fail('malformed end of chunked body');
          this.state = S.Done;
          return i + 1;
        case S.Done:
          return i;
      }
    }
    return this.state === S.Done ? i : -1;
  }

  private fail(why: string): number {
    this.error = why;
    return -2;
  }
}
