import { readFileSync } from '../builtins/fs.js';
import net from 'node:net';
import tls from 'node:tls';
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import type * as Undici from 'undici';
import { formatAuthority, urlAuthority } from '../rules/host.js';
import type { EgressPolicy } from '../rules/egress.js';
import { EgressDenied, resolveAllowed } from './egress.js';
import { H1Pool } from './h1/pool.js';
import { guardResetInBody, undiciParser } from './undici-reset.js';
import { MAX_ANSWER_HEAD } from './answer.js';

/** What HTTP/2 clients' requests are dispatched to (h2/upstream.ts, H2Upstream); a type only, so node:http2 is not loaded here. */
export interface H2Client {
  dispatch: Agent['dispatch'];
  /** No new requests; open streams finish. */
  close(): void;
  /** The same, and requests still waiting for a connection go to the host's next client (the egress policy changed). */
  retire(): void;
  destroy(): void;
}

/** What the HTTP/2 upstream client needs of Upstream (h2/upstream.ts). */
export interface H2UpstreamHost {
  dialAlpn(host: string, port: number, cb: (err: Error | null, socket: tls.TLSSocket | null) => void): void;
  readonly agent: Agent;
  adopt(host: string, port: number, socket: tls.TLSSocket): boolean;
  readonly timeouts: ProxyTimeouts;
  /** The current HTTP/2 client (a new one after renewPool). */
  readonly h2: H2Client;
}

const requireCjs = createRequire(import.meta.url);
/**
 * undici's index also loads fetch, WebSocket, EventSource, caches and mocks (about 8 MiB resident
 * in every sidecar); the proxy needs only the Agent (HTTP/1.1; HTTP/2 clients' h2 upstream is h2/upstream.ts) and its TLS connector. Falls back to the
 * index if a future undici moves these files.
 */
function undiciPart<T>(file: string, name: 'Agent' | 'buildConnector'): T {
  try {
    return requireCjs(`undici/lib/${file}`) as T;
  } catch {
    return (requireCjs('undici') as Record<string, unknown>)[name] as T;
  }
}
type Agent = Undici.Agent;
/**
 * Loaded on first use, not at start-up (issue #20: a sidecar's idle memory). The Agent brings
 * undici's client, pools and HTTP/1 dispatcher (undici's own HTTP/2 one is never given an h2 connection); intercepted HTTP/1.1 on
 * the fast path never needs it, only plain HTTP, WebSockets' fallbacks, HTTP/2 clients and
 * requests the fast path hands over do. The connector comes with the first upstream connection.
 * test/cli/proxy-imports.test.ts checks that an idle proxy has loaded neither.
 */
let agentClass: typeof Undici.Agent | undefined;
let connectorBuilder: typeof Undici.buildConnector | undefined;
const loadAgent = () => (agentClass ??= undiciPart<typeof Undici.Agent>('dispatcher/agent.js', 'Agent'));
const loadConnector = () => (connectorBuilder ??= undiciPart<typeof Undici.buildConnector>('core/connect.js', 'buildConnector'));

/**
 * Trust stores for upstream TLS, one per distinct set of extra CAs, shared by every Upstream in
 * the process and built on the first upstream connection. A store holds the ~140 public roots
 * parsed into OpenSSL objects (about 1 MiB): `keygate serve` runs one proxy per sandbox, all with
 * the same CAs, and a sidecar that has not dialled yet needs none. A store never changes once
 * built (the same as before: it was built once per proxy), so sharing it changes nothing a
 * connection verifies against.
 */
const trustStores = new Map<string, tls.SecureContext>();
function trustStore(extraPem: readonly string[]): tls.SecureContext {
  // A digest, not the PEM text itself: the text can be a whole system bundle (~220 KB), kept for
  // the life of the process as a map key.
  const key = createHash('sha256').update(extraPem.join('\n')).digest('base64');
  let ctx = trustStores.get(key);
  if (!ctx) {
    ctx = tls.createSecureContext({ ca: [...tls.rootCertificates, ...extraPem], minVersion: 'TLSv1.2' });
    trustStores.set(key, ctx);
  }
  return ctx;
}

/** The number of trust stores built so far (tests: shared and lazy). */
export function trustStoresBuilt(): number {
  return trustStores.size;
}

/**
 * undici 7 (the last line that runs on Node 20) crashes the whole process when an upstream
 * ends its connection while undici's HTTP/1 parser is paused for backpressure (nodejs/undici#5360,
 * fixed only in undici 8, which needs Node 22.19): `Parser.finish` asserts the parser is not
 * paused, from the socket's 'end' handler. A slow client reading a `Connection: close` response,
 * or a client leaving at the wrong moment, is enough. This 'end' listener runs before undici's:
 * it resumes the paused parser so it drains what is left (at most the socket's buffered bytes,
 * the origin has finished sending), while `upstreamEnding()` tells the response handlers not to
 * pause again. Remove with undici 8.
 */
let ending = false;

/** True while a paused parser is being drained at the end of its connection (see above). */
export function upstreamEnding(): boolean {
  return ending;
}

interface PausableParser {
  paused: boolean;
  statusCode: number;
  resume(): void;
}

function guardPausedParserOnEnd(socket: net.Socket): void {
  socket.prependListener('end', () => {
    const parser = undiciParser<PausableParser>(socket);
    if (!parser || !parser.paused || !parser.statusCode || socket.destroyed) return;
    ending = true;
    try {
      parser.resume();
    } catch {
      // Could not drain it: make undici's finish() see an unpaused parser (llhttp reports the
      // pause itself there, without asserting) and fail this connection's request instead.
      parser.paused = false;
      socket.destroy(new Error('upstream closed the connection during a paused response'));
    } finally {
      ending = false;
    }
    if (parser.paused) parser.paused = false;
  });
}

/**
 * Two answers undici 7's HTTP/1 parser gets wrong, both turned into a 502 the fast path does not
 * give (src/proxy/h1 relays both answers as RFC 9110/9112 say):
 * - A `Connection: close` in the trailer section (after a chunked body): undici decides whether
 *   to keep a connection from the response head alone, so it pools the connection while its own
 *   parser (llhttp) has seen the close and fails whatever arrives next on it ("Data after
 *   `Connection: close`"): the next request, already sent, ends as a 502. Such a connection is
 *   marked for reset before undici completes the message, so undici closes it after this answer
 *   and the next request goes on a new connection. `connection` holds every Connection value of
 *   the message, trailers included (undici clears it when the message completes).
 * - A `100 Continue` the request did not ask for (RFC 9110 15.2: a client must be able to parse
 *   one and ignore it): undici destroys the connection ("bad response"). It is handed on as an
 *   interim answer like any other 1xx (102), which undici skips and the handlers ignore (they
 *   relay no interim answers), and the final answer follows.
 * The parser class is not exported: its prototype is reached through the first connection's
 * parser and wrapped once for all parsers. Remove when undici handles both itself.
 */
interface H1Parser {
  socket: net.Socket;
  statusText: string;
  onStatus(buf: Buffer): number;
  llhttp?: { llhttp_get_http_major?(ptr: number): number; llhttp_get_http_minor?(ptr: number): number };
  ptr?: number;
  connection: string;
  onMessageComplete(): number;
  onHeadersComplete(statusCode: number, upgrade: boolean, shouldKeepAlive: boolean): number;
}
let parserPatched = false;
/** The HTTP version (major * 10 + minor) of the answer head undici is handing on now, if known. */
let answerVersion: number | undefined;

/**
 * The HTTP version of the HTTP/1.x answer whose head undici is handing to a dispatch handler
 * (read from llhttp: undici does not say, and llhttp accepts `HTTP/2.0` or `HTTP/0.9` status
 * lines); undefined for an HTTP/2 answer, or before the parser is patched.
 */
export function upstreamAnswerVersion(): number | undefined {
  return answerVersion;
}
const CLOSE_TOKEN = /(?:^|[\s,])close(?:[\s,]|$)/i;

function patchParserClass(proto: H1Parser): void {
  const complete = proto.onMessageComplete;
  const headers = proto.onHeadersComplete;
  const status = proto.onStatus;
  if (typeof complete !== 'function' || typeof headers !== 'function' || typeof status !== 'function') return;
  // llhttp hands a reason phrase split across reads in pieces, and undici keeps only the last:
  // the whole phrase (bounded: past the answer check's limit it is refused anyway) is kept instead.
  proto.onStatus = function (this: H1Parser, buf: Buffer) {
    const before = this.statusText ?? '';
    const ret = status.call(this, buf);
    if (before.length > 0) this.statusText = (before + this.statusText).slice(0, MAX_ANSWER_HEAD + 1);
    return ret;
  };
  proto.onMessageComplete = function (this: H1Parser) {
    if (this.connection && CLOSE_TOKEN.test(this.connection)) {
      const reset = Object.getOwnPropertySymbols(this.socket).find((x) => x.description === 'reset');
      if (reset) (this.socket as unknown as Record<symbol, boolean>)[reset] = true;
    }
    return complete.call(this);
  };
  proto.onHeadersComplete = function (this: H1Parser, statusCode: number, upgrade: boolean, shouldKeepAlive: boolean) {
    // The answer's HTTP version, for the answer check (answer.ts) while undici hands the head on.
    const ll = this.llhttp;
    answerVersion = ll?.llhttp_get_http_major && ll.llhttp_get_http_minor && this.ptr !== undefined ? ll.llhttp_get_http_major(this.ptr) * 10 + ll.llhttp_get_http_minor(this.ptr) : undefined;
    try {
      return headers.call(this, statusCode === 100 ? 102 : statusCode, upgrade, shouldKeepAlive);
    } finally {
      answerVersion = undefined;
    }
  };
}

/** A look for undici's parser is under way, or it gave up (undici's internals are not what this expects). */
let parserLookup: 'idle' | 'polling' | 'gave-up' = 'idle';

/**
 * Patches undici's parser class through `socket`, a connection just handed to undici. undici
 * attaches its parser after the connector's callback: a few promise turns later, or, on the
 * first connection of the process, once its llhttp WebAssembly is compiled. So the socket is
 * looked at on every turn of the event loop (setImmediate, before any answer to the request
 * written meanwhile can be read) until the parser is there, the socket is gone, or 2 s passed.
 * No listener on the socket: a 'readable' listener added before undici's would keep undici's
 * from being told of data already buffered. One look at a time; once patched, never again.
 */
function guardParser(socket: net.Socket): void {
  if (parserPatched || parserLookup !== 'idle' || (socket as tls.TLSSocket).alpnProtocol === 'h2') return;
  parserLookup = 'polling';
  const until = Date.now() + 2000;
  const look = () => {
    const parser = undiciParser<H1Parser>(socket);
    if (parser) {
      parserPatched = true;
      parserLookup = 'idle';
      patchParserClass(Object.getPrototypeOf(parser) as H1Parser);
    } else if (socket.destroyed) {
      parserLookup = 'idle'; // the next connection looks again
    } else if (Date.now() > until) {
      parserLookup = 'gave-up';
    } else {
      setImmediate(look);
    }
  };
  setImmediate(look);
}

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
  /** How long a connection opened ahead of a request waits for it (ms). Default 5000. */
  warmIdleMs?: number;
}

type ConnectOptions = Parameters<Undici.buildConnector.connector>[0];
type ConnectCallback = Parameters<Undici.buildConnector.connector>[1];
type Connected = Parameters<ConnectCallback>[1];

/** What undici's connector is given for an HTTPS origin (the key it is known by is `https://` + host). */
function connectOptions(host: string, port: number): ConnectOptions {
  return {
    host: urlAuthority(host, port, 443),
    hostname: net.isIPv6(host) ? `[${host}]` : host,
    protocol: 'https:',
    port: String(port),
    servername: net.isIP(host) ? undefined : host,
  } as ConnectOptions;
}

/** A TLS connection opened ahead of the first request to an origin (see prewarm). */
interface Warm {
  /** Undici's callback, once it asks for this origin before the connection is up. */
  waiter?: ConnectCallback;
  socket?: Connected;
  error?: Error;
  timer?: NodeJS.Timeout;
}

/**
 * Everything that talks to upstreams: one undici Agent for HTTP/1.1 (a keep-alive pool per
 * origin), keygate's HTTP/2 client for HTTP/2 clients (`h2`, h2/upstream.ts), both of whose TLS
 * always verifies against one shared trust store (built once: parsing the roots per connection
 * would dominate connect cost), and the address map for --resolve.
 */
export class Upstream {
  #agent: Agent | undefined;
  /**
   * The HTTP/2 clients' requests: keygate's own HTTP/2 client (h2/upstream.ts), h2 where the
   * origin offers it in ALPN, this HTTP/1.1 pool otherwise. Built by the HTTP/2 exchange's module
   * (loaded with the first HTTP/2 client: node:http2 stays out of an HTTP/1.1-only sidecar).
   */
  #h2: H2Client | undefined;
  #h2Factory: ((host: H2UpstreamHost) => H2Client) | undefined;
  /** The CAs given with --upstream-ca (NODE_EXTRA_CA_CERTS is read with the first dial). */
  private readonly upstreamCa: readonly string[];
  private readonly resolveMap: ReadonlyMap<string, string>;
  private readonly connector: Undici.buildConnector.connector;
  #trust: tls.SecureContext | undefined;
  #dial: Undici.buildConnector.connector | undefined;
  #dialH2: Undici.buildConnector.connector | undefined;
  /** Upstream connections open now, by origin key (`https://host:port`, as undici names it). */
  private readonly live = new Map<string, number>();
  /** Every open connection dialWith made, with where it went: checked again when the egress policy changes. */
  private readonly dialled = new Map<NonNullable<Connected>, { host: string; port: number; address: string }>();
  private readonly warm = new Map<string, Warm>();
  /** Counts the egress policy's changes (renewPool): a connection dialled across one is dialled again (dialWith). */
  private generation = 0;
  /** Keep-alive connections of the intercepted fast path (src/proxy/h1): the same connector as undici's pool. */
  readonly h1: H1Pool;

  constructor(private readonly opts: UpstreamOptions) {
    this.resolveMap = opts.resolve ?? new Map();
    this.upstreamCa = (opts.upstreamCa ?? []).flatMap((p) => p.match(PEM_CERT) ?? []);
    this.connector = (o, cb) => {
      const warm = this.takeWarm(`${o.protocol}//${o.host}`);
      if (!warm) return this.dial(o, cb);
      // Never synchronously: undici's connect() is not re-entrant (a request would never be written).
      if (warm.socket) return process.nextTick(cb, null, warm.socket);
      if (warm.error) return process.nextTick(cb, warm.error, null);
      warm.waiter = cb;
    };
    this.h1 = new H1Pool((host, port, cb) => this.connector(connectOptions(host, port), cb as ConnectCallback), opts.timeouts.keepAliveMs);
  }

  /**
   * The trust store upstream TLS verifies against: the public roots plus the extra CAs (shared,
   * built on first use). NODE_EXTRA_CA_CERTS is read here, not at start: where it names the whole
   * system bundle (as on many CI machines), its ~140 certificates sat in an idle sidecar's heap
   * as strings (a 220 KB file and its slices) before it had dialled anywhere (bench/README.md).
   */
  get secureContext(): tls.SecureContext {
    return (this.#trust ??= trustStore([...extraCaFromEnv(), ...this.upstreamCa]));
  }

  private tlsOptions(allowH2: boolean): Undici.buildConnector.BuildOptions {
    return { secureContext: this.secureContext, rejectUnauthorized: true, timeout: this.opts.timeouts.connectMs, ...(allowH2 ? { allowH2: true } : {}) } as Undici.buildConnector.BuildOptions;
  }

  /** Dials a new connection (the connector without the connections opened ahead). */
  private get dial(): Undici.buildConnector.connector {
    return (this.#dial ??= this.dialWith(loadConnector()(this.tlsOptions(false))));
  }

  /** The same, offering h2 and http/1.1 in ALPN (the HTTP/2 clients' requests; never given a warm connection, which offered only http/1.1). */
  private get dialH2(): Undici.buildConnector.connector {
    return (this.#dialH2 ??= this.dialWith(loadConnector()(this.tlsOptions(true))));
  }

  /** A new verified connection to host:port offering h2 and http/1.1 in ALPN (h2/upstream.ts). */
  dialAlpn(host: string, port: number, cb: (err: Error | null, socket: tls.TLSSocket | null) => void): void {
    this.dialH2(connectOptions(host, port), (err, socket) => cb(err, (socket as tls.TLSSocket | null) ?? null));
  }

  /**
   * Takes a connection dialled by dialAlpn that negotiated http/1.1 as if opened ahead (prewarm):
   * the HTTP/1.1 pool's next new connection to that origin is this one. False when a connection
   * opened ahead is already waiting there (the caller closes its own).
   */
  adopt(host: string, port: number, socket: tls.TLSSocket): boolean {
    const key = `https://${connectOptions(host, port).host}`;
    if (this.warm.has(key) || socket.destroyed) return false;
    const warm: Warm = {};
    this.warm.set(key, warm);
    this.holdWarm(key, warm, socket as unknown as Connected);
    return true;
  }

  /** The clocks every upstream request runs under. */
  get timeouts(): ProxyTimeouts {
    return this.opts.timeouts;
  }

  /**
   * A dialler over undici's TLS connector `base`: egress policy and pins first, then verified TLS.
   * A dial the egress policy changed under (renewPool) is made again under the new one, whoever
   * waits for it: a request planned before the change must not leave on a connection the old
   * policy let through (the connection opened at CONNECT, a pool's dial, an HTTP/2 session).
   */
  private dialWith(base: Undici.buildConnector.connector): Undici.buildConnector.connector {
    const dial = (o: ConnectOptions, cb: ConnectCallback): void => {
      const hostname = o.hostname.startsWith('[') ? o.hostname.slice(1, -1) : o.hostname;
      const port = Number(o.port) || (o.protocol === 'https:' ? 443 : 80);
      const generation = this.generation;
      // Resolved once and checked against the egress policy; the connection goes to exactly that
      // address (no second lookup a rebinding DNS server could answer differently). `host`
      // keeps the name, so undici still sends SNI and verifies the certificate for it.
      this.dialAddress(hostname, port).then(
        (address) =>
          base({ ...o, hostname: address }, (err, socket) => {
            if (this.generation !== generation) {
              socket?.destroy();
              return dial(o, cb);
            }
            if (err || !socket) return cb(err ?? new Error('upstream connection failed'), null);
            guardPausedParserOnEnd(socket);
            guardResetInBody(socket);
            this.count(`${o.protocol}//${o.host}`, socket);
            this.dialled.set(socket, { host: hostname, port, address });
            socket.once('close', () => this.dialled.delete(socket));
            cb(null, socket);
          }),
        (err: Error) => (this.generation !== generation ? dial(o, cb) : cb(err, null)),
      );
    };
    return dial;
  }

  /** Keeps `live` current: an origin with a connection open needs no connection opened ahead. */
  private count(key: string, socket: NonNullable<Connected>): void {
    this.live.set(key, (this.live.get(key) ?? 0) + 1);
    socket.once('close', () => {
      const n = (this.live.get(key) ?? 1) - 1;
      if (n <= 0) this.live.delete(key);
      else this.live.set(key, n);
    });
  }

  /** The warm connection for an origin, handed over once (undici owns it from here). */
  private takeWarm(key: string): Warm | undefined {
    const warm = this.warm.get(key);
    if (!warm) return undefined;
    this.warm.delete(key);
    clearTimeout(warm.timer);
    if (warm.socket && (warm.socket.destroyed || !warm.socket.writable)) return undefined;
    return warm;
  }

  /**
   * Opens the TLS connection to an HTTPS origin ahead of its first request, when none is open:
   * called when a client's CONNECT is intercepted, so the upstream handshake overlaps the
   * client's own (certificate minting, TLS) instead of following it. The connection goes
   * through the same connector as any other (egress policy, --resolve pins, verification); an
   * error is kept and given to the request that would have dialled. At most one per origin at a
   * time; unused, it is closed after warmIdleMs.
   */
  prewarm(host: string, port: number): void {
    const o = connectOptions(host, port);
    // The key undici's connector sees this origin by.
    const key = `https://${o.host}`;
    if (this.warm.has(key) || this.live.has(key)) return;
    const warm: Warm = {};
    this.warm.set(key, warm);
    this.dial(o, (err, socket) => {
      const waiter = warm.waiter;
      // A request waiting for it gets it: dialWith made it under the policy in force now.
      if (waiter) return err || !socket ? waiter(err ?? new Error('upstream connection failed'), null) : waiter(null, socket);
      if (this.warm.get(key) !== warm) {
        // Dropped meanwhile (a policy change, the pool closing): never handed to anyone.
        socket?.destroy();
        return;
      }
      // Kept briefly for the request that is coming, so it fails the same way a dial would.
      if (err || !socket) warm.error = err ?? new Error('upstream connection failed');
      this.holdWarm(key, warm, err ? null : socket);
    });
  }

  /**
   * Keeps `warm` (with `socket`, when there is one) for the next request to `key`: forgotten if
   * the connection closes, closed and forgotten once unused for warmIdleMs.
   */
  private holdWarm(key: string, warm: Warm, socket: Connected): void {
    if (socket) {
      warm.socket = socket;
      socket.once('close', () => {
        if (this.warm.get(key) === warm) this.warm.delete(key);
      });
      // undici has not attached yet: an error before it does must not be unhandled.
      socket.on('error', () => undefined);
    }
    warm.timer = setTimeout(() => {
      if (this.warm.get(key) === warm) this.warm.delete(key);
      warm.socket?.destroy();
    }, this.opts.warmIdleMs ?? 5000);
    warm.timer.unref();
  }

  /**
   * Ends every open upstream connection the egress policy in force now refuses (its name, port or
   * the address it reached), in the middle of an exchange too: each path turns that into a cut
   * the client sees (an unbounded answer, a server-sent event stream or a long HTTP/2 stream would
   * otherwise go on under the old policy). Connections the new policy allows finish what they carry.
   */
  private endDenied(): void {
    const policy = this.opts.policy?.();
    if (!policy) return;
    for (const [socket, d] of [...this.dialled]) {
      if (policy.checkConnection(d.host, d.port, d.address)) socket.destroy();
    }
  }

  /** Closes every connection opened ahead and not yet used. */
  private dropWarm(): void {
    for (const warm of this.warm.values()) {
      clearTimeout(warm.timer);
      warm.socket?.destroy();
    }
    this.warm.clear();
  }

  private newAgent(): Agent {
    const opts = this.opts;
    const Agent = loadAgent();
    return new Agent({
      // Only connections undici gets: the fast path's (same connector, src/proxy/h1) have no parser.
      connect: (o, cb) =>
        this.connector(o, (err, socket) => {
          if (err || !socket) return cb(err ?? new Error('upstream connection failed'), null);
          guardParser(socket);
          cb(null, socket);
        }),
      keepAliveTimeout: opts.timeouts.keepAliveMs,
      keepAliveMaxTimeout: 10 * 60_000,
      headersTimeout: opts.timeouts.headersMs,
      // The answer check's limit (answer.ts), not Node's 16 KiB default: undici counts field bytes
      // only, so the check (which counts the whole head) always decides first.
      maxHeaderSize: MAX_ANSWER_HEAD,
      bodyTimeout: opts.timeouts.bodyMs,
      pipelining: 1,
    });
  }

  /** The pool requests go through. */
  get agent(): Agent {
    return (this.#agent ??= this.newAgent());
  }

  /** Called by the HTTP/2 exchange's module when it loads: how to build the HTTP/2 clients' upstream client. */
  useH2(factory: (host: H2UpstreamHost) => H2Client): void {
    this.#h2Factory ??= factory;
  }

  /** What HTTP/2 clients' requests go through (h2 upstream where the origin offers it, this HTTP/1.1 pool otherwise). */
  get h2(): H2Client {
    if (!this.#h2Factory) throw new Error('the HTTP/2 upstream client is not loaded');
    return (this.#h2 ??= this.#h2Factory(this));
  }

  /**
   * Starts a fresh pool (the egress policy changed: connections opened under the old one must
   * not carry new requests). The old pool finishes what it has in flight, then closes.
   */
  renewPool(): void {
    this.generation++;
    this.endDenied();
    this.dropWarm();
    this.h1.clear();
    // The next request makes a new pool (as at start-up: only when one is needed).
    const old = this.#agent;
    this.#agent = undefined;
    void old?.close().catch(() => undefined);
    // Cleared first: what the old client was still waiting to send goes to the next one.
    const oldH2 = this.#h2;
    this.#h2 = undefined;
    oldH2?.retire();
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

  /**
   * A plain TCP connection (blind tunnels) to `address`, which must come from dialAddress: an
   * address, never a name (net.connect would look a name up again, past the egress policy and
   * with the resolver's search list). Half-open allowed: an origin's FIN ends only its direction,
   * the tunnel carries it to the client and the client's bytes still reach the origin.
   */
  connectTcp(_host: string, port: number, address: string, onread?: net.OnReadOpts): net.Socket {
    return net.connect({ host: address, port, onread, allowHalfOpen: true });
  }

  /**
   * A verified TLS connection (WebSocket upgrades) to `address` (from dialAddress, as above), SNI
   * and certificate checked for `host`. Half-open allowed, as connectTcp: once spliced, an
   * origin's close_notify and FIN end only its direction.
   */
  connectTls(host: string, port: number, address: string): tls.TLSSocket {
    return tls.connect({
      host: address,
      port,
      // Passed on to the TLSSocket by tls.connect (@types/node's ConnectionOptions omits it).
      ...{ allowHalfOpen: true },
      servername: net.isIP(host) ? undefined : host,
      secureContext: this.secureContext,
      rejectUnauthorized: true,
      ALPNProtocols: ['http/1.1'],
      // With an address dialled for a name, verify the name, not the address.
      checkServerIdentity: (_h, cert) => tls.checkServerIdentity(host, cert),
    });
  }

  async close(): Promise<void> {
    this.dropWarm();
    this.h1.clear();
    this.#h2?.close();
    await this.#agent?.close().catch(() => undefined);
  }

  destroy(): void {
    this.dropWarm();
    this.h1.clear();
    void this.#agent?.destroy().catch(() => undefined);
    this.#h2?.destroy();
  }
}
