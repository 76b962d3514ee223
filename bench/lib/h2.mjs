// The h2 phase of `npm run bench` (issue #19): HTTP/2 and gRPC through interception.
//
// - h2: ONE client connection (CONNECT, TLS with ALPN h2, Node's http2 client) with N streams in
//   flight (N = --connections, 32 by default) of small GETs to the origin (nginx with `http2` on
//   its listen, or the Node fallback origin, both h2-capable): req/s, p50/p99, proxy CPU per request.
// - gRPC: unary calls over one grpc-js channel (one HTTP/2 connection; through the proxy by
//   grpc-js's own CONNECT support) to a grpc-js server over TLS with the bench origin's
//   certificate (bench/lib/grpc-origin.mjs, core 1), N calls in flight: calls/s, proxy CPU per call.
//
// Measured for the peers that do h2 interception (keygate on each Node, mitmproxy) and direct;
// squid (no HTTP/2 on bumped connections) and the Node ceiling (no ALPN) are not. Before any
// figure, each peer is checked like the HTTP/1.1 phases: h2 negotiated with the client, the
// client's Authorization replaced by the rule's on both the h2 GET and the gRPC call, a
// certificate that is not the origin's, and the protocol its origin leg spoke (/proto).
// The phase runs inside each interleaved round, after that peer's HTTP/1.1 phases.
import path from 'node:path';
import { freePort } from './setup.mjs';
import { BENCH_DIR, startLocalServer } from './peers.mjs';
import { cpuSeconds } from './proc.mjs';

export const GRPC_HOST = 'grpc.bench.test';
const H2_PEERS = new Set(['keygate', 'keygate-node20', 'keygate-base', 'mitmproxy', 'direct']);
const CLIENT = path.join(BENCH_DIR, 'h2-client.mjs');

/** Starts the gRPC origin (core 1). keygate gets `resolve` so that its port maps to loopback. */
export async function startGrpcOrigin({ work, pki }) {
  const port = await freePort();
  const logFile = path.join(work, 'grpc-origin.log');
  const h = await startLocalServer({ what: 'grpc origin', cmd: process.execPath, args: [path.join(BENCH_DIR, 'lib/grpc-origin.mjs'), String(port), pki.originCert, pki.originKey], logFile, core: 1, port });
  return { ...h, resolve: [`${GRPC_HOST}:${port}:127.0.0.1`] };
}

/**
 * Checks a peer for the h2 phase; returns what may be measured: { h2, grpc } (booleans), the
 * reasons when not, and the origin leg's protocol. `client(spec, script)` runs a load generator.
 */
export async function verifyH2(p, { client, originPort, grpcPort, token, originCa }) {
  const out = { h2: false, grpc: false, h2Skip: null, grpcSkip: null, originProtocol: null };
  if (!H2_PEERS.has(p.name)) {
    out.h2Skip = out.grpcSkip = p.name === 'squid' ? 'squid does not speak HTTP/2 to clients (bumped connections are HTTP/1.1)' : 'not an h2 peer (the ceiling negotiates no ALPN)';
    return out;
  }
  const want = p.name === 'direct' ? 'Bearer client-sent-value' : `Bearer ${token}`;
  const describe = (v) => (!v.ok ? v.error : v.seen_authorization === want ? null : v.seen_authorization === 'Bearer client-sent-value' ? "origin saw the client's own value (not replaced)" : `origin saw ${v.seen_authorization ? 'some other value' : 'no Authorization'}`);
  const base = { proxy: p.proxy, ca: [p.ca, originCa] };
  const v = await client({ ...base, mode: 'h2-verify', host: 'bench.test', port: originPort }, CLIENT);
  out.h2Skip = describe(v) ?? (p.name !== 'direct' && v.issuer === 'keygate bench origin CA' ? 'not intercepted (the origin certificate came through)' : null);
  out.h2 = !out.h2Skip;
  out.originProtocol = v.ok ? v.origin_protocol : null;
  const g = await client({ ...base, mode: 'grpc-verify', host: GRPC_HOST, port: grpcPort }, CLIENT);
  out.grpcSkip = describe(g);
  out.grpc = !out.grpcSkip;
  return out;
}

/** One round of the h2 phase for one peer: { h2, grpc } results with the proxy's CPU per request. */
export async function measureH2(p, { client, cfg, originPort, grpcPort, originCa }) {
  const res = {};
  const base = { proxy: p.proxy, ca: [p.ca, originCa], streams: cfg.connections, durationMs: cfg.durationMs, warmupMs: cfg.warmupMs };
  const run = async (spec) => {
    const cpu0 = p.pid ? cpuSeconds(p.pid) : 0;
    const s = await client({ ...base, ...spec }, CLIENT);
    if (s.ok && p.pid) s.cpu_us_per_req = ((cpuSeconds(p.pid) - cpu0) * 1e6) / Math.max(1, s.completed);
    return s;
  };
  if (p.h2check?.h2) res.h2 = await run({ mode: 'h2-load', host: 'bench.test', port: originPort });
  if (p.h2check?.grpc) res.grpc = await run({ mode: 'grpc-load', host: GRPC_HOST, port: grpcPort });
  return res;
}

export function showH2(x) {
  return x.ok ? `${Math.round(x.rps)}/s p50 ${x.p50_ms.toFixed(2)} p99 ${x.p99_ms.toFixed(2)} ms${x.errors ? ` (${x.errors} errors)` : ''}${x.cpu_us_per_req ? ` cpu ${Math.round(x.cpu_us_per_req)} us/req` : ''}` : x.error;
}

/** The h2 figures of a peer's summary (medians over rounds; `pick` is report.mjs's). */
export function summariseH2(p, pick, okv) {
  const R = p.rounds;
  return {
    h2_rps: pick(R, (r) => okv(r.h2?.h2, 'rps')),
    h2_p50: pick(R, (r) => okv(r.h2?.h2, 'p50_ms')),
    h2_p99: pick(R, (r) => okv(r.h2?.h2, 'p99_ms')),
    h2_cpu: pick(R, (r) => okv(r.h2?.h2, 'cpu_us_per_req')),
    grpc_rps: pick(R, (r) => okv(r.h2?.grpc, 'rps')),
    grpc_p99: pick(R, (r) => okv(r.h2?.grpc, 'p99_ms')),
    grpc_cpu: pick(R, (r) => okv(r.h2?.grpc, 'cpu_us_per_req')),
    h2check: p.h2check ?? null,
  };
}

/** The h2 section of bench/results.md. */
export function renderH2({ peers, summary, cfg, label, f0, f2, fx, ratio }) {
  const N = cfg.connections;
  const L = ['## HTTP/2 and gRPC (h2 phase, medians over rounds)', ''];
  L.push(`One client connection with ${N} streams in flight (small GET), and one grpc-js channel with ${N} unary calls in flight. "origin leg": the protocol the origin saw (\`/proto\`).`, '');
  L.push(`| mode | h2 req/s | h2 p50 / p99 ms | proxy CPU us/req | gRPC calls/s | gRPC p99 ms | proxy CPU us/call | origin leg |`);
  L.push('|---|---|---|---|---|---|---|---|');
  for (const p of peers) {
    const s = summary[p.name];
    if (s.skipped) continue;
    const c = s.h2check;
    const why = (skip) => `not measured: ${String(skip).replace(/\|/g, '/')}`;
    const direct = p.name === 'direct';
    if (!c?.h2 && !c?.grpc && c?.h2Skip === c?.grpcSkip) {
      L.push(`| ${label[p.name]} | ${why(c?.h2Skip ?? 'no check')} ||||||| `);
      continue;
    }
    L.push(`| ${label[p.name]} | ${c?.h2 ? f0(s.h2_rps) : why(c?.h2Skip ?? 'no check')} | ${c?.h2 ? `${f2(s.h2_p50)} / ${f2(s.h2_p99)}` : ''} | ${c?.h2 && !direct ? f0(s.h2_cpu) : ''} | ${c?.grpc ? f0(s.grpc_rps) : why(c?.grpcSkip ?? 'no check')} | ${c?.grpc ? f2(s.grpc_p99) : ''} | ${c?.grpc && !direct ? f0(s.grpc_cpu) : ''} | ${c?.originProtocol ?? ''} |`);
  }
  L.push('');
  for (const name of ['keygate', 'keygate-node20']) {
    const k = summary[name];
    if (!k || k.skipped || !k.h2check?.h2) continue;
    const others = peers.filter((p) => p.name !== name && summary[p.name] && !summary[p.name].skipped && summary[p.name].h2check?.h2);
    if (!others.length) continue;
    L.push(`| ${name} / peer (h2 phase) | better when | ${others.map((p) => p.name).join(' | ')} |`);
    L.push(`|---|---|${others.map(() => '---|').join('')}`);
    const row = (what, better, key, skipDirect = false) => L.push(`| ${what} | ${better} | ${others.map((p) => (skipDirect && p.name === 'direct' ? 'n/a' : fx(ratio(k[key], summary[p.name][key])))).join(' | ')} |`);
    row('h2 req/s', 'higher', 'h2_rps');
    row('h2 p99', 'lower', 'h2_p99');
    row('h2 CPU per request', 'lower', 'h2_cpu', true);
    row('gRPC calls/s', 'higher', 'grpc_rps');
    row('gRPC CPU per call', 'lower', 'grpc_cpu', true);
    L.push('');
  }
  return L;
}

/** The per-round lines of the h2 phase. */
export function renderH2Rounds({ peers, cfg, f0, f2, okv }) {
  const L = ['## Per round, h2 phase', '', '| round | mode | h2 req/s | h2 p99 ms | CPU us/req | gRPC calls/s | CPU us/call | errors |', '|---|---|---|---|---|---|---|---|'];
  for (let r = 0; r < cfg.rounds; r++) {
    for (const p of peers) {
      const x = p.rounds[r]?.h2;
      if (!x) continue;
      const errs = [x.h2, x.grpc].filter((v) => v && !v.ok).map((v) => v.error);
      const reqErrs = (x.h2?.errors ?? 0) + (x.grpc?.errors ?? 0);
      L.push(`| ${r + 1} | ${p.name} | ${f0(okv(x.h2, 'rps'))} | ${f2(okv(x.h2, 'p99_ms'))} | ${f0(okv(x.h2, 'cpu_us_per_req'))} | ${f0(okv(x.grpc, 'rps'))} | ${f0(okv(x.grpc, 'cpu_us_per_req'))} | ${[reqErrs ? `${reqErrs} failed` : '', ...errs].filter(Boolean).join('; ').replace(/\|/g, '/') || '0'} |`);
    }
  }
  L.push('');
  return L;
}
