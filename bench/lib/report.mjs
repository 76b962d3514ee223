// Medians over rounds, keygate's ratios to each peer, the issue's targets, and bench/results.md.
import { renderH2, renderH2Rounds, summariseH2 } from './h2.mjs';

function median(values) {
  const v = values.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

const pick = (rounds, f) => median(rounds.map((r) => {
  try {
    return f(r);
  } catch {
    return null;
  }
}));

const okv = (x, k) => (x && x.ok ? x[k] : null);

export function summarise(peers) {
  const out = {};
  for (const p of peers) {
    if (p.skip) {
      out[p.name] = { skipped: p.skip };
      continue;
    }
    const R = p.rounds;
    out[p.name] = {
      c1_rps: pick(R, (r) => okv(r.c1, 'rps')),
      c1_p50: pick(R, (r) => okv(r.c1, 'p50_ms')),
      c1_p99: pick(R, (r) => okv(r.c1, 'p99_ms')),
      cN_rps: pick(R, (r) => okv(r.cN, 'rps')),
      cN_p50: pick(R, (r) => okv(r.cN, 'p50_ms')),
      cN_p99: pick(R, (r) => okv(r.cN, 'p99_ms')),
      cpu_c1: pick(R, (r) => okv(r.c1, 'cpu_us_per_req')),
      cpu_cN: pick(R, (r) => okv(r.cN, 'cpu_us_per_req')),
      bulk: pick(R, (r) => okv(r.bulk, 'mib_s')),
      tunnel: p.name === 'direct' ? null : pick(R, (r) => okv(r.tunnel, 'mib_s')),
      bulk_cpu: pick(R, (r) => okv(r.bulk, 'cpu_s_per_gib')),
      tunnel_cpu: pick(R, (r) => okv(r.tunnel, 'cpu_s_per_gib')),
      new_p50: pick(R, (r) => okv(r.newHost, 'p50_ms')),
      new_p90: pick(R, (r) => okv(r.newHost, 'p90_ms')),
      known_p50: pick(R, (r) => okv(r.knownHost, 'p50_ms')),
      idle_rss: p.idleRssMiB ?? null,
      settled_rss: p.settledRssMiB ?? null,
      peak_rss: p.peakRssMiB ?? null,
      peak_rss_h1: p.peakHttp1RssMiB ?? p.peakRssMiB ?? null,
      end_rss: p.endRssMiB ?? null,
      errors: R.reduce((a, r) => a + (r.c1?.errors ?? 0) + (r.cN?.errors ?? 0), 0),
      failures: R.flatMap((r) => ['c1', 'cN', 'bulk', 'tunnel', 'newHost', 'knownHost'].filter((k) => r[k] && !r[k].ok).map((k) => `round ${r.round} ${k}: ${r[k].error}`)),
      ...summariseH2(p, pick, okv),
    };
  }
  return out;
}

const f0 = (x) => (x == null ? 'n/a' : Math.round(x).toLocaleString('en-US'));
const f1 = (x) => (x == null ? 'n/a' : x.toFixed(1));
const f2 = (x) => (x == null ? 'n/a' : x.toFixed(2));
const ratio = (a, b) => (a == null || b == null || b === 0 ? null : a / b);
const fx = (x) => (x == null ? 'n/a' : `${x.toFixed(2)}x`);

/** Issue #20's targets for one keygate variant (`keygate`: Node 24, `keygate-node20`), on this run's medians. */
export function targets(s, cfg, name = 'keygate') {
  const k = s[name];
  if (!k || k.skipped) return [];
  const sq = s.squid && !s.squid.skipped ? s.squid : null;
  const mi = s.mitmproxy && !s.mitmproxy.skipped ? s.mitmproxy : null;
  const di = s.direct && !s.direct.skipped ? s.direct : null;
  const ce = s.ceiling && !s.ceiling.skipped ? s.ceiling : null;
  const t = [];
  const add = (label, value, pass, shown) => t.push({ name: label, value: shown, pass: value == null ? null : pass });
  const k1 = ratio(k.c1_rps, ce?.c1_rps);
  add('small requests at 1 connection within 10% of the Node ceiling', k1, k1 >= 0.9, `${k1 == null ? 'n/a' : `${(k1 * 100).toFixed(0)}%`} of the ceiling`);
  const r1 = ratio(k.c1_rps, sq?.c1_rps);
  const c1 = ratio(ce?.c1_rps, sq?.c1_rps);
  add('small requests at 1 connection >= 1.7x squid', r1, r1 >= 1.7, `${fx(r1)}${c1 == null ? '' : ` (the Node ceiling: ${fx(c1)})`}`);
  const r32 = ratio(k.cN_rps, sq?.cN_rps);
  add(`small requests at ${cfg.connections} connections >= 1.5x squid`, r32, r32 >= 1.5, fx(r32));
  const cpu = ratio(k.cpu_cN, sq?.cpu_cN);
  add(`CPU per request at ${cfg.connections} connections <= 0.6x squid's`, cpu, cpu <= 0.6, fx(cpu));
  const m1 = ratio(k.c1_rps, mi?.c1_rps);
  const mN = ratio(k.cN_rps, mi?.cN_rps);
  const mMin = m1 == null || mN == null ? null : Math.min(m1, mN);
  add("req/s >= 10x mitmproxy's (1 and N connections)", mMin, mMin >= 10, `${fx(m1)} / ${fx(mN)}`);
  const rb = ratio(k.bulk, sq?.bulk);
  add('interception bulk >= 1.5x squid', rb, rb >= 1.5, fx(rb));
  const rt = ratio(k.tunnel, di?.bulk);
  add('tunnel bulk >= 95% of direct', rt, rt >= 0.95, rt == null ? 'n/a' : `${(rt * 100).toFixed(0)}%`);
  const nh = ratio(k.new_p50, sq?.new_p50);
  add("first request to a new host p50 <= half of squid's", nh, nh <= 0.5, `${f2(k.new_p50)} ms (${fx(nh)} squid's)`);
  // Issue #20's benchmark has no HTTP/2 phase: its load is the HTTP/1.1 phases, whose peak is read
  // before this benchmark's h2 rounds. The peak after those is a target row of its own.
  add("peak RSS under load <= 100 MiB: the HTTP/1.1 phases (the issue's load)", k.peak_rss_h1, k.peak_rss_h1 <= 100, `${f1(k.peak_rss_h1)} MiB`);
  if (k.peak_rss !== k.peak_rss_h1) add('peak RSS under load <= 100 MiB: after the h2 phase too', k.peak_rss, k.peak_rss <= 100, `${f1(k.peak_rss)} MiB`);
  // Idle as a sidecar idles: after V8's memory reducer has run (some seconds after the last
  // activity). The figure 1.5 s after start, with start-up garbage still held, is shown too.
  const idle = k.settled_rss ?? k.idle_rss;
  add('idle RSS <= 60 MiB', idle, idle <= 60, `${f1(k.settled_rss)} MiB settled (${f1(k.idle_rss)} at 1.5 s)`);
  return t;
}

/** The keygate variants of a run, in the order they were given. */
const KEYGATES = ['keygate', 'keygate-node20'];

const LABEL = {
  keygate: 'keygate on Node 24 (the bin)',
  'keygate-node20': 'keygate on Node 20 (the bin)',
  'keygate-base': 'keygate at an earlier commit (KEYGATE_BENCH_BASE), Node 24',
  squid: 'squid ssl_bump + request_header_add',
  mitmproxy: 'mitmproxy (mitmdump + injecting addon)',
  ceiling: 'Node ceiling: TLS both ways + byte pipe, no HTTP (not a product)',
  direct: 'direct (no proxy)',
};

export function renderResults({ machine, cfg, peers, summary, notes, command, origin, wrk, elapsedS, h2 = false }) {
  const N = cfg.connections;
  const L = [];
  L.push('# keygate benchmark results', '');
  L.push(`Generated by \`${command}\` on ${machine.date} (${Math.round(elapsedS)} s). Regenerate with the same command; see bench/README.md for the method.`, '');
  L.push('## Machine', '');
  L.push(`- ${machine.nproc} cores: ${machine.cpu}; ${machine.memory_gib} GiB memory; ${machine.kernel}`);
  L.push(`- node ${machine.node} (the harness); keygate on Node ${machine.keygateNodes?.keygate ?? 'n/a'} and ${machine.keygateNodes?.['keygate-node20'] ?? 'n/a'}, started with the bin; ${machine.nginx ?? 'nginx: not installed'}; ${machine.squid ?? 'squid: not installed'}; ${machine.mitmproxy ?? 'mitmproxy: not installed'}; ${machine.openssl}`);
  L.push(`- every proxy pinned to core 0 (\`taskset -c 0\`); client and origin (${origin === 'nginx' ? 'nginx, 1 worker' : 'Node fallback server'}) on core 1; loopback only`);
  L.push(`- load average (1/5/15 min) at start: ${machine.loadAtStart ?? 'n/a'}; at the end: ${machine.loadavg ?? 'n/a'}`);
  L.push(`- ${cfg.rounds} interleaved rounds, medians; ${cfg.durationMs / 1000} s per load phase after ${cfg.warmupMs / 1000} s warm-up; ${cfg.bulkBytes / 1048576} MiB bulk body (the median of ${cfg.bulkRepeats ?? 1} transfers per round); ${cfg.hosts} new host names per round`);
  L.push('');
  L.push('## Summary (medians over rounds)', '');
  L.push(`| mode | small GET req/s, 1 conn | p50 / p99 ms at 1 | small GET req/s, ${N} conns | p50 / p99 ms at ${N} | ${cfg.bulkBytes / 1048576} MiB via interception MiB/s | via plain tunnel MiB/s | first request, new host p50 ms | first request, known host p50 ms | proxy CPU us/req at 1 / ${N} | proxy CPU s/GiB interception / tunnel | idle RSS MiB at 1.5 s / settled | peak RSS MiB: HTTP/1.1 phases / all |`);
  L.push('|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const p of peers) {
    const s = summary[p.name];
    if (s.skipped) {
      L.push(`| ${LABEL[p.name]} | skipped: ${s.skipped.replace(/\|/g, '/')} ||||||||||||`);
      continue;
    }
    const direct = p.name === 'direct';
    L.push(`| ${LABEL[p.name]} | ${f0(s.c1_rps)} | ${f2(s.c1_p50)} / ${f2(s.c1_p99)} | ${f0(s.cN_rps)} | ${f2(s.cN_p50)} / ${f2(s.cN_p99)} | ${f0(s.bulk)} | ${direct ? 'n/a' : f0(s.tunnel)} | ${f2(s.new_p50)} | ${f2(s.known_p50)} | ${direct ? 'n/a' : `${f0(s.cpu_c1)} / ${f0(s.cpu_cN)}`} | ${direct ? 'n/a' : `${f2(s.bulk_cpu)} / ${f2(s.tunnel_cpu)}`} | ${direct ? 'n/a' : `${f1(s.idle_rss)} / ${f1(s.settled_rss)}`} | ${direct ? 'n/a' : `${f1(s.peak_rss_h1)} / ${f1(s.peak_rss)}`} |`);
  }
  L.push('');
  L.push('"new host": a new connection (CONNECT, TLS, one GET) to a name the proxy has not seen (certificate minting); "known host": the same to a name it has. CPU is user+system time of the proxy\'s process tree over the whole load phase divided by the requests served; RSS is summed over the tree (squid\'s certificate helpers included). "Node ceiling" (bench/lib/bare-proxy.mjs) terminates TLS and re-originates it with a byte pipe between, one upstream connection per client connection, no HTTP parsing, injection or logging: the bound any Node.js intercepting proxy works under on this machine. It is not a product and has no targets.', '');

  for (const name of KEYGATES) {
    const k = summary[name];
    if (!k || k.skipped) continue;
    L.push(`## ${LABEL[name]} compared with each peer (${name} / peer)`, '');
    const others = peers.filter((p) => p.name !== name && !summary[p.name].skipped);
    L.push(`| figure | better when | ${others.map((p) => p.name).join(' | ')} |`);
    L.push(`|---|---|${others.map(() => '---|').join('')}`);
    const row = (label, better, key, skipDirect = false, otherKey = key) => L.push(`| ${label} | ${better} | ${others.map((p) => (skipDirect && p.name === 'direct' ? 'n/a' : fx(ratio(k[key], summary[p.name][otherKey])))).join(' | ')} |`);
    row('req/s, 1 conn', 'higher', 'c1_rps');
    row(`req/s, ${N} conns`, 'higher', 'cN_rps');
    row(`p99 at ${N}`, 'lower', 'cN_p99');
    row('bulk via interception', 'higher', 'bulk');
    L.push(`| bulk via tunnel (direct: vs its plain transfer) | higher | ${others.map((p) => fx(ratio(k.tunnel, p.name === 'direct' ? summary.direct.bulk : summary[p.name].tunnel))).join(' | ')} |`);
    row('first request, new host p50', 'lower', 'new_p50');
    row('first request, known host p50', 'lower', 'known_p50');
    row(`CPU per request at ${N}`, 'lower', 'cpu_cN', true);
    row('CPU per GiB, interception', 'lower', 'bulk_cpu', true);
    row('CPU per GiB, tunnel', 'lower', 'tunnel_cpu', true);
    row('peak RSS, HTTP/1.1 phases', 'lower', 'peak_rss_h1', true);
    row('peak RSS, all phases', 'lower', 'peak_rss', true);
    row('idle RSS at 1.5 s', 'lower', 'idle_rss', true);
    row('idle RSS settled', 'lower', 'settled_rss', true);
    L.push('');
    L.push(`## Targets of ${name} (issue #20)`, '');
    L.push('| target | this run | met |', '|---|---|---|');
    for (const t of targets(summary, cfg, name)) L.push(`| ${t.name} | ${t.value} | ${t.pass == null ? 'not measured' : t.pass ? 'yes' : '**no**'} |`);
    L.push('');
  }
  if (h2) L.push(...renderH2({ peers, summary, cfg, label: LABEL, f0, f2, fx, ratio }));
  if (wrk != null) {
    L.push(`Client check: \`wrk -t1 -c${N}\` straight at the origin made ${f0(wrk)} req/s on core 1, the bench client ${f0(summary.direct?.cN_rps)} req/s (the client, not the origin, bounds the direct figure when these differ a lot).`, '');
  }
  if (notes.length) {
    L.push('## Notes', '');
    for (const n of notes) L.push(`- ${n.replace(/\n/g, ' ')}`);
    L.push('');
  }
  L.push('## Per round', '');
  L.push(`| round | mode | req/s 1 | req/s ${N} | p99 ${N} ms | CPU us/req ${N} | bulk MiB/s | tunnel MiB/s | new host p50 ms | known host p50 ms | errors |`);
  L.push('|---|---|---|---|---|---|---|---|---|---|---|');
  for (let r = 0; r < cfg.rounds; r++) {
    for (const p of peers) {
      const x = p.rounds[r];
      if (!x) continue;
      const errs = [x.c1, x.cN, x.bulk, x.tunnel, x.newHost, x.knownHost].filter((v) => v && !v.ok).map((v) => v.error);
      const reqErrs = (x.c1?.errors ?? 0) + (x.cN?.errors ?? 0);
      L.push(`| ${r + 1} | ${p.name} | ${f0(okv(x.c1, 'rps'))} | ${f0(okv(x.cN, 'rps'))} | ${f2(okv(x.cN, 'p99_ms'))} | ${f0(okv(x.cN, 'cpu_us_per_req'))} | ${f0(okv(x.bulk, 'mib_s'))} | ${f0(okv(x.tunnel, 'mib_s'))} | ${f2(okv(x.newHost, 'p50_ms'))} | ${f2(okv(x.knownHost, 'p50_ms'))} | ${[reqErrs ? `${reqErrs} non-200` : '', ...errs].filter(Boolean).join('; ').replace(/\|/g, '/') || '0'} |`);
    }
  }
  L.push('');
  if (h2) L.push(...renderH2Rounds({ peers, cfg, f0, f2, okv }));
  return L.join('\n');
}
