/** Bytes of the start of a line kept to tell a request line (`METHOD SP`) from a field line. */
const LINE_START = 24;
const REQUEST_LINE_START = /^[A-Z][A-Z-]* /;

/**
 * What Node's parser does not say when a head overflows its `maxHeaderSize`: whether the request
 * line alone was too long (414) or the header section (431). Its error carries only the chunk
 * being parsed, so reading the answer from that chunk made it depend on how the bytes arrived
 * (a 128 KiB field after a request line sent on its own got a 414; a long URL arriving in small
 * pieces got a 431). This follows the lines of a connection as they arrive, so the answer
 * depends only on the bytes. Used by every HTTP server of the project: the proxy's two
 * (src/proxy/boundary.ts) and the JSON surfaces (src/server/http-errors.ts).
 *
 * Fed every chunk after the parser (it is a later 'data' listener); `requestLineBytes` is asked
 * from the parser's error, before this chunk was fed. A line is a request line when it starts
 * with an upper-case method and a space, which no field line can (strict parsing refuses a space
 * before the colon).
 */
export class HeadLines {
  /** Bytes of the current line so far (up to its LF). */
  private lineBytes = 0;
  /** The first LINE_START bytes of the current line. */
  private lineStart = '';
  /** The current line so far ends with CR. */
  private endsWithCr = false;
  /** Length (without CRLF) of the last complete request line. */
  private requestLine = 0;
  /** A request line was completed and the blank line ending its head not yet seen. */
  private inHead = false;
  /** Bytes (line ends included) of the complete lines of the head in progress. */
  private headBytes = 0;

  feed(chunk: Buffer, end = chunk.length): void {
    let pos = 0;
    for (let lf = chunk.indexOf(0x0a, pos); lf >= 0 && lf < end; lf = chunk.indexOf(0x0a, pos)) {
      this.take(chunk, pos, lf);
      const length = this.lineBytes - (this.endsWithCr ? 1 : 0);
      if (REQUEST_LINE_START.test(this.lineStart)) {
        this.requestLine = length;
        this.inHead = true;
        this.headBytes = this.lineBytes + 1;
      } else if (this.inHead) {
        this.headBytes += this.lineBytes + 1;
        if (length === 0) this.inHead = false;
      }
      this.lineBytes = 0;
      this.lineStart = '';
      this.endsWithCr = false;
      pos = lf + 1;
    }
    if (pos < end) this.take(chunk, pos, end);
  }

  private take(chunk: Buffer, from: number, to: number): void {
    if (to <= from) return;
    if (this.lineStart.length < LINE_START) this.lineStart += chunk.toString('latin1', from, Math.min(to, from + LINE_START - this.lineStart.length));
    this.lineBytes += to - from;
    this.endsWithCr = chunk[to - 1] === 0x0d;
  }

  /**
   * The length of the overflowing head's request line (so far, if the overflow is inside it),
   * `packet` being the chunk the parser was reading and `parsed` how far it got.
   */
  requestLineBytes(packet?: Buffer, parsed?: number): number {
    const probe = this.at(packet, parsed);
    return REQUEST_LINE_START.test(probe.lineStart) ? probe.lineBytes : probe.requestLine;
  }

  /**
   * Bytes of the head in progress up to where the parser stopped (request line, fields, line
   * ends: never fewer than the parser itself counts toward its limit), or 0 outside a head.
   */
  headBytesSoFar(packet?: Buffer, parsed?: number): number {
    const probe = this.at(packet, parsed);
    if (REQUEST_LINE_START.test(probe.lineStart)) return probe.lineBytes;
    return probe.inHead ? probe.headBytes + probe.lineBytes : 0;
  }

  /**
   * Whether a parse error is really the head's overflow. Node's parser counts a head toward its
   * limit only as each chunk ends (or a field does): a head whose bad byte lies past the limit
   * was a 400 in one write and an overflow in pieces. Counted on the bytes themselves, it is an
   * overflow (414 or 431) whenever the head was over the limit where the parser stopped.
   */
  overflowed(code: string | undefined, limit: number, packet?: Buffer, parsed?: number): boolean {
    if (code === 'HPE_HEADER_OVERFLOW') return true;
    return typeof code === 'string' && code.startsWith('HPE_') && !BODY_ERRORS.has(code) && this.headBytesSoFar(packet, parsed) >= limit;
  }

  /** A copy of this, fed `packet` up to `parsed` (the parser's position in it). */
  private at(packet?: Buffer, parsed?: number): HeadLines {
    const probe = new HeadLines();
    Object.assign(probe, this);
    if (packet) probe.feed(packet, Math.max(0, Math.min(packet.length, parsed ?? packet.length)));
    return probe;
  }
}

/** Parser errors found in a body, never in a head (a body line may look like a request line). */
const BODY_ERRORS = new Set(['HPE_INVALID_CHUNK_SIZE', 'HPE_CHUNK_EXTENSIONS_OVERFLOW', 'HPE_INVALID_EOF_STATE', 'HPE_CLOSED_CONNECTION']);

/** What a server keeps per connection: the lines of its heads, from its first byte. */
const followed = new WeakMap<object, HeadLines>();

/**
 * Follows the lines of every connection `server` accepts (a 'connection' listener after Node's
 * own, so each chunk reaches the parser first). Node then delivers the bytes through 'data'
 * events instead of feeding its parser directly: a small cost per chunk, paid for an answer
 * that does not depend on segmentation.
 */
export function followHeadLines(server: { on(event: 'connection', l: (s: NodeJS.EventEmitter) => void): unknown }): void {
  // Plain HTTP servers only: a TLS server's 'connection' socket carries the encrypted bytes.
  server.on('connection', (socket) => {
    const lines = new HeadLines();
    followed.set(socket, lines);
    socket.on('data', (chunk: Buffer) => lines.feed(chunk));
  });
}

/** The lines a followed connection's heads had so far, or undefined. */
export function headLinesOf(socket: object): HeadLines | undefined {
  return followed.get(socket);
}
