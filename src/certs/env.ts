import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import tls from 'node:tls';

export interface SandboxEnvOptions {
  /** e.g. `http://keygate-proxy:8080`. */
  proxyUrl: string;
  /** The proxy CA certificate (PEM), added to Node's trust by NODE_EXTRA_CA_CERTS. */
  caCertPath: string;
  /** System roots + proxy CA: for tools whose variables replace the trust store. */
  bundlePath: string;
  /** Config-level no_proxy entries. */
  noProxy?: readonly string[];
}

const LOOPBACK = ['localhost', '127.0.0.1', '::1'];

/** `*.example.com` -> `.example.com`: the suffix form curl, Python and undici understand. */
function noProxyEntry(pattern: string): string {
  return pattern.startsWith('*.') ? pattern.slice(1) : pattern;
}

/**
 * The environment a sandbox needs to go out through the proxy and trust it. Only public
 * material: the CA certificate, never its key.
 */
export function sandboxEnv(opts: SandboxEnvOptions): Record<string, string> {
  const noProxy = [...new Set([...(opts.noProxy ?? []).map(noProxyEntry), ...LOOPBACK])].join(',');
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
  };
}

/** The system roots Node trusts plus the proxy CA, as one PEM bundle. */
export function caBundle(caPem: string): string {
  return [...tls.rootCertificates, caPem.trim()].join('\n') + '\n';
}

/** Writes the bundle atomically (readable by everyone: it holds only certificates). */
export function writeCaBundle(caPem: string, file: string): void {
  mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, caBundle(caPem), { mode: 0o644 });
  renameSync(tmp, file);
}
