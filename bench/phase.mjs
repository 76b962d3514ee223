#!/usr/bin/env node
// One load phase against keygate alone, for profiling and A/B comparisons (bench/ab.mjs): the
// benchmark's nginx origin and client, keygate started as run.mjs starts it (the image's node
// flags), one phase, one JSON line: the client's figures plus the proxy's CPU (`cpu_us_per_req`;
// for bulk, ms of CPU per GiB), `util` (its CPU share), `idle` and `peak` RSS (MiB).
//
// usage: node bench/phase.mjs [--mode small|bulk|probe|fresh] [--known [--count 20] (probe, fresh: new
//          connections to --host)] [--connections 32] [--seconds 5]
//          [--host bench.test|plain.test] [--cpu-prof] [--strace FILE [--strace-raw]]
//          [--repeats N (bulk)] [--perf FILE (perf record of keygate; add
//          KEYGATE_NODE_ARGS=--perf-basic-prof for JS names)] [--keygate-arg ARG]...
// env: KEYGATE_NODE_ARGS  extra node flags for keygate (space separated, given as NODE_OPTIONS), e.g. --trace-gc
//      BENCH_NODE         the node binary keygate's bin runs on (default: the one running this script)
//      and any KEYGATE_* setting, passed through to keygate.
//      KEYGATE_BENCH_BASE=DIR  the bin of another built checkout instead of this one (an earlier
//      commit; in bench/ab.mjs, a variant beside "").
//      BENCH_PROXY=squid|mitmproxy|bare|direct  measure squid, mitmproxy, the bare Node TLS pipe
//      (bench/lib/bare-proxy.mjs, the ceiling of any Node proxy) or no proxy at all instead of
//      keygate: in bench/ab.mjs, a variant.
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import { runClient } from './lib/client-run.mjs';
import { startOrigin, startKeygate, startSquid, startMitmproxy, startBare, BENCH_DIR } from './lib/peers.mjs';
import { ensurePki, ensureContent } from './lib/setup.mjs';
import { cpuSeconds, rssMiB, peakRssMiB } from './lib/proc.mjs';
import { probe } from './lib/probe.mjs';

const { values: o } = parseArgs({
  options: {
    mode: { type: 'string', default: 'small' },
    connections: { type: 'string', default: '32' },
    seconds: { type: 'string', default: '5' },
    host: { type: 'string', default: 'bench.test' },
    'cpu-prof': { type: 'boolean', default: false },
    strace: { type: 'string' },
    'strace-raw': { type: 'boolean', default: false },
    repeats: { type: 'string', default: '3' },
    perf: { type: 'string' },
    'keygate-arg': { type: 'string', multiple: true, default: [] },
    known: { type: 'boolean', default: false },
    count: { type: 'string', default: '20' },
  },
});
const WORK = path.join(BENCH_DIR, '.work');
spawnSync('taskset', ['-a', '-pc', '1', String(process.pid)], { stdio: 'ignore' });
const pki = ensurePki(WORK);
const content = ensureContent(WORK, 100 * 1048576);
const origin = await startOrigin({ work: WORK, pki, content });
const names = ['bench.test', 'plain.test', ...Array.from({ length: 20 }, (_, i) => `p${i}-${Date.now()}.bench.test`)];
const nodeArgs = [...(process.env.KEYGATE_NODE_ARGS ? process.env.KEYGATE_NODE_ARGS.split(' ') : []), ...(o['cpu-prof'] ? ['--cpu-prof', `--cpu-prof-dir=${WORK}/prof`] : [])];
let kg;
try {
  const which = process.env.BENCH_PROXY ?? 'keygate';
  if (which === 'squid') kg = await startSquid({ work: WORK, pki, token: 'phase-token', names });
  else if (which === 'mitmproxy') kg = await startMitmproxy({ work: WORK, pki, token: 'phase-token' });
  else if (which === 'direct') kg = { port: 0, pid: 0, ca: pki.originCa, stop: async () => {} };
  else if (which === 'bare') kg = await startBare({ work: WORK, pki, originPort: origin.port });
  else kg = await startKeygate({ work: WORK, pki, token: 'phase-token', names, originPort: origin.port, extraArgs: o['keygate-arg'], nodeArgs, node: process.env.BENCH_NODE ?? process.execPath, ...(process.env.KEYGATE_BENCH_BASE ? { repo: process.env.KEYGATE_BENCH_BASE } : {}) });
  await new Promise((r) => setTimeout(r, 1500));
  const idle = kg.pid ? rssMiB(kg.pid) : 0;
  const client = (spec) => runClient(spec, { echo: true });
  const base = { proxy: kg.port ? { host: '127.0.0.1', port: kg.port } : null, port: origin.port, ca: [kg.ca, pki.originCa] };
  let st;
  if (o.strace) {
    st = spawn('strace', [o['strace-raw'] ? '-tt' : '-c', '-f', '-p', String(kg.pid), '-o', o.strace]);
    await new Promise((r) => setTimeout(r, 500));
  }
  let pf;
  if (o.perf) {
    pf = spawn('perf', ['record', '-F', '1999', '-p', String(kg.pid), '-o', o.perf], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 500));
  }
  // First requests: to 20 names the proxy has not seen, or (--known) --count times to --host.
  const firstHosts = o.known ? Array(Number(o.count)).fill(o.host) : names.slice(2);
  const c0 = kg.pid ? cpuSeconds(kg.pid) : 0;
  const t0 = performance.now();
  let r;
  if (o.mode === 'small') r = await client({ ...base, mode: 'small', host: o.host, connections: Number(o.connections), durationMs: Number(o.seconds) * 1000, warmupMs: 500 });
  else if (o.mode === 'bulk') r = await client({ ...base, mode: 'bulk', host: o.host, expectBytes: 100 * 1048576, warmupTransfers: 1, repeats: Number(o.repeats) });
  else if (o.mode === 'probe') r = await probe({ proxyPort: kg.port, originPort: origin.port, hosts: firstHosts, ca: [kg.ca, pki.originCa] });
  else if (o.mode === 'fresh') r = await client({ ...base, mode: 'fresh', hosts: firstHosts });
  else throw new Error(`unknown --mode ${o.mode}`);
  const c1 = kg.pid ? cpuSeconds(kg.pid) : 0;
  if (pf) {
    pf.kill('SIGINT');
    await new Promise((res) => pf.on('close', res));
  }
  if (st) {
    st.kill('SIGINT');
    await new Promise((res) => st.on('close', res));
  }
  r.util = (c1 - c0) / ((performance.now() - t0) / 1000);
  // small: us per request; bulk: ms per GiB; probe, fresh: us per new connection (its one request included).
  r.cpu_us_per_req = r.total ? ((c1 - c0) * 1e6) / r.total : r.runs ? ((c1 - c0) * 1e3) / ((r.runs.length + 1) * (100 / 1024)) : ((c1 - c0) * 1e6) / firstHosts.length;
  r.idle = idle;
  r.peak = kg.pid ? peakRssMiB(kg.pid) : 0;
  console.log(JSON.stringify(r));
} finally {
  // The origin too, whatever failed: a run must not leave an nginx behind.
  await kg?.stop();
  await origin.stop();
}
