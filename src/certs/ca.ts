import { createHash, createPrivateKey, createPublicKey, randomBytes, webcrypto, X509Certificate as NodeX509, type KeyObject } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, statSync } from '../builtins/fs.js';
import path from 'node:path';
import { createFileExclusive } from '../secrets/envelope.js';
import { certificateSubjectAndSki } from './der.js';

type X509Module = typeof import('@peculiar/x509');
let x509Module: Promise<X509Module> | undefined;

/**
 * @peculiar/x509 (with reflect-metadata and its ASN.1 stack) is only needed to create a CA and to
 * mint leaves for IP literals. Loaded on first use: it is a fifth of a running sidecar's memory
 * otherwise (a sidecar runs beside every sandbox), and leaves for host names are written as DER.
 */
export function loadX509(): Promise<X509Module> {
  x509Module ??= (async () => {
    await import('reflect-metadata');
    const x509 = await import('@peculiar/x509');
    x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);
    return x509;
  })();
  return x509Module;
}

export const CA_CERT_FILE = 'ca.pem';
export const CA_KEY_FILE = 'ca-key.pem';
export const EC_ALG = { name: 'ECDSA', namedCurve: 'P-256' } as const;
export const SIGN_ALG = { name: 'ECDSA', hash: 'SHA-256' } as const;
const CA_YEARS = 10;

/** The proxy's certificate authority. The private key stays in this process and in ca-key.pem. */
export interface Ca {
  certPem: string;
  /** The certificate's subject Name as DER (the issuer of every leaf, byte for byte). */
  subjectDer: Buffer;
  /** Non-extractable signing key (WebCrypto, for @peculiar/x509). */
  key: webcrypto.CryptoKey;
  /**
   * The same key as a node:crypto KeyObject, for the synchronous leaf signature (certs/leaf.ts).
   * Made from the PEM, not converted from `key`: Node 24 deprecates KeyObject.from() of a
   * non-extractable CryptoKey (DEP0204), which printed a warning at every proxy start.
   */
  signingKey: KeyObject;
  /** Subject key identifier (hex), the AKI of every leaf. */
  ski: string;
  notBefore: Date;
  notAfter: Date;
  certPath: string;
  keyPath: string;
}

export class CaError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CaError';
  }
}

function pemToDer(pem: string, label: string): Buffer {
  const m = new RegExp(`-----BEGIN ${label}-----([\\s\\S]+?)-----END ${label}-----`).exec(pem);
  if (!m) throw new CaError(`expected a PEM ${label}`);
  return Buffer.from(m[1].replace(/\s+/g, ''), 'base64');
}

export function derToPem(der: ArrayBuffer | Buffer, label: string): string {
  const b64 = Buffer.from(der as ArrayBuffer).toString('base64');
  return `-----BEGIN ${label}-----\n${b64.replace(/(.{64})/g, '$1\n').replace(/\n$/, '')}\n-----END ${label}-----\n`;
}

/** A positive serial number of 16 random bytes (hex), as CA/B rules ask. */
export function randomSerial(): string {
  const b = randomBytes(16);
  b[0] &= 0x7f;
  if (b[0] === 0) b[0] = 1;
  return b.toString('hex');
}

async function createCa(certPath: string, keyPath: string): Promise<void> {
  const x509 = await loadX509();
  const keys = (await webcrypto.subtle.generateKey(EC_ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const now = Date.now();
  const notBefore = new Date(now - 60 * 60 * 1000);
  const notAfter = new Date(now + CA_YEARS * 365 * 24 * 3600 * 1000);
  // A per-install suffix makes each CA recognisable in a trust store listing.
  const cn = `keygate proxy CA ${randomBytes(4).toString('hex')}`;
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomSerial(),
    name: `CN=${cn}, O=keygate`,
    notBefore,
    notAfter,
    signingAlgorithm: SIGN_ALG,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  const keyPem = derToPem(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey), 'PRIVATE KEY');
  // Key first, exclusively: when two processes start at once, the one that wins the key also
  // writes the certificate; the other waits for it below.
  if (createFileExclusive(keyPath, keyPem, 0o600)) {
    createFileExclusive(certPath, cert.toString('pem') + '\n', 0o644);
  }
}

async function waitForFile(file: string, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (!existsSync(file)) {
    if (Date.now() > until) throw new CaError(`${file} did not appear (another process is creating the CA?)`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Loads the CA from `dir`, checking that the key belongs to the certificate and is private. */
export async function loadCa(dir: string): Promise<Ca> {
  const certPath = path.join(dir, CA_CERT_FILE);
  const keyPath = path.join(dir, CA_KEY_FILE);
  const mode = statSync(keyPath).mode & 0o777;
  if (mode & 0o077) throw new CaError(`${keyPath} is accessible to other users (mode ${mode.toString(8)}); run: chmod 600 ${keyPath}`);
  const certPem = readFileSync(certPath, 'utf8');
  const keyPem = readFileSync(keyPath, 'utf8');
  let nodeCert: NodeX509;
  try {
    nodeCert = new NodeX509(certPem);
  } catch {
    throw new CaError(`${certPath} is not a PEM certificate`);
  }
  let spki: Buffer;
  let signingKey: KeyObject;
  try {
    signingKey = createPrivateKey(keyPem);
    spki = createPublicKey(signingKey).export({ type: 'spki', format: 'der' });
  } catch {
    throw new CaError(`${keyPath} is not a PEM private key`);
  }
  if (!spki.equals(nodeCert.publicKey.export({ type: 'spki', format: 'der' }))) {
    throw new CaError(`${keyPath} does not belong to ${certPath}`);
  }
  if (!nodeCert.ca) throw new CaError(`${certPath} is not a CA certificate`);
  if (nodeCert.publicKey.asymmetricKeyType !== 'ec') throw new CaError(`${certPath}: only ECDSA P-256 CAs are supported`);
  const key = await webcrypto.subtle.importKey('pkcs8', pemToDer(keyPem, 'PRIVATE KEY'), EC_ALG, false, ['sign']);
  let parsed: { subject: Buffer; ski?: Buffer };
  try {
    parsed = certificateSubjectAndSki(nodeCert.raw);
  } catch (err) {
    throw new CaError(`${certPath}: ${(err as Error).message}`);
  }
  // Without the extension, RFC 5280's method 1: SHA-1 of the public key bits (a P-256 point
  // is the last 65 bytes of its SPKI).
  const ski = (parsed.ski ?? createHash('sha1').update(spki.subarray(spki.length - 65)).digest()).toString('hex');
  return {
    certPem: nodeCert.toString(),
    subjectDer: parsed.subject,
    key,
    signingKey,
    ski,
    notBefore: new Date(nodeCert.validFrom),
    notAfter: new Date(nodeCert.validTo),
    certPath,
    keyPath,
  };
}

/** Loads the CA in `dir`, creating `ca.pem` and `ca-key.pem` (mode 0600) on first use. */
export async function ensureCa(dir: string): Promise<Ca> {
  mkdirSync(dir, { recursive: true });
  const certPath = path.join(dir, CA_CERT_FILE);
  const keyPath = path.join(dir, CA_KEY_FILE);
  const hasCert = existsSync(certPath);
  const hasKey = existsSync(keyPath);
  if (hasCert !== hasKey) {
    // A lone half may be a racing creator about to write the other half; give it a moment.
    if (hasKey) await waitForFile(certPath, 2000);
    else throw new CaError(`${certPath} exists without ${keyPath}; restore the key or remove both to create a new CA`);
  }
  if (!hasCert && !hasKey) await createCa(certPath, keyPath);
  await waitForFile(certPath, 2000);
  return loadCa(dir);
}
