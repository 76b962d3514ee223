#!/usr/bin/env node
// `npm run bench`: keygate against squid, mitmproxy and no proxy at all, in one run, interleaved.
// Loopback only. See bench/README.md for what is measured and how to read the results.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { ensureContent, ensurePackages, ensurePki, findNodes, has, machineInfo } from './lib/setup.mjs';
import { BENCH_DIR, REPO_ROOT, startBare, startKeygate, startMitmproxy, startOrigin, startSquid } from './lib/peers.mjs';
import { runClient } from './lib/client-run.mjs';
import { cpuSeconds, peakRssMiB, rssMiB } from './lib/proc.mjs';
import { GRPC_HOST, measureH2, showH2, startGrpcOrigin, verifyH2 } from './lib/h2.mjs';

/** When idle memory is read the second time, ms after the proxies started. */
const SETTLE_MS = 20_000;
import { renderResults, summarise } from './lib/report.mjs';

const USAGE = `usage: npm run bench -- [options]
  --quick              short run (~1.5-2 min): 2 s per load phase, 10 new hosts
  --duration S         seconds per load phase (default 8)
  --warmup S           unmeasured seconds before each load phase (default 1)
  --rounds N           interleaved rounds; figures are medians over rounds (default 2)
  --hosts N            new host names per round for the first-request test (default 20)
  --bulk-mib N         size of the bulk body in MiB (default 100)
  --connections N      connections for the concurrent phase (default 32)
  --peers LIST         comma list of keygate,keygate-node20,squid,mitmproxy,ceiling,direct (default
                       all). keygate: the bin on Node 24 LTS (scripts/node24.sh installs it from the
                       npm registry); keygate-node20: the bin on this machine's Node 20; ceiling:
                       bench/lib/bare-proxy.mjs on Node 24, TLS both ways and a byte pipe, the bound
                       of any Node.js proxy here; keygate-base (not in the default list): the bin of
                       the built checkout KEYGATE_BENCH_BASE names, on Node 24 (an earlier commit,
                       compared in the same interleaved run)
  --keygate-arg ARG    extra argument for keygate proxy (repeatable)
  --cpu-prof           run keygate with NODE_OPTIONS=--cpu-prof (profiles in bench/.work/prof)
  --no-install         never apt-get install a missing peer
  --no-build           use dist/ as it is (default: npm run build first)
  --node-origin        use the Node origin instead of nginx
  --no-h2              skip the h2 phase (one h2 connection with --connections streams; gRPC unary
                       calls; keygate, mitmproxy and direct)
  --out FILE           results file (default bench/results.md)`;

let opts;
try {
  ({ values: opts } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      duration: { type: 'string' },
      warmup: { type: 'string' },
      rounds: { type: 'string' },
      hosts: { type: 'string' },
      'bulk-mib': { type: 'string' },
      connections: { type: 'string' },
      peers: { type: 'string', default: 'keygate,keygate-node20,squid,mitmproxy,ceiling,direct' },
      'keygate-arg': { type: 'string', multiple: true, default: [] },
      'cpu-prof': { type: 'boolean', default: false },
      'no-install': { type: 'boolean', default: false },
      'no-build': { type: 'boolean', default: false },
      'node-origin': { type: 'boolean', default: false },
      'no-h2': { type: 'boolean', default: false },
      out: { type: 'string', default: path.join(BENCH_DIR, 'results.md') },
      help: { type: 'boolean', short: 'h', default: false },
    },
    allowPositionals: false,
  }));
} catch (err) {
  console.error(`${err.message}\n${USAGE}`);
  process.exit(2);
}
if (opts.help) {
  console.log(USAGE);
  process.exit(0);
}

const num = (v, d) => (v === undefined ? d : Number(v));
const cfg = {
  durationMs: num(opts.duration, opts.quick ? 2 : 8) * 1000,
  warmupMs: num(opts.warmup, opts.quick ? 0.5 : 1) * 1000,
  rounds: num(opts.rounds, 2),
  hosts: num(opts.hosts, opts.quick ? 10 : 20),
  bulkBytes: num(opts['bulk-mib'], 100) * 1048576,
  // One 100 MiB transfer took 0.2-0.4 s and moved by up to 1.3x between rounds of the same
  // build; the median of three per round is what each round reports.
  bulkRepeats: 3,
  connections: num(opts.connections, 32),
  peers: opts.peers.split(',').map((s) => s.trim()).filter(Boolean),
};
for (const [k, v] of Object.entries(cfg)) {
  if (typeof v === 'number' && !(v > 0)) {
    console.error(`invalid value for ${k}`);
    process.exit(2);
  }
}
const unknownPeer = cfg.peers.find((p) => !['keygate', 'keygate-node20', 'keygate-base', 'squid', 'mitmproxy', 'ceiling', 'direct'].includes(p));
if (unknownPeer) {
  console.error(`unknown peer '${unknownPeer}'`);
  process.exit(2);
}

const t0 = Date.now();
const loadAtStart = (() => {
  try {
    return readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  } catch {
    return null;
  }
})();
const log = (msg) => console.log(`[bench ${((Date.now() - t0) / 1000).toFixed(0).padStart(4)}s] ${msg}`);
const WORK = path.join(BENCH_DIR, '.work');
mkdirSync(WORK, { recursive: true });

// One run at a time: a second run would rewrite the first one's origin and proxy directories.
const LOCK = path.join(WORK, 'run.lock');
try {
  writeFileSync(LOCK, String(process.pid), { flag: 'wx' });
} catch {
  const other = Number(readFileSync(LOCK, 'utf8'));
  let otherAlive = false;
  try {
    process.kill(other, 0);
    otherAlive = /bench\/run\.mjs/.test(readFileSync(`/proc/${other}/cmdline`, 'utf8'));
  } catch {
    /* gone */
  }
  if (otherAlive) {
    console.error(`another benchmark run (pid ${other}) is using bench/.work; wait for it to finish`);
    process.exit(1);
  }
  writeFileSync(LOCK, String(process.pid));
}
process.on('exit', () => {
  try {
    if (readFileSync(LOCK, 'utf8') === String(process.pid)) rmSync(LOCK);
  } catch {
    /* already gone */
  }
});

// The harness itself stays off the proxy's core.
if (has('taskset')) spawnSync('taskset', ['-a', '-pc', '1', String(process.pid)], { stdio: 'ignore' });

const notes = [];
const running = [];
async function stopAll() {
  for (const r of running.splice(0).reverse()) await r.stop().catch(() => undefined);
}
let interrupted = false;
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    if (interrupted) return;
    interrupted = true;
    log(`${sig}: stopping everything this run started`);
    void stopAll().then(() => process.exit(130));
  });
}

/** A load generator on core 1 (bench/lib/client-run.mjs). */
const client = (spec, script) => runClient(spec, script ? { script } : {});

async function main() {
  log(`config: ${JSON.stringify(cfg)}`);
  if (cfg.peers.some((p) => p === 'squid' || p === 'mitmproxy')) notes.push(...ensurePackages({ log, allowInstall: !opts['no-install'] }));
  // The Node each keygate variant and the ceiling run on, resolved once (null: that variant is skipped).
  const nodes = findNodes({ log, notes, allowInstall: !opts['no-install'] });
  if (cfg.peers.some((p) => p.startsWith('keygate'))) {
    if (!opts['no-build']) {
      log('building keygate (npm run build)');
      const b = spawnSync('npm', ['run', 'build'], { cwd: REPO_ROOT, encoding: 'utf8' });
      if (b.status !== 0) {
        const why = `${b.stdout}${b.stderr}`.trim().split('\n').filter((l) => /error/i.test(l)).slice(0, 3).join('; ');
        notes.push(`npm run build failed (${why || 'see npm output'}); measured the existing dist/`);
        log('build failed; using the existing dist/');
      }
    }
    if (!existsSync(path.join(REPO_ROOT, 'dist/cli/main.js'))) {
      notes.push('keygate skipped: dist/cli/main.js does not exist (build failed)');
      cfg.peers = cfg.peers.filter((p) => !p.startsWith('keygate'));
    }
  }
  const pki = ensurePki(WORK);
  const content = ensureContent(path.join(WORK), cfg.bulkBytes);
  const token = `bench-${randomBytes(12).toString('hex')}`;
  // New host names per round (and per run, so no disk cache from a previous run can help).
  const runId = randomBytes(3).toString('hex');
  const newHosts = Array.from({ length: cfg.rounds }, (_, r) => Array.from({ length: cfg.hosts }, (_, i) => `r${r + 1}h${i + 1}-${runId}.bench.test`));
  const names = ['bench.test', 'plain.test', 'verify.bench.test', GRPC_HOST, ...newHosts.flat()];

  const origin = await startOrigin({ work: WORK, pki, content, forceNode: opts['node-origin'] });
  running.push(origin);
  if (origin.kind !== 'nginx') notes.push('nginx unavailable: the origin was the Node fallback server (slower; direct figures are not comparable with nginx runs)');
  log(`origin (${origin.kind}) on 127.0.0.1:${origin.port}, pid ${origin.pid}, core 1`);
  // The h2 phase's gRPC origin, before the proxies: keygate is told where its name points.
  let grpcOrigin = null;
  if (!opts['no-h2']) {
    try {
      grpcOrigin = await startGrpcOrigin({ work: WORK, pki });
      running.push(grpcOrigin);
      log(`grpc origin on 127.0.0.1:${grpcOrigin.port}, pid ${grpcOrigin.pid}, core 1`);
    } catch (err) {
      notes.push(`gRPC origin could not start (${err.message.split('\n')[0]}): gRPC not measured`);
    }
  }

  // ---- start every proxy, record idle memory, check injection ----------------------------
  const peers = [];
  const startKeygateOn = (name, node, repo = undefined) => {
    if (!node) throw new Error(`no ${name === 'keygate-node20' ? 'Node 20' : 'Node 24'} on this machine`);
    const nodeArgs = opts['cpu-prof'] ? ['--cpu-prof', `--cpu-prof-dir=${path.join(WORK, 'prof', name)}`] : [];
    return startKeygate({ work: WORK, pki, token, names, originPort: origin.port, extraResolve: grpcOrigin?.resolve ?? [], extraArgs: opts['keygate-arg'], nodeArgs, node: node.bin, name, repo });
  };
  const starters = {
    keygate: () => startKeygateOn('keygate', nodes.node24),
    'keygate-node20': () => startKeygateOn('keygate-node20', nodes.node20),
    'keygate-base': () => {
      const base = process.env.KEYGATE_BENCH_BASE;
      if (!base || !existsSync(path.join(base, 'dist/cli/main.js'))) throw new Error('KEYGATE_BENCH_BASE must name a built checkout (dist/cli/main.js)');
      return startKeygateOn('keygate-base', nodes.node24, base);
    },
    squid: () => {
      if (!has('squid')) throw new Error('squid is not installed');
      return startSquid({ work: WORK, pki, token, names });
    },
    mitmproxy: () => {
      if (!has('mitmdump')) throw new Error('mitmdump is not installed');
      return startMitmproxy({ work: WORK, pki, token });
    },
    ceiling: () => startBare({ work: WORK, pki, originPort: origin.port, node: (nodes.node24 ?? nodes.node20 ?? { bin: process.execPath }).bin }),
  };
  for (const name of cfg.peers) {
    if (name === 'direct') {
      peers.push({ name, proxy: null, ca: pki.originCa, skip: null, tunnelOk: false, rounds: [] });
      continue;
    }
    const peer = { name, skip: null, tunnelOk: false, rounds: [] };
    try {
      const h = await starters[name]();
      running.push(h);
      Object.assign(peer, { handle: h, pid: h.pid, proxy: { host: '127.0.0.1', port: h.port }, ca: h.ca });
      log(`${name} on 127.0.0.1:${h.port}, pid ${h.pid}, core 0`);
    } catch (err) {
      peer.skip = `could not start: ${err.message.split('\n')[0]}`;
      notes.push(`${name} skipped: ${err.message}`);
      log(`${name} skipped: ${err.message}`);
    }
    peers.push(peer);
  }
  const started = Date.now();
  await new Promise((r) => setTimeout(r, 1500));
  for (const p of peers) if (p.pid && !p.skip) p.idleRssMiB = rssMiB(p.pid);
  // Idle as a sidecar spends most of its life: V8's memory reducer gives back start-up garbage
  // and the young generation some seconds after the last activity (node proxies: about 10 s).
  await new Promise((r) => setTimeout(r, Math.max(0, started + SETTLE_MS - Date.now())));
  for (const p of peers) if (p.pid && !p.skip) p.settledRssMiB = rssMiB(p.pid);
  log(`idle RSS at 1.5 s / ${SETTLE_MS / 1000} s: ${peers.filter((p) => p.pid && !p.skip).map((p) => `${p.name} ${p.idleRssMiB.toFixed(1)} / ${p.settledRssMiB.toFixed(1)} MiB`).join(', ')}`);

  const base = (p) => ({ proxy: p.proxy, port: origin.port, ca: [p.ca, pki.originCa] });
  for (const p of peers) {
    if (p.skip) continue;
    if (p.name === 'ceiling') {
      // Not a product: it injects nothing. Checked to relay a request with the client's own
      // header untouched (no HTTP work at all), through its own TLS termination.
      const v = await client({ ...base(p), mode: 'verify', host: 'bench.test' });
      if (!v.ok || v.status !== 200 || v.seen_authorization !== 'Bearer client-sent-value') {
        p.skip = `relay check failed: ${v.ok ? `status ${v.status}` : v.error}`;
        notes.push(`ceiling: measurements aborted: ${p.skip}`);
      }
      log(`ceiling: ${p.skip ?? 'relays requests unchanged'}`);
      continue;
    }
    // Injection (and replacement of a client-sent value) on the rule host and a wildcard name.
    for (const host of ['bench.test', 'verify.bench.test']) {
      let v;
      for (let attempt = 0; attempt < 20; attempt++) {
        v = await client({ ...base(p), mode: 'verify', host });
        if (v.ok) break;
        await new Promise((r) => setTimeout(r, 250));
      }
      const want = p.name === 'direct' ? 'Bearer client-sent-value' : `Bearer ${token}`;
      if (!v.ok || v.status !== 200 || v.seen_authorization !== want) {
        const seen = !v.ok ? v.error : v.seen_authorization === 'Bearer client-sent-value' ? "the client's own value (not replaced)" : v.seen_authorization ? 'some other value' : 'no Authorization header';
        p.skip = `injection check failed on ${host}: origin saw ${seen}${v.ok ? ` (status ${v.status})` : ''}`;
        break;
      }
      if (p.name !== 'direct' && v.issuer === 'keygate bench origin CA') {
        p.skip = `injection check failed on ${host}: the connection was not intercepted`;
        break;
      }
    }
    if (p.skip) {
      notes.push(`${p.name}: measurements aborted: ${p.skip}`);
      log(`${p.name}: ${p.skip}`);
      continue;
    }
    if (p.name !== 'direct') {
      const v = await client({ ...base(p), mode: 'verify', host: 'plain.test' });
      p.tunnelOk = v.ok && v.issuer === 'keygate bench origin CA' && v.seen_authorization === 'Bearer client-sent-value';
      if (!p.tunnelOk) notes.push(`${p.name}: plain.test was not a blind tunnel (${v.ok ? `issuer ${v.issuer}` : v.error}); tunnel bulk not measured`);
    }
    log(`${p.name}: injection verified${p.name !== 'direct' ? `; plain.test ${p.tunnelOk ? 'is a blind tunnel' : 'NOT a blind tunnel'}` : ''}`);
  }
  // The h2 phase's own checks (h2 negotiated, injection on h2 and on gRPC, the origin leg's protocol).
  const h2ctx = { client, cfg, token, originPort: origin.port, grpcPort: grpcOrigin?.port, originCa: pki.originCa };
  if (!opts['no-h2']) {
    for (const p of peers) {
      if (p.skip) continue;
      p.h2check = await verifyH2(p, h2ctx);
      if (!grpcOrigin) Object.assign(p.h2check, { grpc: false, grpcSkip: 'no gRPC origin' });
      const c = p.h2check;
      log(`${p.name} h2: ${c.h2 ? `verified (origin leg ${c.originProtocol})` : c.h2Skip}; gRPC: ${c.grpc ? 'verified' : c.grpcSkip}`);
    }
  }

  // ---- interleaved rounds ---------------------------------------------------------------
  const active = peers.filter((p) => !p.skip);
  for (let r = 0; r < cfg.rounds; r++) {
    const order = r % 2 === 0 ? active : [...active].reverse();
    for (const p of order) {
      const res = { round: r + 1 };
      const b = base(p);
      for (const [key, conns] of [['c1', 1], ['cN', cfg.connections]]) {
        const cpu0 = p.pid ? cpuSeconds(p.pid) : 0;
        const s = await client({ ...b, mode: 'small', host: 'bench.test', connections: conns, durationMs: cfg.durationMs, warmupMs: cfg.warmupMs });
        const cpu1 = p.pid ? cpuSeconds(p.pid) : 0;
        if (s.ok && p.pid) s.cpu_us_per_req = ((cpu1 - cpu0) * 1e6) / Math.max(1, s.total);
        res[key] = s;
        log(`round ${r + 1} ${p.name} small x${conns}: ${s.ok ? `${Math.round(s.rps)} req/s p50 ${s.p50_ms.toFixed(2)} p99 ${s.p99_ms.toFixed(2)} ms${s.errors ? ` (${s.errors} errors)` : ''}${s.cpu_us_per_req ? ` cpu ${Math.round(s.cpu_us_per_req)} us/req` : ''}` : s.error}`);
      }
      const bulk = async (host) => {
        const cpu0 = p.pid ? cpuSeconds(p.pid) : 0;
        const x = await client({ ...b, mode: 'bulk', host, expectBytes: cfg.bulkBytes, warmupTransfers: 1, repeats: cfg.bulkRepeats });
        if (x.ok && p.pid) x.cpu_s_per_gib = ((cpuSeconds(p.pid) - cpu0) * 1024 * 1048576) / x.total_bytes;
        return x;
      };
      const showBulk = (x) => (x.ok ? `${Math.round(x.mib_s)} MiB/s${x.cpu_s_per_gib ? `, proxy CPU ${x.cpu_s_per_gib.toFixed(2)} s/GiB` : ''}` : x.error);
      res.bulk = await bulk('bench.test');
      log(`round ${r + 1} ${p.name} bulk ${p.proxy ? 'intercepted' : 'direct'}: ${showBulk(res.bulk)}`);
      if (p.tunnelOk) {
        res.tunnel = await bulk('plain.test');
        log(`round ${r + 1} ${p.name} bulk tunnel: ${showBulk(res.tunnel)}`);
      }
      res.newHost = await client({ ...b, mode: 'fresh', hosts: newHosts[r] });
      res.knownHost = await client({ ...b, mode: 'fresh', hosts: Array(cfg.hosts).fill('bench.test') });
      log(`round ${r + 1} ${p.name} first request: new host p50 ${res.newHost.ok ? res.newHost.p50_ms.toFixed(2) : res.newHost.error} ms, known host p50 ${res.knownHost.ok ? res.knownHost.p50_ms.toFixed(2) : res.knownHost.error} ms`);
      p.rounds.push(res);
    }
  }
  // The peak under the HTTP/1.1 phases alone (the load of issue #20's benchmark), read before
  // the h2 rounds: their first h2 connection loads and compiles node:http2 and undici's h2
  // client, which would otherwise raise every later phase's peak.
  for (const p of active) if (p.pid) p.peakHttp1RssMiB = peakRssMiB(p.pid);
  // The h2 phase, in interleaved rounds of its own after the HTTP/1.1 ones.
  for (let r = 0; r < cfg.rounds; r++) {
    const order = r % 2 === 0 ? active : [...active].reverse();
    for (const p of order) {
      if (!(p.h2check?.h2 || p.h2check?.grpc)) continue;
      const res = p.rounds[r];
      res.h2 = await measureH2(p, h2ctx);
      log(`round ${r + 1} ${p.name} h2 x${cfg.connections} streams: ${res.h2.h2 ? showH2(res.h2.h2) : 'not measured'}; gRPC unary x${cfg.connections}: ${res.h2.grpc ? showH2(res.h2.grpc) : 'not measured'}`);
    }
  }
  for (const p of active) {
    if (!p.pid) continue;
    p.peakRssMiB = peakRssMiB(p.pid);
    p.endRssMiB = rssMiB(p.pid);
  }

  // ---- a second opinion on the client: wrk straight at the origin ------------------------
  let wrk = null;
  if (has('wrk') && cfg.peers.includes('direct')) {
    const argv = ['wrk', '-t1', `-c${cfg.connections}`, `-d${Math.max(1, Math.round(cfg.durationMs / 1000))}s`, '-H', `Host: bench.test:${origin.port}`, `https://127.0.0.1:${origin.port}/small`];
    const w = spawnSync(has('taskset') ? 'taskset' : argv[0], has('taskset') ? ['-c', '1', ...argv] : argv.slice(1), { encoding: 'utf8' });
    const m = /Requests\/sec:\s*([\d.]+)/.exec(w.stdout ?? '');
    if (m) {
      wrk = Number(m[1]);
      log(`wrk (direct, ${cfg.connections} connections, same core as the client would use): ${Math.round(wrk)} req/s`);
    }
  }

  await stopAll();
  const machine = { ...machineInfo(), loadAtStart, keygateNodes: { keygate: nodes.node24?.version ?? null, 'keygate-node20': nodes.node20?.version ?? null } };
  if (loadAtStart && Number(loadAtStart.split(' ')[0]) > machine.nproc / 2) {
    notes.push(`the machine was busy when the run started (load average ${loadAtStart} on ${machine.nproc} cores): absolute figures are depressed and noisy; the interleaved ratios are the more robust reading`);
  }
  const summary = summarise(peers, cfg);
  const command = `npm run bench${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`;
  const md = renderResults({ machine, cfg, peers, summary, notes, command, origin: origin.kind, wrk, elapsedS: (Date.now() - t0) / 1000, h2: !opts['no-h2'] });
  writeFileSync(opts.out, md);
  writeFileSync(path.join(WORK, 'results.json'), JSON.stringify({ machine, cfg, peers: peers.map(({ handle, ...rest }) => rest), summary, notes, wrk }, null, 2));
  console.log('\n' + md.split('\n## Per round')[0]);
  log(`results written to ${path.relative(process.cwd(), opts.out)} (raw: bench/.work/results.json)`);
}

main().catch(async (err) => {
  console.error(`bench failed: ${err.stack ?? err}`);
  await stopAll();
  process.exit(1);
});
