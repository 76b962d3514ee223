#!/usr/bin/env node
// The h2 phase's load generator (bench/lib/h2.mjs), run as a child on core 1 like bench/client.mjs.
//
// h2: ONE connection (CONNECT through the proxy when one is given, then TLS offering only h2 in
// ALPN, then Node's http2 client) with `streams` requests in flight at all times, small GETs.
// grpc: one grpc-js channel (one HTTP/2 connection; through the proxy as grpc-js's own
// `grpc_proxy` support does it: CONNECT), `streams` unary calls in flight at all times.
//
// usage: node bench/h2-client.mjs '<json spec>'   -> one JSON result line on stdout
//   spec.mode: 'h2-verify' | 'h2-load' | 'grpc-verify' | 'grpc-load'
import http from 'node:http';
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { summary } from './lib/stats.mjs';
import { GRPC_SERVICE } from './lib/grpc-service.mjs';

const spec = JSON.parse(process.argv[2] ?? '{}');
const caPem = (spec.ca ?? []).map((f) => readFileSync(f, 'utf8'));
const CLIENT_AUTH = 'Bearer client-sent-value';

/** A TCP socket to host:port: a CONNECT tunnel through spec.proxy, or straight to 127.0.0.1. */
function dial(host, port) {
  if (!spec.proxy) {
    return new Promise((resolve, reject) => {
      const s = net.connect({ host: '127.0.0.1', port }, () => resolve(s));
      s.once('error', reject);
    });
  }
  return new Promise((resolve, reject) => {
    const req = http.request({ host: spec.proxy.host, port: spec.proxy.port, method: 'CONNECT', path: `${host}:${port}`, headers: { host: `${host}:${port}` } });
    req.once('connect', (res, socket, head) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        reject(new Error(`CONNECT ${host}:${port} answered ${res.statusCode}`));
        return;
      }
      if (head.length) socket.unshift(head);
      resolve(socket);
    });
    req.once('error', reject);
    req.end();
  });
}

/** An HTTP/2 session to host (fails unless the peer chose h2 in ALPN). */
async function h2Session(host, port) {
  const socket = await dial(host, port);
  socket.setNoDelay(true);
  const t = await new Promise((resolve, reject) => {
    const s = tls.connect({ socket, servername: host, ca: caPem, ALPNProtocols: ['h2'], checkServerIdentity: (_h, cert) => tls.checkServerIdentity(host, cert) }, () => resolve(s));
    s.once('error', reject);
  });
  if (t.alpnProtocol !== 'h2') {
    t.destroy();
    throw new Error(`the ${spec.proxy ? 'proxy' : 'origin'} chose ${t.alpnProtocol || 'no protocol'} in ALPN, not h2`);
  }
  const session = http2.connect(`https://${host}:${port}`, { createConnection: () => t });
  session.on('error', () => undefined);
  await new Promise((resolve, reject) => {
    session.once('connect', resolve);
    session.once('error', reject);
  });
  return { session, issuer: t.getPeerCertificate()?.issuer?.CN ?? null };
}

function get(session, host, port, path, extra = {}) {
  return new Promise((resolve, reject) => {
    const req = session.request({ ':path': path, ':authority': `${host}:${port}`, 'user-agent': 'keygate-bench', ...extra });
    let status = 0;
    const chunks = [];
    req.on('response', (h) => (status = Number(h[':status'])));
    req.on('data', (d) => chunks.push(d));
    req.on('end', () => resolve({ status, body: Buffer.concat(chunks).toString('utf8') }));
    req.on('error', reject);
  });
}

/**
 * Keeps `inFlight` calls of `once()` running for warmup + duration; counts the calls that end
 * inside the measured window, with their latencies.
 */
async function closedLoop(inFlight, once) {
  const lat = [];
  let completed = 0;
  let errors = 0;
  let firstError = null;
  const start = performance.now() + spec.warmupMs;
  const end = start + spec.durationMs;
  const worker = async () => {
    while (performance.now() < end) {
      const t0 = performance.now();
      let ok = false;
      try {
        ok = await once();
      } catch (err) {
        firstError ??= err?.message ?? String(err);
      }
      const t1 = performance.now();
      if (t0 >= start && t1 <= end) {
        if (ok) {
          completed++;
          lat.push(t1 - t0);
        } else errors++;
      }
      if (!ok && errors > 1000) throw new Error(`too many failed requests: ${firstError ?? 'non-200 answers'}`);
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
  return { completed, rps: completed / (spec.durationMs / 1000), errors, ...(firstError ? { first_error: firstError } : {}), ...summary(lat) };
}

async function h2Verify() {
  const { session, issuer } = await h2Session(spec.host, spec.port);
  try {
    const echo = await get(session, spec.host, spec.port, '/echo', { authorization: CLIENT_AUTH });
    // What the origin's leg spoke (nginx: $server_protocol; the Node origin: the request's version).
    const proto = await get(session, spec.host, spec.port, '/proto');
    return { status: echo.status, seen_authorization: echo.body, issuer, origin_protocol: proto.status === 200 ? proto.body.trim() : null };
  } finally {
    session.close();
  }
}

async function h2Load() {
  const { session } = await h2Session(spec.host, spec.port);
  try {
    return await closedLoop(spec.streams, async () => (await get(session, spec.host, spec.port, '/small')).status === 200);
  } finally {
    session.close();
  }
}

/** A grpc-js client for grpc.bench.test: through the proxy by grpc-js's own proxy support. */
async function grpcClient() {
  const grpc = await import('@grpc/grpc-js');
  const target = `${spec.host}:${spec.port}`;
  const options = { 'grpc.enable_retries': 0 };
  if (spec.proxy) {
    // grpc-js reads its proxy from the environment when the channel is made; it sends CONNECT
    // with the target's name (no resolution here: the proxy resolves it).
    process.env.grpc_proxy = `http://${spec.proxy.host}:${spec.proxy.port}`;
    delete process.env.no_grpc_proxy;
  } else {
    delete process.env.grpc_proxy;
    options['grpc.ssl_target_name_override'] = spec.host;
    options['grpc.default_authority'] = target;
  }
  const Ctor = grpc.makeGenericClientConstructor(GRPC_SERVICE, 'Bench');
  const client = new Ctor(spec.proxy ? target : `127.0.0.1:${spec.port}`, grpc.credentials.createSsl(Buffer.from(caPem.join('\n'))), options);
  const call = (msg, auth) =>
    new Promise((resolve, reject) => {
      const md = new grpc.Metadata();
      if (auth) md.set('authorization', auth);
      client.unary(Buffer.from(msg), md, (err, res) => (err ? reject(new Error(`${err.code}: ${err.details}`)) : resolve(res)));
    });
  return { client, call };
}

async function grpcVerify() {
  const { client, call } = await grpcClient();
  try {
    const seen = await call('echo', CLIENT_AUTH);
    return { status: 200, seen_authorization: seen.toString() };
  } finally {
    client.close();
  }
}

async function grpcLoad() {
  const { client, call } = await grpcClient();
  try {
    await call('warm');
    return await closedLoop(spec.streams, async () => (await call('x')).length === 64);
  } finally {
    client.close();
  }
}

const modes = { 'h2-verify': h2Verify, 'h2-load': h2Load, 'grpc-verify': grpcVerify, 'grpc-load': grpcLoad };
const deadline = setTimeout(() => {
  process.stdout.write(JSON.stringify({ ok: false, error: 'timed out' }) + '\n');
  process.exit(1);
}, (spec.durationMs ?? 0) + (spec.warmupMs ?? 0) + 30_000);
try {
  if (!modes[spec.mode]) throw new Error(`unknown mode ${spec.mode}`);
  const result = await modes[spec.mode]();
  clearTimeout(deadline);
  process.stdout.write(JSON.stringify({ ok: true, ...result }) + '\n');
  process.exit(0);
} catch (err) {
  process.stdout.write(JSON.stringify({ ok: false, error: err?.message ?? String(err) }) + '\n');
  process.exit(1);
}
