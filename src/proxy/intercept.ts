import type { Socket } from 'node:net';
import tls from 'node:tls';
import type { LeafMinter } from '../certs/leaf.js';
import { formatAuthority } from '../rules/host.js';
import { afterEarlierAnswers, type DataPath } from './boundary.js';
import { internal, malformed, refused, writeRawError } from './errors.js';
import { ALPN_PROTOCOLS, chooseExchange, type Exchanges } from './exchange.js';
import { finishRecord, newRecord, refusedPath } from './record.js';
import { CONNECT_OK } from './tunnel.js';

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

/**
 * The intercept step: a CONNECT to a rule host, answered 200, then TLS terminated with a leaf
 * minted for the host, and the connection given to an exchange (the one switch point,
 * exchange.ts). Cleartext HTTP sent into the tunnel is refused like `http://` to a rule host.
 */
export async function intercept(dp: DataPath, minter: LeafMinter, exchanges: Exchanges, client: Socket, head: Buffer, host: string, port: number, clientAddr: string): Promise<void> {
  // The 200 only after the answers to requests pipelined before the CONNECT (boundary.ts).
  await new Promise<void>((resolve) => afterEarlierAnswers(client, resolve));
  if (client.destroyed) return;
  const { core } = dp;
  // The upstream handshake (for an origin with no connection open) overlaps the client's.
  core.upstream.prewarm(host, port);
  let ctx: tls.SecureContext;
  // The client waits for the proxy here, not the other way round: its idle clock (listener.ts)
  // stops while the leaf is minted. A mint slower than idle_timeout_ms (the first one, on a
  // loaded machine) destroyed the connection with no answer at all.
  const idleMs = client.timeout;
  if (idleMs) client.setTimeout(0);
  try {
    ctx = await minter.secureContext(host);
  } catch (err) {
    core.logger.error({ host, err: (err as Error).message }, 'certificate minting failed');
    writeRawError(client, internal('cannot issue a certificate for this host'));
    return;
  } finally {
    if (idleMs && !client.destroyed) client.setTimeout(idleMs);
  }
  if (client.destroyed) return;
  client.write(CONNECT_OK);
  // The first byte tells TLS (a handshake record, 0x16) from cleartext HTTP sent through the
  // tunnel (what some clients do for http:// URLs). Cleartext to a rule host is refused.
  const first = head.length ? head : await firstChunk(client, core.timeouts.tlsHandshakeMs);
  if (!first) {
    client.destroy();
    return;
  }
  client.unshift(first);
  if (first[0] !== 0x16) {
    refusePlaintextInTunnel(dp, client, first, host, port, clientAddr);
    return;
  }
  const tlsSocket = new tls.TLSSocket(client, { isServer: true, secureContext: ctx, ALPNProtocols: ALPN_PROTOCOLS });
  const t = { host, port, authority: formatAuthority(host, port), client: clientAddr, inFlight: 0 };
  dp.tunnels.set(tlsSocket, t);
  dp.track(tlsSocket);
  let secured = false;
  // A failure already logged (the clock, an error with its cause, a close during the handshake):
  // the close handler adds no line of its own.
  let explained = false;
  const writtenBefore = client.bytesWritten;
  const handshakeFailed = (reason: string, msg: string) => {
    explained = true;
    core.events.emit('tls_handshake', { host, ok: false, reason });
    core.logger.info({ type: 'tls_handshake', client: clientAddr, host, port, ok: false, reason }, msg);
  };
  const handshakeTimer = setTimeout(() => {
    handshakeFailed('handshake timeout', 'client TLS handshake failed: timed out');
    tlsSocket.destroy();
  }, core.timeouts.tlsHandshakeMs);
  tlsSocket.once('secure', () => {
    secured = true;
    clearTimeout(handshakeTimer);
    // From here the exchange's idle clock (on the TLS socket) applies, request-aware.
    client.setTimeout(0);
    core.events.emit('tls_handshake', { host, ok: true, proto: tlsSocket.alpnProtocol === 'h2' ? 'h2' : 'h1' });
    // The one switch point, now that the negotiated protocol is known (before the first request
    // is read: the socket buffers what arrives until the exchange reads it).
    chooseExchange(tlsSocket.alpnProtocol, exchanges).serve(tlsSocket, t);
  });
  tlsSocket.on('error', (err: NodeJS.ErrnoException) => {
    // With TLS 1.3 the client checks the certificate after the server's side of the handshake is
    // done: its alert (unknown CA, bad certificate) arrives after 'secure', and is still a handshake failure.
    if (!secured || /^ERR_SSL_.*ALERT/.test(err.code ?? '')) {
      clearTimeout(handshakeTimer);
      handshakeFailed(err.code ?? 'handshake failed', `client TLS handshake failed: ${handshakeFailure(err)}`);
    }
    tlsSocket.destroy();
  });
  // A client that leaves mid-handshake without an alert (Node's TLS client rejecting the
  // certificate closes before its Finished) half-closes a socket that allows half-open: without
  // this the connection waited out the handshake timeout and nothing said why.
  tlsSocket.once('end', () => {
    if (secured) return;
    clearTimeout(handshakeTimer);
    const sawCertificate = client.bytesWritten > writtenBefore;
    handshakeFailed(
      'closed during handshake',
      `client TLS handshake failed: the client closed the connection ${sawCertificate ? 'after receiving the certificate (does it trust the keygate CA?)' : 'before the server answered its hello'}`,
    );
    tlsSocket.destroy();
  });
  tlsSocket.once('close', () => {
    clearTimeout(handshakeTimer);
    // A TLS 1.3 client that rejects the certificate often just closes, no alert, before its
    // Finished reached the proxy (Node's client) or right after it: no application byte came.
    // Counted on the TLS socket: the TCP socket's own count stops when TLS takes over its handle
    // (reading that one put this line, and its cost, on every intercepted connection).
    if (!explained && tlsSocket.bytesRead === 0) {
      const when = secured ? 'right after' : 'during';
      core.logger.info({ type: 'tls_handshake', client: clientAddr, host, port, ok: false, reason: `closed ${secured ? 'after' : 'during'} handshake` }, `client closed the connection ${when} the TLS handshake, without a request (does the client trust the keygate CA?)`);
    }
    client.destroy();
  });
}

/**
 * What a failed client handshake means, for the log: no protocol in common (ALPN), the client
 * not trusting the keygate CA, a TLS version either side refuses, or something else.
 */
export function handshakeFailure(err: NodeJS.ErrnoException): string {
  const what = `${err.code ?? ''} ${err.message}`.toUpperCase();
  if (/NO_APPLICATION_PROTOCOL|NO APPLICATION PROTOCOL/.test(what)) return `no application protocol in common (ALPN: keygate offers ${ALPN_PROTOCOLS.join(', ')})`;
  if (/UNKNOWN_CA|UNKNOWN CA|BAD_CERTIFICATE|BAD CERTIFICATE|CERTIFICATE_UNKNOWN|CERTIFICATE UNKNOWN/.test(what)) return 'the client does not trust the certificate (does it trust the keygate CA?)';
  if (/PROTOCOL_VERSION|PROTOCOL VERSION|UNSUPPORTED_PROTOCOL|WRONG_VERSION_NUMBER|VERSION_TOO_LOW|VERSION TOO LOW/.test(what)) return 'no TLS protocol version in common (keygate accepts TLS 1.2 and 1.3)';
  if (/ECONNRESET|EPIPE|SOCKET HANG UP/.test(what)) return 'the client closed the connection during the handshake';
  return `handshake error (${(err.code ?? 'unknown').slice(0, 60)})`;
}

/**
 * Cleartext HTTP inside a CONNECT tunnel to a rule host: refused like absolute-form http://
 * to it. The request line (already read) names method and path for the log.
 */
function refusePlaintextInTunnel(dp: DataPath, client: Socket, first: Buffer, host: string, port: number, clientAddr: string): void {
  const started = performance.now();
  const line = /^([A-Z]{1,16}) (\S+) HTTP\/1\.[01]\r?\n/.exec(first.subarray(0, 2048).toString('latin1'));
  const rec = newRecord(line?.[1] ?? '', { client: clientAddr, host, port, decision: 'intercept' }, line ? refusedPath(line[2]) : '');
  const err = line ? refused('credentials are injected only over HTTPS: use https:// for this host') : malformed('neither TLS nor HTTP inside the tunnel');
  rec.status = err.status;
  rec.error = err.reason;
  client.resume();
  writeRawError(client, err);
  finishRecord(dp.core, rec, started);
}
