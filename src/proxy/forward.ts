import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Readable } from 'node:stream';
import type { CompiledRule, Decision } from '../rules/compile.js';
import { formatAuthority } from '../rules/host.js';
import type { ProxyCore, RequestRecord } from './context.js';
import { finishRecord } from './record.js';
import { invalidAnswer, ProxyError, sendError, upstreamError } from './errors.js';
import { filterRawResponseHeaders, relayedTrailers, trailerProblem, upstreamRequestHeaders } from './headers.js';
import { answerProblem, bodilessAnswer } from './answer.js';
import { idleCutReason, idleCutsExchange } from './limits.js';
import { upstreamAnswerVersion, upstreamEnding } from './upstream.js';
import type { Http2ServerResponse } from 'node:http2';
import { chunkRelayed } from './buffer-gc.js';
import { announcesBody, continueIfOwed } from './boundary.js';
import { repeatedSingleValue } from './h2/fields.js';

/** RFC 9113 INTERNAL_ERROR, as a number: importing node:http2 for its constant would load HTTP/2 into every sidecar (test/cli/proxy-imports.test.ts). */
const H2_INTERNAL_ERROR = 2;
const H2_NO_ERROR = 0;
/** RFC 9113 CANCEL: the stream is no longer wanted (a client whose idle clock ran out on it). */
const H2_CANCEL = 8;

/**
 * Writes an HTTP/2 client's whole answer (`answer`), then asks the client to stop sending a
 * request body nobody will read (the answer came before it ended: an early answer, a refusal):
 * RST_STREAM(NO_ERROR) once the answer is out, which keeps the answer whole (RFC 9113 8.1).
 * Node's compatibility API sends an answer's trailers (or its empty end) when the stream emits
 * 'wantTrailers', after the stream's 'finish': a reset submitted before that overtakes them.
 * Submitted after it, from outside the session's callbacks, Node writes what is pending first.
 * An answer whose head ended the stream (204, 304) has no trailers to wait for.
 */
export function answerThenStopUpload(res: Http2ServerResponse, answer: () => void): void {
  const stream = res.stream;
  const headEnded = stream.writableEnded;
  answer();
  if (!stream.destroyed && stream.state.remoteClose === 0) stopUpload(stream, headEnded);
}

function stopUpload(stream: Http2ServerResponse['stream'], headEnded: boolean): void {
  const close = () =>
    setImmediate(() => {
      if (!stream.closed && !stream.destroyed) stream.close(H2_NO_ERROR);
    });
  if (headEnded) close();
  else stream.once('wantTrailers', close);
}

export interface ForwardTarget {
  scheme: 'https' | 'http';
  host: string;
  port: number;
  /** Path and query exactly as they go upstream. */
  pathAndQuery: string;
  /** Path for the log (no query: it can hold tokens). */
  logPath: string;
  decision: Decision;
  rule?: CompiledRule;
  client: string;
  /**
   * HTTP/2 (h2/exchange.ts): the request fields without pseudo-headers (instead of
   * `req.rawHeaders`), whether a body follows, and whether the client sent `te: trailers`.
   * Response trailers are relayed.
   */
  h2?: { fields: string[]; body: boolean; trailers?: boolean };
}

/** Answers with the proxy's own error and records it. */
export function refuse(core: ProxyCore, res: ServerResponse, rec: RequestRecord, started: number, err: ProxyError, close = false): void {
  rec.status = err.status;
  rec.error = err.reason;
  sendError(res, err, close);
  finishRecord(core, rec, started);
}

/**
 * The request body as the upstream client reads it, counted. Its first read is when the upstream
 * is ready for the body (connected, past the egress checks after DNS): a client that asked for
 * `100 Continue` is told to send it then, not before (boundary.ts checkExpectationsInPlan).
 */
async function* counted(src: Readable, rec: RequestRecord, res: ServerResponse): AsyncGenerator<Buffer> {
  continueIfOwed(res);
  for await (const chunk of src) {
    rec.bytes_in += (chunk as Buffer).length;
    yield chunk as Buffer;
  }
}

/** Raw fields as strings: undici's latin1 bytes from an HTTP/1.1 origin (as on the wire), h2/upstream.ts's strings from an HTTP/2 one. */
function latin1(raw: (Buffer | string)[]): string[] {
  const strings = new Array<string>(raw.length);
  for (let i = 0; i < raw.length; i++) {
    const v = raw[i];
    strings[i] = typeof v === 'string' ? v : v.toString('latin1');
  }
  return strings;
}

/**
 * Upstream trailers, as relayed by every path (headers.ts, relayedTrailers), as `[name, value]`
 * pairs, or undefined when the section is not relayed at all (trailerProblem). Both clients give
 * a raw list: undici's latin1 bytes (HTTP/1.1), h2/upstream.ts's strings (HTTP/2).
 */
function trailerPairs(given: (Buffer | string)[], head: string[]): [string, string][] | undefined {
  const raw = latin1(given);
  if (trailerProblem(raw)) return undefined;
  const kept = relayedTrailers(raw, head);
  const out: [string, string][] = [];
  for (let i = 0; i < kept.length; i += 2) out.push([kept[i], kept[i + 1]]);
  return out;
}

const GRPC_STATUS_FIELDS = new Set(['grpc-status', 'grpc-message', 'grpc-status-details-bin']);

/** Response headers without gRPC status fields, which go to the response's trailers. */
function moveGrpcStatus(headers: string[], res: ServerResponse): string[] {
  if (!headers.some((n, i) => i % 2 === 0 && GRPC_STATUS_FIELDS.has(n.toLowerCase()))) return headers;
  const kept: string[] = [];
  const moved: Record<string, string> = {};
  for (let i = 0; i < headers.length; i += 2) {
    const lower = headers[i].toLowerCase();
    if (GRPC_STATUS_FIELDS.has(lower)) moved[lower] = headers[i + 1];
    else kept.push(headers[i], headers[i + 1]);
  }
  res.addTrailers(moved);
  return kept;
}

/**
 * Sends one request upstream and streams the answer back: HTTP/1.1 clients' through the shared
 * undici pool, HTTP/2 clients' through keygate's own HTTP/2 client (h2/upstream.ts, the same
 * dispatch interface; HTTP/1.1 pool for origins without h2). The
 * request body as it arrives, the response chunk by chunk with backpressure both ways. Nothing is
 * buffered.
 *
 * This uses the dispatch handler interface rather than undici's `request()`: the response goes straight from
 * undici's parser to the client socket, without a body stream, a pipeline and an AbortController
 * per request (they were a large share of the CPU per request in profiles). Headers are sent with
 * the first body chunk when it is already there (one TLS record for a small response), and
 * flushed on their own otherwise, so server-sent events still reach the client as they are written.
 */
export function forward(core: ProxyCore, req: IncomingMessage, res: ServerResponse, t: ForwardTarget, rec: RequestRecord, started: number): void {
  // A request pipelined behind another on an HTTP/1.1 connection: Node's server reads it (and
  // emits it) at once, but its response waits for the earlier ones (it gets the socket then).
  // It goes upstream only then: one request at a time per client connection, in order, as the
  // fast path does (RFC 9112 9.3.2: pipelined requests that are not safe must not be processed
  // in parallel), and never once the client is gone (Node destroys every queued request when
  // the connection closes), so nothing more leaves with the rule's credentials.
  if (!t.h2 && res.socket === null) {
    const onSocket = () => {
      req.off('close', onGone);
      forward(core, req, res, t, rec, started);
    };
    const onGone = () => {
      if (res.socket !== null) return;
      res.off('socket', onSocket);
      if (rec.status === 0) rec.status = 499;
      rec.error = 'client closed the connection';
      finishRecord(core, rec, started);
    };
    res.once('socket', onSocket);
    req.once('close', onGone);
    return;
  }
  rec.rule = t.rule?.name ?? null;
  rec.injected = t.rule?.headerNames ?? [];
  const headers = upstreamRequestHeaders(t.h2?.fields ?? req.rawHeaders, { rule: t.rule });
  // TE is hop-by-hop, so the proxy says it for itself: it relays trailers on every path, so an
  // HTTP/2 client that reads them may have them asked for (h2/upstream.ts sends this to HTTP/2
  // origins only; gRPC servers refuse a request without it).
  if (t.h2?.trailers) headers.push('te', 'trailers');
  let abortUpstream: ((err: Error) => void) | undefined;
  let clientGone = false;
  let finished = false;
  let waitingForDrain = false;
  let flushScheduled = false;
  /** The answer head's fields (their `Connection` names fields the trailers may not carry). */
  let headFields: string[] = [];

  const done = (error?: string) => {
    if (finished) return;
    finished = true;
    res.off('close', onClose);
    if (error && !rec.error) rec.error = error;
    finishRecord(core, rec, started);
  };
  // The client going away cancels the upstream request (and frees its pool slot).
  const onClose = () => {
    if (res.writableFinished || finished) return;
    clientGone = true;
    abortUpstream?.(new Error('client closed the connection'));
    if (rec.status === 0) rec.status = 499;
    done('client closed the connection');
  };
  res.once('close', onClose);
  // The client's idle clock fires here instead of closing blindly (HTTP/1.1: the connection's,
  // server.timeout; HTTP/2: the stream's, h2/exchange.ts): a client stalled mid-upload, or not
  // reading what it asked for, is cut (HTTP/2: its stream alone, RST_STREAM(CANCEL)); one
  // waiting for the upstream is left to the upstream clocks (response header and body timeouts).
  res.on('timeout', () => {
    const stream = t.h2 ? (res as unknown as Http2ServerResponse).stream : undefined;
    const unread = res.headersSent && ((stream ? stream.writableLength : res.socket?.writableLength) ?? 0) > 0;
    // HTTP/2: whether the client's END_STREAM came (Node's `complete` waits for the body to be read).
    const uploading = stream ? stream.state.remoteClose === 0 : !req.complete;
    if (!idleCutsExchange(uploading, unread)) return;
    // Held back: a body the proxy has read up to its buffer's bound and nobody consumed since.
    // (A record already written, the answer's tail still queued, is not changed.)
    if (!finished) rec.error ??= idleCutReason(uploading, req.readableLength >= req.readableHighWaterMark);
    // As if the client had gone (the upstream request given up, the record written), then cut.
    onClose();
    if (stream) stream.close(H2_CANCEL);
    else res.destroy();
  });

  /**
   * The answer is broken after its head went out: the client must see a broken response, not a
   * complete one. An HTTP/2 stream destroyed without an error ends with RST_STREAM(NO_ERROR),
   * which a client may take for the end of a complete answer: INTERNAL_ERROR says it is not.
   */
  const cut = () => {
    if (t.h2) (res as unknown as Http2ServerResponse).stream.close(H2_INTERNAL_ERROR);
    else res.destroy();
  };

  /**
   * The proxy's own answer in place of the origin's (an upstream failure, an answer not
   * accepted). `close`: an HTTP/1.1 connection closes after it (a refusal). A request whose body
   * is still coming has no reader left: its HTTP/1.1 connection closes too, and an HTTP/2 client
   * is asked to stop sending (answerThenStopUpload; HTTP/2 has no `Connection` to set).
   */
  const answerInstead = (perr: ProxyError, close: boolean) => {
    if (!t.h2) refuse(core, res, rec, started, perr, close || !req.complete);
    else if (t.h2.body) answerThenStopUpload(res as unknown as Http2ServerResponse, () => refuse(core, res, rec, started, perr));
    else refuse(core, res, rec, started, perr);
  };

  const flush = () => {
    flushScheduled = false;
    if (!finished && !res.headersSent) res.flushHeaders();
  };

  (t.h2 ? core.upstream.h2 : core.upstream.agent).dispatch(
    {
      origin: `${t.scheme}://${formatAuthority(t.host, t.port)}`,
      path: t.pathAndQuery,
      method: req.method as 'GET',
      headers,
      // undici streams async iterables; the generator counts bytes without buffering.
      body: (t.h2 ? t.h2.body : announcesBody(req)) ? (counted(req, rec, res) as unknown as Readable) : null,
    },
    {
      onConnect(abort: (err?: Error) => void) {
        abortUpstream = abort;
        if (clientGone) abort(new Error('client closed the connection'));
      },
      // Once the exchange is over for the client (it left, or the proxy answered an error), the
      // upstream request is aborted and whatever undici still delivers is dropped, never paused:
      // a parser paused at that point and then ended by the origin trips an assertion inside
      // undici (Parser.finish) that takes the whole process down.
      onHeaders(statusCode: number, rawHeaders: Buffer[], resume: () => void, statusText?: string) {
        if (clientGone || res.destroyed) return true;
        const raw = latin1(rawHeaders);
        // The check every path holds an answer head to (answer.ts), interim answers included.
        const problem = answerProblem({ version: upstreamAnswerVersion(), status: statusCode, reason: statusText ?? '', raw, method: req.method ?? '' });
        if (problem) {
          // Finished first: undici reports the abort to onError at once, which would cut the answer.
          finished = true;
          res.off('close', onClose);
          abortUpstream?.(new Error('upstream answer not accepted'));
          const perr = invalidAnswer(t.host, problem);
          core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
          answerInstead(perr, false);
          return true;
        }
        // undici hands informational answers (103 Early Hints, 102) here too: they are not relayed
        // (as on the fast path), the final answer follows. Written, it would make the final one a
        // second head, which fails the whole response.
        if (statusCode < 200) return true;
        rec.status = statusCode;
        headFields = raw;
        if (core.draining()) res.shouldKeepAlive = false;
        // An answer before the request's body has all arrived (an early 413 or 401 to an upload):
        // nobody will read the rest. An HTTP/1.1 client is told so by `Connection: close` and
        // the end of the connection after the answer, as on the fast path, rather than having
        // its upload read and dropped for as long as it sends. (An HTTP/2 client: onComplete.)
        if (!t.h2 && !req.complete) res.shouldKeepAlive = false;
        let headers = filterRawResponseHeaders(raw, false, statusCode);
        // A gRPC "trailers-only" answer (grpc-status in a HEADERS frame that ends the stream)
        // cannot be re-sent as one frame through Node's compatibility API: its status fields go
        // in the trailers instead, an equivalent gRPC answer with no message.
        if (t.h2) headers = moveGrpcStatus(headers, res);
        // node:http2 sends a field that takes one value only once (h2/fields.ts): an answer
        // repeating one cannot reach an HTTP/2 client as the origin sent it, and is not altered.
        const repeated = t.h2 ? repeatedSingleValue(headers) : undefined;
        const unrelayable = () => {
          finished = true;
          res.off('close', onClose);
          abortUpstream?.(new Error('upstream answer not accepted'));
          // What writeHead set before it threw must not go out with the proxy's own answer.
          for (const name of res.getHeaderNames()) res.removeHeader(name);
          const perr = repeated ? invalidAnswer(t.host, `more than one ${repeated} field, which HTTP/2 carries once`) : upstreamError({ code: 'INVALID_RESPONSE_HEADER' }, t.host);
          core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
          answerInstead(perr, false);
          return true;
        };
        if (repeated) return unrelayable();
        try {
          res.writeHead(statusCode, headers);
        } catch {
          // Any other upstream header Node refuses to relay: reported instead of half a response.
          return unrelayable();
        }
        // Small answers arrive with their headers: let the first chunk carry them. If nothing
        // follows at once (a stream), send the headers on their own.
        if (!flushScheduled) {
          flushScheduled = true;
          setImmediate(flush);
        }
        res.on('drain', () => {
          if (waitingForDrain) {
            waitingForDrain = false;
            resume();
          }
        });
        return true;
      },
      onData(chunk: Buffer) {
        if (finished || res.destroyed) return true;
        rec.bytes_out += chunk.length;
        chunkRelayed(chunk.length);
        // Never pause while undici drains a connection the origin has ended (upstream.ts).
        if (res.write(chunk) || upstreamEnding()) return true;
        waitingForDrain = true;
        return false;
      },
      onComplete(trailers: string[] | null) {
        if (finished) return;
        // Trailers (gRPC's grpc-status over HTTP/2; any chunked HTTP/1.1 answer's), through the
        // one trailer policy. Node writes them to an HTTP/1.1 client only on a chunked answer.
        const given = trailers as unknown as (Buffer | string)[] | null;
        if (given && given.length) {
          const pairs = trailerPairs(given, headFields);
          if (pairs === undefined) {
            // A section not relayed at all (headers.ts, trailerProblem): the answer is cut.
            cut();
            done('upstream sent a malformed trailer section');
            return;
          }
          if (pairs.length) {
            // A trailer repeating a field that takes one value: node:http2 cannot send it (see onHeaders).
            if (t.h2 && repeatedSingleValue(pairs.flat())) {
              cut();
              done('upstream sent a trailer section HTTP/2 cannot carry');
              return;
            }
            if (t.h2) {
              const obj: Record<string, string[]> = {};
              for (const [name, value] of pairs) (obj[name.toLowerCase()] ??= []).push(value);
              (res as unknown as { addTrailers(h: Record<string, string[]>): void }).addTrailers(obj);
            } else res.addTrailers(pairs);
          }
        }
        // The HTTP/2 client's counterpart of `Connection: close` above (RFC 9113 8.1).
        if (t.h2?.body) answerThenStopUpload(res as unknown as Http2ServerResponse, () => res.end());
        else res.end();
        done();
      },
      onError(err: Error) {
        if (finished) return;
        if (clientGone) {
          done('client closed the connection');
          return;
        }
        // undici holds a 304 (or 204, or an answer to HEAD) to its Content-Length and fails it
        // when no body follows; such an answer has no body (a 304 names the representation's
        // length, RFC 9110 8.6): it is complete. undici closes that connection, nothing is reused.
        if ((err as NodeJS.ErrnoException).code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH' && rec.status >= 200 && bodilessAnswer(req.method, rec.status) && rec.bytes_out === 0 && !res.destroyed) {
          res.end();
          done();
          return;
        }
        if (res.headersSent || rec.status !== 0) {
          // Part of the answer is out: the client must see a broken response, not a complete one.
          cut();
          done('response stream interrupted');
          return;
        }
        finished = true;
        res.off('close', onClose);
        const perr = upstreamError(err, t.host);
        core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
        req.resume();
        // A refusal found on the way (the egress policy after resolution: a 403) closes like every
        // refusal; an upstream failure (502, 504) leaves the connection to the client, unless the
        // request's body is still coming (answerInstead).
        answerInstead(perr, perr.status < 500);
      },
    },
  );
}
