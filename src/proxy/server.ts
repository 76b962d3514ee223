import { EventEmitter } from 'node:events';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import os from 'node:os';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { createLogger, type Logger } from '../log.js';
import type { Ca } from '../certs/ca.js';
import { LeafMinter } from '../certs/leaf.js';
import type { CompiledConfig } from '../rules/compile.js';
import { formatAuthority, isIpLiteral, parseAuthority } from '../rules/host.js';
import type { ProxyCore, TunnelTarget } from './context.js';
import { chunkExtensionsTooLarge, headTimeout, internal, malformed, overloaded, ProxyError, reflecting, refused, shuttingDown, writeRawError } from './errors.js';
import { forward, refuse } from './forward.js';
import { finishRecord, newRecord, refusedPath } from './record.js';
import { CONNECT_OK, openTunnel } from './tunnel.js';
import { EgressDenied } from './egress.js';
import { unwrapAddress } from '../rules/egress.js';
import { Upstream } from './upstream.js';
import { HeadLines, limitsFromTimeouts, resolveLimits, timeoutsOf, type ProxyLimits } from './limits.js';
import { connectTarget, planIntercepted, planPlain, type RequestFacts } from './plan.js';
import { refuseUpgrade, relayUpgrade } from './websocket.js';
import { serveFast, type FastPathOptions } from './h1/connection.js';

export type { ProxyTimeouts } from './upstream.js';
export type { ProxyLimits } from './limits.js';
import type { ProxyTimeouts } from './upstream.js';
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

/** The first bytes a client sends, or undefined if it closes or stays silent. */
function firstChunk(socket: Socket, timeoutMs: number): Promise<Buffer | undefined> {
  return new Promise((resolve) => {
    const done = (chunk?: Buffer) => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.pause();
      resolve(chunk);
    };
    const onData = (chunk: Buffer) => done(chunk);
    const onClose = () => done(undefined);
    const timer = setTimeout(() => done(undefined), timeoutMs);
    socket.on('data', onData);
    socket.once('close', onClose);
  });
}

const LOOPBACK_NAMES = new Set(['localhost', '127.0.0.1', '::1', '0.0.0.0', '::']);

function clientOf(socket: Socket): string {
  return socket.remoteAddress ? formatAuthority(socket.remoteAddress.replace(/^::ffff:/, ''), socket.remotePort ?? 0) : 'unknown';
}

/**
 * A request the proxy refuses closes its connection: after a framing or size error the
 * connection's framing cannot be trusted, and after a refusal of the request's target, method
 * or destination nothing pipelined behind it is acted on either (RFC 9110 15.5.20: a 421 is
 * retried on another connection anyway).
 */
const REFUSAL_CLOSES = true;

/** What the plan step needs of a request Node's parser read. */
function factsOf(req: IncomingMessage): RequestFacts {
  return { method: req.method ?? '', target: req.url ?? '', version: req.httpVersionMajor * 10 + req.httpVersionMinor, rawHeaders: req.rawHeaders };
}

/** Options for both HTTP servers: the parser strict whatever NODE_OPTIONS says, sizes and clocks from the limits. */
function serverOptions(l: ProxyLimits): http.ServerOptions {
  return {
    insecureHTTPParser: false,
    // Node would answer a missing Host itself, outside the proxy's checks (no Proxy-Status, and a
    // request pipelined behind it would still be acted on): the checks answer it instead.
    requireHostHeader: false,
    maxHeaderSize: l.maxHeaderBytes,
    requestTimeout: 0, // uploads and streams may be long: only idle clocks apply to them
    headersTimeout: l.headerTimeoutMs,
    keepAliveTimeout: l.keepAliveTimeoutMs,
    // Node checks head timeouts on this interval: a quarter of the timeout keeps the answer close to it.
    connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(l.headerTimeoutMs / 4))),
  };
}

/** The answer to a request Node's parser refused (or timed out). */
function clientErrorResponse(err: NodeJS.ErrnoException & { rawPacket?: Buffer; bytesParsed?: number }, l: ProxyLimits, lines: HeadLines | undefined): ProxyError {
  switch (err.code) {
    case 'HPE_HEADER_OVERFLOW':
      return (lines ?? new HeadLines()).answer(l, err.rawPacket, err.bytesParsed);
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return headTimeout();
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return chunkExtensionsTooLarge();
    default:
      return malformed(`malformed HTTP request (${/^HPE_[A-Z_]+$/.test(err.code ?? '') ? err.code : 'parse error'})`);
  }
}

/**
 * Starts the proxy: one listener for CONNECT (blind tunnel or TLS interception per the rules)
 * and absolute-form plain HTTP. Intercepted TLS connections are fed to an internal HTTP server
 * that never listens, so the same parser handles requests, keep-alive and upgrades.
 */
export async function startProxy(opts: ProxyOptions): Promise<ProxyHandle> {
  const limits = resolveLimits(limitsFromTimeouts(opts.timeouts), { certCacheSize: opts.certCacheSize }, opts.limits);
  const timeouts: ProxyTimeouts = timeoutsOf(limits);
  const logger = opts.logger ?? createLogger({ name: 'keygate-proxy' });
  const events = new EventEmitter();
  let current = opts.config;
  let closing = false;
  const deny = new Set<string>();
  let ownPort = 0;
  const addDeny = (authority: string) => {
    const { host, port } = parseAuthority(authority, undefined);
    deny.add(formatAuthority(host, port));
  };
  for (const d of opts.denyTargets ?? []) addDeny(d);

  const localAddresses = new Set<string>();
  if (opts.listen.host === '0.0.0.0' || opts.listen.host === '::' || opts.listen.host === '') {
    for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) localAddresses.add(a.address.toLowerCase());
  }
  /** An address:port that is one of the proxy's own listeners (or a deny target): a loop, or the admin API. */
  const isSelf = (address: string, port: number) => {
    const a = unwrapAddress(address);
    if (deny.has(formatAuthority(a, port))) return true;
    if (port !== ownPort) return false;
    return LOOPBACK_NAMES.has(a) || a.startsWith('127.') || a === listenHost || localAddresses.has(a);
  };
  const upstream = new Upstream({
    resolve: opts.resolve,
    upstreamCa: opts.upstreamCa,
    timeouts,
    policy: () => current.egress,
    isSelf,
    onDenied: (e) => egressDenied(e.host, e.port, e.refusal.kind, e.address),
  });
  const egressDenied = (host: string, port: number, kind: string, address?: string) => {
    events.emit('egress_denied', { host, port, kind, address });
    logger.warn({ type: 'egress_denied', host, port, kind, address }, 'egress policy refused a destination');
  };
  /** The name-level egress check (ports, host lists, address literals), before any DNS. */
  /** The plan step's refusals are values: an egress refusal among them is logged and emitted here. */
  const reportRefusal = <T>(planned: T | ProxyError): T | ProxyError => {
    if (planned instanceof EgressDenied) egressDenied(planned.host, planned.port, planned.refusal.kind);
    return planned;
  };
  const minter = new LeafMinter(opts.ca, { cacheSize: limits.certCacheSize, onCert: (e) => events.emit('cert', e) });
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
  };
  const listenHost = opts.listen.host;

  const tunnels = new WeakMap<Duplex, TunnelTarget>();
  const openSockets = new Set<Duplex>();
  const track = (s: Duplex) => {
    openSockets.add(s);
    s.once('close', () => openSockets.delete(s));
  };
  /**
   * Sockets the HTTP server hands over (CONNECT, upgrades) lose its idle clock: no byte either
   * way for idleTimeoutMs closes them. Traffic in either direction resets it, so a stream that
   * makes progress is never cut.
   */
  const idleGuard = (s: Duplex) => {
    const sock = s as Socket;
    if (typeof sock.setTimeout !== 'function') return;
    sock.setTimeout(limits.idleTimeoutMs);
    sock.on('timeout', () => sock.destroy());
  };

  // ---- intercepted requests -------------------------------------------------------------
  const inner = http.createServer(serverOptions(limits));
  inner.timeout = limits.idleTimeoutMs;
  // The inner server never listens, and Node starts its head-timeout clock (slow-loris guard) on
  // 'listening': start it by hand, stopped again in close().
  inner.emit('listening');

  inner.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const started = performance.now();
    const t = tunnels.get(req.socket);
    if (!t || answered.has(req.socket)) {
      res.destroy();
      return;
    }
    const config = current; // one snapshot for the whole request
    const rec = newRecord(req.method ?? '', { client: t.client, host: t.host, port: t.port, decision: 'intercept' }, '');
    t.inFlight++;
    res.once('close', () => {
      t.inFlight--;
      if (closing && t.inFlight === 0) req.socket.end();
    });
    if (closing) res.shouldKeepAlive = false;
    const checked = reportRefusal(planIntercepted(factsOf(req), t, config, limits));
    if (checked instanceof ProxyError) {
      rec.path = refusedPath(req.url ?? '');
      req.resume();
      // Answered and closing: a request pipelined behind this one is never acted on.
      answered.add(req.socket);
      refuse(core, res, rec, started, checked, REFUSAL_CLOSES);
      return;
    }
    rec.path = checked.path;
    void forward(core, req, res, { scheme: 'https', host: t.host, port: t.port, pathAndQuery: checked.pathAndQuery, logPath: checked.path, decision: 'intercept', rule: checked.rule, client: t.client }, rec, started);
  });

  inner.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    const t = tunnels.get(socket);
    stopFollowing(socket);
    if (!t || answered.has(socket)) {
      closeAfterAnswer(socket);
      return;
    }
    const base = { client: t.client, host: t.host, port: t.port, decision: 'intercept' as const };
    const path = refusedPath(req.url ?? '');
    if (req.method === 'TRACE') {
      refuseUpgrade(core, req, socket, base, path, reflecting());
      return;
    }
    if (String(req.headers.upgrade).toLowerCase() !== 'websocket') {
      refuseUpgrade(core, req, socket, base, path, malformed('only WebSocket upgrades are supported'));
      return;
    }
    const checked = reportRefusal(planIntercepted(factsOf(req), t, current, limits));
    if (checked instanceof ProxyError) {
      refuseUpgrade(core, req, socket, base, path, checked);
      return;
    }
    idleGuard(socket);
    relayUpgrade(core, req, socket, head, { scheme: 'https', ...base, pathAndQuery: checked.pathAndQuery, logPath: checked.path, rule: checked.rule });
  });

  /**
   * Connections the proxy answered with a closing error (a parse error, a head timeout):
   * writeRawError only half-closes them, and Node's parser, which is not in an error state after
   * a timeout, would go on reading; nothing they send from then on is acted on.
   */
  const answered = new WeakSet<Duplex>();
  /** A socket handed over (CONNECT, upgrade) after the proxy's closing answer: closed once that answer is out. */
  const closeAfterAnswer = (socket: Duplex) => {
    const s = socket as Socket;
    if (typeof s.destroySoon === 'function') s.destroySoon();
    else socket.destroy();
  };
  /** The lines of each connection's heads, for a segmentation-independent 414 or 431 (HeadLines). */
  const lines = new WeakMap<Duplex, { lines: HeadLines; listener: (chunk: Buffer) => void }>();
  const follow = (socket: Duplex) => {
    const l = new HeadLines();
    const listener = (chunk: Buffer) => l.feed(chunk);
    lines.set(socket, { lines: l, listener });
    socket.on('data', listener);
  };
  const stopFollowing = (socket: Duplex) => {
    const l = lines.get(socket);
    if (!l) return;
    socket.off('data', l.listener);
    lines.delete(socket);
  };
  inner.on('connection', follow);
  const onClientError = (err: NodeJS.ErrnoException & { rawPacket?: Buffer; bytesParsed?: number }, socket: Duplex) => {
    // Node's parser reports its error again for every chunk that follows: the first answer stands
    // (destroying the socket here would drop that answer before it is flushed).
    if (answered.has(socket)) return;
    if (err.code === 'ECONNRESET' || !socket.writable) return socket.destroy();
    answered.add(socket);
    const perr = clientErrorResponse(err, limits, lines.get(socket)?.lines);
    const client = tunnels.get(socket)?.client ?? clientOf(socket as Socket);
    events.emit('client_error', { client, code: err.code ?? 'UNKNOWN', status: perr.status });
    logger.info({ type: 'client_error', client, code: err.code, status: perr.status }, 'refused a request the parser rejected');
    writeRawError(socket, perr);
  };
  inner.on('clientError', onClientError);
  // CONNECT inside an intercepted tunnel: a tunnel in a tunnel is never opened (Node would only drop the connection).
  inner.on('connect', (req: IncomingMessage, socket: Duplex) => {
    const t = tunnels.get(socket);
    stopFollowing(socket);
    if (!t || answered.has(socket)) {
      closeAfterAnswer(socket);
      return;
    }
    refuseUpgrade(core, req, socket, { client: t.client, host: t.host, port: t.port, decision: 'intercept' }, '', malformed('CONNECT is not accepted inside a tunnel'));
  });

  const fastPath = opts.fastPath ?? process.env.KEYGATE_FAST_PATH !== '0';
  const fast: FastPathOptions = {
    core,
    limits,
    plan: (facts, t, config) => reportRefusal(planIntercepted(facts, t, config, limits)),
    fallback(socket, bytes) {
      inner.emit('connection', socket);
      // The server now reads the socket; the bytes already read go to its parser first.
      if (bytes.length) socket.emit('data', bytes);
      socket.resume();
    },
  };

  async function intercept(client: Socket, head: Buffer, host: string, port: number, clientAddr: string): Promise<void> {
    // The upstream handshake (for an origin with no connection open) overlaps the client's.
    upstream.prewarm(host, port);
    let ctx: tls.SecureContext;
    try {
      ctx = await minter.secureContext(host);
    } catch (err) {
      logger.error({ host, err: (err as Error).message }, 'certificate minting failed');
      writeRawError(client, internal('cannot issue a certificate for this host'));
      return;
    }
    if (client.destroyed) return;
    client.write(CONNECT_OK);
    // The first byte tells TLS (a handshake record, 0x16) from cleartext HTTP sent through the
    // tunnel (what some clients do for http:// URLs). Cleartext to a rule host is refused.
    const first = head.length ? head : await firstChunk(client, timeouts.tlsHandshakeMs);
    if (!first) {
      client.destroy();
      return;
    }
    client.unshift(first);
    if (first[0] !== 0x16) {
      refusePlaintextInTunnel(client, first, host, port, clientAddr);
      return;
    }
    const tlsSocket = new tls.TLSSocket(client, { isServer: true, secureContext: ctx, ALPNProtocols: ['http/1.1'] });
    tunnels.set(tlsSocket, { host, port, authority: formatAuthority(host, port), client: clientAddr, inFlight: 0 });
    track(tlsSocket);
    let secured = false;
    const handshakeTimer = setTimeout(() => tlsSocket.destroy(), timeouts.tlsHandshakeMs);
    tlsSocket.once('secure', () => {
      secured = true;
      clearTimeout(handshakeTimer);
      // From here the inner server's idle clock (on the TLS socket) applies, request-aware.
      client.setTimeout(0);
      events.emit('tls_handshake', { host, ok: true });
    });
    tlsSocket.on('error', (err: NodeJS.ErrnoException) => {
      if (!secured) {
        clearTimeout(handshakeTimer);
        const reason = err.code ?? 'handshake failed';
        events.emit('tls_handshake', { host, ok: false, reason });
        logger.info({ type: 'tls_handshake', client: clientAddr, host, port, ok: false, reason }, 'client TLS handshake failed (does the client trust the keygate CA?)');
      }
      tlsSocket.destroy();
    });
    tlsSocket.once('close', () => {
      clearTimeout(handshakeTimer);
      client.destroy();
    });
    if (fastPath) serveFast(tlsSocket, tunnels.get(tlsSocket)!, fast);
    else inner.emit('connection', tlsSocket);
  }

  /**
   * Cleartext HTTP inside a CONNECT tunnel to a rule host: refused like absolute-form http://
   * to it. The request line (already read) names method and path for the log.
   */
  function refusePlaintextInTunnel(client: Socket, first: Buffer, host: string, port: number, clientAddr: string): void {
    const started = performance.now();
    const line = /^([A-Z]{1,16}) (\S+) HTTP\/1\.[01]\r?\n/.exec(first.subarray(0, 2048).toString('latin1'));
    const path = line ? line[2].split('?')[0].slice(0, 200) : '';
    const rec = newRecord(line?.[1] ?? '', { client: clientAddr, host, port, decision: 'intercept' }, path);
    const err = line ? refused('credentials are injected only over HTTPS: use https:// for this host') : malformed('neither TLS nor HTTP inside the tunnel');
    rec.status = err.status;
    rec.error = err.reason;
    client.resume();
    writeRawError(client, err);
    finishRecord(core, rec, started);
  }

  // ---- the listener -------------------------------------------------------------------
  const front = http.createServer(serverOptions(limits));
  front.timeout = limits.idleTimeoutMs;

  front.on('connect', (req: IncomingMessage, client: Socket, head: Buffer) => {
    stopFollowing(client);
    if (overLimit.has(client)) return;
    if (answered.has(client)) {
      closeAfterAnswer(client);
      return;
    }
    const clientAddr = clientOf(client);
    client.on('error', () => client.destroy());
    idleGuard(client);
    const target = connectTarget(factsOf(req), limits);
    if (target instanceof ProxyError) {
      refuseUpgrade(core, req, client, { client: clientAddr, host: '', port: 0, decision: 'tunnel' }, '', target);
      return;
    }
    const { host, port } = target;
    const config = current;
    const decision = config.decide(host, port);
    if (closing) {
      refuseUpgrade(core, req, client, { client: clientAddr, host, port, decision }, '', shuttingDown());
      return;
    }
    if (core.isDenied(host, port)) {
      refuseUpgrade(core, req, client, { client: clientAddr, host, port, decision }, '', refused(`${formatAuthority(host, port)} is not reachable through this proxy`));
      return;
    }
    const refusal = config.egress.checkName(host, port);
    if (refusal) {
      refuseUpgrade(core, req, client, { client: clientAddr, host, port, decision }, '', reportRefusal(new EgressDenied(refusal, host, port)));
      return;
    }
    if (decision === 'intercept') {
      void intercept(client, head, host, port, clientAddr);
    } else {
      openTunnel(core, client, head, { host, port, client: clientAddr, decision }, track);
    }
  });

  front.on('request', (req: IncomingMessage, res: ServerResponse) => {
    if (overLimit.has(req.socket) || answered.has(req.socket)) return;
    const started = performance.now();
    const clientAddr = clientOf(req.socket);
    const t = reportRefusal(planPlain(factsOf(req), current, limits, core.isDenied));
    if (closing) res.shouldKeepAlive = false;
    if (t instanceof ProxyError) {
      const rec = newRecord(req.method ?? '', { client: clientAddr, host: '', port: 0, decision: 'tunnel' }, '');
      try {
        const m = /^[a-z]+:\/\/([^/?#]*)([^?#]*)/i.exec(req.url ?? '');
        if (m) {
          const a = parseAuthority(m[1], 80);
          Object.assign(rec, { host: a.host, port: a.port, path: m[2] || '/', decision: current.decide(a.host, a.port) });
        }
      } catch {
        /* the record keeps an empty host */
      }
      req.resume();
      // Answered and closing: a request (or CONNECT) pipelined behind this one is never acted on.
      answered.add(req.socket);
      refuse(core, res, rec, started, t, REFUSAL_CLOSES);
      return;
    }
    const logPath = t.pathAndQuery.split('?')[0];
    const rec = newRecord(req.method ?? '', { client: clientAddr, host: t.host, port: t.port, decision: t.decision }, logPath);
    void forward(core, req, res, { scheme: 'http', host: t.host, port: t.port, pathAndQuery: t.pathAndQuery, logPath, decision: t.decision, client: clientAddr }, rec, started);
  });

  front.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    stopFollowing(socket);
    if (overLimit.has(socket)) return;
    if (answered.has(socket)) {
      closeAfterAnswer(socket);
      return;
    }
    const clientAddr = clientOf(socket as Socket);
    idleGuard(socket);
    const t = reportRefusal(planPlain(factsOf(req), current, limits, core.isDenied));
    if (t instanceof ProxyError) {
      refuseUpgrade(core, req, socket, { client: clientAddr, host: '', port: 0, decision: 'tunnel' }, '', t);
      return;
    }
    if (String(req.headers.upgrade).toLowerCase() !== 'websocket') {
      refuseUpgrade(core, req, socket, { client: clientAddr, host: t.host, port: t.port, decision: t.decision }, '', malformed('only WebSocket upgrades are supported'));
      return;
    }
    const logPath = t.pathAndQuery.split('?')[0];
    relayUpgrade(core, req, socket, head, { scheme: 'http', host: t.host, port: t.port, pathAndQuery: t.pathAndQuery, logPath, decision: t.decision, client: clientAddr });
  });

  front.on('clientError', onClientError);

  // Connection limits: counted per listener and per client address; over the limit the
  // client hears why (503) instead of a silent reset, and nothing it sent is acted on.
  let connections = 0;
  const perClient = new Map<string, number>();
  const overLimit = new WeakSet<Duplex>();
  front.on('connection', (s: Socket) => {
    track(s);
    const addr = (s.remoteAddress ?? '').replace(/^::ffff:/, '');
    const mine = (perClient.get(addr) ?? 0) + 1;
    if (connections + 1 > limits.maxConnections || mine > limits.maxConnectionsPerClient) {
      overLimit.add(s);
      const total = connections + 1 > limits.maxConnections;
      events.emit('connection_refused', { client: addr, reason: total ? 'max_connections' : 'max_connections_per_client' });
      logger.warn({ type: 'connection_refused', client: addr, connections, from_client: mine - 1 }, 'connection limit reached');
      s.on('error', () => s.destroy());
      writeRawError(s, overloaded(total ? `the proxy has reached its limit of ${limits.maxConnections} connections; retry later` : `this client has reached its limit of ${limits.maxConnectionsPerClient} connections; close some first`));
      const kill = setTimeout(() => s.destroy(), 2000);
      s.once('close', () => clearTimeout(kill));
      return;
    }
    connections++;
    perClient.set(addr, mine);
    follow(s);
    s.once('close', () => {
      connections--;
      const n = (perClient.get(addr) ?? 1) - 1;
      if (n <= 0) perClient.delete(addr);
      else perClient.set(addr, n);
    });
  });

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
      if (policyChanged) upstream.renewPool();
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
        // Stops the inner server's head-timeout clock (it never listened: the callback gets ERR_SERVER_NOT_RUNNING).
        inner.close(() => undefined);
        await upstream.close();
      })();
      return closed;
    },
  };
}
