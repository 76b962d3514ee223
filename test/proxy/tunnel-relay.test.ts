// The blind tunnel's relay: half-close in both directions, backpressure towards a client that
// stops reading (the proxy must stop reading the upstream instead of queueing everything), and
// every byte unaltered while the upstream side reads into reused memory (tunnel.ts DirectReader).
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { connectTunnel } from '../helpers/connect.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-relay-'));
let proxy: ProxyHandle;
let logText = '';
let counter: net.Server; // reads until FIN, answers with the byte count, then FIN
let firehose: net.Server; // writes as fast as backpressure allows
let firehoseAccepted = 0;
let pattern: net.Server; // on the client's first byte: 48 MiB of random bytes in uneven writes, then FIN
let patternHash = '';
let resetter: net.Server; // on the client's first byte: a few bytes, then a TCP reset
let listener: net.Server; // records how each connection ended: 'end' (FIN) or the error code
let greeter: net.Server; // says hello and half-closes at once, then reads until the client's FIN
const greeterGot: string[] = [];
const listenerEnds: string[] = [];
const sockets = new Set<net.Socket>();
const MIB = 1 << 20;

function listen(server: net.Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)));
}

beforeAll(async () => {
  counter = net.createServer({ allowHalfOpen: true }, (s) => {
    sockets.add(s);
    let n = 0;
    s.on('data', (d: Buffer) => (n += d.length));
    s.on('end', () => s.end(String(n)));
  });
  firehose = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
    const chunk = Buffer.alloc(256 * 1024, 0x61);
    const pump = () => {
      while (!s.destroyed && firehoseAccepted < 256 * MIB) {
        firehoseAccepted += chunk.length;
        if (!s.write(chunk)) {
          s.once('drain', pump);
          return;
        }
      }
    };
    pump();
  });
  pattern = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
    const block = randomBytes(3 * MIB + 7);
    const hash = createHash('sha256');
    let left = 48 * MIB;
    let at = 0;
    const pump = () => {
      while (left > 0) {
        // Uneven slices of a random block, so no two reads on the proxy see the same bytes.
        const n = Math.min(left, 1 + ((at * 7919) % (200 * 1024)));
        const from = at % (block.length - n);
        const chunk = block.subarray(from, from + n);
        hash.update(chunk);
        left -= n;
        at += n;
        if (!s.write(chunk)) return void s.once('drain', pump);
      }
      patternHash = hash.digest('hex');
      s.end();
    };
    // The client speaks first, so that no byte arrives before its reader is attached.
    s.once('data', pump);
  });
  resetter = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
    s.once('data', () => s.write('partial', () => setTimeout(() => s.resetAndDestroy(), 50)));
  });
  listener = net.createServer((s) => {
    sockets.add(s);
    s.resume(); // flowing, so that a FIN is seen as 'end'
    s.on('end', () => listenerEnds.push('end'));
    s.on('error', (e: NodeJS.ErrnoException) => listenerEnds.push(e.code ?? 'error'));
  });
  greeter = net.createServer({ allowHalfOpen: true }, (s) => {
    sockets.add(s);
    s.on('error', (e: NodeJS.ErrnoException) => greeterGot.push(`error ${e.code}`));
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString()));
    s.on('end', () => {
      greeterGot.push(got);
      s.destroy();
    });
    s.end('hello');
  });
  const [cport, fport, pport, rport, lport, gport] = await Promise.all([listen(counter), listen(firehose), listen(pattern), listen(resetter), listen(listener), listen(greeter)]);
  const ca = await ensureCa(path.join(dir, 'certs'));
  proxy = await startProxy({
    listen: { host: '127.0.0.1', port: 0 },
    ca,
    config: compileConfig({ no_proxy: [], rules: [] }), // every CONNECT is a blind tunnel
    logger: createLogger({ destination: new Writable({ write: (c, _e, cb) => ((logText += c), cb()) }), flushMs: 0 }),
    resolve: new Map([
      [`counter.test.local:${cport}`, '127.0.0.1'],
      [`firehose.test.local:${fport}`, '127.0.0.1'],
      [`pattern.test.local:${pport}`, '127.0.0.1'],
      [`resetter.test.local:${rport}`, '127.0.0.1'],
      [`listener.test.local:${lport}`, '127.0.0.1'],
      [`greeter.test.local:${gport}`, '127.0.0.1'],
    ]),
  });
  (globalThis as Record<string, unknown>).__ports = { cport, fport, pport, rport, lport, gport };
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await proxy?.close(500);
  await new Promise((r) => counter?.close(r));
  await new Promise((r) => firehose?.close(r));
  await new Promise((r) => pattern?.close(r));
  await new Promise((r) => resetter?.close(r));
  await new Promise((r) => listener?.close(r));
  await new Promise((r) => greeter?.close(r));
  rmSync(dir, { recursive: true, force: true });
});

const ports = () => (globalThis as Record<string, unknown>).__ports as { cport: number; fport: number; pport: number; rport: number; lport: number; gport: number };

describe('blind tunnel relay', () => {
  // A reset is not an end: through a blind tunnel the other side sees a reset too, never a FIN
  // it would take for the end of the stream (TLS inside the tunnel cannot say which it was).
  it("carries the upstream's reset to the client as a reset, not as an end", async () => {
    const t = await connectTunnel(proxy.port, `resetter.test.local:${ports().rport}`);
    expect(t.status).toBe(200);
    const ended = new Promise<string>((resolve) => {
      let got = '';
      t.socket.on('data', (d: Buffer) => (got += d.toString()));
      t.socket.on('end', () => resolve(`end after ${got}`));
      t.socket.on('error', (e: NodeJS.ErrnoException) => resolve(`${e.code} after ${got}`));
    });
    t.socket.write('go');
    expect(await ended).toBe('ECONNRESET after partial');
    t.socket.destroy();
  });

  it("carries the client's reset to the upstream as a reset, not as an end", async () => {
    const before = listenerEnds.length;
    const t = await connectTunnel(proxy.port, `listener.test.local:${ports().lport}`);
    expect(t.status).toBe(200);
    t.socket.write('some bytes');
    await new Promise((r) => setTimeout(r, 100));
    t.socket.resetAndDestroy();
    const deadline = Date.now() + 5000;
    while (listenerEnds.length === before && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(listenerEnds.slice(before)).toEqual(['ECONNRESET']);
  });

  it('carries a client half-close to the upstream and the answer and its close back', async () => {
    const t = await connectTunnel(proxy.port, `counter.test.local:${ports().cport}`);
    expect(t.status).toBe(200);
    const answer = new Promise<string>((resolve) => {
      let text = '';
      t.socket.on('data', (d: Buffer) => (text += d.toString()));
      t.socket.on('end', () => resolve(text));
    });
    const payload = Buffer.alloc(5 * MIB + 123, 0x62);
    t.socket.end(payload);
    expect(await answer).toBe(String(payload.length));
    t.socket.destroy();
  });

  // TCP is two streams: an origin that has said all it will say (FIN) may still read. The tunnel
  // must pass its FIN on and keep carrying the client's bytes until the client ends too.
  it("carries the upstream's half-close to the client and the client's bytes after it", async () => {
    const before = greeterGot.length;
    const socket = net.connect({ port: proxy.port, host: '127.0.0.1', allowHalfOpen: true });
    const authority = `greeter.test.local:${ports().gport}`;
    socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
    let text = '';
    const closed = new Promise<string>((resolve) => socket.on('close', () => resolve(text)));
    socket.on('error', () => undefined);
    await new Promise<void>((resolve) => {
      socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
      socket.once('end', () => resolve());
    });
    expect(text).toBe('HTTP/1.1 200 Connection Established\r\n\r\nhello');
    expect(socket.destroyed).toBe(false);
    socket.end('after the origin ended');
    const deadline = Date.now() + 5000;
    while (greeterGot.length === before && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(greeterGot.slice(before)).toEqual(['after the origin ended']);
    await closed;
  });

  it('stops reading the upstream while the client does not read', async () => {
    firehoseAccepted = 0;
    const t = await connectTunnel(proxy.port, `firehose.test.local:${ports().fport}`);
    expect(t.status).toBe(200);
    t.socket.pause();
    // Give the upstream every chance to push; only socket buffers and the relay's bounded
    // queue may hold what the client has not read.
    await new Promise((r) => setTimeout(r, 1500));
    const stalled = firehoseAccepted;
    expect(stalled).toBeLessThan(64 * MIB);
    // Reading again lets the stream flow on.
    let received = 0;
    t.socket.on('data', (d: Buffer) => (received += d.length));
    t.socket.resume();
    const deadline = Date.now() + 10_000;
    while (received < stalled + 8 * MIB && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(received).toBeGreaterThan(stalled);
    t.socket.destroy();
  });

  it('delivers every byte unaltered to a client that reads in fits and starts', async () => {
    const t = await connectTunnel(proxy.port, `pattern.test.local:${ports().pport}`);
    expect(t.status).toBe(200);
    // Stalls make the proxy's writes to the client pend, so that reads on the upstream side go
    // on while earlier bytes are still queued: reused read memory would corrupt them.
    const hash = createHash('sha256');
    let received = 0;
    let stalls = 0;
    await new Promise<void>((resolve, reject) => {
      t.socket.on('data', (d: Buffer) => {
        hash.update(d);
        received += d.length;
        if (received > (stalls + 1) * 4 * MIB) {
          stalls++;
          t.socket.pause();
          setTimeout(() => t.socket.resume(), 30);
        }
      });
      t.socket.on('end', () => resolve());
      t.socket.on('error', reject);
      t.socket.write('go');
    });
    expect(stalls).toBeGreaterThan(5);
    expect(received).toBe(48 * MIB);
    expect(hash.digest('hex')).toBe(patternHash);
    t.socket.destroy();
  });
});

describe('blind tunnels when the egress policy changes', () => {
  // A blind tunnel carries bytes the proxy cannot read for as long as both ends keep it open:
  // closing it is the only way a new policy that denies where it goes can apply to it.
  it('a tunnel the new policy denies (by port) is closed; one it still allows goes on; the old policy back, new tunnels open', async () => {
    const keep = proxy.getConfig();
    const denied = await connectTunnel(proxy.port, `counter.test.local:${ports().cport}`);
    const allowed = await connectTunnel(proxy.port, `listener.test.local:${ports().lport}`);
    expect([denied.status, allowed.status]).toEqual([200, 200]);
    const closed = new Promise<void>((r) => denied.socket.once('close', () => r()));
    let allowedClosed = false;
    allowed.socket.once('close', () => (allowedClosed = true));
    try {
      proxy.setConfig(compileConfig({ no_proxy: [], rules: [], access_control: { deny_ports: [ports().cport] } }));
      await closed;
      await new Promise((r) => setTimeout(r, 100));
      expect(allowedClosed).toBe(false);
      expect(allowed.socket.write('still open')).toBe(true);
      // Logged as a refusal, and the tunnel's close record says why.
      const lines = logText.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(lines.some((l) => l.type === 'egress_denied' && l.host === 'counter.test.local' && l.kind === 'port_denied')).toBe(true);
      expect(lines.some((l) => l.type === 'tunnel' && l.phase === 'close' && l.host === 'counter.test.local' && l.error === 'closed: the egress policy now refuses this destination')).toBe(true);
      // A new tunnel there is refused under the new policy.
      expect((await connectTunnel(proxy.port, `counter.test.local:${ports().cport}`)).status).toBe(403);
    } finally {
      proxy.setConfig(keep);
      allowed.socket.destroy();
      denied.socket.destroy();
    }
    const again = await connectTunnel(proxy.port, `counter.test.local:${ports().cport}`);
    expect(again.status).toBe(200);
    again.socket.destroy();
  });
});
