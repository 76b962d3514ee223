#!/usr/bin/env node
// npm run fuzz [-- --iterations 3000 --duration 60 --seed N --json]
//
// Throws mutated CONNECT lines, request heads (absolute-form and inside intercepted tunnels) and
// TLS ClientHellos at a spawned `keygate proxy` on loopback, and checks after every batch that a
// good intercepted request still succeeds and the process is alive. Deterministic for a given
// seed (printed). Exits 1 if the proxy crashes, stops serving good requests, or leaks
// descriptors. Needs `npm run build` first.
import net from 'node:net';
import tls from 'node:tls';
import { parseArgs } from 'node:util';
import { ProxyAgent, request } from 'undici';
import { connectTunnel, createPki, fdCount, sleep, spawnProxy, startOrigin, tlsOver } from './lib/harness.mjs';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '3000' },
    duration: { type: 'string', default: '60' },
    seed: { type: 'string' },
    concurrency: { type: 'string', default: '8' },
    json: { type: 'boolean', default: false },
  },
});
const maxIterations = Math.max(1, Number(values.iterations));
const deadline = Date.now() + Math.max(1, Number(values.duration)) * 1000;
const seed = values.seed !== undefined ? Number(values.seed) >>> 0 : (Math.random() * 2 ** 32) >>> 0;
const concurrency = Math.max(1, Number(values.concurrency));
const log = (msg) => !values.json && process.stderr.write(msg + '\n');

// mulberry32: small, seedable, good enough to pick mutations.
let state = seed;
function rnd() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (arr) => arr[Math.floor(rnd() * arr.length)];
const int = (n) => Math.floor(rnd() * n);

const HOST = 'api.fuzz.local';
const pki = await createPki([HOST]);
const origin = await startOrigin(pki);
const proxy = await spawnProxy({
  config: { rules: [{ name: 'fuzz', match_hosts: [HOST], headers: [{ name: 'X-Key', type: 'plaintext', value: 'kgFUZZ-secret' }] }] },
  resolve: [`${HOST}:${origin.port}:127.0.0.1`],
  upstreamCa: [pki.caPem],
  limits: ['header_timeout_ms=1000', 'tls_handshake_timeout_ms=1000', 'idle_timeout_ms=2000', 'keep_alive_timeout_ms=500', 'connect_timeout_ms=1000'],
});
const authority = `${HOST}:${origin.port}`;

// A real ClientHello for the intercepted host, captured from Node's TLS client.
const clientHello = await new Promise((resolve) => {
  const server = net.createServer((s) => {
    s.once('data', (d) => {
      resolve(d);
      s.destroy();
      server.close();
    });
  });
  server.listen(0, '127.0.0.1', () => {
    const t = tls.connect({ host: '127.0.0.1', port: server.address().port, servername: HOST, rejectUnauthorized: false });
    t.on('error', () => undefined);
  });
});

const SEEDS = {
  connect: [`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`, `CONNECT [::1]:443 HTTP/1.1\r\n\r\n`, `CONNECT 127.0.0.1:${origin.port} HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n`],
  head: [
    `GET http://127.0.0.1:${origin.port}/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n`,
    `POST http://127.0.0.1:${origin.port}/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello`,
    `POST http://127.0.0.1:${origin.port}/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n`,
    `GET http://127.0.0.1:${origin.port}/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
  ],
  inner: [`GET /echo HTTP/1.1\r\nHost: ${authority}\r\n\r\n`, `POST /upload HTTP/1.1\r\nHost: ${authority}\r\nContent-Length: 3\r\n\r\nabc`, `GET https://${authority}/echo?x=%2e%2e/ HTTP/1.1\r\nHost: ${authority}\r\n\r\n`],
};
const INTERESTING = ['\r', '\n', '\r\n', '\0', ' ', ':', '\t', '%', '/', '..', '@', '[', ']', '*', 'chunked', 'Content-Length: 1\r\n', 'Transfer-Encoding: chunked\r\n', '\xff', '\x7f', '9'.repeat(20), 'A'.repeat(70000)];

function mutate(input) {
  let b = Buffer.from(input, typeof input === 'string' ? 'latin1' : undefined);
  const rounds = 1 + int(4);
  for (let r = 0; r < rounds; r++) {
    const at = int(b.length + 1);
    switch (int(7)) {
      case 0: // flip a bit
        if (b.length) b[int(b.length)] ^= 1 << int(8);
        break;
      case 1: // random byte
        if (b.length) b[int(b.length)] = int(256);
        break;
      case 2: // insert something interesting
        b = Buffer.concat([b.subarray(0, at), Buffer.from(pick(INTERESTING), 'latin1'), b.subarray(at)]);
        break;
      case 3: // delete a slice
        b = Buffer.concat([b.subarray(0, at), b.subarray(Math.min(b.length, at + 1 + int(16)))]);
        break;
      case 4: // duplicate a slice
        b = Buffer.concat([b.subarray(0, at), b.subarray(at, at + int(64)), b.subarray(at)]);
        break;
      case 5: // truncate
        b = b.subarray(0, at);
        break;
      case 6: // a length field, if any, set to something extreme
        if (b.length > 5) b.writeUInt16BE(pick([0, 1, 0xffff, 0x4000]), int(Math.min(b.length - 2, 64)));
        break;
    }
  }
  return b;
}

/** Sends bytes on a socket, reads until close or a short deadline, then drops it. */
function throwAt(socket, bytes) {
  return new Promise((resolve) => {
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve();
    };
    const timer = setTimeout(finish, 300 + int(300));
    socket.on('data', () => undefined);
    socket.on('error', finish);
    socket.on('close', finish);
    socket.write(bytes, () => undefined);
    if (rnd() < 0.3) socket.end();
  });
}

const dial = () =>
  new Promise((resolve, reject) => {
    const s = net.connect(proxy.port, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  });

async function oneCase() {
  const kind = pick(['connect', 'head', 'inner', 'hello']);
  try {
    if (kind === 'connect' || kind === 'head') {
      await throwAt(await dial(), mutate(pick(SEEDS[kind])));
    } else {
      const tunnel = await connectTunnel(proxy.port, authority);
      if (kind === 'hello') await throwAt(tunnel, mutate(clientHello));
      else await throwAt(await tlsOver(tunnel, HOST, proxy.caPem), mutate(pick(SEEDS.inner)));
    }
  } catch {
    // Refusals and resets are expected answers to garbage.
  }
  return kind;
}

// Each good request on a connection of its own: a kept-alive one can meet the proxy's idle close
// (1-2 s here) in flight when a batch of cases takes longer than that on a loaded machine, and
// that reset would be the client's race, not a proxy that stopped serving.
async function good() {
  const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
  try {
    const res = await request(`https://${authority}/echo`, { dispatcher: agent });
    const body = await res.body.json();
    if (res.statusCode !== 200 || !body.names.includes('x-key')) throw new Error(`good request: status ${res.statusCode}`);
  } finally {
    await agent.close();
  }
}

await good();
await sleep(300);
const startFds = fdCount(proxy.pid);
log(`fuzz: seed ${seed}, up to ${maxIterations} cases or ${values.duration}s, proxy pid ${proxy.pid}`);

let iterations = 0;
let goodOk = 0;
const failures = [];
const byKind = { connect: 0, head: 0, inner: 0, hello: 0 };
while (iterations < maxIterations && Date.now() < deadline && failures.length === 0) {
  const batch = Math.min(concurrency, maxIterations - iterations);
  const kinds = await Promise.all(Array.from({ length: batch }, oneCase));
  for (const k of kinds) if (k) byKind[k]++;
  iterations += batch;
  if (!proxy.alive()) {
    failures.push(`proxy exited (${proxy.exitCode()}) after ${iterations} cases`);
    break;
  }
  try {
    await good();
    goodOk++;
  } catch (err) {
    failures.push(`after ${iterations} cases: ${err.message}`);
  }
}

// Connections still closing (handshake and idle clocks are 1-2 s here) before the descriptor check.
let endFds = fdCount(proxy.pid);
for (let i = 0; i < 50 && endFds > startFds + 2; i++) {
  await sleep(100);
  endFds = fdCount(proxy.pid);
}
if (endFds > startFds + 2) failures.push(`descriptor leak: ${startFds} -> ${endFds}`);
const output = proxy.output();
if (output.includes('kgFUZZ-secret')) failures.push('the injected secret appeared in the proxy output');
const alive = proxy.alive();
await proxy.stop();
await origin.close();

const report = { seed, iterations, by_kind: byKind, good_requests: goodOk, fds: { start: startFds, end: endFds }, proxy_alive: alive, ok: failures.length === 0, failures };
if (values.json) process.stdout.write(JSON.stringify(report) + '\n');
else {
  log(`cases ${iterations} (${Object.entries(byKind).map(([k, v]) => `${k} ${v}`).join(', ')}); good requests between batches: ${goodOk} ok`);
  log(`open fds ${startFds} -> ${endFds}`);
  log(report.ok ? 'fuzz: OK' : `fuzz: FAILED (seed ${seed}): ${failures.join('; ')}`);
}
process.exit(report.ok ? 0 : 1);
