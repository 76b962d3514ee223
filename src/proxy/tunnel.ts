import type { OnReadOpts, Socket } from 'node:net';
import type { Decision } from '../rules/compile.js';
import type { ProxyCore, TunnelRecord } from './context.js';
import { layerError, ProxyError, upstreamError, writeRawError } from './errors.js';
import { accessLog } from './record.js';
import { afterEarlierAnswers } from './boundary.js';
import { chunkRelayed } from './buffer-gc.js';
import { passOnFailure } from '../half-open.js';

export const CONNECT_OK = 'HTTP/1.1 200 Connection Established\r\n\r\n';

/**
 * A blind TCP tunnel: the proxy sees only bytes, terminates no TLS and injects nothing. The
 * client hears `200` only once the upstream socket is connected, so a refused or unreachable
 * destination is a clear 502/504 instead of a dead tunnel.
 */
export function openTunnel(core: ProxyCore, client: Socket, head: Buffer, target: TunnelTarget, track: (s: Socket) => void): void {
  track(client);
  // The 200 (and the tunnel) only after the answers to requests pipelined before the CONNECT.
  afterEarlierAnswers(client, () => {
    if (!client.destroyed) dialTunnel(core, client, head, target, track);
  });
}

function dialTunnel(core: ProxyCore, client: Socket, head: Buffer, target: TunnelTarget, track: (s: Socket) => void): void {
  const started = performance.now();
  // Resolved and checked against the egress policy first; the socket then goes to exactly that
  // address. A refusal is answered before any connection is attempted.
  core.upstream.dialAddress(target.host, target.port).then(
    (address) => {
      if (client.destroyed) return;
      splice(core, client, head, target, track, address, started);
    },
    (err: unknown) => {
      const perr = upstreamError(err, target.host);
      if (!(err instanceof ProxyError)) core.events.emit('upstream_error', { host: target.host, reason: perr.reason });
      const close: TunnelRecord = {
        type: 'tunnel',
        phase: 'close',
        client: target.client,
        host: target.host,
        port: target.port,
        decision: target.decision,
        status: perr.status,
        bytes_in: 0,
        bytes_out: 0,
        duration_ms: Math.round((performance.now() - started) * 10) / 10,
        error: perr.reason,
      };
      writeRawError(client, perr);
      core.events.emit('tunnel', close);
      accessLog(core).warn(close, 'tunnel');
    },
  );
}

/** Bytes a tunnel may queue towards a slow side before it stops reading the other side. */
const TUNNEL_QUEUE_BYTES = 1 << 20;

/**
 * `src` to `dst` like pipe(), but reading stops only once 1 MiB is queued for `dst`, not at the
 * 16 KiB writable mark pipe() obeys: with 64 KiB reads that mark is crossed by every chunk, so
 * pipe() stops and restarts reading (and the event loop turns) once per chunk even when the
 * kernel takes the bytes at once. Memory per tunnel stays bounded: 1 MiB plus one read per
 * direction.
 */
function relay(src: Socket, dst: Socket): void {
  const resume = () => src.resume();
  src.on('data', (chunk: Buffer) => {
    dst.write(chunk);
    chunkRelayed(chunk.length);
    if (dst.writableLength > TUNNEL_QUEUE_BYTES) {
      src.pause();
      dst.once('drain', resume);
    }
  });
  src.once('end', () => dst.end());
  src.resume();
}

const READ_BYTES = 64 * 1024;

/**
 * Upstream to client without a new Buffer per read (the `onread` option of net.connect): the
 * socket reads into one buffer and the bytes go straight to the client. A write the kernel took
 * at once leaves nothing pending, so the same memory takes the next read; a write still pending
 * owns the memory, so the next read gets a new buffer. Most reads of a bulk download allocate
 * nothing, which spares the allocation, the page faults of fresh memory and the garbage
 * collections that dead 64 KiB chunks bring (bench/README.md). The price is one buffer held per
 * open tunnel.
 */
class DirectReader {
  src: Socket | undefined;
  private buf: Buffer | undefined;
  private lent = true;

  constructor(private readonly dst: Socket) {}

  readonly opts: OnReadOpts = {
    buffer: () => {
      if (this.lent) {
        this.buf = Buffer.allocUnsafeSlow(READ_BYTES);
        this.lent = false;
        // Lent buffers die once written; they count towards the collection hint like chunks.
        chunkRelayed(READ_BYTES);
      }
      return this.buf!;
    },
    callback: (n: number, b: Uint8Array): boolean => {
      const dst = this.dst;
      dst.write(n === b.length ? b : b.subarray(0, n));
      if (dst.writableLength === 0) return true;
      this.lent = true;
      if (dst.writableLength <= TUNNEL_QUEUE_BYTES) return true;
      // Reading stops (returning false stops it) until the client has taken the queue.
      dst.once('drain', () => this.src?.resume());
      return false;
    },
  };
}

type TunnelTarget = { host: string; port: number; client: string; decision: Decision };

function splice(core: ProxyCore, client: Socket, head: Buffer, target: TunnelTarget, track: (s: Socket) => void, address: string, started: number): void {
  const rec: TunnelRecord = { type: 'tunnel', phase: 'open', client: target.client, host: target.host, port: target.port, decision: target.decision };
  const direct = new DirectReader(client);
  const upstream = core.upstream.connectTcp(target.host, target.port, address, direct.opts);
  direct.src = upstream;
  let connected = false;
  let upstreamEnded = false;
  let done = false;
  const timer = setTimeout(() => upstream.destroy(layerError('connect timeout', 'ETIMEDOUT')), core.timeouts.connectMs);

  const finish = (err?: string) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    const close: TunnelRecord = {
      ...rec,
      phase: 'close',
      status: rec.status,
      bytes_in: client.bytesRead,
      bytes_out: client.bytesWritten,
      duration_ms: Math.round((performance.now() - started) * 10) / 10,
    };
    if (err) close.error = err;
    core.events.emit('tunnel', close);
    accessLog(core).info(close, 'tunnel');
  };

  upstream.once('connect', () => {
    connected = true;
    clearTimeout(timer);
    upstream.setNoDelay(true);
    client.setNoDelay(true);
    rec.status = 200;
    core.events.emit('tunnel', { ...rec });
    client.write(CONNECT_OK);
    if (head.length) upstream.write(head);
    // Backpressure both ways; ending one side half-closes the other.
    // Upstream to client through the DirectReader; client to upstream through relay() (the
    // client's socket was made by the server, too late for an `onread` buffer).
    upstream.once('end', () => {
      upstreamEnded = true;
      client.end();
    });
    // Flowing mode, so that 'end' is emitted at EOF (no 'data' listener would start it).
    upstream.resume();
    relay(client, upstream);
  });
  upstream.on('error', (err) => {
    if (!connected) {
      const perr = upstreamError(err, target.host);
      rec.status = perr.status;
      core.events.emit('upstream_error', { host: target.host, reason: perr.reason });
      writeRawError(client, perr);
      finish(perr.reason);
      return;
    }
    passOnFailure(client, err);
  });
  client.on('error', (err) => passOnFailure(upstream, err));
  upstream.on('close', (hadError) => {
    // After the origin's FIN the client was ended (its queued bytes still go out); destroying it
    // here could drop them. A close with no FIN before it was a failure or a local destroy, and
    // the client must not be left open on a tunnel that goes nowhere.
    if (connected && (hadError || !upstreamEnded)) client.destroy();
  });
  client.on('close', () => {
    upstream.destroy();
    finish();
  });
  track(client);
  core.watchEgress(client, {
    host: target.host,
    port: target.port,
    address,
    close(reason) {
      finish(reason);
      upstream.destroy();
      client.destroy();
    },
  });
}
