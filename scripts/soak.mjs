#!/usr/bin/env node
// npm run soak [-- --duration 60 --concurrency 8 --json --max-rss-growth-mb 64 --max-fd-growth 4]
//
// Drives mixed traffic through a spawned `keygate proxy` for a bounded time, on loopback only:
// intercepted requests (rule headers injected), blind tunnels, server-sent events, WebSocket
// echoes and 1 MiB uploads. Reports requests, errors, p50/p99 latency, and the proxy's RSS and
// open descriptors at start and end. Exits 1 on any error, a descriptor leak or RSS growth above
// the bound. Needs `npm run build` first (it runs dist/).
import { parseArgs } from 'node:util';
import { Readable } from 'node:stream';
import { ProxyAgent, request } from 'undici';
import WebSocket from 'ws';
import { connectTunnel, createPki, fdCount, percentile, rssMb, sleep, spawnProxy, startOrigin, tlsOver } from './lib/harness.mjs';

const { values } = parseArgs({
  options: {
    duration: { type: 'string', default: '60' },
    concurrency: { type: 'string', default: '8' },
    json: { type: 'boolean', default: false },
    'max-rss-growth-mb': { type: 'string', default: '64' },
    'max-fd-growth': { type: 'string', default: '4' },
  },
});
const durationMs = Math.max(1, Number(values.duration)) * 1000;
const concurrency = Math.max(1, Number(values.concurrency));
const maxRssGrowth = Number(values['max-rss-growth-mb']);
const maxFdGrowth = Number(values['max-fd-growth']);
const log = (msg) => !values.json && process.stderr.write(msg + '\n');

const INTERCEPT = 'api.soak.local';
const TUNNEL = 'tunnel.soak.local';
const SECRET = 'kgSOAK-secret-value-0001';

const pki = await createPki([INTERCEPT, TUNNEL]);
const origin = await startOrigin(pki);
const proxy = await spawnProxy({
  config: { rules: [{ name: 'soak', match_hosts: [INTERCEPT], headers: [{ name: 'Authorization', type: 'plaintext', value: `Bearer ${SECRET}` }] }] },
  resolve: [`${INTERCEPT}:${origin.port}:127.0.0.1`, `${TUNNEL}:${origin.port}:127.0.0.1`],
  upstreamCa: [pki.caPem],
  // Short keep-alive so idle pooled sockets are gone when the end is measured.
  limits: ['keep_alive_timeout_ms=1000'],
});
const ca = [proxy.caPem, pki.caPem];
const base = (host) => `https://${host}:${origin.port}`;

const latencies = [];
const errors = [];
const counts = { intercept: 0, tunnel: 0, sse: 0, websocket: 0, upload: 0 };

async function intercepted(agent) {
  const res = await request(`${base(INTERCEPT)}/echo?i=1`, { dispatcher: agent });
  const body = await res.body.json();
  if (res.statusCode !== 200 || !body.names.includes('authorization')) throw new Error(`intercept: status ${res.statusCode}, injected ${body.names.includes('authorization')}`);
}

async function tunnelled(agent) {
  const res = await request(`${base(TUNNEL)}/echo`, { dispatcher: agent });
  const body = await res.body.json();
  if (res.statusCode !== 200 || body.names.includes('authorization')) throw new Error(`tunnel: status ${res.statusCode}`);
}

async function sse(agent) {
  const res = await request(`${base(INTERCEPT)}/sse?n=5&ms=10`, { dispatcher: agent });
  const text = await res.body.text();
  if (res.statusCode !== 200 || !text.includes('data: 5\n\n')) throw new Error(`sse: status ${res.statusCode}, ${text.length} bytes`);
}

async function upload(agent) {
  const total = 1024 * 1024;
  let sent = 0;
  const body = new Readable({
    read() {
      if (sent >= total) return this.push(null);
      sent += 64 * 1024;
      this.push(Buffer.alloc(64 * 1024, 0x61));
    },
  });
  const res = await request(`${base(INTERCEPT)}/upload`, { dispatcher: agent, method: 'POST', body, headers: { 'content-length': String(total) } });
  const answer = await res.body.json();
  if (res.statusCode !== 200 || answer.bytes !== total) throw new Error(`upload: status ${res.statusCode}, ${answer.bytes} bytes`);
}

async function websocket() {
  const tunnel = await connectTunnel(proxy.port, `${INTERCEPT}:${origin.port}`);
  const t = await tlsOver(tunnel, INTERCEPT, ca);
  const ws = new WebSocket(`wss://${INTERCEPT}:${origin.port}/ws`, { createConnection: () => t });
  try {
    await new Promise((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    for (let i = 0; i < 3; i++) {
      const echoed = await new Promise((resolve, reject) => {
        ws.once('message', (d) => resolve(String(d)));
        ws.once('error', reject);
        ws.send(`ping ${i}`);
      });
      if (echoed !== `ping ${i}`) throw new Error(`websocket: echoed ${echoed}`);
    }
  } finally {
    ws.terminate();
    t.destroy();
  }
}

const kinds = [
  ['intercept', intercepted],
  ['tunnel', tunnelled],
  ['intercept', intercepted],
  ['sse', sse],
  ['websocket', websocket],
  ['intercept', intercepted],
  ['upload', upload],
  ['tunnel', tunnelled],
];

async function worker(id, deadline) {
  const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca }, connections: 2 });
  let k = id;
  try {
    while (Date.now() < deadline) {
      const [kind, fn] = kinds[k++ % kinds.length];
      const t0 = performance.now();
      try {
        await fn(agent);
        latencies.push(performance.now() - t0);
        counts[kind]++;
      } catch (err) {
        errors.push(`${kind}: ${err.message}`);
      }
    }
  } finally {
    await agent.close();
  }
}

// Warm up (first certificate, pools, JIT) before the start reading.
await Promise.all(Array.from({ length: 2 }, (_, i) => worker(i, Date.now() + 1000)));
latencies.length = 0;
errors.length = 0;
for (const k of Object.keys(counts)) counts[k] = 0;
await sleep(1500);
const start = { rssMb: rssMb(proxy.pid), fds: fdCount(proxy.pid) };
log(`soak: ${durationMs / 1000}s, ${concurrency} workers, proxy pid ${proxy.pid}; start RSS ${start.rssMb.toFixed(1)} MB, ${start.fds} fds`);

const started = Date.now();
await Promise.all(Array.from({ length: concurrency }, (_, i) => worker(i, started + durationMs)));
const elapsed = (Date.now() - started) / 1000;

// Let idle keep-alive sockets (1 s on both sides) expire, then read the end state.
let end = { rssMb: rssMb(proxy.pid), fds: fdCount(proxy.pid) };
for (let i = 0; i < 40 && end.fds > start.fds; i++) {
  await sleep(100);
  end = { rssMb: rssMb(proxy.pid), fds: fdCount(proxy.pid) };
}
const alive = proxy.alive();
const output = proxy.output();
await proxy.stop();
await origin.close();

latencies.sort((a, b) => a - b);
const requests = latencies.length;
const report = {
  duration_s: Math.round(elapsed * 10) / 10,
  concurrency,
  requests,
  by_kind: counts,
  errors: errors.length,
  error_samples: [...new Set(errors)].slice(0, 10),
  rps: Math.round(requests / elapsed),
  p50_ms: Math.round(percentile(latencies, 50) * 10) / 10,
  p99_ms: Math.round(percentile(latencies, 99) * 10) / 10,
  rss_mb: { start: Math.round(start.rssMb * 10) / 10, end: Math.round(end.rssMb * 10) / 10 },
  fds: { start: start.fds, end: end.fds },
  proxy_alive: alive,
  secret_in_output: output.includes(SECRET),
};
const problems = [];
if (report.errors > 0) problems.push(`${report.errors} errors`);
if (!alive) problems.push('the proxy died');
if (end.fds - start.fds > maxFdGrowth) problems.push(`descriptor leak: ${start.fds} -> ${end.fds}`);
if (end.rssMb - start.rssMb > maxRssGrowth) problems.push(`RSS grew ${(end.rssMb - start.rssMb).toFixed(1)} MB (bound ${maxRssGrowth} MB)`);
if (report.secret_in_output) problems.push('the injected secret appeared in the proxy output');
if (requests === 0) problems.push('no request completed');
report.ok = problems.length === 0;
report.problems = problems;

if (values.json) process.stdout.write(JSON.stringify(report) + '\n');
else {
  log(`requests ${requests} (${report.rps}/s): ${Object.entries(counts).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  log(`errors ${report.errors}${report.error_samples.length ? ': ' + report.error_samples.join('; ') : ''}`);
  log(`latency p50 ${report.p50_ms} ms, p99 ${report.p99_ms} ms`);
  log(`RSS ${report.rss_mb.start} -> ${report.rss_mb.end} MB; open fds ${start.fds} -> ${end.fds}`);
  log(report.ok ? 'soak: OK' : `soak: FAILED (${problems.join('; ')})`);
}
process.exit(report.ok ? 0 : 1);
