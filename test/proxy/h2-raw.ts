/**
 * Hand-built HTTP/2 frames for what Node's http2 client refuses to send: a header block of
 * HPACK literals (never indexed, no Huffman), so any name and value bytes go on the wire as
 * given, and a reader that reports what came back on stream 1.
 */
import tls from 'node:tls';

export const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

export function frame(type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream & 0x7fffffff, 5);
  return Buffer.concat([h, payload]);
}

/** An HPACK integer with an N-bit prefix (RFC 7541 5.1), the prefix's high bits given in `first`. */
function int(n: number, bits: number, first = 0): Buffer {
  const max = (1 << bits) - 1;
  if (n < max) return Buffer.from([first | n]);
  const out = [first | max];
  n -= max;
  while (n >= 128) {
    out.push((n % 128) + 128);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

/** A header block of "literal, never indexed, new name" fields, bytes exactly as given (latin1). */
export function literalBlock(fields: [string, string][]): Buffer {
  const parts: Buffer[] = [];
  for (const [name, value] of fields) {
    const n = Buffer.from(name, 'latin1');
    const v = Buffer.from(value, 'latin1');
    parts.push(Buffer.from([0x10]), int(n.length, 7), n, int(v.length, 7), v);
  }
  return Buffer.concat(parts);
}

export const END_STREAM = 0x1;
export const END_HEADERS = 0x4;

/** The frames received for a while: type, flags, stream and payload of each. */
export interface Frame {
  type: number;
  flags: number;
  stream: number;
  payload: Buffer;
}

/** Frames received, and whether the peer ended the connection (rather than `until` or the clock). */
export type Conversation = Frame[] & { closedByPeer?: boolean };

/** Sends the preface, an empty SETTINGS and `frames`, then collects frames until `until` holds, the socket closes or `ms` pass. */
export function converseH2(socket: tls.TLSSocket, frames: Buffer[], until: (f: Frame[]) => boolean, ms = 3000): Promise<Conversation> {
  return new Promise((resolve) => {
    let buf = Buffer.alloc(0);
    const got: Conversation = [];
    let done = false;
    const finish = (byPeer = false) => {
      if (done) return;
      done = true;
      got.closedByPeer = byPeer;
      clearTimeout(timer);
      socket.destroy();
      resolve(got);
    };
    const timer = setTimeout(finish, ms);
    socket.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) break;
        const f = { type: buf[3], flags: buf[4], stream: buf.readUInt32BE(5) & 0x7fffffff, payload: buf.subarray(9, 9 + len) };
        buf = buf.subarray(9 + len);
        got.push(f);
        // SETTINGS from the server is acknowledged, as a client must.
        if (f.type === 4 && !(f.flags & 1)) socket.write(frame(4, 1, 0));
      }
      if (until(got)) finish();
    });
    socket.on('close', () => finish(true));
    socket.on('error', () => undefined);
    socket.write(Buffer.concat([PREFACE, frame(4, 0, 0), ...frames]));
  });
}

/** The status of a response header block that starts with `:status` (static-table index or a literal), or 0. */
export function statusOf(block: Buffer | undefined): number {
  if (!block) return 0;
  const indexed: Record<number, number> = { 0x88: 200, 0x89: 204, 0x8a: 206, 0x8b: 304, 0x8c: 400, 0x8d: 404, 0x8e: 500 };
  if (indexed[block[0]]) return indexed[block[0]];
  // Literal with an indexed name (:status is index 8), any of the three literal kinds.
  if ((block[0] & 0x3f) === 8 || (block[0] & 0x0f) === 8) return Number(block.subarray(2, 2 + block[1]).toString('latin1'));
  return 0;
}

/** What stream 1 got: 'reset' (RST_STREAM or GOAWAY), or the first byte of its response header block. */
export function outcome(frames: Frame[]): { reset: boolean; headers?: Buffer } {
  const reset = frames.some((f) => (f.type === 3 && f.stream === 1) || f.type === 7);
  const h = frames.find((f) => f.type === 1 && f.stream === 1);
  return { reset, headers: h?.payload };
}

/**
 * An HTTP/2 origin written frame by frame, for what node:http2 servers will not send: TLS with
 * ALPN h2, its SETTINGS, the client's preface read and its SETTINGS acknowledged; every HEADERS
 * frame goes to `onHeaders` with its stream id, header block and the number of its connection
 * (from 0), which answers by writing frames on the socket.
 */
export async function rawH2Server(
  cert: { keyPem: string; certPem: string },
  onHeaders: (s: tls.TLSSocket, stream: number, block: Buffer, conn: number, endStream: boolean) => void,
  /** DATA frames; with it, the server gives back the flow-control window each one used. */
  onData?: (s: tls.TLSSocket, stream: number, payload: Buffer, endStream: boolean, conn: number) => void,
): Promise<tls.Server> {
  let conns = 0;
  const server = tls.createServer({ key: cert.keyPem, cert: cert.certPem, ALPNProtocols: ['h2'] }, (s) => {
    const conn = conns++;
    s.on('error', () => undefined);
    s.write(frame(0x4, 0, 0)); // our SETTINGS (all defaults)
    let buf = Buffer.alloc(0);
    let preface = false;
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (!preface) {
        if (buf.length < PREFACE.length) return;
        buf = buf.subarray(PREFACE.length);
        preface = true;
      }
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) return;
        const [type, flags, stream] = [buf[3], buf[4], buf.readUInt32BE(5) & 0x7fffffff];
        const payload = buf.subarray(9, 9 + len);
        buf = buf.subarray(9 + len);
        if (type === 0x4 && !(flags & 0x1)) s.write(frame(0x4, 0x1, 0)); // SETTINGS ACK
        if (type === 0x1) onHeaders(s, stream, payload, conn, (flags & 0x1) !== 0);
        if (type === 0x0 && onData) {
          const data = flags & 0x8 ? payload.subarray(1, payload.length - payload[0]) : payload; // PADDED
          if (payload.length > 0) {
            const inc = Buffer.alloc(4);
            inc.writeUInt32BE(payload.length, 0);
            s.write(Buffer.concat([frame(0x8, 0, 0, inc), frame(0x8, 0, stream, inc)])); // WINDOW_UPDATE
          }
          onData(s, stream, data, (flags & 0x1) !== 0, conn);
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return server;
}
