/**
 * Just enough DER to write the leaf certificates the proxy mints for DNS names. Building them
 * with a general ASN.1 library took most of a certificate mint (~10 ms); everything here is a
 * concatenation of precomputed bytes plus the few fields that change per host, so a mint is a
 * synchronous signature and a TLS context (well under a millisecond of DER work).
 */

function lengthBytes(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

/** A TLV with `tag` around the concatenated `parts`. */
export function tlv(tag: number, ...parts: Buffer[]): Buffer {
  const body = parts.length === 1 ? parts[0] : Buffer.concat(parts);
  return Buffer.concat([Buffer.from([tag]), lengthBytes(body.length), body]);
}

export const seq = (...parts: Buffer[]): Buffer => tlv(0x30, ...parts);
export const set = (...parts: Buffer[]): Buffer => tlv(0x31, ...parts);
export const octets = (b: Buffer): Buffer => tlv(0x04, b);
export const utf8 = (s: string): Buffer => tlv(0x0c, Buffer.from(s, 'utf8'));
export const ia5 = (s: string): Buffer => tlv(0x16, Buffer.from(s, 'ascii'));
/** A BIT STRING of whole bytes. */
export const bits = (b: Buffer): Buffer => tlv(0x03, Buffer.from([0]), b);
export const TRUE = Buffer.from([0x01, 0x01, 0xff]);

/** A non-negative INTEGER from big-endian magnitude bytes (minimal encoding). */
export function uint(magnitude: Buffer): Buffer {
  let i = 0;
  while (i < magnitude.length - 1 && magnitude[i] === 0) i++;
  const m = magnitude.subarray(i);
  return tlv(0x02, m[0] & 0x80 ? Buffer.concat([Buffer.from([0]), m]) : m);
}

export function oid(dotted: string): Buffer {
  const arcs = dotted.split('.').map(Number);
  const out: number[] = [arcs[0] * 40 + arcs[1]];
  for (const arc of arcs.slice(2)) {
    const chunk: number[] = [arc & 0x7f];
    for (let v = Math.floor(arc / 128); v > 0; v = Math.floor(v / 128)) chunk.unshift(0x80 | (v & 0x7f));
    out.push(...chunk);
  }
  return tlv(0x06, Buffer.from(out));
}

const pad = (n: number, w = 2) => String(n).padStart(w, '0');

/** RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050; whole seconds, UTC. */
export function time(d: Date): Buffer {
  const y = d.getUTCFullYear();
  const rest = `${pad(d.getUTCMonth() + 1)}${pad(d.getUTCDate())}${pad(d.getUTCHours())}${pad(d.getUTCMinutes())}${pad(d.getUTCSeconds())}Z`;
  return y < 2050 ? tlv(0x17, Buffer.from(`${pad(y % 100)}${rest}`, 'ascii')) : tlv(0x18, Buffer.from(`${pad(y, 4)}${rest}`, 'ascii'));
}

/** One extension: `SEQUENCE { extnID, critical?, extnValue OCTET STRING }`. */
export function extension(id: string, critical: boolean, value: Buffer): Buffer {
  return critical ? seq(oid(id), TRUE, octets(value)) : seq(oid(id), octets(value));
}


export interface Tlv {
  tag: number;
  /** Offset of the first byte of the TLV (its tag). */
  offset: number;
  /** Offset of the contents. */
  start: number;
  /** Offset just past the contents. */
  end: number;
}

/** Reads the TLV at `offset` (definite lengths only, as DER requires). */
export function readTlv(der: Buffer, offset: number): Tlv {
  if (offset + 2 > der.length) throw new Error('truncated DER');
  const tag = der[offset];
  let len = der[offset + 1];
  let start = offset + 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    if (n === 0 || n > 4 || start + n > der.length) throw new Error('unsupported DER length');
    len = 0;
    for (let i = 0; i < n; i++) len = len * 256 + der[start + i];
    start += n;
  }
  if (start + len > der.length) throw new Error('truncated DER');
  return { tag, offset, start, end: start + len };
}

/** The TLVs directly inside a constructed value. */
export function children(der: Buffer, parent: Tlv): Tlv[] {
  const out: Tlv[] = [];
  for (let at = parent.start; at < parent.end; ) {
    const t = readTlv(der, at);
    out.push(t);
    at = t.end;
  }
  return out;
}

/**
 * From a certificate's DER: the subject Name exactly as encoded (a leaf's issuer must be
 * byte-identical to it) and the SubjectKeyIdentifier extension's key id, if present.
 */
export function certificateSubjectAndSki(der: Buffer): { subject: Buffer; ski?: Buffer } {
  const cert = readTlv(der, 0);
  const tbs = children(der, cert)[0];
  const fields = children(der, tbs);
  // version [0] is optional; then serial, signature, issuer, validity, subject.
  const base = fields[0].tag === 0xa0 ? 1 : 0;
  const subject = fields[base + 4];
  if (!subject || subject.tag !== 0x30) throw new Error('certificate without a subject');
  const skiOid = oid('2.5.29.14');
  let ski: Buffer | undefined;
  const exts = fields.find((f) => f.tag === 0xa3);
  if (exts) {
    for (const ext of children(der, children(der, exts)[0])) {
      const parts = children(der, ext);
      if (!der.subarray(parts[0].offset, parts[0].end).equals(skiOid)) continue;
      const value = parts[parts.length - 1]; // OCTET STRING wrapping the key id's OCTET STRING
      const inner = readTlv(der, value.start);
      ski = Buffer.from(der.subarray(inner.start, inner.end));
    }
  }
  return { subject: Buffer.from(der.subarray(subject.offset, subject.end)), ski };
}
