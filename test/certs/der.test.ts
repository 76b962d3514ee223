import { X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureCa, LeafMinter } from '../../src/certs/index.js';
import { oid, time, tlv, uint } from '../../src/certs/der.js';

const hex = (b: Buffer) => b.toString('hex');

describe('der', () => {
  it('encodes lengths in short and long form', () => {
    expect(hex(tlv(0x04, Buffer.alloc(3)))).toBe('0403000000');
    expect(hex(tlv(0x04, Buffer.alloc(200)).subarray(0, 3))).toBe('0481c8');
    expect(hex(tlv(0x04, Buffer.alloc(300)).subarray(0, 4))).toBe('0482012c');
  });

  it('encodes non-negative integers minimally, with a leading zero when the top bit is set', () => {
    expect(hex(uint(Buffer.from([2])))).toBe('020102');
    expect(hex(uint(Buffer.from([0x00, 0x00, 0x7f])))).toBe('02017f');
    expect(hex(uint(Buffer.from([0x80, 0x01])))).toBe('0203008001');
    expect(hex(uint(Buffer.from([0])))).toBe('020100');
  });

  it('encodes object identifiers with multi-byte arcs', () => {
    expect(hex(oid('2.5.29.17'))).toBe('0603551d11');
    expect(hex(oid('1.2.840.10045.4.3.2'))).toBe('06082a8648ce3d040302');
    expect(hex(oid('1.3.6.1.5.5.7.3.1'))).toBe('06082b06010505070301');
  });

  it('uses UTCTime through 2049 and GeneralizedTime from 2050, whole seconds', () => {
    expect(time(new Date('2026-11-21T23:49:29.987Z')).toString('latin1')).toBe('\x17\x0d261121234929Z');
    expect(time(new Date('2049-12-31T23:59:59Z')).toString('latin1')).toBe('\x17\x0d491231235959Z');
    expect(time(new Date('2050-01-01T00:00:00Z')).toString('latin1')).toBe('\x18\x0f20500101000000Z');
  });
});

describe('LeafMinter fast path (DNS names written as DER)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-der-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('writes the same certificate as the general generator, bar serial and signature', async () => {
    const ca = await ensureCa(dir);
    const minter = new LeafMinter(ca);
    const caCert = new X509Certificate(ca.certPem);
    const host = 'xn--bcher-kva.example.com';
    const fast = new X509Certificate(await minter.certificatePem(host));
    expect(fast.verify(caCert.publicKey)).toBe(true);
    expect(fast.checkIssued(caCert)).toBe(true);
    expect(fast.subject).toBe(`CN=${host}`);
    expect(fast.subjectAltName).toBe(`DNS:${host}`);
    expect(fast.checkHost(host)).toBe(host);
    expect(fast.checkHost('other.example.com')).toBeUndefined();
    expect(fast.ca).toBe(false);
    expect(fast.keyUsage).toContain('1.3.6.1.5.5.7.3.1');
    // The general generator (used for IP literals) with the same key: same public key, issuer and extensions.
    const generic = new X509Certificate(await minter.certificatePem('127.0.0.1'));
    expect(fast.publicKey.export({ type: 'spki', format: 'der' }).equals(generic.publicKey.export({ type: 'spki', format: 'der' }))).toBe(true);
    expect(fast.issuer).toBe(generic.issuer);
    expect(fast.serialNumber).not.toBe(generic.serialNumber);
    expect(new Date(fast.validTo).getTime()).toBeLessThanOrEqual(new Date(caCert.validTo).getTime());
    expect(new Date(fast.validFrom).getTime()).toBeGreaterThanOrEqual(new Date(caCert.validFrom).getTime());
  });
});
