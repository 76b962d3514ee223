// Tar archives written byte by byte, for headers no tar writer produces: names carried by PAX
// records or GNU long-name entries (while the ustar header says something harmless), names with
// NUL bytes or backslashes, sizes that lie, truncated archives.
import zlib from 'node:zlib';

export type HostileType = 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'CharacterDevice' | 'FIFO';
const FLAG: Record<HostileType, string> = { File: '0', Link: '1', SymbolicLink: '2', CharacterDevice: '3', Directory: '5', FIFO: '6' };

/** How the entry's path and link target reach the reader. */
export type Encoding = 'ustar' | 'pax' | 'gnu';

export interface HostileEntry {
  path: string;
  type: HostileType;
  body?: Buffer;
  linkpath?: string;
  encoding: Encoding;
  /** Added to the size written in the header (a lie: the data that follows is `body` as is). */
  sizeLie?: number;
  /** Permission bits in the header (0o644 when not given). */
  mode?: number;
}

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, '0') + '\0';
}

/** One raw 512-byte header; strings are written as UTF-8 and cut at the field's width. */
function header(name: string, flag: string, size: number, linkname = '', prefix = '', mode = 0o644): Buffer {
  const b = Buffer.alloc(512);
  b.write(name, 0, 100, 'utf8');
  b.write(octal(mode, 8), 100, 'latin1');
  b.write(octal(0, 8), 108, 'latin1');
  b.write(octal(0, 8), 116, 'latin1');
  b.write(octal(size, 12), 124, 'latin1');
  b.write(octal(0, 12), 136, 'latin1');
  b.write('        ', 148, 'latin1');
  b.write(flag, 156, 'latin1');
  b.write(linkname, 157, 100, 'utf8');
  b.write('ustar\0', 257, 'latin1');
  b.write('00', 263, 'latin1');
  b.write(prefix, 345, 155, 'utf8');
  let sum = 0;
  for (const x of b) sum += x;
  b.write(octal(sum, 7) + ' ', 148, 'latin1');
  return b;
}

const pad = (n: number) => Buffer.alloc((512 - (n % 512)) % 512);

function paxRecord(key: string, value: string): Buffer {
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return Buffer.from(`${len}${body}`, 'utf8');
}

function withBody(h: Buffer, body: Buffer): Buffer[] {
  return [h, body, pad(body.length)];
}

/** Whether `p` fits a plain ustar header (name, or prefix + name split at a slash). */
export function fitsUstar(p: string): boolean {
  if (Buffer.byteLength(p) <= 100) return true;
  for (let i = p.indexOf('/'); i >= 0; i = p.indexOf('/', i + 1)) {
    if (Buffer.byteLength(p.slice(0, i)) <= 155 && Buffer.byteLength(p.slice(i + 1)) <= 100 && i + 1 < p.length) return true;
  }
  return false;
}

function ustarSplit(p: string): [string, string] {
  if (Buffer.byteLength(p) <= 100) return [p, ''];
  for (let i = p.lastIndexOf('/'); i >= 0; i = p.lastIndexOf('/', i - 1)) {
    if (Buffer.byteLength(p.slice(0, i)) <= 155 && Buffer.byteLength(p.slice(i + 1)) <= 100 && i + 1 < p.length) return [p.slice(i + 1), p.slice(0, i)];
    if (i === 0) break;
  }
  throw new Error(`does not fit ustar: ${p}`);
}

/** The uncompressed tar stream (entries, then the two zero blocks). */
export function hostileTar(entries: HostileEntry[]): Buffer {
  const out: Buffer[] = [];
  entries.forEach((e, i) => {
    const body = e.body ?? Buffer.alloc(0);
    const size = Math.max(0, body.length + (e.sizeLie ?? 0));
    const link = e.linkpath ?? '';
    if (e.encoding === 'pax') {
      const recs = Buffer.concat([paxRecord('path', e.path), ...(link ? [paxRecord('linkpath', link)] : [])]);
      out.push(...withBody(header(`PaxHeader/e${i}`, 'x', recs.length), recs));
      out.push(header(`decoy${i}`, FLAG[e.type], size, link ? `decoy-target${i}` : '', '', e.mode));
    } else if (e.encoding === 'gnu') {
      const name = Buffer.from(e.path + '\0', 'utf8');
      out.push(...withBody(header('././@LongLink', 'L', name.length), name));
      if (link) {
        const ln = Buffer.from(link + '\0', 'utf8');
        out.push(...withBody(header('././@LongLink', 'K', ln.length), ln));
      }
      out.push(header(`decoy${i}`, FLAG[e.type], size, link ? `decoy-target${i}` : '', '', e.mode));
    } else {
      const [name, prefix] = ustarSplit(e.path);
      out.push(header(name, FLAG[e.type], size, link, prefix, e.mode));
    }
    out.push(body, pad(body.length));
  });
  out.push(Buffer.alloc(1024));
  return Buffer.concat(out);
}

export function hostileTarGz(entries: HostileEntry[], opts: { truncateAt?: number } = {}): Buffer {
  const gz = zlib.gzipSync(hostileTar(entries));
  return opts.truncateAt === undefined ? gz : gz.subarray(0, Math.min(opts.truncateAt, gz.length - 1));
}
