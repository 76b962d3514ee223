import { readFileSync } from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { createRequire } from 'node:module';
import type * as Undici from 'undici';
import { formatAuthority } from '../rules/host.js';
import type { EgressPolicy } from '../rules/egress.js';
import { EgressDenied, resolveAllowed } from './egress.js';

const requireCjs = createRequire(import.meta.url);
/**
 * undici's index also loads fetch, WebSocket, EventSource, caches and mocks (about 8 MiB resident
 * in every sidecar); the proxy needs only the Agent and its TLS connector. Falls back to the
 * index if a future undici moves these files.
 */
function undiciPart<T>(file: string, name: 'Agent' | 'buildConnector'): T {
  try {
    return requireCjs(`undici/lib/${file}`) as T;
  } catch {
    return (requireCjs('undici') as Record<string, unknown>)[name] as T;
  }
}
const Agent = undiciPart<typeof Undici.Agent>('dispatcher/agent.js', 'Agent');
type Agent = Undici.Agent;
const buildConnector = undiciPart<typeof Undici.buildConnector>('core/connect.js', 'buildConnector');

export interface ProxyTimeouts {
  /** TCP + TLS connect to an upstream. */
  connectMs: number;
  /** Upstream response headers after the request was sent. */
  headersMs: number;
  /** Silence between two chunks of an upstream response body. */
  bodyMs: number;
  /** Client TLS handshake inside an intercepted tunnel. */
  tlsHandshakeMs: number;
  /** Client request headers (slow-loris guard). */
  clientHeadersMs: number;
  /** Idle keep-alive connections, both sides. */
  keepAliveMs: number;
}

export const DEFAULT_TIMEOUTS: ProxyTimeouts = {
  connectMs: 10_000,
  headersMs: 300_000,
  bodyMs: 300_000,
  tlsHandshakeMs: 10_000,
  clientHeadersMs: 30_000,
  keepAliveMs: 30_000,
};

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** Certificates from NODE_EXTRA_CA_CERTS (Node adds them to its default store, not to tls.rootCertificates). */
export function extraCaFromEnv(env: NodeJS.ProcessEnv = process.env): string[] {
  const file = env.NODE_EXTRA_CA_CERTS;
  if (!file) return [];
  try {
    return readFileSync(file, 'utf8').match(PEM_CERT) ?? [];
  } catch {
    return [];
  }
}

export interface UpstreamOptions {
  /** `host:port` -> address, like curl's --resolve. Keys use normalised hosts (IPv6 without brackets). */
  resolve?: ReadonlyMap<string, string>;
  /** Extra PEM CAs trusted for upstream TLS, on top of the system roots and NODE_EXTRA_CA_CERTS. */
  upstreamCa?: string[];
  timeouts: ProxyTimeouts;
  /** The egress policy in force now (checked on every new upstream connection). */
  policy?: () => EgressPolicy;
  /** True for an address:port that is one of the proxy's own listeners. */
  isSelf?: (address: string, port: number) => boolean;
  /** Told about every refusal (events, log). */
  onDenied?: (e: EgressDenied) => void;
}

/**
 * Everything that talks to upstreams: one undici Agent (a keep-alive pool per origin) whose TLS
 * always verifies against one shared trust store (built once: parsing the roots per connection
 * would dominate connect cost), and the address map for --resolve.
 */
export class Upstream {
  #agent: Agent;
  readonly secureContext: tls.SecureContext;
  private readonly resolveMap: ReadonlyMap<string, string>;
  private readonly connector: Undici.buildConnector.connector;

  constructor(private readonly opts: UpstreamOptions) {
    this.resolveMap = opts.resolve ?? new Map();
    const ca = [...tls.rootCertificates, ...extraCaFromEnv(), ...(opts.upstreamCa ?? []).flatMap((p) => p.match(PEM_CERT) ?? [])];
    this.secureContext = tls.createSecureContext({ ca, minVersion: 'TLSv1.2' });
    const base = buildConnector({
      secureContext: this.secureContext,
      rejectUnauthorized: true,
      timeout: opts.timeouts.connectMs,
    } as Undici.buildConnector.BuildOptions);
    this.connector = (o, cb) => {
      const hostname = o.hostname.startsWith('[') ? o.hostname.slice(1, -1) : o.hostname;
      const port = Number(o.port) || (o.protocol === 'https:' ? 443 : 80);
      // Resolved once and checked against the egress policy; the connection goes to exactly that
      // address (no second lookup a rebinding DNS server could answer differently). `host`
      // keeps the name, so undici still sends SNI and verifies the certificate for it.
      this.dialAddress(hostname, port).then(
        (address) => base({ ...o, hostname: address }, cb),
        (err: Error) => cb(err, null),
      );
    };
    this.#agent = this.newAgent();
  }

  private newAgent(): Agent {
    const opts = this.opts;
    return new Agent({
      connect: this.connector,
      keepAliveTimeout: opts.timeouts.keepAliveMs,
      keepAliveMaxTimeout: 10 * 60_000,
      headersTimeout: opts.timeouts.headersMs,
      bodyTimeout: opts.timeouts.bodyMs,
      pipelining: 1,
    });
  }

  /** The pool requests go through. */
  get agent(): Agent {
    return this.#agent;
  }

  /**
   * Starts a fresh pool (the egress policy changed: connections opened under the old one must
   * not carry new requests). The old pool finishes what it has in flight, then closes.
   */
  renewPool(): void {
    const old = this.#agent;
    this.#agent = this.newAgent();
    void old.close().catch(() => undefined);
  }

  /**
   * The one address to dial for host:port: the --resolve pin, the literal, or the first DNS
   * answer, after every answer passed the egress policy and none is the proxy itself. Rejects
   * with an EgressDenied (a ProxyError, 403) or the DNS error.
   */
  dialAddress(host: string, port: number): Promise<string> {
    const pinned = this.resolveMap.get(formatAuthority(host, port)) ?? this.resolveMap.get(`${host}:${port}`);
    const p = resolveAllowed(host, port, { pinned, policy: this.opts.policy?.(), isSelf: this.opts.isSelf, timeoutMs: this.opts.timeouts.connectMs });
    if (this.opts.onDenied) p.catch((err: unknown) => err instanceof EgressDenied && this.opts.onDenied!(err));
    return p;
  }

  /** The address to dial for host:port (the --resolve pin, else the name itself). */
  address(host: string, port: number): string {
    return this.resolveMap.get(formatAuthority(host, port)) ?? this.resolveMap.get(`${host}:${port}`) ?? host;
  }

  /** A plain TCP connection (blind tunnels) to `address` (from dialAddress). */
  connectTcp(host: string, port: number, address = this.address(host, port)): net.Socket {
    return net.connect({ host: address, port });
  }

  /** A verified TLS connection (WebSocket upgrades) to `address`, SNI and certificate checked for `host`. */
  connectTls(host: string, port: number, address = this.address(host, port)): tls.TLSSocket {
    return tls.connect({
      host: address,
      port,
      servername: net.isIP(host) ? undefined : host,
      secureContext: this.secureContext,
      rejectUnauthorized: true,
      ALPNProtocols: ['http/1.1'],
      // With an address dialled for a name, verify the name, not the address.
      checkServerIdentity: (_h, cert) => tls.checkServerIdentity(host, cert),
    });
  }

  async close(): Promise<void> {
    await this.#agent.close().catch(() => undefined);
  }

  destroy(): void {
    void this.#agent.destroy().catch(() => undefined);
  }
}
