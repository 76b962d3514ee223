import { execFile } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import tls from 'node:tls';
import { promisify } from 'node:util';

export interface SandboxEnvOptions {
  /** e.g. `http://keygate-proxy:8080`. */
  proxyUrl: string;
  /** The proxy CA certificate (PEM), added to Node's trust by NODE_EXTRA_CA_CERTS. */
  caCertPath: string;
  /** System roots + proxy CA: for tools whose variables replace the trust store. */
  bundlePath: string;
  /** Config-level no_proxy entries. */
  noProxy?: readonly string[];
  /**
   * A PKCS12 truststore (system roots + CA, password `changeit`) for Java, which ignores
   * HTTPS_PROXY and PEM bundles; JAVA_TOOL_OPTIONS is set only when one is given.
   */
  javaTrustStorePath?: string;
}

/** Where the proxy CA and the bundle are inside a box (sandbox.md, property 3). */
export const BOX_CA_PATH = '/etc/keygate/ca.pem';
export const BOX_BUNDLE_PATH = '/etc/keygate/ca-bundle.pem';
/** The Java truststore inside a box (PKCS12, see writeJavaTrustStore). */
export const BOX_TRUSTSTORE_PATH = '/etc/keygate/truststore.p12';
/** The box's proxy as the box sees it: a relay in its network namespace (sandbox.md, property 1). */
export const BOX_PROXY_URL = 'http://127.0.0.1:3128';
export const JAVA_TRUSTSTORE_PASSWORD = 'changeit';

const LOOPBACK = ['localhost', '127.0.0.1', '::1'];

/** `*.example.com` -> `.example.com`: the suffix form curl, Python and undici understand. */
function noProxyEntry(pattern: string): string {
  return pattern.startsWith('*.') ? pattern.slice(1) : pattern;
}

/** `-Dhttp.nonProxyHosts` form of NO_PROXY: `|`-separated, `*.suffix` wildcards. */
function javaNonProxyHosts(entries: string[]): string {
  return entries.map((e) => (e.startsWith('.') ? `*${e}` : e)).join('|');
}

function javaToolOptions(proxy: URL, trustStore: string, noProxy: string[]): string {
  const port = proxy.port || '80';
  return [
    `-Dhttp.proxyHost=${proxy.hostname}`,
    `-Dhttp.proxyPort=${port}`,
    `-Dhttps.proxyHost=${proxy.hostname}`,
    `-Dhttps.proxyPort=${port}`,
    `-Dhttp.nonProxyHosts=${javaNonProxyHosts(noProxy)}`,
    `-Djavax.net.ssl.trustStore=${trustStore}`,
    '-Djavax.net.ssl.trustStoreType=PKCS12',
    `-Djavax.net.ssl.trustStorePassword=${JAVA_TRUSTSTORE_PASSWORD}`,
  ].join(' ');
}

/**
 * The environment a sandbox needs to go out through the proxy and trust it, for every common
 * client with no extra step (docs/clients.md says which variable serves which client). Only
 * public material: the CA certificate, never its key.
 */
export function sandboxEnv(opts: SandboxEnvOptions): Record<string, string> {
  const noProxyList = [...new Set([...(opts.noProxy ?? []).map(noProxyEntry), ...LOOPBACK])];
  const noProxy = noProxyList.join(',');
  const java: Record<string, string> = opts.javaTrustStorePath ? { JAVA_TOOL_OPTIONS: javaToolOptions(new URL(opts.proxyUrl), opts.javaTrustStorePath, noProxyList) } : {};
  return {
    HTTPS_PROXY: opts.proxyUrl,
    HTTP_PROXY: opts.proxyUrl,
    https_proxy: opts.proxyUrl,
    http_proxy: opts.proxyUrl,
    NO_PROXY: noProxy,
    no_proxy: noProxy,
    NODE_EXTRA_CA_CERTS: opts.caCertPath,
    SSL_CERT_FILE: opts.bundlePath,
    REQUESTS_CA_BUNDLE: opts.bundlePath,
    CURL_CA_BUNDLE: opts.bundlePath,
    GIT_SSL_CAINFO: opts.bundlePath,
    // An npmrc `cafile` (npm's own default too) replaces NODE_EXTRA_CA_CERTS for npm's requests.
    NPM_CONFIG_CAFILE: opts.bundlePath,
    // aiohttp's WebSocket client reads these, not HTTPS_PROXY.
    WSS_PROXY: opts.proxyUrl,
    WS_PROXY: opts.proxyUrl,
    // Node >= 22.21 / 24: fetch and http(s) honour HTTPS_PROXY with this (Node 20 needs EnvHttpProxyAgent).
    NODE_USE_ENV_PROXY: '1',
    ...java,
  };
}

/**
 * Where operating systems keep their trust store as one PEM file (Debian and Ubuntu, Fedora and
 * RHEL, Alpine and the BSDs, openSUSE). The first that exists is "the system roots".
 */
export const SYSTEM_BUNDLES = ['/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt', '/etc/ssl/cert.pem', '/etc/ssl/ca-bundle.pem'];

const systemRootsCache = new Map<string, string>();

/**
 * The machine's own trust store, as PEM: what a client's SSL_CERT_FILE replaces, so the bundle
 * must keep it, including the CAs an operator added to it (an internal CA for the hosts a box
 * reaches through a blind tunnel). Node's built-in roots where no store file exists.
 */
export function systemRootsPem(candidates: readonly string[] = SYSTEM_BUNDLES): string {
  const key = candidates.join('\0');
  let pem = systemRootsCache.get(key);
  if (pem === undefined) {
    const file = candidates.find((f) => {
      try {
        return statSync(f).isFile();
      } catch {
        return false;
      }
    });
    const text = file ? readFileSync(file, 'utf8') : '';
    pem = text.includes('-----BEGIN CERTIFICATE-----') ? text.trim() : tls.rootCertificates.join('\n');
    systemRootsCache.set(key, pem);
  }
  return pem;
}

/** The system roots plus the proxy CA, as one PEM bundle. */
export function caBundle(caPem: string, candidates: readonly string[] = SYSTEM_BUNDLES): string {
  return `${systemRootsPem(candidates)}\n${caPem.trim()}\n`;
}

/** Writes the bundle atomically (readable by everyone: it holds only certificates). */
export function writeCaBundle(caPem: string, file: string): void {
  mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, caBundle(caPem), { mode: 0o644 });
  renameSync(tmp, file);
}

/** The JDK's own roots: Debian's shared store, else the keytool's JDK's. */
function javaRoots(keytool: string): string | undefined {
  const candidates = ['/etc/ssl/certs/java/cacerts', path.join(path.dirname(path.dirname(keytool)), 'lib', 'security', 'cacerts')];
  return candidates.find((f) => existsSync(f));
}

/** keytool on PATH (resolved through symlinks, to find its JDK), or undefined. */
export function findKeytool(env: NodeJS.ProcessEnv = process.env): string | undefined {
  for (const dir of (env.PATH ?? '').split(path.delimiter).filter(Boolean)) {
    const f = path.join(dir, 'keytool');
    if (existsSync(f)) return realpathSync(f);
  }
  return undefined;
}

/**
 * Java ignores HTTPS_PROXY and PEM bundles: writes a PKCS12 truststore (the JDK's roots plus the
 * proxy CA, password `changeit`, public material only) atomically. Resolves false when no keytool
 * is installed (the caller then leaves JAVA_TOOL_OPTIONS out and says so). keytool is a JVM
 * started twice (a second or two): it runs without holding up the event loop.
 */
export async function writeJavaTrustStore(caPem: string, file: string, keytool = findKeytool()): Promise<boolean> {
  if (!keytool) return false;
  const roots = javaRoots(keytool);
  const dir = mkdtempSync(path.join(path.dirname(path.resolve(file)), '.truststore-'));
  try {
    const tmp = path.join(dir, 'store.p12');
    const ca = path.join(dir, 'ca.pem');
    writeFileSync(ca, caPem);
    const pass = JAVA_TRUSTSTORE_PASSWORD;
    const run = (args: string[]) => promisify(execFile)(keytool, args, { timeout: 60_000 });
    if (roots) await run(['-importkeystore', '-noprompt', '-srckeystore', roots, '-srcstorepass', pass, '-destkeystore', tmp, '-deststoretype', 'PKCS12', '-deststorepass', pass]);
    await run(['-importcert', '-noprompt', '-alias', 'keygate-proxy-ca', '-file', ca, '-keystore', tmp, '-storetype', 'PKCS12', '-storepass', pass]);
    chmodSync(tmp, 0o644);
    renameSync(tmp, file);
    return true;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
