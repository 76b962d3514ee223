import http2, { type ClientHttp2Session, type ClientHttp2Stream, type OutgoingHttpHeaders } from 'node:http2';
import type { TLSSocket } from 'node:tls';
import type { Dispatcher } from 'undici';
import { urlAuthority } from '../../rules/host.js';
import { MAX_ANSWER_FIELDS, MAX_ANSWER_HEAD } from '../answer.js';
import { layerError, type LayerCode } from '../errors.js';
import type { H2Client, H2UpstreamHost, ProxyTimeouts } from '../upstream.js';
import { ReplayBody } from './replay.js';

/**
 * keygate's own HTTP/2 client for the HTTP/2 clients' requests (forward.ts), in place of undici's
 * h2 dispatcher, which relayed an answer whose stream the origin reset before END_STREAM as a
 * complete one (a Node ClientHttp2Stream ends its readable side on a reset too, and undici took
 * that 'end' for the end of the answer): a client took a truncated download for a whole one.
 * This client tells the two apart (`cleanEnd` below) and reports anything but END_STREAM as an
 * error, so forward.ts cuts the answer (or answers 502/504 before its head).
 *
 * One interface, two protocols, chosen per origin by ALPN on the first connection (the model is
 * undici's client.js, one switch between its HTTP/1 and HTTP/2 connections):
 * - h2: one ClientHttp2Session per origin, multiplexed up to the peer's
 *   SETTINGS_MAX_CONCURRENT_STREAMS, a second session when all are full; a session that got a
 *   GOAWAY, closed or failed takes no new streams (the next request opens a new one); an idle
 *   session is closed after the keep-alive limit the other pools use; sessions are unref'd.
 * - http/1.1: the origin is remembered as speaking HTTP/1.1 (for the life of this client, renewed
 *   with the pools), the connection just dialled is handed to the HTTP/1.1 pool as a connection
 *   opened ahead (Upstream.adopt), and this and later requests go through that pool, as they
 *   did through undici's allowH2 agent.
 * Every connection comes from Upstream's dialler (egress policy after DNS, --resolve pins,
 * verified TLS against the upstream trust store, ALPN h2 and http/1.1): no TLS of its own.
 *
 * Fields are read in their raw form (Node's third 'response'/'headers'/'trailers' argument), so
 * repeated fields reach the answer check and the client as the origin sent them. The session's
 * header limits are the answer check's own (answer.ts) plus room to exceed them, so the check
 * decides and an answer with 200 fields is relayed as on HTTP/1.1 (Node's default is 128 pairs).
 */

/** Answer fields a session accepts: one over the answer check's limit (plus `:status`), so the check says why. */
const MAX_PAIRS = MAX_ANSWER_FIELDS + 2;
/** SETTINGS_MAX_HEADER_LIST_SIZE: the answer check's head size plus HPACK's 32 bytes per field (RFC 9113 6.5.2), and one field over. */
const MAX_LIST_SIZE = MAX_ANSWER_HEAD + 32 * (MAX_ANSWER_FIELDS + 2);
/** The most streams one session carries (a peer without a limit in its SETTINGS is unlimited, RFC 9113 6.5.2). */
const DEFAULT_MAX_STREAMS = 1000;

interface Session {
  session: ClientHttp2Session;
  /** Streams open now. */
  active: number;
  /** Takes no new streams (GOAWAY, close, error, idle close). */
  closed: boolean;
  /** The peer's SETTINGS arrived (until then one stream: its limit is not known). */
  settings: boolean;
  /** The last stream id a GOAWAY from the peer said it processed (streams above it were not). */
  goawayLast?: number;
  idle?: NodeJS.Timeout;
}

/**
 * How a request waiting for a session learns its fate: a session with room, 'h1' (the origin
 * chose http/1.1: the HTTP/1.1 pool takes it), 'again' (this client was retired before the
 * request had a stream: it is dispatched anew through the current one), or an error.
 */
type Ready = (err: Error | null, s: Session | 'h1' | 'again' | null) => void;

interface Origin {
  /** Its key in H2Upstream's map. */
  key: string;
  host: string;
  port: number;
  /** The origin chose http/1.1 in ALPN. */
  h1: boolean;
  sessions: Session[];
  /** Requests waiting for a session with room. */
  waiting: Ready[];
  dialing: boolean;
}

/** `[name, value, ...]` from Node's raw header list, pseudo-headers left out. */
function regularFields(raw: readonly string[] | undefined, obj: Record<string, unknown>): string[] {
  const out: string[] = [];
  if (Array.isArray(raw)) {
    for (let i = 0; i + 1 < raw.length; i += 2) if (!raw[i].startsWith(':')) out.push(raw[i], raw[i + 1]);
    return out;
  }
  // No raw list (not seen on Node 20 or 24): the object, in order, each value of a repeated field.
  for (const [name, value] of Object.entries(obj)) {
    if (name.startsWith(':') || value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) out.push(name, String(v));
  }
  return out;
}

/** The request has a body (read from the client as it is sent: it cannot be sent twice). */
function hasBody(opts: Dispatcher.DispatchOptions): boolean {
  return opts.body !== null && opts.body !== undefined;
}

/**
 * The request for the HTTP/1.1 pool: without the `te: trailers` forward.ts adds for HTTP/2
 * origins. In HTTP/1.1, TE must be named in Connection (RFC 9110 10.1.4), which undici writes
 * itself, and undici relays a chunked answer's trailers whether or not it was asked for.
 */
function withoutTe(opts: Dispatcher.DispatchOptions): Dispatcher.DispatchOptions {
  const fields = opts.headers;
  if (!Array.isArray(fields) || !fields.some((f, i) => i % 2 === 0 && String(f).toLowerCase() === 'te')) return opts;
  const kept: string[] = [];
  for (let i = 0; i + 1 < fields.length; i += 2) if (String(fields[i]).toLowerCase() !== 'te') kept.push(String(fields[i]), String(fields[i + 1]));
  return { ...opts, headers: kept };
}

/** Request fields as node:http2 takes them: lower-case names, repeated fields as arrays. */
function requestHeaders(method: string, path: string, authority: string, fields: readonly string[]): OutgoingHttpHeaders {
  const h: OutgoingHttpHeaders = { ':method': method, ':scheme': 'https', ':authority': authority, ':path': path };
  for (let i = 0; i + 1 < fields.length; i += 2) {
    const name = fields[i].toLowerCase();
    const prev = h[name];
    if (prev === undefined) h[name] = fields[i + 1];
    else if (Array.isArray(prev)) prev.push(fields[i + 1]);
    else h[name] = [String(prev), fields[i + 1]];
  }
  return h;
}

export class H2Upstream implements H2Client {
  private readonly origins = new Map<string, Origin>();
  /** Set once no new stream may start here: why waiting requests are not served (an error, or 'again': see retire). */
  private closing: Error | 'again' | undefined;

  constructor(private readonly up: H2UpstreamHost) {}

  /**
   * Sends one request (undici's dispatch interface, which forward.ts drives): an HTTP/2 stream on
   * a session to the origin, or the HTTP/1.1 pool's dispatch for an origin that chose http/1.1.
   */
  dispatch(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    return this.begin(opts, handler, false);
  }

  /**
   * Sends again a request the origin did not process (Exchange.refused): once, through the
   * current client (this one, or the next after a change of the egress policy).
   */
  retry(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): void {
    const current = this.up.h2;
    if (current !== this && current instanceof H2Upstream) current.retry(opts, handler);
    else this.begin(opts, handler, true);
  }

  private begin(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler, retried: boolean): boolean {
    const url = new URL(String(opts.origin));
    const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
    const port = Number(url.port) || 443;
    const key = `${host}|${port}`;
    let o = this.origins.get(key);
    if (!o) this.origins.set(key, (o = { key, host, port, h1: false, sessions: [], waiting: [], dialing: false }));
    if (o.h1) return this.up.agent.dispatch(withoutTe(opts), handler);
    new Exchange(this, o, opts, handler, urlAuthority(host, port, 443), retried).start();
    return true;
  }

  /** Dispatches a request that had no stream yet through the host's current HTTP/2 client (this one was retired). */
  again(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): void {
    this.up.h2.dispatch(opts, handler);
  }

  /** Hands a request to the HTTP/1.1 pool (its origin chose http/1.1). */
  h1(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): void {
    this.up.agent.dispatch(withoutTe(opts), handler);
  }

  /** A session to `o` with room for one more stream (or 'h1'), now or once one is dialled. */
  acquire(o: Origin, ready: Ready): void {
    const s = this.withRoom(o);
    if (s) return ready(null, s);
    o.waiting.push(ready);
    if (!o.dialing && !o.sessions.some((x) => !x.closed && !x.settings)) this.dial(o);
  }

  /** Gives up waiting (the request was aborted before it had a session). */
  cancel(o: Origin, ready: Ready): void {
    const i = o.waiting.indexOf(ready);
    if (i >= 0) o.waiting.splice(i, 1);
  }

  private withRoom(o: Origin): Session | undefined {
    for (const s of o.sessions) {
      if (s.closed || s.session.closed || s.session.destroyed) continue;
      const max = s.settings ? (s.session.remoteSettings?.maxConcurrentStreams ?? DEFAULT_MAX_STREAMS) : 1;
      if (s.active < Math.min(max, DEFAULT_MAX_STREAMS)) return s;
    }
    return undefined;
  }

  private dial(o: Origin): void {
    o.dialing = true;
    this.up.dialAlpn(o.host, o.port, (err, socket) => {
      o.dialing = false;
      if (err || !socket) {
        // Every request waiting for this connection fails as a dial would (502, 504, 403).
        const waiting = o.waiting.splice(0);
        for (const w of waiting) w(err ?? layerError('upstream connection failed', 'UND_ERR_SOCKET'), null);
        return;
      }
      if (this.closing) {
        socket.destroy();
        const why = this.closing;
        for (const w of o.waiting.splice(0)) (why === 'again' ? w(null, 'again') : w(why, null));
        return;
      }
      if (socket.alpnProtocol !== 'h2') {
        o.h1 = true;
        if (!this.up.adopt(o.host, o.port, socket)) socket.destroy();
        for (const w of o.waiting.splice(0)) w(null, 'h1');
        return;
      }
      this.open(o, socket);
      this.serveWaiting(o);
    });
  }

  /** Hands waiting requests to sessions with room; dials another session when some are left. */
  private serveWaiting(o: Origin): void {
    while (o.waiting.length) {
      const s = this.withRoom(o);
      if (!s) break;
      // Opens its stream at once (streamCount), so the next one sees the room that is left.
      o.waiting.shift()!(null, s);
    }
    // Another session only when none is about to say how many streams it takes.
    if (o.waiting.length && !o.dialing && !o.sessions.some((x) => !x.closed && !x.settings)) this.dial(o);
  }

  private open(o: Origin, socket: TLSSocket): void {
    const session = http2.connect(`https://${urlAuthority(o.host, o.port, 443)}`, {
      createConnection: () => socket,
      maxHeaderListPairs: MAX_PAIRS,
      maxSessionMemory: 16,
      settings: { enablePush: false, maxHeaderListSize: MAX_LIST_SIZE },
    });
    // Never holds the process open (an idle proxy exits when its listeners close).
    session.unref();
    const s: Session = { session, active: 0, closed: false, settings: false };
    o.sessions.push(s);
    const gone = () => {
      clearTimeout(noSettings);
      s.closed = true;
      clearTimeout(s.idle);
      const i = o.sessions.indexOf(s);
      if (i >= 0) o.sessions.splice(i, 1);
      // Requests that were waiting for room here find another session or dial one.
      if (o.waiting.length) this.serveWaiting(o);
      // Nothing kept for an HTTP/2 origin without sessions (one remembered as HTTP/1.1 stays).
      else if (!o.sessions.length && !o.dialing && !o.h1 && this.origins.get(o.key) === o) this.origins.delete(o.key);
    };
    // Streams the GOAWAY covers (above its last stream id) are closed by nghttp2 and fail;
    // those below it finish; no new stream goes on this session.
    session.on('goaway', (_code: number, lastStreamID: number) => {
      s.goawayLast = lastStreamID;
      s.closed = true;
      if (s.active === 0) session.close();
      gone();
    });
    session.on('error', () => gone());
    session.on('close', gone);
    // More room once the peer's SETTINGS say how many streams it takes.
    // An origin that never sends its SETTINGS (the preface every HTTP/2 server starts with) is
    // given up on after the connect timeout, with the requests waiting for it.
    const noSettings = setTimeout(() => {
      for (const w of o.waiting.splice(0)) w(layerError('upstream sent no HTTP/2 SETTINGS', 'UND_ERR_CONNECT_TIMEOUT'), null);
      session.destroy();
    }, this.up.timeouts.connectMs);
    noSettings.unref();
    session.on('remoteSettings', () => {
      clearTimeout(noSettings);
      s.settings = true;
      if (o.waiting.length) this.serveWaiting(o);
    });
    this.idleClock(s);
  }

  /** Called when a stream on `s` opens or closes: an idle session is closed after the keep-alive limit. */
  streamCount(o: Origin, s: Session, delta: number): void {
    s.active += delta;
    if (delta > 0) {
      clearTimeout(s.idle);
      s.idle = undefined;
      return;
    }
    if (s.closed && s.active === 0) s.session.close();
    else this.idleClock(s);
    if (o.waiting.length) this.serveWaiting(o);
  }

  private idleClock(s: Session): void {
    if (s.active > 0 || s.closed) return;
    clearTimeout(s.idle);
    s.idle = setTimeout(() => {
      if (s.active > 0) return;
      s.closed = true;
      s.session.close();
    }, this.up.timeouts.keepAliveMs);
    s.idle.unref();
  }

  get timeouts(): ProxyTimeouts {
    return this.up.timeouts;
  }

  /**
   * The egress policy changed (Upstream.renewPool): no new streams on these sessions, which close
   * once their streams are done. Requests still waiting for a session have sent nothing: they are
   * dispatched again through the new client, so they are dialled under the new policy instead of
   * failing with a 502.
   */
  retire(): void {
    this.shut('again', (s) => s.close());
  }

  /** No new streams; sessions close once their streams are done. */
  close(): void {
    this.shut(layerError('upstream client closed', 'UND_ERR_CLOSED'), (s) => s.close());
  }

  /** Every session closed now, its streams failed. */
  destroy(): void {
    this.shut(layerError('upstream client destroyed', 'UND_ERR_DESTROYED'), (s) => s.destroy());
  }

  /** Fails the requests waiting for a session with `err` (or sends them 'again') and ends every session with `end`. */
  private shut(err: Error | 'again', end: (s: ClientHttp2Session) => void): void {
    this.closing = err;
    for (const o of this.origins.values()) {
      for (const w of o.waiting.splice(0)) (err === 'again' ? w(null, 'again') : w(err, null));
      for (const s of o.sessions) {
        s.closed = true;
        clearTimeout(s.idle);
        end(s.session);
      }
    }
    this.origins.clear();
  }
}

/**
 * One request on one HTTP/2 stream, driving undici's handler interface: onConnect (abort), then
 * onHeaders for every answer head (interim ones too, the answer check reads them all), onData
 * with backpressure, and exactly one of onComplete (END_STREAM seen) or onError.
 */
class Exchange {
  private settled = false;
  private stream: ClientHttp2Stream | undefined;
  private session: Session | undefined;
  private headSeen = false;
  /** END_STREAM came from the origin (not the end a reset or a closed session gives the readable side). */
  private cleanEnd = false;
  private ended = false;
  private trailers: string[] | null = null;
  private paused = false;
  private clock: NodeJS.Timeout | undefined;
  private readonly ready: Ready = (err, s) => this.onSession(err, s);
  /** The request body, kept while the origin may refuse the stream (replay.ts). */
  private body: ReplayBody | undefined;
  /** The upload loop is between reads: a retry waits for it to settle (one reader at a time). */
  private uploading = false;
  /** Refused while the upload loop was waiting: it hands the body over to the retry when it wakes. */
  private retryWhenIdle = false;

  constructor(
    private readonly client: H2Upstream,
    private readonly origin: Origin,
    private readonly opts: Dispatcher.DispatchOptions,
    private readonly handler: Dispatcher.DispatchHandler,
    private readonly authority: string,
    /** This is the second attempt of a request the origin refused (no third). */
    private readonly retried = false,
  ) {}

  start(): void {
    this.handler.onConnect?.((err?: Error) => this.abort(err ?? layerError('request aborted', 'UND_ERR_ABORTED')));
    if (this.settled) return;
    this.client.acquire(this.origin, this.ready);
  }

  /** The proxy gave up on this request (the client left, the answer was refused): the stream is reset. */
  private abort(err: Error): void {
    if (this.settled) return;
    if (this.stream) this.reset();
    else this.client.cancel(this.origin, this.ready);
    this.fail(err);
  }

  private fail(err: Error): void {
    if (this.settled) return;
    this.settled = true;
    clearTimeout(this.clock);
    this.reset();
    this.handler.onError?.(err);
  }

  /**
   * Resets the stream, and never ends its request body first: Node's `close(code)` on a stream
   * whose writable side is open sends END_STREAM before the RST_STREAM, so an origin would see a
   * request body the client broke off as complete (and could act on it) before the reset came.
   * `destroy` resets at once (INTERNAL_ERROR) with the body left open. A request already sent
   * whole is cancelled (CANCEL: the answer is no longer wanted).
   */
  private reset(): void {
    const s = this.stream;
    if (!s || s.closed) return;
    if (s.writableEnded) s.close(http2.constants.NGHTTP2_CANCEL);
    else s.destroy(new Error('request abandoned before its body ended'));
  }

  private complete(): void {
    if (this.settled) return;
    this.settled = true;
    clearTimeout(this.clock);
    this.handler.onComplete?.(this.trailers);
  }

  private onSession(err: Error | null, s: Session | 'h1' | 'again' | null): void {
    if (this.settled) return;
    if (err || !s) return this.fail(err ?? layerError('upstream connection failed', 'UND_ERR_SOCKET'));
    if (s === 'again') {
      // The client was retired before this request had a stream: nothing of it was sent.
      this.settled = true;
      this.client.again(this.opts, this.handler);
      return;
    }
    if (s === 'h1') {
      // The origin chose http/1.1: the HTTP/1.1 pool takes the request (and the handler) as it is.
      this.settled = true;
      this.client.h1(this.opts, this.handler);
      return;
    }
    this.send(s);
  }

  private send(s: Session): void {
    const o = this.opts;
    const fields = (Array.isArray(o.headers) ? o.headers : []) as string[];
    const body = hasBody(o);
    let stream: ClientHttp2Stream;
    try {
      stream = s.session.request(requestHeaders(o.method, o.path, this.authority, fields), { endStream: !body });
    } catch (err) {
      return this.fail(err as Error);
    }
    this.stream = stream;
    this.session = s;
    this.client.streamCount(this.origin, s, +1);
    stream.on('close', () => {
      this.client.streamCount(this.origin, s, -1);
      this.onClose();
    });
    // A readable side ended while the stream is still open is the origin's END_STREAM; Node also
    // ends it when the stream is closed by RST_STREAM, a GOAWAY or the session's end, and then
    // the stream is already marked closed (checked on Node 20 and 24). No event tells the two apart.
    const push = stream.push;
    stream.push = (chunk: unknown, encoding?: BufferEncoding) => {
      if (chunk === null && !this.ended) {
        this.ended = true;
        this.cleanEnd = !stream.closed;
      }
      return push.call(stream, chunk, encoding);
    };
    stream.on('error', (err: Error) => (this.refused() ? this.sendAgain() : this.fail(err)));
    stream.on('headers', (headers, _flags, raw?: string[]) => this.onHead(headers, raw));
    stream.on('response', (headers, _flags, raw?: string[]) => this.onHead(headers, raw));
    stream.on('trailers', (headers, _flags, raw?: string[]) => {
      this.trailers = regularFields(raw, headers as Record<string, unknown>);
    });
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => {
      if (this.cleanEnd && this.headSeen) this.complete();
    });
    // The answer's head is waited for once the request is sent (its body included, as on HTTP/1.1).
    if (body) void this.upload(stream, (this.body = ReplayBody.of(o.body as AsyncIterable<Buffer>)));
    else this.headersClock();
  }

  private onHead(headers: http2.IncomingHttpHeaders, raw: string[] | undefined): void {
    if (this.settled) return;
    const status = Number(headers[':status']);
    const fields = regularFields(raw, headers as Record<string, unknown>);
    const final = !(status >= 100 && status < 200);
    if (final) {
      this.headSeen = true;
      // The origin processed the stream: nothing of the body will be sent again.
      this.body?.release();
      this.startClock(this.client.timeouts.bodyMs, 'upstream stalled', 'UND_ERR_BODY_TIMEOUT');
    }
    const resume = () => {
      if (!this.paused || this.settled) return;
      this.paused = false;
      this.startClock(this.client.timeouts.bodyMs, 'upstream stalled', 'UND_ERR_BODY_TIMEOUT');
      this.stream?.resume();
    };
    this.handler.onHeaders?.(status, fields as unknown as Buffer[], resume, '');
    // A head that ended the stream (no body): complete once 'end' came, whichever came first.
    if (final && this.cleanEnd && this.stream?.readableEnded) this.complete();
  }

  private onData(chunk: Buffer): void {
    if (this.settled) return;
    if (this.handler.onData?.(chunk) === false) {
      // The client is not reading: stop reading the stream (its flow-control window fills, the
      // origin waits); the client's own clocks cover a client that stopped (forward.ts).
      this.paused = true;
      clearTimeout(this.clock);
      this.stream?.pause();
    } else this.clock?.refresh();
  }

  /**
   * The origin did not process this request (RFC 9113 8.7: RST_STREAM REFUSED_STREAM, or a
   * GOAWAY whose last stream id is below this stream), nothing of its answer came, and all that
   * was read of its body is kept (replay.ts: at most REPLAY_MAX bytes). Such a request may be
   * sent again, whatever its method; once, so an origin that keeps refusing gets the 502.
   */
  private refused(): boolean {
    const st = this.stream;
    if (this.settled || this.retried || this.headSeen || !st) return false;
    if (hasBody(this.opts) && !this.body?.replayable) return false;
    if (st.rstCode === http2.constants.NGHTTP2_REFUSED_STREAM) return true;
    const last = this.session?.goawayLast;
    return last !== undefined && st.id !== undefined && st.id > last;
  }

  private sendAgain(): void {
    this.settled = true;
    clearTimeout(this.clock);
    if (this.uploading) this.retryWhenIdle = true;
    else this.handOver();
  }

  /** The retry, from the body's first byte (the upload loop of this attempt has stopped). */
  private handOver(): void {
    this.retryWhenIdle = false;
    if (!this.body) return this.client.retry(this.opts, this.handler);
    // The read that settled last may have taken the body past what is kept.
    if (!this.body.rewind()) return void this.handler.onError?.(layerError('upstream refused the stream, and the request body is too large to send again', 'UND_ERR_SOCKET'));
    this.client.retry({ ...this.opts, body: this.body as unknown as Dispatcher.DispatchOptions['body'] }, this.handler);
  }

  private onClose(): void {
    if (this.settled) return;
    if (this.refused()) return this.sendAgain();
    if (this.cleanEnd && this.headSeen) {
      // 'end' is emitted before 'close' when END_STREAM came; this is only reached if it was not.
      return this.complete();
    }
    const code = this.stream?.rstCode;
    const err = this.headSeen
      ? layerError(`upstream stream closed before its end (RST_STREAM ${code ?? 'none'})`, 'UND_ERR_SOCKET')
      : layerError(`upstream stream closed before an answer (RST_STREAM ${code ?? 'none'})`, 'UND_ERR_SOCKET');
    this.fail(err);
  }

  /**
   * The request body, streamed with backpressure: written as the origin's flow-control window
   * allows. A chunk read once this attempt is over stays in the ReplayBody for the retry.
   */
  private async upload(stream: ClientHttp2Stream, body: ReplayBody): Promise<void> {
    const over = () => this.settled || stream.closed || stream.destroyed;
    this.uploading = true;
    let failed: Error | undefined;
    try {
      while (!over()) {
        const chunk = await body.next();
        if (over()) return;
        if (chunk === null) break;
        if (!stream.write(chunk)) {
          await new Promise<void>((resolve) => {
            const go = () => {
              stream.off('drain', go);
              stream.off('close', go);
              resolve();
            };
            stream.on('drain', go);
            stream.on('close', go);
          });
        }
      }
      if (!over()) {
        stream.end();
        if (!this.headSeen) this.headersClock();
      }
    } catch (err) {
      failed = err instanceof Error ? err : new Error('request body failed');
    } finally {
      this.uploading = false;
      if (failed && this.retryWhenIdle) {
        // Refused, and the client's body failed meanwhile: there is nothing to send again.
        this.retryWhenIdle = false;
        this.handler.onError?.(failed);
      } else if (failed) {
        // The client's body failed (it reset its stream): the upstream request is cancelled.
        this.abort(failed);
      } else if (this.retryWhenIdle) this.handOver();
    }
  }

  private headersClock(): void {
    this.startClock(this.client.timeouts.headersMs, 'upstream did not answer in time', 'UND_ERR_HEADERS_TIMEOUT');
  }

  private startClock(ms: number, message: string, code: LayerCode): void {
    clearTimeout(this.clock);
    if (!ms) return;
    this.clock = setTimeout(() => this.fail(layerError(message, code)), ms);
    this.clock.unref();
  }
}
