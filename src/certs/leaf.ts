import { createHash, KeyObject, sign, webcrypto } from 'node:crypto';
import { isIP } from 'node:net';
import tls from 'node:tls';
import { derToPem, EC_ALG, loadX509, randomSerial, SIGN_ALG, type Ca } from './ca.js';
import { bits, extension, oid, seq, set, time, tlv, uint, utf8 } from './der.js';

const DAY = 24 * 3600 * 1000;

export interface LeafMinterOptions {
  /** Cached SecureContexts (LRU). */
  cacheSize?: number;
  /** Lifetime of a minted certificate. */
  validityDays?: number;
  /** Called on every lookup: `cached` false when a certificate was minted. */
  onCert?: (e: { host: string; cached: boolean }) => void;
}

/** What every leaf for a DNS name shares, as DER: all but serial, validity, subject and SAN. */
interface Template {
  caKey: KeyObject;
  issuer: Buffer;
  spki: Buffer;
  /** BasicConstraints (CA:false), KeyUsage, ExtendedKeyUsage: before the SAN. */
  head: Buffer;
  /** AuthorityKeyIdentifier, SubjectKeyIdentifier: after the SAN. */
  tail: Buffer;
}

const V3 = tlv(0xa0, uint(Buffer.from([2])));
const ECDSA_SHA256 = seq(oid('1.2.840.10045.4.3.2'));
const OID_CN = oid('2.5.4.3');
const OID_SAN = '2.5.29.17';
/** A host name that goes into a certificate as is (normalised: ASCII, punycode for IDN). */
const DNS_NAME = /^[A-Za-z0-9*_.-]{1,253}$/;

interface Entry {
  ctx: tls.SecureContext;
  pem: string;
  renewAfter: number;
}

/**
 * Mints per-host server certificates signed by the CA. One leaf key serves every host (key
 * generation is the expensive part; a certificate per host is a cheap signature). Contexts are
 * cached in a bounded LRU and concurrent requests for the same host share one mint.
 */
export class LeafMinter {
  private keysP: Promise<{ keys: webcrypto.CryptoKeyPair; keyPem: string }>;
  private templateP: Promise<Template> | undefined;
  private readonly cache = new Map<string, Entry>();
  private readonly pending = new Map<string, Promise<Entry>>();
  private readonly cacheSize: number;
  private readonly validityMs: number;

  constructor(
    private readonly ca: Ca,
    private readonly opts: LeafMinterOptions = {},
  ) {
    this.cacheSize = Math.max(1, opts.cacheSize ?? 1000);
    this.validityMs = (opts.validityDays ?? 30) * DAY;
    this.keysP = (async () => {
      const keys = (await webcrypto.subtle.generateKey(EC_ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
      return { keys, keyPem: derToPem(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey), 'PRIVATE KEY') };
    })();
    // The error, if any, surfaces on the first mint; avoid an unhandled rejection meanwhile.
    this.keysP.catch(() => undefined);
  }

  get size(): number {
    return this.cache.size;
  }

  /** The TLS context for `host` (a normalised host name or IP address). */
  async secureContext(host: string): Promise<tls.SecureContext> {
    return (await this.entry(host)).ctx;
  }

  /** The PEM certificate minted for `host` (for tests and diagnostics). */
  async certificatePem(host: string): Promise<string> {
    return (await this.entry(host)).pem;
  }

  private async entry(host: string): Promise<Entry> {
    const hit = this.cache.get(host);
    if (hit && Date.now() < hit.renewAfter) {
      this.cache.delete(host);
      this.cache.set(host, hit);
      this.opts.onCert?.({ host, cached: true });
      return hit;
    }
    let p = this.pending.get(host);
    if (!p) {
      p = this.mint(host).finally(() => this.pending.delete(host));
      this.pending.set(host, p);
      p.then(
        (e) => {
          this.cache.delete(host);
          this.cache.set(host, e);
          while (this.cache.size > this.cacheSize) this.cache.delete(this.cache.keys().next().value as string);
          this.opts.onCert?.({ host, cached: false });
        },
        () => undefined,
      );
    }
    return p;
  }

  private template(): Promise<Template> {
    this.templateP ??= (async () => {
      const { keys } = await this.keysP;
      const spki = Buffer.from(await webcrypto.subtle.exportKey('spki', keys.publicKey));
      // The subjectPublicKey bits of a P-256 SPKI: the uncompressed point at its end.
      const point = spki.subarray(spki.length - 65);
      const ski = createHash('sha1').update(point).digest();
      return {
        caKey: this.ca.signingKey,
        issuer: this.ca.subjectDer,
        spki,
        head: Buffer.concat([
          extension('2.5.29.19', true, seq()),
          extension('2.5.29.15', true, tlv(0x03, Buffer.from([0x07, 0x80]))), // digitalSignature
          extension('2.5.29.37', false, seq(oid('1.3.6.1.5.5.7.3.1'))), // serverAuth
        ]),
        tail: Buffer.concat([
          extension('2.5.29.35', false, seq(tlv(0x80, Buffer.from(this.ca.ski, 'hex')))),
          extension('2.5.29.14', false, tlv(0x04, ski)),
        ]),
      };
    })();
    return this.templateP;
  }

  /** The same certificate as `mintGeneric` for a DNS name, written directly as DER and signed synchronously. */
  private async mintDns(host: string, notBefore: Date, notAfter: Date): Promise<string> {
    const t = await this.template();
    const tbs = seq(
      V3,
      uint(Buffer.from(randomSerial(), 'hex')),
      ECDSA_SHA256,
      t.issuer,
      seq(time(notBefore), time(notAfter)),
      seq(set(seq(OID_CN, utf8(host)))),
      t.spki,
      tlv(0xa3, seq(t.head, extension(OID_SAN, false, seq(tlv(0x82, Buffer.from(host, 'ascii')))), t.tail)),
    );
    const signature = sign('sha256', tbs, t.caKey); // DER-encoded ECDSA, as X.509 wants
    return derToPem(seq(tbs, ECDSA_SHA256, bits(signature)), 'CERTIFICATE');
  }

  private async mint(host: string): Promise<Entry> {
    const { keys, keyPem } = await this.keysP;
    const now = Date.now();
    // Inside the CA's validity, always: a leaf outliving its issuer is rejected by clients.
    const notBefore = new Date(Math.max(now - 60 * 60 * 1000, this.ca.notBefore.getTime()));
    const notAfter = new Date(Math.min(now + this.validityMs, this.ca.notAfter.getTime()));
    if (notAfter.getTime() <= now) throw new Error('the proxy CA has expired; create a new one');
    const pem = !isIP(host) && DNS_NAME.test(host) ? await this.mintDns(host, notBefore, notAfter) : await this.mintGeneric(host, keys, notBefore, notAfter);
    const ctx = tls.createSecureContext({ key: keyPem, cert: pem, minVersion: 'TLSv1.2' });
    // Renew well before expiry so no client ever sees a certificate about to lapse.
    const renewAfter = Math.min(now + (notAfter.getTime() - now) / 2, notAfter.getTime() - 60_000);
    return { ctx, pem, renewAfter };
  }

  /** Any host (IP literals included) through the general X.509 generator. */
  private async mintGeneric(host: string, keys: webcrypto.CryptoKeyPair, notBefore: Date, notAfter: Date): Promise<string> {
    const x509 = await loadX509();
    const san = isIP(host) ? ipNames(host).map((value) => ({ type: 'ip' as const, value })) : [{ type: 'dns' as const, value: host }];
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: randomSerial(),
      subject: isIP(host) ? 'O=keygate' : `CN=${host}`,
      issuer: new x509.Name(this.ca.subjectDer),
      notBefore,
      notAfter,
      signingAlgorithm: SIGN_ALG,
      publicKey: keys.publicKey,
      signingKey: this.ca.key,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        new x509.SubjectAlternativeNameExtension(san),
        new x509.AuthorityKeyIdentifierExtension(this.ca.ski),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
      ],
    });
    return cert.toString('pem') + '\n';
  }
}

/**
 * The IP SANs of a leaf for `ip`. An IPv4 address also gets its IPv4-mapped IPv6 form: the proxy
 * treats a CONNECT to `[::ffff:a.b.c.d]` as one to a.b.c.d (one rule, one no_proxy entry, one
 * leaf), and the client, which asked for the IPv6 spelling, checks the certificate against that.
 * Written in hex groups (`::ffff:7f00:1`): the X.509 library misreads the dotted-quad tail.
 */
export function ipNames(ip: string): string[] {
  if (isIP(ip) !== 4) return [ip];
  const [a, b, c, d] = ip.split('.').map(Number);
  return [ip, `::ffff:${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`];
}
