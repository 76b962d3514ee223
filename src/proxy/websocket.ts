import type { IncomingMessage, RequestOptions } from 'node:http';
import http, { STATUS_CODES } from '../node-http.js';
import type { Duplex } from 'node:stream';
import { joinHalfOpen } from '../half-open.js';
import { formatAuthority } from '../rules/host.js';
import type { ProxyCore } from './context.js';
import type { ForwardTarget } from './forward.js';
import { afterEarlierAnswers } from './boundary.js';
import { finishRecord, newRecord } from './record.js';
import { endThenLinger, invalidAnswer, layerError, malformed, ProxyError, upstreamError, writeRawError } from './errors.js';
import { filterRawResponseHeaders, relayedTrailers, trailerProblem, upstreamRequestHeaders } from './headers.js';
import { answerProblem, bodilessAnswer, MAX_ANSWER_FIELDS, MAX_ANSWER_HEAD } from './answer.js';
import { chunkOf } from './h1/chunked.js';
import type { RequestRecord } from './context.js';

/** Where an upgrade goes: the same target a forwarded request has. */
export type UpgradeTarget = ForwardTarget;

function rawHead(status: number, message: string | undefined, headers: string[]): string {
  let head = `HTTP/1.1 ${status} ${message || STATUS_CODES[status] || ''}\r\n`;
  for (let i = 0; i < headers.length; i += 2) head += `${headers[i]}: ${headers[i + 1]}\r\n`;
  return head + '\r\n';
}

export function refuseUpgrade(core: ProxyCore, req: IncomingMessage, socket: Duplex, t: Pick<UpgradeTarget, 'client' | 'host' | 'port' | 'decision'>, path: string, err: ProxyError): void {
  const started = performance.now();
  const rec = newRecord(req.method ?? '', t, path);
  rec.status = err.status;
  rec.error = err.reason;
  writeRawError(socket, err);
  finishRecord(core, rec, started);
}

/**
 * Forwards a WebSocket handshake (the rule's headers injected into it) over a verified
 * connection to the same destination, and once the upstream answers 101 splices the two sockets.
 * Any other answer is relayed as a normal response and the connection closed, so nothing the
 * client sends afterwards can reach the upstream unchecked.
 */
export function relayUpgrade(core: ProxyCore, req: IncomingMessage, socket: Duplex, head: Buffer, t: UpgradeTarget): void {
  afterEarlierAnswers(socket, () => relayInOrder(core, req, socket, head, t));
}

function relayInOrder(core: ProxyCore, req: IncomingMessage, socket: Duplex, head: Buffer, t: UpgradeTarget): void {
  if (socket.destroyed) return;
  // Node's parser gives every byte after an upgrade request's head to the new protocol, whatever
  // body the head announces; the origin would read those bytes as that body (and what follows
  // them as another request, unchecked). A handshake has no body: one that announces one is refused.
  const cl = req.headers['content-length'];
  if (req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0')) {
    refuseUpgrade(core, req, socket, t, t.logPath, malformed('an upgrade request carries no body'));
    return;
  }
  const started = performance.now();
  // Resolved and checked against the egress policy first; the connection then goes to exactly that address.
  core.upstream.dialAddress(t.host, t.port).then(
    (address) => {
      if (socket.destroyed) return;
      relayTo(core, req, socket, head, t, address, started);
    },
    (err: unknown) => {
      const perr = upstreamError(err, t.host);
      if (!(err instanceof ProxyError)) core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
      const rec = newRecord(req.method ?? '', t, t.logPath);
      rec.status = perr.status;
      rec.error = perr.reason;
      writeRawError(socket, perr);
      finishRecord(core, rec, started);
    },
  );
}

function relayTo(core: ProxyCore, req: IncomingMessage, socket: Duplex, head: Buffer, t: UpgradeTarget, address: string, started: number): void {
  const rec = newRecord(req.method ?? '', t, t.logPath);
  rec.rule = t.rule?.name ?? null;
  rec.injected = t.rule?.headerNames ?? [];
  const headers = upstreamRequestHeaders(req.rawHeaders, { rule: t.rule, websocket: true });
  headers.unshift('host', t.port === (t.scheme === 'https' ? 443 : 80) ? formatAuthority(t.host, t.port).replace(/:\d+$/, '') : formatAuthority(t.host, t.port));
  let settled = false;
  const upReq = http.request({
    method: req.method,
    path: t.pathAndQuery,
    headers,
    setHost: false,
    maxHeaderSize: MAX_ANSWER_HEAD + 1024,
    // No agent: with createConnection, node:http uses our (verified) socket for this one request.
    createConnection: () => (t.scheme === 'https' ? core.upstream.connectTls(t.host, t.port, address) : core.upstream.connectTcp(t.host, t.port, address)),
  } as RequestOptions);
  // The answer check's own bounds decide (answer.ts), not Node's 16 KiB and 2,000-field defaults
  // (past 2,000 Node drops fields silently): one field more than the check allows is kept.
  upReq.maxHeadersCount = MAX_ANSWER_FIELDS + 1;
  const timer = setTimeout(() => upReq.destroy(layerError('timeout', 'UND_ERR_HEADERS_TIMEOUT')), core.timeouts.headersMs);
  socket.on('error', () => upReq.destroy());

  /** The answer check every path shares (answer.ts), for this handshake's answer; a 502 and true when it fails. */
  const refused = (res: IncomingMessage, why?: string): boolean => {
    const problem =
      why ??
      answerProblem({ version: res.httpVersionMajor * 10 + res.httpVersionMinor, status: res.statusCode ?? 0, reason: res.statusMessage ?? '', raw: res.rawHeaders, method: req.method ?? 'GET', websocket: true });
    if (!problem) return false;
    upReq.destroy();
    const perr = invalidAnswer(t.host, problem);
    core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
    rec.status = perr.status;
    rec.error = perr.reason;
    writeRawError(socket, perr);
    finishRecord(core, rec, started);
    return true;
  };

  upReq.on('upgrade', (res, upSocket, upHead) => {
    settled = true;
    clearTimeout(timer);
    if (refused(res)) {
      upSocket.destroy();
      return;
    }
    rec.status = res.statusCode ?? 101;
    socket.write(rawHead(rec.status, res.statusMessage, filterRawResponseHeaders(res.rawHeaders, true)));
    if (upHead.length) socket.write(upHead);
    if (head.length) upSocket.write(head);
    const done = () => {
      upSocket.destroy();
      socket.destroy();
    };
    // Each direction's end is passed on alone (a side that stopped sending may still read), a
    // reset as a reset; the record is written once both sides are closed.
    joinHalfOpen(socket, upSocket, () => {
      rec.bytes_in = (socket as { bytesRead?: number }).bytesRead ?? 0;
      rec.bytes_out = (socket as { bytesWritten?: number }).bytesWritten ?? 0;
      finishRecord(core, rec, started);
    });
    core.watchEgress(socket, {
      host: t.host,
      port: t.port,
      address,
      close(reason) {
        rec.error = reason;
        done();
      },
    });
  });

  upReq.on('response', (res) => {
    settled = true;
    clearTimeout(timer);
    // A 101 that Node did not take for a switch (no Upgrade field): no protocol to splice to.
    if (refused(res, res.statusCode === 101 ? 'protocol switch without Upgrade' : undefined)) return;
    relayRefusedHandshake(core, res, socket, rec, started);
  });

  upReq.on('error', (err) => {
    clearTimeout(timer);
    if (settled) {
      socket.destroy();
      return;
    }
    settled = true;
    const perr = upstreamError(err, t.host);
    core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
    rec.status = perr.status;
    rec.error = perr.reason;
    writeRawError(socket, perr);
    finishRecord(core, rec, started);
  });
  upReq.end();
}

/**
 * An origin that did not switch (a 401, a 404, a redirect): its answer goes back as it is, in
 * framing that keeps a cut visible (its Content-Length, or chunked, as it came or for an answer
 * the origin ends by closing, the last chunk written only once the origin's end was read), and
 * the connection closes after it, so nothing the client sends afterwards reaches the origin
 * unchecked. An answer cut by the origin is cut for the client too, never closed as if complete.
 */
function relayRefusedHandshake(core: ProxyCore, res: IncomingMessage, socket: Duplex, rec: RequestRecord, started: number): void {
  const status = res.statusCode ?? 502;
  rec.status = status;
  const bodiless = bodilessAnswer('GET', status);
  const length = res.headers['content-length'];
  // Chunked as it came, and chunked too when the origin delimits the answer by closing: relayed
  // close-delimited, a reset in the body would end toward the client exactly as the answer's end.
  const chunked = !bodiless && (res.headers['transfer-encoding'] !== undefined || length === undefined);
  const kept = filterRawResponseHeaders(res.rawHeaders, false, status);
  const fields: string[] = [];
  for (let i = 0; i < kept.length; i += 2) if (bodiless || kept[i].toLowerCase() !== 'content-length') fields.push(kept[i], kept[i + 1]);
  if (!bodiless && length !== undefined) fields.push('Content-Length', length);
  if (chunked) fields.push('Transfer-Encoding', 'chunked');
  fields.push('Connection', 'close');
  socket.write(rawHead(status, res.statusMessage, fields));
  res.on('data', (c: Buffer) => {
    if (c.length === 0) return;
    rec.bytes_out += c.length;
    const flowing = chunked ? socket.write(chunkOf(c)) : socket.write(c);
    // Backpressure: the origin is read no faster than the client reads.
    if (!flowing) {
      res.pause();
      socket.once('drain', () => res.resume());
    }
  });
  res.on('end', () => {
    if (chunked) {
      if (trailerProblem(res.rawTrailers)) {
        rec.error = 'upstream sent a malformed trailer section';
        socket.destroy();
        finishRecord(core, rec, started);
        return;
      }
      const trailers = relayedTrailers(res.rawTrailers, res.rawHeaders);
      let section = '0\r\n';
      for (let i = 0; i < trailers.length; i += 2) section += `${trailers[i]}: ${trailers[i + 1]}\r\n`;
      socket.write(section + '\r\n');
    }
    // Nothing the client sends from here reaches anyone; the linger bounds how long it may hold on.
    endThenLinger(socket);
    finishRecord(core, rec, started);
  });
  // Cut by the origin (or the client gone): the client's connection is cut too.
  res.on('close', () => {
    if (res.complete) return;
    rec.error = 'response stream interrupted';
    socket.destroy();
    finishRecord(core, rec, started);
  });
  res.on('error', () => socket.destroy());
}
