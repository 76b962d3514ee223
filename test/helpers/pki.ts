/**
 * Test PKI: a throw-away CA and a server certificate for given names, separate from the proxy's
 * own CA (so tests can tell "the origin's certificate" from "a certificate minted by keygate").
 */
import 'reflect-metadata';
import { webcrypto, X509Certificate } from 'node:crypto';
import { isIP } from 'node:net';
import * as x509 from '@peculiar/x509';

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;

export interface TestPki {
  /** The test CA certificate (PEM): give it to the proxy with --upstream-ca. */
  caPem: string;
  /** Server certificate (PEM) for the names, and its key. */
  certPem: string;
  keyPem: string;
  /** SHA-256 fingerprint of the server certificate, as node:crypto prints it. */
  fingerprint256: string;
}

function toPem(der: ArrayBuffer, label: string): string {
  const b64 = Buffer.from(der).toString('base64').replace(/(.{64})/g, '$1\n');
  return `-----BEGIN ${label}-----\n${b64.replace(/\n$/, '')}\n-----END ${label}-----\n`;
}

/**
 * A CA named `caName` and one leaf valid for every name in `names` (DNS names, wildcards or IPs);
 * `leaf` moves the leaf's validity (an expired or not-yet-valid origin certificate).
 */
export async function createTestPki(names: string[], caName = 'keygate test origin CA', leaf: { notBefore?: Date; notAfter?: Date } = {}): Promise<TestPki> {
  const caKeys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const now = Date.now();
  const ca = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: '01',
    name: `CN=${caName}`,
    notBefore: new Date(now - 3600_000),
    notAfter: new Date(now + 7 * 24 * 3600_000),
    signingAlgorithm: ALG,
    keys: caKeys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(caKeys.publicKey),
    ],
  });
  const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const leafCert = await x509.X509CertificateGenerator.create({
    serialNumber: '02',
    subject: `CN=${names[0]}`,
    issuer: ca.subject,
    notBefore: leaf.notBefore ?? new Date(now - 3600_000),
    notAfter: leaf.notAfter ?? new Date(now + 7 * 24 * 3600_000),
    signingAlgorithm: ALG,
    publicKey: keys.publicKey,
    signingKey: caKeys.privateKey,
    extensions: [
      new x509.BasicConstraintsExtension(false),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(names.map((n) => (isIP(n) ? { type: 'ip' as const, value: n } : { type: 'dns' as const, value: n }))),
      await x509.AuthorityKeyIdentifierExtension.create(caKeys.publicKey),
    ],
  });
  const certPem = leafCert.toString('pem') + '\n';
  return {
    caPem: ca.toString('pem') + '\n',
    certPem,
    keyPem: toPem(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey), 'PRIVATE KEY'),
    fingerprint256: new X509Certificate(certPem).fingerprint256,
  };
}
