import type { IncomingMessage, RequestOptions } from 'node:http';
import http, { STATUS_CODES } from '../node-http.js';
import type { Duplex } from 'node:stream';
import { formatAuthority } from '../rules/host.js';
import type { ProxyCore } from './context.js';
import type { ForwardTarget } from './forward.js';
import { afterEarlierAnswers } from './boundary.js';
import { finishRecord, newRecord } from './record.js';
import { malformed, ProxyError, upstreamError, writeRawError } from './errors.js';
import { filterRawResponseHeaders, upstreamRequestHeaders } from './headers.js';

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
    // No agent: with createConnection, node:http uses our (verified) socket for this one request.
    createConnection: () => (t.scheme === 'https' ? core.upstream.connectTls(t.host, t.port, address) : core.upstream.connectTcp(t.host, t.port, address)),
  } as RequestOptions);
  const timer = setTimeout(() => upReq.destroy(Object.assign(new Error('timeout'), { code: 'UND_ERR_HEADERS_TIMEOUT' })), core.timeouts.headersMs);
  socket.on('error', () => upReq.destroy());

  upReq.on('upgrade', (res, upSocket, upHead) => {
    settled = true;
    clearTimeout(timer);
    rec.status = res.statusCode ?? 101;
    socket.write(rawHead(rec.status, res.statusMessage, filterRawResponseHeaders(res.rawHeaders, true)));
    if (upHead.length) socket.write(upHead);
    if (head.length) upSocket.write(head);
    upSocket.pipe(socket);
    socket.pipe(upSocket);
    const done = () => {
      upSocket.destroy();
      socket.destroy();
    };
    upSocket.on('error', done);
    socket.on('error', done);
    socket.on('close', () => {
      upSocket.destroy();
      rec.bytes_in = (socket as { bytesRead?: number }).bytesRead ?? 0;
      rec.bytes_out = (socket as { bytesWritten?: number }).bytesWritten ?? 0;
      finishRecord(core, rec, started);
    });
    upSocket.on('close', () => socket.end());
  });

  upReq.on('response', (res) => {
    settled = true;
    clearTimeout(timer);
    // Framing is redone here: the body is relayed decoded and ends with the connection. A coding
    // besides chunked would reach the client still applied, unannounced: refused, as by forward.ts.
    const te = res.headers['transfer-encoding'];
    if (te !== undefined && te.trim().toLowerCase() !== 'chunked') {
      upReq.destroy();
      const perr = new ProxyError(502, 'http_protocol_error', `upstream ${t.host} sent an invalid response (upstream framing not accepted (Transfer-Encoding))`);
      rec.status = perr.status;
      rec.error = perr.reason;
      writeRawError(socket, perr);
      finishRecord(core, rec, started);
      return;
    }
    rec.status = res.statusCode ?? 502;
    const kept = filterRawResponseHeaders(res.rawHeaders, false);
    const pairs: string[] = [];
    for (let i = 0; i < kept.length; i += 2) if (kept[i].toLowerCase() !== 'content-length') pairs.push(kept[i], kept[i + 1]);
    socket.write(rawHead(rec.status, res.statusMessage, [...pairs, 'Connection', 'close']));
    res.on('data', (c: Buffer) => {
      rec.bytes_out += c.length;
    });
    res.pipe(socket);
    res.on('end', () => finishRecord(core, rec, started));
    res.on('error', () => socket.destroy());
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
