import { STATUS_CODES } from '../../node-http.js';
import type { TLSSocket } from 'node:tls';
import type { CompiledConfig, CompiledRule } from '../../rules/compile.js';
import { urlAuthority } from '../../rules/host.js';
import type { ProxyCore, RequestRecord, TunnelTarget } from '../context.js';
import { endThenLinger, errorResponse, invalidAnswer, layerError, ProxyError, upstreamError, writeRawError } from '../errors.js';
import type { InterceptPlan, RequestFacts } from '../plan.js';
import { finishRecord, newRecord, refusedPath } from '../record.js';
import { filterRawResponseHeaders, relayedTrailerLines, upstreamRequestHeaders } from '../headers.js';
import { headTimeout, idleCutReason, idleCutsExchange, type ProxyLimits } from '../limits.js';
import { chunkRelayed } from '../buffer-gc.js';
import { ChunkedScanner, chunkOf, LAST_CHUNK } from './chunked.js';
import { keepAliveHintMs, usable } from './pool.js';
import { parseRequestHead, parseResponseHead, type RequestHead, type ResponseHead } from './head.js';

/**
 * The intercepted fast path: HTTP/1.1 exchanges inside an intercepted tunnel relayed with
 * one strict parser per side and no per-request stream objects, instead of Node's HTTP server
 * (IncomingMessage, ServerResponse) and undici's dispatcher. Profiles put those layers at
 * about three quarters of the proxy's CPU per small request (bench/README.md).
 *
 * It only takes what it can read beyond doubt (src/proxy/h1/head.ts). Any other request head
 * is handed with its bytes untouched to the Node path (`fallback`), which then owns the
 * connection. Every head it does take goes through the same plan step as the Node path's
 * (src/proxy/plan.ts): a refusal is answered here, rendered by errors.ts, and closes the
 * connection, so nothing pipelined behind it is acted on. Hand-over happens only between
 * exchanges, with nothing in flight.
 *
 * What it keeps of the Node path's guarantees: the request goes to the CONNECT target only
 * (the plan compares Host with it), on the normalised path; the rule's headers replace every
 * client header of the same names (upstreamRequestHeaders); hop-by-hop headers are dropped
 * both ways; framing toward each side is the proxy's own (Content-Length as counted, chunked
 * relayed through a strict scanner, or chunked for an answer the origin ends by closing, so a
 * reset there is a cut, not an end), never a header the client or upstream could have listed in
 * `Connection`; bodies stream with backpressure both ways; the same clocks
 * apply; one access line and 'request' event per exchange.
 */

export interface FastPathOptions {
  core: ProxyCore;
  limits: ProxyLimits;
  /** The plan step (src/proxy/plan.ts): where the request goes and with which rule, or its refusal. */
  plan(facts: RequestFacts, t: TunnelTarget, config: CompiledConfig): InterceptPlan | ProxyError;
  /** The Node path: takes over the socket, `bytes` being the first it reads. */
  fallback(socket: TLSSocket, bytes: Buffer): void;
}

/** Body bytes held while the upstream connection is being opened; past this the client is paused. */
const MAX_QUEUED = 64 * 1024;

const EMPTY = Buffer.alloc(0);
/** RFC 9110 9.2.2: a proxy must not retry other methods on its own. */
const IDEMPOTENT = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE']);
const ignore = () => undefined;

/** Closes a connection this exchange no longer uses; a late error from it must not be unhandled. */
function discard(up: TLSSocket | undefined): void {
  if (!up) return;
  up.on('error', ignore);
  up.destroy();
}

type Phase = 'idle' | 'connecting' | 'waiting' | 'body' | 'done';

export function serveFast(socket: TLSSocket, t: TunnelTarget, o: FastPathOptions): void {
  new FastConnection(socket, t, o);
}

class FastConnection {
  /** Bytes read from the client and not consumed yet (a head in progress, or pipelined requests). */
  private pending: Buffer = EMPTY;
  private headTimer: NodeJS.Timeout | undefined;
  private handedOver = false;
  private clientEnded = false;
  private readonly core: ProxyCore;
  private readonly limits: ProxyLimits;
  private readonly authority: string;

  // ---- the exchange in progress (one at a time) ----
  private phase: Phase = 'idle';
  private rec!: RequestRecord;
  private started = 0;
  private method = '';
  private requestHead = '';
  private bodyLeft = 0;
  private clientClose = false;
  private queued: Buffer[] = [];
  private queuedBytes = 0;
  /** The upstream connection of the exchange in progress (our listeners on it). */
  private up: TLSSocket | undefined;
  /**
   * The upstream connection of the last exchange, kept with our listeners for the next one: a
   * tunnel has one destination, so it stays bound to this client connection instead of a round
   * trip through the shared pool per request. Any event from it while kept (bytes, end, error,
   * its idle clock) retires it; it goes back to the pool when this connection ends or is handed over.
   */
  private kept: TLSSocket | undefined;
  /** When the kept connection stops being reusable (performance.now() ms). */
  private keptUntil = 0;
  private reused = false;
  private retried = false;
  private rbuf: Buffer = EMPTY;
  private resp: ResponseHead | undefined;
  private left = 0;
  private scanner: ChunkedScanner | undefined;
  /** Trailer section bytes received and not relayed yet (see trailerPart). */
  private trailer: Buffer = EMPTY;
  private upstreamReusable = true;
  private headersSent = false;
  private closeAfter = false;
  private waitingDrain = false;

  constructor(
    private readonly socket: TLSSocket,
    private readonly t: TunnelTarget,
    private readonly o: FastPathOptions,
  ) {
    this.core = o.core;
    this.limits = o.limits;
    this.authority = urlAuthority(t.host, t.port, 443);
    socket.on('data', this.onClientData);
    socket.on('end', this.onClientEnd);
    socket.on('close', this.onClientClose);
    socket.on('timeout', this.onClientTimeout);
    socket.on('drain', this.onClientDrain);
    socket.setTimeout(this.limits.keepAliveTimeoutMs);
  }

  // ---- client side --------------------------------------------------------------------------

  private readonly onClientData = (chunk: Buffer): void => {
    if (this.phase === 'done') return; // the connection is closing after its last exchange
    if (this.phase === 'idle') {
      this.pending = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
      this.nextRequest();
      return;
    }
    // Body bytes of the request in progress first; whatever follows is the next request.
    if (this.bodyLeft > 0) {
      const take = Math.min(this.bodyLeft, chunk.length);
      this.sendBody(take === chunk.length ? chunk : chunk.subarray(0, take));
      if (take === chunk.length) return;
      chunk = chunk.subarray(take);
    }
    this.pending = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
    // Pipelined requests wait for this exchange; the client waits once there is a head's worth.
    if (this.pending.length > this.limits.maxHeaderBytes) this.socket.pause();
  };

  /**
   * The client ended its side (RFC 9112 9.6: it may, once its last request is sent). Every
   * request it completed before is still answered, in order (nextRequest ends the connection once
   * none is left); a request cut short (a body, or a head in progress) never will be.
   */
  private readonly onClientEnd = (): void => {
    this.clientEnded = true;
    if (this.phase === 'idle') this.nextRequest();
    else if (this.bodyLeft > 0) this.socket.destroy(); // the body will never be complete
  };

  private readonly onClientClose = (): void => {
    clearTimeout(this.headTimer);
    this.returnKept();
    if (this.handedOver || this.phase === 'idle' || this.phase === 'done') return;
    discard(this.detachUp());
    if (this.rec.status === 0) this.rec.status = 499;
    this.finish('client closed the connection');
  };

  /**
   * The client's idle clock: between exchanges it closes the connection; during one, it cuts
   * a client stalled mid-upload or not reading what it asked for. A client waiting for a slow
   * upstream is left to the upstream clocks.
   */
  private readonly onClientTimeout = (): void => {
    if (this.phase === 'idle') {
      if (this.pending.length === 0) this.socket.destroy();
      return;
    }
    const uploading = this.bodyLeft > 0;
    if (!idleCutsExchange(uploading, this.headersSent && this.socket.writableLength > 0)) return;
    // Paused mid-upload: the proxy stopped reading the client because the upstream does not read.
    // (A record already written, the answer's tail still queued, is not changed.)
    if (this.phase !== 'done') this.rec.error ??= idleCutReason(uploading, this.socket.isPaused());
    this.socket.destroy();
  };

  private readonly onClientDrain = (): void => {
    if (this.waitingDrain) {
      this.waitingDrain = false;
      this.up?.setTimeout(this.core.timeouts.bodyMs);
      this.up?.resume();
    }
  };

  /** Parses the next request from `pending`, if a whole head is there. */
  private nextRequest(): void {
    if (this.pending.length === 0) {
      // Half-closed by the client and every request it sent is answered: done.
      if (this.clientEnded) return void this.socket.end();
      this.socket.setTimeout(this.limits.keepAliveTimeoutMs);
      return;
    }
    const head = parseRequestHead(this.pending, this.limits);
    if (head === 'incomplete') {
      // The client ended its side in the middle of a head: it never completes.
      if (this.clientEnded) {
        clearTimeout(this.headTimer);
        this.phase = 'done';
        this.pending = EMPTY;
        return void this.socket.end();
      }
      // Slow-loris guard: the head must be complete in time (the Node path's 408).
      this.headTimer ??= setTimeout(() => {
        this.core.events.emit('client_error', { client: this.t.client, code: 'ERR_HTTP_REQUEST_TIMEOUT', status: 408 });
        // Answered and closing: nothing the client sends from here is acted on.
        this.phase = 'done';
        this.pending = EMPTY;
        writeRawError(this.socket, headTimeout());
      }, this.limits.headerTimeoutMs);
      return;
    }
    clearTimeout(this.headTimer);
    this.headTimer = undefined;
    if (head === 'fallback') return this.handOver('head');
    if (this.core.draining()) return this.handOver('draining');
    const config = this.core.config(); // one snapshot for the whole request
    const planned = this.o.plan({ method: head.method, target: head.target, version: 11, rawHeaders: head.rawHeaders }, this.t, config);
    if (planned instanceof ProxyError) return this.refuse(head, planned);
    this.begin(head, planned);
  }

  /**
   * The plan refused this request: the proxy's own answer, one record, and the connection
   * closes. Nothing read after it (a pipelined request) is acted on.
   */
  private refuse(head: RequestHead, err: ProxyError): void {
    clearTimeout(this.headTimer);
    this.phase = 'done';
    this.pending = EMPTY;
    this.returnKept();
    const started = performance.now();
    const rec = newRecord(head.method, { client: this.t.client, host: this.t.host, port: this.t.port, decision: 'intercept' }, refusedPath(head.target), 'fast');
    rec.status = err.status;
    rec.error = err.reason;
    writeRawError(this.socket, err);
    finishRecord(this.core, rec, started);
  }

  /**
   * Gives the connection to the Node path for good. `reason`: the head is not one the fast
   * parser takes ('head'), or the proxy is shutting down ('draining'). Counted, so an operator
   * sees traffic that misses the fast path.
   */
  private handOver(reason: 'head' | 'draining'): void {
    this.handedOver = true;
    this.core.events.emit('fast_path_fallback', { reason });
    const s = this.socket;
    s.off('data', this.onClientData);
    s.off('end', this.onClientEnd);
    s.off('close', this.onClientClose);
    s.off('timeout', this.onClientTimeout);
    s.off('drain', this.onClientDrain);
    s.setTimeout(0);
    this.returnKept();
    const bytes = this.pending;
    this.pending = EMPTY;
    this.o.fallback(s, bytes);
    // The client's end was read here: the Node path's server must see it too, after these bytes,
    // to answer them and then close (it listens for 'end', which a socket emits only once).
    if (this.clientEnded && !s.destroyed) s.emit('end');
  }

  // ---- one exchange ---------------------------------------------------------------------------

  private begin(head: RequestHead, planned: InterceptPlan): void {
    const t = this.t;
    const rule = planned.rule;
    this.started = performance.now();
    this.rec = newRecord(head.method, { client: t.client, host: t.host, port: t.port, decision: 'intercept' }, planned.path, 'fast');
    this.rec.rule = rule?.name ?? null;
    this.rec.injected = rule?.headerNames ?? [];
    t.inFlight++;
    this.phase = 'connecting';
    this.method = head.method;
    this.clientClose = head.close;
    this.requestHead = requestHead(head, planned.pathAndQuery, this.authority, rule);
    this.retried = false;
    this.upstreamReusable = true;
    this.headersSent = false;
    this.closeAfter = false;
    this.resp = undefined;
    this.scanner = undefined;
    this.trailer = EMPTY;
    this.rbuf = EMPTY;
    this.socket.setTimeout(this.limits.idleTimeoutMs);

    const rest = this.pending.subarray(head.headBytes);
    this.pending = EMPTY;
    this.bodyLeft = head.contentLength;
    this.queued = [];
    this.queuedBytes = 0;
    if (rest.length) this.onClientData(rest);
    this.connect(false);
  }

  /** Takes a pooled connection (or dials); `fresh` skips the pool (the retry after a stale one). */
  private connect(fresh: boolean): void {
    const pool = this.core.upstream.h1;
    const kept = this.kept;
    if (kept) {
      this.kept = undefined;
      if (!fresh && usable(kept) && pool.isCurrent(kept)) {
        this.up = kept;
        this.send(true);
        return;
      }
      discard(this.unlisten(kept));
    }
    const onUp = (err: Error | null, up: TLSSocket | null, reused: boolean) => {
      if (this.phase !== 'connecting') {
        // The client left meanwhile.
        if (up) pool.release(this.t.host, this.t.port, up);
        return;
      }
      if (err || !up) {
        this.fail(upstreamError(err, this.t.host));
        return;
      }
      this.attach(up, reused);
    };
    if (fresh) pool.dialNew(this.t.host, this.t.port, (err, up) => onUp(err, up, false));
    else pool.acquire(this.t.host, this.t.port, onUp);
  }

  private attach(up: TLSSocket, reused: boolean): void {
    this.up = up;
    up.on('data', this.onUpData);
    up.on('end', this.onUpEnd);
    up.on('error', this.onUpError);
    up.on('close', this.onUpClose);
    up.on('timeout', this.onUpTimeout);
    up.on('drain', this.onUpDrain);
    this.send(reused);
  }

  /** Writes the request (and the body bytes already here) on `this.up`. */
  private send(reused: boolean): void {
    const up = this.up!;
    this.reused = reused;
    this.phase = 'waiting';
    up.setTimeout(this.core.timeouts.headersMs);
    const body = this.queuedBytes ? Buffer.concat(this.queued) : EMPTY;
    this.queued = [];
    this.queuedBytes = 0;
    this.rec.bytes_in += body.length;
    if (body.length === 0) {
      up.write(this.requestHead, 'latin1');
    } else if (body.length < 16384) {
      up.write(Buffer.concat([Buffer.from(this.requestHead, 'latin1'), body]));
    } else {
      up.write(this.requestHead, 'latin1');
      up.write(body);
    }
    if (this.bodyLeft > 0) this.socket.resume();
  }

  private detachUp(): TLSSocket | undefined {
    const up = this.up;
    this.up = undefined;
    return up && this.unlisten(up);
  }

  private unlisten(up: TLSSocket): TLSSocket {
    up.off('data', this.onUpData);
    up.off('end', this.onUpEnd);
    up.off('error', this.onUpError);
    up.off('close', this.onUpClose);
    up.off('timeout', this.onUpTimeout);
    up.off('drain', this.onUpDrain);
    up.setTimeout(0);
    return up;
  }

  /** Keeps the connection of a complete exchange for the next one (see `kept`). */
  private keep(): void {
    const up = this.up!;
    this.up = undefined;
    const idleMs = keepAliveHintMs(this.resp!.rawHeaders, this.core.timeouts.keepAliveMs);
    if (idleMs <= 0) {
      discard(this.unlisten(up));
      return;
    }
    this.keptUntil = performance.now() + idleMs;
    up.setTimeout(idleMs);
    up.resume(); // paused for a slow client: a close must be seen
    this.kept = up;
  }

  /** An event from the kept connection between exchanges: it cannot be trusted for the next one. */
  private dropKept(): void {
    const k = this.kept;
    this.kept = undefined;
    if (k) discard(this.unlisten(k));
  }

  /** This client connection is done with its kept upstream connection: back to the shared pool. */
  private returnKept(): void {
    const k = this.kept;
    this.kept = undefined;
    if (k) this.core.upstream.h1.release(this.t.host, this.t.port, this.unlisten(k), Math.floor(this.keptUntil - performance.now()));
  }

  /** Request body bytes from the client. */
  private sendBody(chunk: Buffer): void {
    this.bodyLeft -= chunk.length;
    if (!this.up) {
      this.queued.push(chunk);
      this.queuedBytes += chunk.length;
      if (this.queuedBytes > MAX_QUEUED) this.socket.pause();
      return;
    }
    this.rec.bytes_in += chunk.length;
    if (!this.up.write(chunk)) this.socket.pause();
  }

  private readonly onUpDrain = (): void => {
    if (this.up && this.bodyLeft > 0) this.socket.resume();
  };

  // ---- upstream side ----------------------------------------------------------------------------

  private readonly onUpData = (chunk: Buffer): void => {
    if (!this.up) return this.dropKept(); // an upstream never speaks first
    if (this.resp) {
      this.relay(chunk);
      return;
    }
    let buf = this.rbuf.length ? Buffer.concat([this.rbuf, chunk]) : chunk;
    for (;;) {
      const r = parseResponseHead(buf, this.method);
      if (r === 'incomplete') {
        this.rbuf = buf;
        return;
      }
      if ('error' in r) {
        this.upstreamReusable = false;
        this.fail(invalidAnswer(this.t.host, r.error));
        return;
      }
      buf = buf.subarray(r.headBytes);
      if (r.status >= 200) {
        this.rbuf = EMPTY;
        this.respond(r, buf);
        return;
      }
      // 1xx: informational, not relayed (as on the Node path); the real head follows.
      if (buf.length === 0) {
        this.rbuf = EMPTY;
        return;
      }
    }
  };

  /** Sends the response head (with the first body bytes, one TLS record for a small answer). */
  private respond(r: ResponseHead, first: Buffer): void {
    this.resp = r;
    this.phase = 'body';
    this.rec.status = r.status;
    this.up?.setTimeout(this.core.timeouts.bodyMs);
    const f = r.framing;
    // A client that half-closed is not a reason to close: what it pipelined before is answered (nextRequest).
    this.closeAfter = this.clientClose || f.kind === 'close' || this.core.draining() || this.bodyLeft > 0;
    let head = `HTTP/1.1 ${r.status} ${STATUS_CODES[r.status] ?? 'unknown'}\r\n`;
    const hs = filterRawResponseHeaders(r.rawHeaders, false, r.status);
    for (let i = 0; i < hs.length; i += 2) {
      // The length toward the client is the proxy's own (a `Connection: content-length` must not drop it).
      if (f.kind === 'length' && hs[i].length === 14 && hs[i].toLowerCase() === 'content-length') continue;
      head += `${hs[i]}: ${hs[i + 1]}\r\n`;
    }
    if (f.kind === 'length') {
      head += `Content-Length: ${f.length}\r\n`;
      this.left = f.length;
    } else if (f.kind === 'chunked') {
      head += 'Transfer-Encoding: chunked\r\n';
      this.scanner = new ChunkedScanner();
    } else if (f.kind === 'close') {
      // An answer the origin delimits by ending its connection goes to the client chunked (the
      // request was HTTP/1.1): its end is then the proxy's last chunk, sent only when the origin
      // really ended it. Relayed as close-delimited, a connection the origin reset in the middle
      // of the body ended toward the client exactly as a complete answer does.
      head += 'Transfer-Encoding: chunked\r\n';
    }
    if (this.closeAfter) head += 'Connection: close\r\n';
    head += '\r\n';
    this.headersSent = true;
    const body = this.bodyPart(first);
    if (body === undefined) return;
    if (body.length > 0 && body.length < 16384) {
      this.write(Buffer.concat([Buffer.from(head, 'latin1'), body]));
    } else {
      this.socket.write(head, 'latin1');
      if (body.length) this.write(body);
    }
    this.maybeComplete();
  }

  private relay(chunk: Buffer): void {
    const body = this.bodyPart(chunk);
    if (body === undefined) return;
    if (body.length) this.write(body);
    this.maybeComplete();
  }

  /** The part of `chunk` that belongs to the response body; undefined when the framing broke. */
  private bodyPart(chunk: Buffer): Buffer | undefined {
    const f = this.resp!.framing;
    switch (f.kind) {
      case 'none':
        if (chunk.length) this.upstreamReusable = false;
        return EMPTY;
      case 'length': {
        const take = Math.min(this.left, chunk.length);
        this.left -= take;
        this.rec.bytes_out += take;
        if (take < chunk.length) this.upstreamReusable = false; // bytes nobody asked for
        return take === chunk.length ? chunk : chunk.subarray(0, take);
      }
      case 'chunked': {
        const s = this.scanner!;
        const before = s.dataBytes;
        const trailing = s.trailing;
        const end = s.scan(chunk);
        this.rec.bytes_out += s.dataBytes - before;
        if (end === -2) {
          this.broken(`upstream sent a malformed chunked body (${s.error})`);
          return undefined;
        }
        if (end >= 0 && end < chunk.length) this.upstreamReusable = false;
        const upTo = end === -1 ? chunk.length : end;
        // The trailer section is held (bounded by the scanner) and relayed filtered once complete.
        const from = trailing ? 0 : s.trailerAt;
        if (from >= 0) return this.trailerPart(chunk, from, upTo, s.done);
        return upTo === chunk.length ? chunk : chunk.subarray(0, upTo);
      }
      case 'close':
        this.rec.bytes_out += chunk.length;
        // One chunk per read (never an empty one: that is the last chunk).
        return chunk.length ? chunkOf(chunk) : EMPTY;
    }
  }

  /**
   * `chunk[from, upTo)` is trailer section: kept until it is complete (`done`), then relayed
   * with the fields a trailer may not carry removed (hop-by-hop, framing, routing: headers.ts),
   * the rest byte for byte. Returns what goes to the client now: `chunk` before `from`, then the
   * filtered section once complete; undefined when the section is not relayed at all (the answer
   * is cut: headers.ts, relayedTrailerLines).
   */
  private trailerPart(chunk: Buffer, from: number, upTo: number, done: boolean): Buffer | undefined {
    this.trailer = this.trailer.length ? Buffer.concat([this.trailer, chunk.subarray(from, upTo)]) : chunk.subarray(from, upTo);
    const head = chunk.subarray(0, from);
    if (!done) return head;
    const section = this.trailer.toString('latin1');
    this.trailer = EMPTY;
    // `name: value CRLF ... CRLF`, or the final CRLF alone.
    const lines = section.length > 2 ? section.slice(0, -4).split('\r\n') : [];
    const kept = relayedTrailerLines(lines, this.resp!.rawHeaders);
    // A section that is not relayed at all: the answer is cut, as on the paths undici reads.
    if (kept === undefined) {
      this.broken('upstream sent a malformed trailer section');
      return undefined;
    }
    if (kept.length === lines.length) return Buffer.concat([head, Buffer.from(section, 'latin1')]);
    return Buffer.concat([head, Buffer.from(kept.map((l) => l + '\r\n').join('') + '\r\n', 'latin1')]);
  }

  private write(data: Buffer): void {
    chunkRelayed(data.length);
    if (!this.socket.write(data) && !this.waitingDrain) {
      this.waitingDrain = true;
      // Paused for a slow client, the upstream is not stalling: its idle clock stops, and the
      // client's own (onClientTimeout: not reading what it asked for) applies meanwhile.
      this.up?.setTimeout(0);
      this.up?.pause();
    }
  }

  private maybeComplete(): void {
    const f = this.resp!.framing;
    if (f.kind === 'none' || (f.kind === 'length' && this.left === 0) || (f.kind === 'chunked' && this.scanner!.done)) this.complete();
  }

  private readonly onUpEnd = (): void => {
    if (!this.up) return this.dropKept();
    if (this.resp?.framing.kind === 'close') {
      // The origin ended its answer: the client's last chunk (respond: sent chunked).
      this.upstreamReusable = false;
      this.write(LAST_CHUNK);
      this.complete();
      return;
    }
    this.upstreamGone(layerError('upstream closed the connection', 'ECONNRESET'));
  };

  private readonly onUpError = (err: Error): void => (this.up ? this.upstreamGone(err) : this.dropKept());

  private readonly onUpClose = (): void => (this.up ? this.upstreamGone(layerError('upstream closed the connection', 'ECONNRESET')) : this.dropKept());

  private readonly onUpTimeout = (): void => {
    if (!this.up) return this.dropKept();
    if (!this.resp) this.fail(upstreamError({ code: 'UND_ERR_HEADERS_TIMEOUT' }, this.t.host));
    else this.broken('upstream stalled');
  };

  /** The upstream connection failed or closed before the exchange was complete. */
  private upstreamGone(err: Error): void {
    if (this.phase !== 'waiting' && this.phase !== 'body') return;
    // A kept-alive connection the upstream had closed as the request went out. Sent again once,
    // on a new connection, only when the method is idempotent (the first copy may have arrived)
    // and it has no body (nothing was consumed from the client).
    if (this.phase === 'waiting' && this.reused && !this.retried && IDEMPOTENT.has(this.method) && this.rbuf.length === 0 && this.rec.bytes_in === 0 && this.bodyLeft === 0) {
      discard(this.detachUp());
      this.retried = true;
      this.phase = 'connecting';
      this.connect(true);
      return;
    }
    if (this.resp) this.broken('response stream interrupted');
    else this.fail(upstreamError(err, this.t.host));
  }

  // ---- endings --------------------------------------------------------------------------------

  /** The response is complete: log, give the connection back, go on with the next request. */
  private complete(): void {
    if (this.up) {
      if (this.upstreamReusable && this.resp!.reusable && this.bodyLeft === 0 && this.core.upstream.h1.isCurrent(this.up)) this.keep();
      else discard(this.detachUp());
    }
    this.waitingDrain = false;
    this.finish();
    this.afterExchange();
  }

  /** An error before any response byte reached the client: the proxy's own answer. */
  private fail(err: ProxyError): void {
    discard(this.detachUp());
    this.core.events.emit('upstream_error', { host: this.t.host, reason: err.reason });
    this.rec.status = err.status;
    // A refusal found on the way (the egress policy after resolution: 403) closes, as every refusal does.
    this.closeAfter = this.clientClose || this.core.draining() || this.bodyLeft > 0 || err.status < 500;
    this.socket.write(errorResponse(err, this.closeAfter), 'latin1');
    this.finish(err.reason);
    this.afterExchange();
  }

  /** An error after the response started: the client must see a broken response, not a complete one. */
  private broken(why: string): void {
    discard(this.detachUp());
    this.finish(why);
    this.socket.destroy();
  }

  private finish(error?: string): void {
    if (this.phase === 'done' || this.phase === 'idle') return;
    this.phase = 'done';
    if (error && !this.rec.error) this.rec.error = error;
    this.t.inFlight--;
    finishRecord(this.core, this.rec, this.started);
  }

  private afterExchange(): void {
    // Draining may have begun after this response's head went out: close now, not at the grace deadline.
    if (this.closeAfter || this.socket.destroyed || this.core.draining()) {
      // Ended, then the linger: neither left to a client's FIN that may never come, nor
      // destroyed before a slow reader has the answer's tail.
      endThenLinger(this.socket);
      return;
    }
    this.phase = 'idle';
    this.socket.resume();
    this.nextRequest();
  }
}

/** The request head sent upstream: Host from the CONNECT target, the rule's headers, the proxy's own framing. */
function requestHead(head: RequestHead, pathAndQuery: string, authority: string, rule: CompiledRule | undefined): string {
  let out = `${head.method} ${pathAndQuery} HTTP/1.1\r\nhost: ${authority}\r\n`;
  let hasLength = false;
  for (let i = 0; i < head.rawHeaders.length; i += 2) {
    if (head.rawHeaders[i].length === 14 && head.rawHeaders[i].toLowerCase() === 'content-length') hasLength = true;
  }
  const hs = upstreamRequestHeaders(head.rawHeaders, { rule });
  for (let i = 0; i < hs.length; i += 2) {
    // Dropped here and written below: listed in `Connection`, it would otherwise vanish while the body is still sent.
    if (hs[i].length === 14 && hs[i].toLowerCase() === 'content-length') continue;
    out += `${hs[i]}: ${hs[i + 1]}\r\n`;
  }
  if (hasLength) out += `content-length: ${head.contentLength}\r\n`;
  return out + '\r\n';
}
