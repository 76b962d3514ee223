import { spawnSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, chmodSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import tls from 'node:tls';
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { afterAll, describe, expect, it } from 'vitest';
import { ensureCa, loadCa, LeafMinter, sandboxEnv, writeCaBundle, CaError } from '../../src/certs/index.js';
import { caBundle, SYSTEM_BUNDLES } from '../../src/certs/env.js';
import { REPO_ROOT } from '../helpers/cli.js';

const dirs: string[] = [];
function tmp(): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kg-certs-'));
  dirs.push(d);
  return d;
}
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('ensureCa', () => {
  it('creates a CA on first run with a private key file and loads the same CA afterwards', async () => {
    const dir = tmp();
    const ca = await ensureCa(dir);
    expect(statSync(path.join(dir, 'ca-key.pem')).mode & 0o777).toBe(0o600);
    const cert = new X509Certificate(readFileSync(path.join(dir, 'ca.pem')));
    expect(cert.ca).toBe(true);
    expect(cert.checkIssued(cert)).toBe(true);
    expect(cert.verify(cert.publicKey)).toBe(true);
    const parsed = new x509.X509Certificate(ca.certPem);
    const bc = parsed.getExtension(x509.BasicConstraintsExtension)!;
    expect([bc.ca, bc.pathLength, bc.critical]).toEqual([true, 0, true]);
    const ku = parsed.getExtension(x509.KeyUsagesExtension)!;
    expect(ku.usages).toBe(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign);
    expect(ku.critical).toBe(true);
    expect(parsed.getExtension(x509.SubjectKeyIdentifierExtension)!.keyId).toBe(ca.ski);
    const years = (new Date(cert.validTo).getTime() - Date.now()) / (365 * 24 * 3600 * 1000);
    expect(years).toBeGreaterThan(9.9);
    const again = await ensureCa(dir);
    expect(again.certPem).toBe(ca.certPem);
    expect(ca.ski).toMatch(/^[0-9a-f]{40}$/);
  });

  it('two concurrent first starts agree on one CA', async () => {
    const dir = tmp();
    const [a, b] = await Promise.all([ensureCa(dir), ensureCa(dir)]);
    expect(a.certPem).toBe(b.certPem);
  });

  it('refuses a key readable by others and a key that does not belong to the certificate', async () => {
    const dir = tmp();
    await ensureCa(dir);
    chmodSync(path.join(dir, 'ca-key.pem'), 0o644);
    await expect(loadCa(dir)).rejects.toThrow(/chmod 600/);
    const other = tmp();
    await ensureCa(other);
    writeFileSync(path.join(dir, 'ca-key.pem'), readFileSync(path.join(other, 'ca-key.pem')), { mode: 0o600 });
    chmodSync(path.join(dir, 'ca-key.pem'), 0o600);
    await expect(loadCa(dir)).rejects.toBeInstanceOf(CaError);
  });
});

describe('LeafMinter', () => {
  it('mints leaves that chain to the CA, with SAN, AKI, serverAuth, CA:false, validity inside the CA, one key for all hosts', async () => {
    const ca = await ensureCa(tmp());
    const caCert = new X509Certificate(ca.certPem);
    const minter = new LeafMinter(ca);
    const a = new X509Certificate(await minter.certificatePem('api.example.com'));
    const b = new X509Certificate(await minter.certificatePem('x.y.example.com'));
    const ip = new X509Certificate(await minter.certificatePem('127.0.0.1'));
    const v6 = new X509Certificate(await minter.certificatePem('::1'));
    for (const leaf of [a, b, ip, v6]) {
      expect(leaf.checkIssued(caCert)).toBe(true);
      expect(leaf.verify(caCert.publicKey)).toBe(true);
      expect(leaf.ca).toBe(false);
      expect(leaf.keyUsage).toEqual(['1.3.6.1.5.5.7.3.1']);
      expect(new Date(leaf.validFrom).getTime()).toBeGreaterThanOrEqual(new Date(caCert.validFrom).getTime());
      expect(new Date(leaf.validTo).getTime()).toBeLessThanOrEqual(new Date(caCert.validTo).getTime());
      const parsed = new x509.X509Certificate(leaf.toString());
      expect(parsed.getExtension(x509.AuthorityKeyIdentifierExtension)!.keyId).toBe(ca.ski);
      expect(parsed.getExtension(x509.BasicConstraintsExtension)!.ca).toBe(false);
    }
    expect(a.subjectAltName).toBe('DNS:api.example.com');
    expect(a.checkHost('api.example.com')).toBe('api.example.com');
    expect(a.checkHost('other.example.com')).toBeUndefined();
    // An IPv4 leaf also names the address's IPv4-mapped IPv6 form: a CONNECT to [::ffff:127.0.0.1]
    // is intercepted as one to 127.0.0.1, and the client checks the certificate against what it asked for.
    expect(ip.subjectAltName).toBe('IP Address:127.0.0.1, IP Address:0:0:0:0:0:FFFF:7F00:1');
    expect(ip.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(tls.checkServerIdentity('::ffff:127.0.0.1', ip.toLegacyObject())).toBeUndefined();
    expect(tls.checkServerIdentity('::ffff:127.0.0.2', ip.toLegacyObject())).toBeInstanceOf(Error);
    expect(v6.checkIP('::1')).toBe('::1');
    const spki = (c: X509Certificate) => c.publicKey.export({ type: 'spki', format: 'der' }).toString('hex');
    expect(spki(a)).toBe(spki(b));
    expect(spki(a)).toBe(spki(ip));
    expect(a.serialNumber).not.toBe(b.serialNumber);
  });

  it('caches contexts, de-duplicates concurrent mints and stays bounded', async () => {
    const ca = await ensureCa(tmp());
    const events: { host: string; cached: boolean }[] = [];
    const minter = new LeafMinter(ca, { cacheSize: 2, onCert: (e) => events.push(e) });
    const [c1, c2, c3] = await Promise.all([minter.secureContext('a.test'), minter.secureContext('a.test'), minter.secureContext('a.test')]);
    expect(c1).toBe(c2);
    expect(c2).toBe(c3);
    expect(events.filter((e) => !e.cached)).toHaveLength(1);
    expect(await minter.secureContext('a.test')).toBe(c1);
    expect(events.at(-1)).toEqual({ host: 'a.test', cached: true });
    await minter.secureContext('b.test');
    await minter.secureContext('c.test');
    expect(minter.size).toBe(2);
    expect(await minter.secureContext('a.test')).not.toBe(c1); // evicted, re-minted
  });

  it('serves a TLS handshake that a client trusting only the CA accepts', async () => {
    const ca = await ensureCa(tmp());
    const minter = new LeafMinter(ca);
    const ctx = await minter.secureContext('svc.test');
    const server = tls.createServer({ SNICallback: (_n, cb) => cb(null, ctx) }, (s) => s.end('ok'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as { port: number }).port;
    try {
      const text = await new Promise<string>((resolve, reject) => {
        const s = tls.connect({ host: '127.0.0.1', port, servername: 'svc.test', ca: ca.certPem }, () => undefined);
        let buf = '';
        s.on('data', (d) => (buf += d));
        s.on('end', () => resolve(buf));
        s.on('error', reject);
      });
      expect(text).toBe('ok');
    } finally {
      server.close();
    }
  });
});

describe('on every supported Node', () => {
  // Node 24 deprecates KeyObject.from() of a non-extractable CryptoKey (DEP0204): converting the
  // CA key that way printed a warning in every proxy's output at its first leaf. A fresh process,
  // since a deprecation warning is printed once per process.
  it('loading the CA and minting leaves prints no warning', () => {
    const dir = tmp();
    const script = `
      const { ensureCa, LeafMinter } = await import(${JSON.stringify(pathToFileURL(path.join(REPO_ROOT, 'dist/certs/index.js')).href)});
      await ensureCa(${JSON.stringify(dir)});
      const minter = new LeafMinter(await ensureCa(${JSON.stringify(dir)}));
      await minter.certificatePem('api.example.com');
      await minter.certificatePem('127.0.0.1');
      process.stdout.write('minted');`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' });
    expect(r.stdout).toBe('minted');
    expect(r.stderr).toBe('');
  });
});

describe('sandbox env and bundle', () => {
  it('publishes proxy variables, NO_PROXY with loopback, CA paths and never the key', async () => {
    const dir = tmp();
    const ca = await ensureCa(dir);
    const bundle = path.join(dir, 'bundle.pem');
    writeCaBundle(ca.certPem, bundle);
    const env = sandboxEnv({ proxyUrl: 'http://proxy:8080', caCertPath: ca.certPath, bundlePath: bundle, noProxy: ['internal.example', '*.corp.example'] });
    expect(env.HTTPS_PROXY).toBe('http://proxy:8080');
    expect(env.http_proxy).toBe('http://proxy:8080');
    expect(env.NO_PROXY).toBe('internal.example,.corp.example,localhost,127.0.0.1,::1');
    expect(env.no_proxy).toBe(env.NO_PROXY);
    expect(env.NODE_EXTRA_CA_CERTS).toBe(ca.certPath);
    for (const k of ['SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO']) expect(env[k]).toBe(bundle);
    expect(JSON.stringify(env)).not.toContain('ca-key');
    const text = readFileSync(bundle, 'utf8');
    expect(text).toContain(ca.certPem.trim());
    expect(text).not.toContain('PRIVATE KEY');
    // The machine's own store (what SSL_CERT_FILE replaces in a client), then the CA.
    const store = SYSTEM_BUNDLES.find((f) => existsSync(f));
    const roots = store ? readFileSync(store, 'utf8').match(/BEGIN CERTIFICATE/g)!.length : tls.rootCertificates.length;
    expect(text.match(/BEGIN CERTIFICATE/g)!.length).toBe(roots + 1);
    expect(text.trim().endsWith(ca.certPem.trim())).toBe(true);
  });

  it('keeps what the operator added to the system store (an internal CA); Node\'s roots where no store file exists', async () => {
    const dir = tmp();
    const ca = await ensureCa(dir);
    const internal = await ensureCa(path.join(dir, 'internal'));
    // A system store of the OS's shape: some roots, and the operator's internal CA among them.
    const store = path.join(dir, 'ca-certificates.crt');
    writeFileSync(store, `${tls.rootCertificates.slice(0, 3).join('\n')}\n${internal.certPem.trim()}\n`);
    const withStore = caBundle(ca.certPem, ['/nonexistent/bundle.crt', store]);
    expect(withStore).toContain(internal.certPem.trim());
    expect(withStore.match(/BEGIN CERTIFICATE/g)!.length).toBe(5);
    const noStore = caBundle(ca.certPem, [path.join(dir, 'missing.crt')]);
    expect(noStore).not.toContain(internal.certPem.trim());
    expect(noStore.match(/BEGIN CERTIFICATE/g)!.length).toBe(tls.rootCertificates.length + 1);
    expect(noStore.trim().endsWith(ca.certPem.trim())).toBe(true);
  });
});
