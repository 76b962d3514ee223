import { EventEmitter } from 'node:events';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { createLogger, type Logger } from '../log.js';
import type { Ca } from '../certs/ca.js';
import { LeafMinter } from '../certs/leaf.js';
import type { CompiledConfig } from '../rules/compile.js';
import { formatAuthority, isIpLiteral, parseAuthority } from '../rules/host.js';
import { unwrapAddress } from '../rules/egress.js';
import { NodeBoundary, type DataPath } from './boundary.js';
import type { EgressHold, ProxyCore, TunnelTarget } from './context.js';
import { EgressDenied } from './egress.js';
import type { ProxyError } from './errors.js';
import type { Exchange } from './exchange.js';
import { serveFast } from './h1/connection.js';
import { intercept } from './intercept.js';
import { limitsFromTimeouts, resolveLimits, timeoutsOf, type ProxyLimits } from './limits.js';
import { createListener } from './listener.js';
import { createNodeExchange } from './node-exchange.js';
import type { H2Exchange } from './h2/exchange.js';
import { planIntercepted } from './plan.js';
import { Upstream } from './upstream.js';
import { isLocalAddress, isLoopback, LOOPBACK_NAMES } from './local-addresses.js';

export type { ProxyTimeouts } from './upstream.js';
export type { ProxyLimits } from './limits.js';
import type { ProxyTimeouts } from './upstream.js';
import { relayGcSetting } from './buffer-gc.js';
import { switchSetting } from '../settings.js';
export type { RequestRecord, TunnelRecord } from './context.js';

export interface ProxyOptions {
  listen: { host: string; port: number };
  ca: Ca;
  config: CompiledConfig;
  logger?: Logger;
  /** `host:port` -> address (curl's --resolve). Host as normalised (IPv6 in brackets or not). */
  resolve?: ReadonlyMap<string, string>;
  /** Extra PEM CAs for upstream TLS, on top of system roots and NODE_EXTRA_CA_CERTS. */
  upstreamCa?: string[];
  /** Older spelling of the timeout limits; `limits` wins where both are given. */
  timeouts?: Partial<ProxyTimeouts>;
  /** Sizes, counts and timeouts (src/proxy/limits.ts; defaults in DEFAULT_LIMITS). */
  limits?: Partial<ProxyLimits>;
  /** `host:port` targets never reachable through the proxy (e.g. the admin listener). */
  denyTargets?: string[];
  /** SecureContexts kept for intercepted hosts (same as limits.certCacheSize). */
  certCacheSize?: number;
  /**
   * Plain HTTP/1.1 exchanges inside intercepted tunnels take the strict fast path
   * (src/proxy/h1); everything else takes Node's HTTP server. Default: on, unless
   * KEYGATE_FAST_PATH=0.
   */
  fastPath?: boolean;
}

export interface ProxyHandle {
  host: string;
  port: number;
  /** `http://host:port`, what HTTPS_PROXY points at. */
  url: string;
  /** Swaps the configuration atomically: requests and tunnels already started keep theirs. */
  setConfig(config: CompiledConfig): void;
  getConfig(): CompiledConfig;
  /**
   * 'request', 'tunnel', 'tls_handshake', 'cert', 'upstream_error', 'client_error',
   * 'connection_refused', 'egress_denied', 'ca_expiry', 'fast_path_fallback'. Never header values.
   */
  events: EventEmitter;
  /** The limits in force. */
  readonly limits: Readonly<ProxyLimits>;
  /** Days until the proxy CA expires, and whether that is inside the warning window. */
  caExpiry(): { notAfter: string; daysLeft: number; warning: boolean };
  /** Adds a `host:port` the proxy must refuse to reach (an admin listener started later). */
  denyTarget(authority: string): void;
  /** Stops accepting, lets in-flight requests finish for up to graceMs, then cuts the rest. */
  close(graceMs?: number): Promise<void>;
}

/**
 * Starts the proxy: the data path of src/proxy/README.md, assembled. One listener for CONNECT
 * (blind tunnel or TLS interception per the rules) and absolute-form plain HTTP; intercepted
 * connections go to an exchange (the strict HTTP/1.1 fast path, or Node's HTTP server), and
 * every request of every exchange goes through the same plan step.
 */
export async function startProxy(opts: ProxyOptions): Promise<ProxyHandle> {
  const limits = resolveLimits(limitsFromTimeouts(opts.timeouts), { certCacheSize: opts.certCacheSize }, opts.limits);
  const timeouts: ProxyTimeouts = timeoutsOf(limits);
  const logger = opts.logger ?? createLogger({ name: 'keygate-proxy' });
  const events = new EventEmitter();
  let current = opts.config;
  let closing = false;
  const deny = new Set<string>();
  /**
   * Ports denied on every address of this host: a deny target named by a loopback or wildcard
   * address is a listener of this host, and one bound to 0.0.0.0 (the shipped image's API) answers
   * on 127.0.0.2 and on every interface address too, not only on the spelling it was denied as.
   */
  const denyLocalPorts = new Set<number>();
  let ownPort = 0;
  const listenHost = opts.listen.host;
  const addDeny = (authority: string) => {
    const { host, port } = parseAuthority(authority, undefined, 'configured');
    deny.add(formatAuthority(host, port));
    if (isLocalAddress(unwrapAddress(host))) denyLocalPorts.add(port);
  };
  for (const d of opts.denyTargets ?? []) addDeny(d);

  const listensEverywhere = opts.listen.host === '0.0.0.0' || opts.listen.host === '::' || opts.listen.host === '';
  /**
   * An address:port that is one of the proxy's own listeners (or a deny target): a loop, or the
   * admin API. This host's addresses are read at each such check (src/proxy/local-addresses.ts:
   * the kernel's tables too, since libuv leaves out interfaces without carrier).
   */
  const isSelf = (address: string, port: number) => {
    const a = unwrapAddress(address);
    if (deny.has(formatAuthority(a, port))) return true;
    if (denyLocalPorts.has(port) && isLocalAddress(a)) return true;
    if (port !== ownPort) return false;
    return isLoopback(a) || a === listenHost || (listensEverywhere && isLocalAddress(a));
  };
  const egressDenied = (host: string, port: number, kind: string, address?: string) => {
    events.emit('egress_denied', { host, port, kind, address });
    logger.warn({ type: 'egress_denied', host, port, kind, address }, 'egress policy refused a destination');
  };
  const upstream = new Upstream({
    resolve: opts.resolve,
    upstreamCa: opts.upstreamCa,
    timeouts,
    policy: () => current.egress,
    isSelf,
    onDenied: (e) => egressDenied(e.host, e.port, e.refusal.kind, e.address),
  });
  const minter = new LeafMinter(opts.ca, { cacheSize: limits.certCacheSize, onCert: (e) => events.emit('cert', e) });
  /** Long-lived channels the proxy cannot read into (ProxyCore.watchEgress), by client socket. */
  const egressHolds = new Map<Duplex, EgressHold>();
  const core: ProxyCore = {
    config: () => current,
    upstream,
    logger,
    events,
    timeouts,
    draining: () => closing,
    isDenied(host, port) {
      if (deny.has(formatAuthority(host, port))) return true;
      // The proxy itself, by any loopback spelling or the --resolve pin to it: a loop.
      const address = upstream.address(host, port);
      return port === ownPort && (LOOPBACK_NAMES.has(host) || LOOPBACK_NAMES.has(address) || address === listenHost || host === listenHost);
    },
    watchEgress(s, hold) {
      egressHolds.set(s, hold);
      s.once('close', () => egressHolds.delete(s));
    },
  };

  const tunnels = new WeakMap<Duplex, TunnelTarget>();
  const openSockets = new Set<Duplex>();
  const dp: DataPath = {
    core,
    limits,
    tunnels,
    track(s) {
      openSockets.add(s);
      s.once('close', () => openSockets.delete(s));
    },
    /**
     * Sockets the HTTP server hands over (CONNECT, upgrades) lose its idle clock: no byte either
     * way for idleTimeoutMs closes them. Traffic in either direction resets it, so a stream that
     * makes progress is never cut.
     */
    idleGuard(s) {
      const sock = s as Socket;
      if (typeof sock.setTimeout !== 'function') return;
      sock.setTimeout(limits.idleTimeoutMs);
      sock.on('timeout', () => sock.destroy());
    },
    reportRefusal<T>(planned: T | ProxyError): T | ProxyError {
      if (planned instanceof EgressDenied) egressDenied(planned.host, planned.port, planned.refusal.kind);
      return planned;
    },
    boundary: new NodeBoundary(core, limits, tunnels),
  };

  // ---- the exchanges, and the listener -------------------------------------------------------
  const node = createNodeExchange(dp);
  const fastPath = opts.fastPath ?? switchSetting(process.env, 'KEYGATE_FAST_PATH') !== false;
  // Read here, at start, so that a value it cannot use stops the command (not a relay, later).
  relayGcSetting();
  const fastOptions = {
    core,
    limits,
    plan: (facts: Parameters<typeof planIntercepted>[0], t: TunnelTarget, config: CompiledConfig) => dp.reportRefusal(planIntercepted(facts, t, config, limits)),
    fallback: node.adopt,
  };
  const fast: Exchange | undefined = fastPath ? { name: 'fast', serve: (socket, t) => serveFast(socket, t, fastOptions) } : undefined;
  const h2 = lazyH2Exchange(dp);
  const exchanges = { fast, node, h2 };
  const front = createListener(dp, (client, head, host, port, clientAddr) => void intercept(dp, minter, exchanges, client, head, host, port, clientAddr));

  await new Promise<void>((resolve, reject) => {
    front.once('error', reject);
    front.listen(opts.listen.port, opts.listen.host, () => {
      front.off('error', reject);
      resolve();
    });
  });
  const addr = front.address() as AddressInfo;
  ownPort = addr.port;
  const shownHost = isIpLiteral(addr.address) && addr.address.includes(':') ? `[${addr.address}]` : addr.address;

  const DAY = 24 * 3600_000;
  const caExpiry = () => {
    const daysLeft = Math.floor((opts.ca.notAfter.getTime() - Date.now()) / DAY);
    return { notAfter: opts.ca.notAfter.toISOString(), daysLeft, warning: daysLeft <= limits.caExpiryWarnDays };
  };
  // Checked at start and twice a day: a sidecar may run for months. Emitted after the caller
  // has had the handle (and a chance to subscribe).
  const checkCa = () => {
    const e = caExpiry();
    if (!e.warning) return;
    events.emit('ca_expiry', e);
    logger.warn(
      { type: 'ca_expiry', not_after: e.notAfter, days_left: e.daysLeft },
      e.daysLeft < 0 ? 'the proxy CA has expired: intercepted hosts fail until a new CA is created and trusted' : `the proxy CA expires in ${e.daysLeft} days: create a new one and distribute it to sandboxes before then`,
    );
  };
  const caTimer = setInterval(checkCa, 12 * 3600_000).unref();
  setImmediate(checkCa);

  /**
   * A blind tunnel or a spliced WebSocket carries bytes the proxy does not read, for as long as
   * both ends keep it open: the only way a new egress policy that denies its destination (name,
   * port or address) can apply to it is to end it. Intercepted connections meet the new policy at
   * their next request instead (each request is planned again).
   */
  const closeDeniedTunnels = (config: CompiledConfig) => {
    for (const hold of [...egressHolds.values()]) {
      const refusal = config.egress.checkConnection(hold.host, hold.port, hold.address);
      if (!refusal) continue;
      egressDenied(hold.host, hold.port, refusal.kind, hold.address);
      hold.close('closed: the egress policy now refuses this destination');
    }
  };

  let closed: Promise<void> | undefined;
  return {
    limits,
    caExpiry,
    host: addr.address,
    port: addr.port,
    url: `http://${shownHost}:${addr.port}`,
    events,
    setConfig(config: CompiledConfig) {
      const policyChanged = config.egress.key !== current.egress.key;
      current = config;
      // Pooled upstream connections were checked against the old policy: new requests get new ones.
      if (policyChanged) {
        upstream.renewPool();
        closeDeniedTunnels(config);
      }
    },
    getConfig: () => current,
    denyTarget: addDeny,
    close(graceMs = 10_000) {
      closed ??= (async () => {
        closing = true;
        clearInterval(caTimer);
        const stopped = new Promise<void>((r) => front.close(() => r()));
        front.closeIdleConnections();
        for (const s of openSockets) {
          const t = tunnels.get(s);
          if (t && t.inFlight === 0) s.destroy();
        }
        const deadline = Date.now() + graceMs;
        while (openSockets.size > 0 && Date.now() < deadline) {
          front.closeIdleConnections();
          await new Promise((r) => setTimeout(r, 50));
        }
        for (const s of openSockets) s.destroy();
        await stopped;
        node.close();
        h2.close();
        await upstream.close();
      })();
      return closed;
    },
  };
}

/**
 * The HTTP/2 exchange, loaded with the first intercepted connection whose client chose h2.
 * node:http2 and the exchange are about 0.9 MiB of a sidecar's idle memory on Node 24 (0.4 on
 * Node 20; bench/README.md), and many sidecars never see an h2 client. That first connection
 * waits for the import (a few ms, once per process); what its client sends meanwhile stays in
 * the TLS socket's buffer, which Node's http2 session reads first. A connection gone meanwhile,
 * or a proxy closing, is not served. test/cli/proxy-imports.test.ts checks an h1-only proxy
 * never loads node:http2.
 */
function lazyH2Exchange(dp: DataPath): Exchange & { close(): void } {
  let h2: H2Exchange | undefined;
  let loading: Promise<H2Exchange> | undefined;
  let closed = false;
  return {
    name: 'h2',
    serve(socket, t) {
      if (h2) return h2.serve(socket, t);
      loading ??= import('./h2/exchange.js').then((m) => (h2 = m.createH2Exchange(dp)));
      loading.then(
        (x) => {
          if (closed || socket.destroyed) socket.destroy();
          else x.serve(socket, t);
        },
        (err: unknown) => {
          dp.core.logger.error({ err }, 'the HTTP/2 exchange could not be loaded');
          socket.destroy();
        },
      );
    },
    close() {
      closed = true;
      h2?.close();
    },
  };
}
