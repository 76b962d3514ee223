#!/usr/bin/env node
// The benchmark's load generator, run as a child on its own core (`taskset -c 1`).
//
// A deliberately small HTTP/1.1 client over raw sockets: CONNECT (when a proxy is given), then TLS,
// then keep-alive requests with a hand-written response parser. undici or node:http would spend
// more CPU per request than nginx does, and the client shares its core with the origin: the
// cheaper the client, the more of the measurement is the proxy.
//
// usage: node bench/client.mjs '<json spec>'   -> one JSON result line on stdout
//   spec.mode: 'small' | 'bulk' | 'fresh' | 'verify'
import net from 'node:net';
import tls from 'node:tls';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { summary } from './lib/stats.mjs';

const spec = JSON.parse(process.argv[2] ?? '{}');
const ca = (spec.ca ?? []).map((f) => readFileSync(f, 'utf8'));
// Built once: parsing the CAs per connection would add the client's own cost to every
// first-request figure.
const secureContext = tls.createSecureContext({ ca });

/** Opens a tunnel (or a direct TCP connection) and a verified TLS session to `host`. */
function open(host) {
  return new Promise((resolve, reject) => {
    const port = spec.port;
    const finishTls = (socket, head) => {
      if (head && head.length) socket.unshift(head);
      const t = tls.connect({
        socket,
        servername: host,
        secureContext,
        ALPNProtocols: ['http/1.1'],
        checkServerIdentity: (_h, cert) => tls.checkServerIdentity(host, cert),
      });
      t.setNoDelay?.(true);
      t.once('secureConnect', () => {
        t.removeListener('error', reject);
        resolve(t);
      });
      t.once('error', reject);
    };
    if (!spec.proxy) {
      const s = net.connect({ host: spec.address ?? '127.0.0.1', port });
      s.setNoDelay(true);
      s.once('error', reject);
      s.once('connect', () => finishTls(s));
      return;
    }
    const s = net.connect({ host: spec.proxy.host, port: spec.proxy.port });
    s.setNoDelay(true);
    s.once('error', reject);
    let buf = Buffer.alloc(0);
    const onData = (d) => {
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      s.removeListener('data', onData);
      s.pause();
      const head = buf.subarray(0, end).toString('latin1');
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? 0);
      if (status !== 200) {
        s.destroy();
        reject(new Error(`CONNECT ${host}:${port} answered: ${head.split('\r\n')[0]}`));
        return;
      }
      finishTls(s, buf.subarray(end + 4));
    };
    s.on('data', onData);
    s.write(`CONNECT ${host}:${port} HTTP/1.1\r\nHost: ${host}:${port}\r\nUser-Agent: keygate-bench\r\n\r\n`);
  });
}

function requestBytes(host, path, extra = '') {
  return Buffer.from(`GET ${path} HTTP/1.1\r\nHost: ${host}:${spec.port}\r\nUser-Agent: keygate-bench\r\nAccept: */*\r\n${extra}\r\n`, 'latin1');
}

const CRLFCRLF = Buffer.from('\r\n\r\n');

/**
 * Incremental parser of keep-alive responses on one socket (Content-Length or chunked bodies).
 * `onResponse(status, headText, bodyBytes, body?)` is called per complete response; the body is
 * kept only when `keepBody` is set (verification), otherwise just counted.
 */
class ResponseReader {
  constructor(socket, onResponse, keepBody = false) {
    this.onResponse = onResponse;
    this.keepBody = keepBody;
    this.reset();
    this.pending = null;
    socket.on('data', (d) => this.feed(d));
  }

  reset() {
    this.state = 0; // 0 head, 1 length body, 2 chunk size line, 3 chunk data, 4 chunk CRLF, 5 trailers
    this.head = null;
    this.status = 0;
    this.remaining = 0;
    this.bodyBytes = 0;
    this.parts = this.keepBody ? [] : null;
  }

  done() {
    const { status, head, bodyBytes, parts } = this;
    this.reset();
    this.onResponse(status, head, bodyBytes, parts ? Buffer.concat(parts) : null);
  }

  take(d, n) {
    this.bodyBytes += n;
    if (this.parts) this.parts.push(d.subarray(0, n));
  }

  feed(d) {
    if (this.pending) {
      d = Buffer.concat([this.pending, d]);
      this.pending = null;
    }
    while (d.length) {
      if (this.state === 0) {
        const end = d.indexOf(CRLFCRLF);
        if (end < 0) {
          this.pending = d;
          return;
        }
        const head = d.subarray(0, end).toString('latin1');
        d = d.subarray(end + 4);
        this.head = head;
        this.status = Number(head.slice(9, 12));
        const cl = /\r\ncontent-length:[ \t]*(\d+)/i.exec(head);
        if (/\r\ntransfer-encoding:[^\r]*chunked/i.test(head)) this.state = 2;
        else if (cl) {
          this.remaining = Number(cl[1]);
          this.state = 1;
          if (this.remaining === 0) this.done();
        } else if (this.status === 204 || this.status === 304) this.done();
        else throw new Error(`response without a length (connection-delimited bodies are not used here): ${head.split('\r\n')[0]}`);
      } else if (this.state === 1) {
        const n = Math.min(d.length, this.remaining);
        this.take(d, n);
        this.remaining -= n;
        d = d.subarray(n);
        if (this.remaining === 0) this.done();
      } else if (this.state === 2 || this.state === 4 || this.state === 5) {
        const eol = d.indexOf('\r\n');
        if (eol < 0) {
          this.pending = d;
          return;
        }
        const line = d.subarray(0, eol).toString('latin1');
        d = d.subarray(eol + 2);
        if (this.state === 4) this.state = 2;
        else if (this.state === 5) {
          if (line === '') this.done();
        } else {
          this.remaining = parseInt(line, 16);
          this.state = this.remaining === 0 ? 5 : 3;
        }
      } else {
        const n = Math.min(d.length, this.remaining);
        this.take(d, n);
        this.remaining -= n;
        d = d.subarray(n);
        if (this.remaining === 0) this.state = 4;
      }
    }
  }
}

/** N keep-alive connections each looping one small GET for warmup + duration. */
async function small() {
  const host = spec.host;
  const req = requestBytes(host, spec.path ?? '/small');
  const conns = await Promise.all(Array.from({ length: spec.connections }, () => open(host)));
  const lat = [];
  let errors = 0;
  const start = performance.now();
  const measureFrom = start + (spec.warmupMs ?? 0);
  const end = measureFrom + spec.durationMs;
  let completed = 0;
  let total = 0;
  await Promise.all(
    conns.map(
      (sock) =>
        new Promise((resolve) => {
          let t0 = 0;
          const send = () => {
            t0 = performance.now();
            sock.write(req);
          };
          new ResponseReader(sock, (status) => {
            const t1 = performance.now();
            total++;
            if (status !== 200) errors++;
            if (t0 >= measureFrom && t1 <= end) {
              lat.push(t1 - t0);
              completed++;
            }
            if (t1 < end) send();
            else {
              sock.destroy();
              resolve();
            }
          });
          sock.on('error', () => {
            errors++;
            resolve();
          });
          sock.on('close', resolve);
          send();
        }),
    ),
  );
  return { completed, total, rps: completed / (spec.durationMs / 1000), errors, ...summary(lat) };
}

/** One big GET per repeat on an already open connection: MiB/s of the body. */
async function bulk() {
  const host = spec.host;
  const out = [];
  // Unmeasured transfers first: the first bulk transfer through a fresh process pays one-time
  // costs (JIT, first buffer allocations) that a long-running sidecar has long paid.
  const warm = spec.warmupTransfers ?? 0;
  for (let i = 0; i < warm + (spec.repeats ?? 1); i++) {
    const sock = await open(host);
    const issuer = sock.getPeerCertificate()?.issuer?.CN ?? null;
    const r = await new Promise((resolve, reject) => {
      const t0 = performance.now();
      new ResponseReader(sock, (status, _head, bytes) => resolve({ status, bytes, seconds: (performance.now() - t0) / 1000 }));
      sock.on('error', reject);
      sock.write(requestBytes(host, spec.path ?? '/bulk.bin'));
    });
    sock.destroy();
    if (r.status !== 200 || (spec.expectBytes && r.bytes !== spec.expectBytes)) throw new Error(`bulk transfer: status ${r.status}, ${r.bytes} bytes`);
    if (i >= warm) out.push({ mib_s: r.bytes / 1048576 / r.seconds, seconds: r.seconds, bytes: r.bytes, issuer });
  }
  const rates = out.map((o) => o.mib_s).sort((a, b) => a - b);
  return { runs: out, mib_s: rates[Math.floor((rates.length - 1) / 2)], total_bytes: (warm + out.length) * (out[0]?.bytes ?? 0) };
}

/** A new connection (CONNECT + TLS) per host and one small GET: time to the full response. */
async function fresh() {
  const lat = [];
  for (const host of spec.hosts) {
    const t0 = performance.now();
    const sock = await open(host);
    const status = await new Promise((resolve, reject) => {
      new ResponseReader(sock, (s) => resolve(s));
      sock.on('error', reject);
      sock.write(requestBytes(host, spec.path ?? '/small'));
    });
    lat.push(performance.now() - t0);
    sock.destroy();
    if (status !== 200) throw new Error(`first request to ${host}: status ${status}`);
  }
  return summary(lat);
}

/** One GET /echo carrying a client-sent Authorization: what the origin saw, and who signed the certificate. */
async function verify() {
  const sock = await open(spec.host);
  const cert = sock.getPeerCertificate();
  const r = await new Promise((resolve, reject) => {
    new ResponseReader(sock, (status, head, _n, body) => resolve({ status, head, body: body.toString('utf8') }), true);
    sock.on('error', reject);
    sock.write(requestBytes(spec.host, '/echo', 'Authorization: Bearer client-sent-value\r\n'));
  });
  sock.destroy();
  return { status: r.status, seen_authorization: r.body, issuer: cert?.issuer?.CN ?? null, subject: cert?.subject?.CN ?? null };
}

const modes = { small, bulk, fresh, verify };
try {
  if (!modes[spec.mode]) throw new Error(`unknown mode ${spec.mode}`);
  const result = await modes[spec.mode]();
  process.stdout.write(JSON.stringify({ ok: true, ...result }) + '\n');
  process.exit(0);
} catch (err) {
  process.stdout.write(JSON.stringify({ ok: false, error: err?.message ?? String(err) }) + '\n');
  process.exit(1);
}
