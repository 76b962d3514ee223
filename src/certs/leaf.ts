import 'reflect-metadata';
import { webcrypto } from 'node:crypto';
import { isIP } from 'node:net';
import tls from 'node:tls';
import * as x509 from '@peculiar/x509';
import { derToPem, EC_ALG, randomSerial, SIGN_ALG, type Ca } from './ca.js';

const DAY = 24 * 3600 * 1000;

export interface LeafMinterOptions {
  /** Cached SecureContexts (LRU). */
  cacheSize?: number;
  /** Lifetime of a minted certificate. */
  validityDays?: number;
  /** Called on every lookup: `cached` false when a certificate was minted. */
  onCert?: (e: { host: string; cached: boolean }) => void;
}

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

  private async mint(host: string): Promise<Entry> {
    const { keys, keyPem } = await this.keysP;
    const now = Date.now();
    // Inside the CA's validity, always: a leaf outliving its issuer is rejected by clients.
    const notBefore = new Date(Math.max(now - 60 * 60 * 1000, this.ca.notBefore.getTime()));
    const notAfter = new Date(Math.min(now + this.validityMs, this.ca.notAfter.getTime()));
    if (notAfter.getTime() <= now) throw new Error('the proxy CA has expired; create a new one');
    const san = isIP(host) ? { type: 'ip' as const, value: host } : { type: 'dns' as const, value: host };
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: randomSerial(),
      subject: isIP(host) ? 'O=keygate' : `CN=${host}`,
      issuer: this.ca.cert.subjectName,
      notBefore,
      notAfter,
      signingAlgorithm: SIGN_ALG,
      publicKey: keys.publicKey,
      signingKey: this.ca.key,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        new x509.SubjectAlternativeNameExtension([san]),
        new x509.AuthorityKeyIdentifierExtension(this.ca.ski),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
      ],
    });
    const pem = cert.toString('pem') + '\n';
    const ctx = tls.createSecureContext({ key: keyPem, cert: pem, minVersion: 'TLSv1.2' });
    // Renew well before expiry so no client ever sees a certificate about to lapse.
    const renewAfter = Math.min(now + (notAfter.getTime() - now) / 2, notAfter.getTime() - 60_000);
    return { ctx, pem, renewAfter };
  }
}
