/**
 * ChunkedScanner (src/proxy/h1/chunked.ts), pure: where a chunked body ends while its bytes
 * stream through, however the stream is cut, and every framing error. A seeded differential
 * against Node's own parser (llhttp, strict) checks that whenever both accept a body they end
 * it at the same byte with the same payload, and that the scanner never waits for more where
 * Node has already seen the end.
 */
import { describe, expect, it } from 'vitest';
import { ChunkedScanner } from '../../../src/proxy/h1/chunked.js';
import { bytes, HTTPParser, prng } from './differential.js';


interface Scan {
  /** What `scan` returned last (end index in the last buffer, -1, -2). */
  result: number;
  /** End of the body as an offset in the whole stream, when found. */
  end?: number;
  dataBytes: number;
  done: boolean;
  error?: string;
}

/** Scans `body` cut into the given pieces (lengths; the rest goes last). */
function scanPieces(body: Buffer, cuts: number[] = []): Scan {
  const s = new ChunkedScanner();
  let offset = 0;
  let result = -1;
  const pieces: Buffer[] = [];
  for (const c of cuts) {
    pieces.push(body.subarray(offset, offset + c));
    offset += c;
  }
  pieces.push(body.subarray(offset));
  offset = 0;
  for (const p of pieces) {
    result = s.scan(p);
    if (result === -2) return { result, dataBytes: s.dataBytes, done: s.done, error: s.error };
    if (result >= 0) return { result, end: offset + result, dataBytes: s.dataBytes, done: s.done };
    offset += p.length;
  }
  return { result, dataBytes: s.dataBytes, done: s.done };
}

const scanOne = (body: string | Buffer) => scanPieces(typeof body === 'string' ? bytes(body) : body);

/** The body byte by byte. */
function scanBytes(body: Buffer): Scan {
  return scanPieces(body, Array.from({ length: Math.max(0, body.length - 1) }, () => 1));
}

const BODIES: Array<[string, string, number]> = [
  ['one chunk', '5\r\nhello\r\n0\r\n\r\n', 5],
  ['several chunks', '5\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\n\r\n', 12],
  ['hex sizes, both cases, leading zeros', 'a\r\n0123456789\r\nA\r\n0123456789\r\n00010\r\n0123456789abcdef\r\n000\r\n\r\n', 36],
  ['only the last chunk', '0\r\n\r\n', 0],
  ['extensions', '5;name=value\r\nhello\r\n3;a;b=c;q="x y"\r\nabc\r\n0;last\r\n\r\n', 8],
  ['extension with space after ;', '5; a=b\r\nhello\r\n0\r\n\r\n', 5],
  ['trailers', '5\r\nhello\r\n0\r\nExpires: 0\r\nX-Checksum: abc\r\n\r\n', 5],
  ['extension and trailers', '5;x\r\nhello\r\n0;y=z\r\nX-T: v\r\n\r\n', 5],
  ['data full of CRLF and hex', '8\r\n0\r\n\r\n0\r\n\r\n0\r\n\r\n', 8],
  ['binary data', `4\r\n\x00\xff\r\n\r\n0\r\n\r\n`, 4],
];

describe('ChunkedScanner: well-formed bodies', () => {
  it.each(BODIES)('%s: one buffer', (_name, body, data) => {
    const r = scanOne(body);
    expect(r).toEqual({ result: body.length, end: body.length, dataBytes: data, done: true });
  });

  it.each(BODIES)('%s: split in two at every byte boundary', (_name, body, data) => {
    const buf = bytes(body);
    for (let cut = 0; cut <= buf.length; cut++) {
      const r = scanPieces(buf, [cut]);
      // The end is in the second piece unless the first holds the whole body.
      expect(r, `cut at ${cut}`).toEqual({ result: cut === buf.length ? buf.length : buf.length - cut, end: buf.length, dataBytes: data, done: true });
    }
  });

  it.each(BODIES)('%s: byte by byte', (_name, body, data) => {
    const buf = bytes(body);
    expect(scanBytes(buf)).toEqual({ result: 1, end: buf.length, dataBytes: data, done: true });
  });

  it.each(BODIES)('%s: every proper prefix needs more, none is an error', (_name, body) => {
    const buf = bytes(body);
    for (let cut = 0; cut < buf.length; cut++) {
      const s = new ChunkedScanner();
      expect(s.scan(buf.subarray(0, cut)), `prefix of ${cut}`).toBe(-1);
      expect(s.done).toBe(false);
      expect(s.error).toBeUndefined();
    }
  });

  it('bytes after the end are not part of it: scan returns the end index, not the buffer length', () => {
    const body = '5\r\nhello\r\n0\r\nX: y\r\n\r\n';
    for (const after of ['HTTP/1.1 200 OK\r\n', '\r\n', '0\r\n\r\n', 'garbage that is not chunked']) {
      const s = new ChunkedScanner();
      expect(s.scan(bytes(body + after))).toBe(body.length);
      expect(s.done).toBe(true);
      expect(s.dataBytes).toBe(5);
    }
    // Split so that the end falls inside the second buffer, followed by more bytes.
    const s = new ChunkedScanner();
    expect(s.scan(bytes(body.slice(0, 7)))).toBe(-1);
    expect(s.scan(bytes(body.slice(7) + 'NEXT'))).toBe(body.length - 7);
  });

  it('scan(buf, start) starts at start and returns an index into buf', () => {
    const head = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n';
    const body = '3\r\nabc\r\n0\r\n\r\n';
    const s = new ChunkedScanner();
    expect(s.scan(bytes(head + body + 'rest'), head.length)).toBe(head.length + body.length);
    expect(s.dataBytes).toBe(3);
    const t = new ChunkedScanner();
    expect(t.scan(bytes(head + body.slice(0, 4)), head.length)).toBe(-1);
    expect(t.scan(bytes(body.slice(4)))).toBe(body.length - 4);
  });

  it('once done, further buffers are not consumed', () => {
    const s = new ChunkedScanner();
    expect(s.scan(bytes('0\r\n\r\n'))).toBe(5);
    expect(s.scan(bytes('5\r\nhello\r\n'))).toBe(0);
    expect(s.scan(bytes('abc'), 2)).toBe(2);
    expect(s.dataBytes).toBe(0);
  });

  it('counts payload bytes as they pass, before the body ends', () => {
    const s = new ChunkedScanner();
    expect(s.scan(bytes('10\r\n0123456'))).toBe(-1);
    expect(s.dataBytes).toBe(7);
    expect(s.scan(bytes('789abcdef\r\n4\r\nxy'))).toBe(-1);
    expect(s.dataBytes).toBe(18);
    expect(s.scan(bytes('zw\r\n0\r\n\r\n'))).toBe(9);
    expect(s.dataBytes).toBe(20);
  });

  it('a 12-digit size is accepted and counted, streamed in pieces', () => {
    const s = new ChunkedScanner();
    expect(s.scan(bytes('000000100000\r\n'))).toBe(-1); // 0x100000 = 1 MiB
    const piece = Buffer.alloc(64 * 1024, 0x61);
    for (let i = 0; i < 16; i++) expect(s.scan(piece)).toBe(-1);
    expect(s.dataBytes).toBe(1024 * 1024);
    expect(s.scan(bytes('\r\n0\r\n\r\n'))).toBe(7);
    expect(s.done).toBe(true);
  });

  it('extensions and trailers well within the bounds, with tabs and obs-text', () => {
    const ext = ';' + 'e'.repeat(1000) + '=\t"\x80\xff"';
    expect(scanOne(`1${ext}\r\nx\r\n0${ext}\r\n\r\n`)).toMatchObject({ done: true, dataBytes: 1 });
    const trailers = Array.from({ length: 100 }, (_, i) => `X-T${i}: ${'v'.repeat(100)}\t\x80`).join('\r\n');
    expect(scanOne(`1\r\nx\r\n0\r\n${trailers}\r\n\r\n`)).toMatchObject({ done: true, dataBytes: 1 });
  });
});

describe('ChunkedScanner: errors', () => {
  const cases: Array<[string, string]> = [
    ['size of 13 hex digits', '1000000000000\r\n'],
    ['size of 13 digits with leading zeros', '0000000000001\r\nx\r\n0\r\n\r\n'],
    ['no size', '\r\nhello\r\n0\r\n\r\n'],
    ['non-hex size', 'g\r\n'],
    ['non-hex after hex', '5g\r\nhello\r\n'],
    ['0x prefix', '0x5\r\nhello\r\n'],
    ['sign', '+5\r\nhello\r\n'],
    ['negative', '-5\r\nhello\r\n'],
    ['space before the size', ' 5\r\nhello\r\n'],
    ['space after the size', '5 \r\nhello\r\n'],
    ['tab after the size', '5\t\r\nhello\r\n'],
    ['space before ;', '5 ;x\r\nhello\r\n'],
    ['tab before ;', '5\t;x\r\nhello\r\n'],
    ['; without a size', ';x\r\nhello\r\n'],
    ['LF-only after the size', '5\nhello\r\n0\r\n\r\n'],
    ['CR-only after the size', '5\rhello\r\n'],
    ['CR CR LF after the size', '5\r\r\nhello\r\n'],
    ['LF-only after the data', '5\r\nhello\n0\r\n\r\n'],
    ['missing CRLF after the data', '5\r\nhello0\r\n\r\n'],
    ['data longer than the size', '5\r\nhello!\r\n0\r\n\r\n'],
    ['data shorter than the size', '6\r\nhello\r\n0\r\n\r\n0\r\n\r\n'],
    ['LF-only after the last chunk', '0\n\r\n'],
    ['LF-only at the end', '0\r\n\n'],
    ['CR then not LF at the end', '0\r\n\rX'],
    ['LF-only after a trailer', '0\r\nX: y\n\r\n'],
    ['CR CR after a trailer', '0\r\nX: y\r\r\r\n'],
    ['CR CR at the end', '0\r\n\r\r\n'],
    ['CR CR after the data', '1\r\nx\r\r\n0\r\n\r\n'],
    ['bare CR in a trailer', '0\r\nX: a\rb\r\n\r\n'],
    ['NUL in a trailer', '0\r\nX: a\x00b\r\n\r\n'],
    ['DEL in a trailer', '0\r\nX: a\x7fb\r\n\r\n'],
    ['LF in an extension', '5;a\nb\r\nhello\r\n0\r\n\r\n'],
    ['NUL in an extension', '5;a\x00\r\nhello\r\n0\r\n\r\n'],
    ['DEL in an extension', '5;a\x7f\r\nhello\r\n0\r\n\r\n'],
    ['bare CR in an extension', '5;a\rb\r\nhello\r\n0\r\n\r\n'],
  ];

  it.each(cases)('%s', (_name, body) => {
    const buf = bytes(body);
    const r = scanOne(buf);
    expect(r.result).toBe(-2);
    expect(r.error).toEqual(expect.any(String));
    expect(r.done).toBe(false);
    // The same error however the bytes arrive.
    expect(scanBytes(buf)).toEqual(r);
    for (let cut = 0; cut <= buf.length; cut++) expect(scanPieces(buf, [cut]), `cut at ${cut}`).toEqual(r);
  });

  it('names the problem without quoting the body', () => {
    const why = (body: string) => scanOne(body).error;
    expect(why('1000000000000\r\n')).toMatch(/size too large/);
    expect(why('zz\r\n')).toMatch(/malformed chunk size/);
    expect(why('5 ;SECRET\r\n')).toMatch(/malformed chunk size/);
    expect(why('5\r\nSECRET!\r\n')).toMatch(/longer than its size/);
    expect(why('5;SECRET\x00\r\n')).toMatch(/extension/);
    expect(why('0\r\nSECRET\x00\r\n\r\n')).toMatch(/trailer/);
    for (const [, body] of cases) expect(scanOne(body.replace('hello', 'SECRE')).error).not.toMatch(/SECRE|hello/);
  });

  it('an oversize extension is an error, even streamed', () => {
    const long = ';' + 'e'.repeat(5000);
    expect(scanOne(`5${long}\r\nhello\r\n0\r\n\r\n`).error).toMatch(/extension/);
    expect(scanOne(`0${long}\r\n\r\n`).error).toMatch(/extension/);
    // Without its CR ever coming: the scanner does not wait forever.
    const s = new ChunkedScanner();
    expect(s.scan(bytes('5;'))).toBe(-1);
    let r = -1;
    for (let i = 0; i < 10 && r === -1; i++) r = s.scan(Buffer.alloc(1000, 0x65));
    expect(r).toBe(-2);
    expect(s.error).toMatch(/extension/);
  });

  it('oversize trailers are an error, one long line or many short ones, even streamed', () => {
    expect(scanOne(`0\r\nX: ${'v'.repeat(40 * 1024)}\r\n\r\n`).error).toMatch(/trailers too large/);
    const many = Array.from({ length: 2000 }, (_, i) => `X-${i}: vvvvvvvvvv`).join('\r\n');
    expect(scanOne(`0\r\n${many}\r\n\r\n`).error).toMatch(/trailers too large/);
    const s = new ChunkedScanner();
    expect(s.scan(bytes('0\r\nX: '))).toBe(-1);
    let r = -1;
    for (let i = 0; i < 100 && r === -1; i++) r = s.scan(Buffer.alloc(1000, 0x76));
    expect(r).toBe(-2);
    expect(s.error).toMatch(/trailers too large/);
  });

  it('a size that keeps growing is an error at the 13th digit, even streamed', () => {
    const s = new ChunkedScanner();
    for (let i = 0; i < 12; i++) expect(s.scan(bytes('f'))).toBe(-1);
    expect(s.scan(bytes('f'))).toBe(-2);
    expect(s.error).toMatch(/size too large/);
  });

  it('an error is final: scanning more bytes after it never resumes the body', () => {
    const s = new ChunkedScanner();
    expect(s.scan(bytes('5\r\nhelloXX'))).toBe(-2);
    // What would be a valid end of body, had the scanner carried on from its broken state.
    expect(s.scan(bytes('\r\n0\r\n\r\n'))).toBe(-2);
    expect(s.done).toBe(false);
  });
});

// ---- differential against Node's parser --------------------------------------------------


const HEAD = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n';
const NEXT = 'HTTP/1.1 204 No Content\r\n\r\n';

interface NodeChunked {
  error?: string;
  consumed: number;
  /** Payload bytes of the first response. */
  bodyBytes: number;
  /** Responses complete. */
  complete: number;
}

/** Node's strict parser over a chunked response with `body` as its body. */
function nodeChunked(body: Buffer): NodeChunked {
  const p = new HTTPParser();
  p.initialize(HTTPParser.RESPONSE, {}, 0, HTTPParser.kLenientNone);
  const out: NodeChunked = { consumed: 0, bodyBytes: 0, complete: 0 };
  p[HTTPParser.kOnHeadersComplete] = () => 0;
  p[HTTPParser.kOnBody] = (b: Buffer) => {
    if (out.complete === 0) out.bodyBytes += b.length;
  };
  p[HTTPParser.kOnMessageComplete] = () => {
    out.complete++;
  };
  try {
    const r = p.execute(Buffer.concat([bytes(HEAD), body]));
    if (r instanceof Error) out.error = (r as NodeJS.ErrnoException).code ?? 'error';
    else out.consumed = r - HEAD.length;
    return out;
  } finally {
    p.close();
  }
}


// Extensions and trailers llhttp accepts, and some only the scanner does (it checks bytes, not their grammar).
const EXTENSIONS = ['', ';a', ';a=b', ';a="q r"', ';a=b;c'];
const ODD_EXTENSIONS = ['; a=b', ';a =b', ';\xff', ';a=\t', ';;'];
const TRAILERS = ['Expires: 0', 'X-Sum: abc', 'X:\ty', 'X: \x80'];
const ODD_TRAILERS = ['bad', ' folded', 'X : y'];
const ALPHABET = [0x0d, 0x0a, 0x20, 0x09, 0x3b, 0x3d, 0x22, 0x00, 0x7f, 0x80, 0xff, ...Buffer.from('0159afAFgx')];

function generate(rand: () => number): Buffer {
  const pick = <T>(a: readonly T[]): T => a[Math.floor(rand() * a.length)];
  const ext = () => (rand() < 0.5 ? '' : pick(rand() < 0.85 ? EXTENSIONS : ODD_EXTENSIONS));
  let s = '';
  const chunks = Math.floor(rand() * 4);
  for (let c = 0; c < chunks; c++) {
    const size = 1 + Math.floor(rand() * 40);
    let hex = size.toString(16);
    if (rand() < 0.3) hex = hex.toUpperCase();
    if (rand() < 0.2) hex = '00' + hex;
    const data = Array.from({ length: size }, () => String.fromCharCode(pick([0x61, 0x0d, 0x0a, 0x30, 0x3b, 0x00, 0xff]))).join('');
    s += `${hex}${ext()}\r\n${data}\r\n`;
  }
  s += `${pick(['0', '0', '000'])}${ext()}\r\n`;
  const trailers = rand() < 0.7 ? 0 : 1 + Math.floor(rand() * 2);
  for (let t = 0; t < trailers; t++) s += `${pick(rand() < 0.85 ? TRAILERS : ODD_TRAILERS)}\r\n`;
  s += '\r\n';
  const mutations = rand() < 0.3 ? 0 : 1 + Math.floor(rand() * 2);
  for (let m = 0; m < mutations; m++) {
    const at = Math.floor(rand() * s.length);
    const x = String.fromCharCode(pick(ALPHABET));
    const op = Math.floor(rand() * 3);
    s = op === 0 ? s.slice(0, at) + x + s.slice(at) : op === 1 ? s.slice(0, at) + x + s.slice(at + 1) : s.slice(0, at) + s.slice(at + 1);
  }
  return bytes(s);
}

describe('ChunkedScanner: differential against Node\'s strict parser', () => {
  it('where both accept a body they end it at the same byte with the same payload; the scanner never waits past Node\'s end', () => {
    const rand = prng(0x6368756e);
    const CASES = 5000;
    let both = 0;
    let scannerOnly = 0;
    let nodeOnly = 0;
    let neither = 0;
    let waiting = 0;
    const nodeErrors: Record<string, number> = {};
    const failures: string[] = [];
    for (let c = 0; c < CASES; c++) {
      const body = generate(rand);
      const show = JSON.stringify(body.toString('latin1'));
      const s = scanOne(Buffer.concat([body, bytes(NEXT)]));
      // However the stream is cut, the scanner says the same.
      const cut = Math.floor(rand() * (body.length + 1));
      const split = scanPieces(Buffer.concat([body, bytes(NEXT)]), [cut]);
      if (split.end !== s.end || split.dataBytes !== s.dataBytes || split.error !== s.error) failures.push(`${show}: cut at ${cut} gives ${JSON.stringify(split)}, whole ${JSON.stringify(s)}`);
      if (s.end !== undefined) {
        // The body as the scanner delimits it, then another response.
        const n = nodeChunked(Buffer.concat([body.subarray(0, s.end), bytes(NEXT)]));
        if (n.error) {
          nodeErrors[n.error] = (nodeErrors[n.error] ?? 0) + 1;
          // Node may refuse an extension or trailer the scanner lets through, but never after
          // having ended the body somewhere else.
          if (n.complete > 0) failures.push(`${show}: Node ended the body elsewhere, then ${n.error}`);
          scannerOnly++;
          continue;
        }
        both++;
        if (n.complete !== 2 || n.consumed !== s.end + NEXT.length) failures.push(`${show}: scanner ended at ${s.end}, Node saw ${n.complete} responses in ${n.consumed} bytes`);
        if (n.bodyBytes !== s.dataBytes) failures.push(`${show}: payload ${s.dataBytes} vs Node ${n.bodyBytes}`);
        continue;
      }
      const n = nodeChunked(Buffer.concat([body, bytes(NEXT)]));
      if (s.result === -1) {
        waiting++;
        if (n.complete > 0) failures.push(`${show}: the scanner waits for more, Node ended the body`);
      } else if (n.complete > 0) {
        nodeOnly++;
      } else {
        neither++;
      }
    }
    console.log(
      `chunked differential: ${CASES} bodies, ${both} accepted by both (${failures.length} disagreements), ${scannerOnly} by the scanner only ` +
        `(Node: ${JSON.stringify(nodeErrors)}), ${nodeOnly} by Node only, ${neither} by neither, ${waiting} where the scanner waits for more`,
    );
    expect(failures.slice(0, 20)).toEqual([]);
    expect(both).toBeGreaterThan(1000);
    expect(neither).toBeGreaterThan(500);
  });
});
