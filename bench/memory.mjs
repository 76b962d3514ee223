#!/usr/bin/env node
// keygate's memory through one round of the benchmark's phases, on Node 24 and Node 20 (issue #20):
// idle RSS 1.5 s and 20 s after start ("settled"), then peak RSS (VmHWM) after each phase of a
// round as `npm run bench` runs it (small GET at 1 and 32 connections, 100 MiB through
// interception and through the tunnel, new and known hosts, the h2 phase: h2 and gRPC), so a
// peak can be traced to the phase that set it. keygate is started as run.mjs starts it (the bin,
// its CA created beforehand); both keygates start together (idle memory needs no core), the load
// phases then run one keygate at a time. One JSON line per Node, then a table.
//
// usage: node bench/memory.mjs [--nodes 24,20] [--seconds 4] [--rounds 1] [--no-h2] [--keygate-arg ARG]...
//          [--phases c1,c32,bulk,tunnel,hosts,h2 (which phases run, in that order)] [--smaps (the RSS
//          split after every phase, not only at the end)]
// env: KEYGATE_NODE_ARGS (as phase.mjs), KEYGATE_BENCH_BASE=DIR (another built checkout) and any
//      KEYGATE_* setting, passed through to keygate.
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { runClient } from './lib/client-run.mjs';
import { startOrigin, startKeygate, BENCH_DIR } from './lib/peers.mjs';
import { ensurePki, ensureContent, findNodes } from './lib/setup.mjs';
import { rssMiB, peakRssMiB } from './lib/proc.mjs';
import { GRPC_HOST, measureH2, startGrpcOrigin, verifyH2 } from './lib/h2.mjs';

const { values: o } = parseArgs({
  options: {
    nodes: { type: 'string', default: '24,20' },
    seconds: { type: 'string', default: '4' },
    rounds: { type: 'string', default: '1' },
    'no-h2': { type: 'boolean', default: false },
    'keygate-arg': { type: 'string', multiple: true, default: [] },
    phases: { type: 'string', default: 'c1,c32,bulk,tunnel,hosts,h2' },
    smaps: { type: 'boolean', default: false },
  },
});
const WORK = path.join(BENCH_DIR, '.work');
spawnSync('taskset', ['-a', '-pc', '1', String(process.pid)], { stdio: 'ignore' });
const found = findNodes({ log: () => undefined, notes: [], allowInstall: false });
const pki = ensurePki(WORK);
const content = ensureContent(WORK, 100 * 1048576);
const token = `mem-${randomBytes(6).toString('hex')}`;
const run = randomBytes(3).toString('hex');
const rounds = Number(o.rounds);
const fresh = Array.from({ length: rounds }, (_, r) => Array.from({ length: 20 }, (_, i) => `m${r}x${i}-${run}.bench.test`));
const names = ['bench.test', 'plain.test', 'verify.bench.test', GRPC_HOST, ...fresh.flat()];
const ms = Number(o.seconds) * 1000;

/**
 * RSS split (MiB): the node binary's code and read-only data (file pages), other files, and
 * anonymous memory: malloc's main heap (`brk`), other anonymous mappings (V8's heap pages, malloc's
 * thread arenas and large blocks).
 */
function smapsSummary(pid) {
  const out = { text: 0, rodata: 0, files: 0, brk: 0, anon: 0 };
  let name = '';
  let exec = false;
  for (const l of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const m = /^[0-9a-f]+-[0-9a-f]+ (\S+) \S+ \S+ \d+\s*(.*)$/.exec(l);
    if (m) {
      [exec, name] = [m[1].includes('x'), m[2]];
      continue;
    }
    const r = /^Rss:\s+(\d+) kB/.exec(l);
    if (!r) continue;
    const key = /\/node$/.test(name) ? (exec ? 'text' : 'rodata') : name.startsWith('/') ? 'files' : name === '[heap]' ? 'brk' : 'anon';
    out[key] += Number(r[1]) / 1024;
  }
  for (const k of Object.keys(out)) out[k] = Math.round(out[k] * 10) / 10;
  return out;
}

const client = (spec, script) => runClient(spec, { ...(script ? { script } : {}), echo: true });

const origin = await startOrigin({ work: WORK, pki, content });
const phases = new Set(o.phases.split(','));
const grpc = o['no-h2'] || !phases.has('h2') ? null : await startGrpcOrigin({ work: WORK, pki });
const kgs = [];
try {
  const nodeArgs = process.env.KEYGATE_NODE_ARGS ? process.env.KEYGATE_NODE_ARGS.split(' ') : [];
  for (const n of o.nodes.split(',')) {
    const node = n === '20' ? found.node20 : found.node24;
    if (!node) throw new Error(`no Node ${n} on this machine`);
    const kg = await startKeygate({ work: WORK, pki, token, names, originPort: origin.port, extraResolve: grpc?.resolve ?? [], extraArgs: o['keygate-arg'], nodeArgs, node: node.bin, name: `mem-node${n}`, ...(process.env.KEYGATE_BENCH_BASE ? { repo: process.env.KEYGATE_BENCH_BASE } : {}) });
    kgs.push({ n, version: node.version, kg, t0: Date.now(), out: {} });
  }
  const at = async (k, when) => {
    await new Promise((r) => setTimeout(r, Math.max(0, k.t0 + when - Date.now())));
    return Math.round(rssMiB(k.kg.pid) * 10) / 10;
  };
  for (const k of kgs) k.out.idle = await at(k, 1500);
  for (const k of kgs) {
    k.out.settled = await at(k, 20_000);
    k.out.settled_smaps = smapsSummary(k.kg.pid);
  }
  for (const k of kgs) {
    const b = { proxy: { host: '127.0.0.1', port: k.kg.port }, port: origin.port, ca: [k.kg.ca, pki.originCa] };
    const peak = () => Math.round(peakRssMiB(k.kg.pid) * 10) / 10;
    const after = (name) => {
      k.out[`peak_after_${name}`] = peak();
      if (o.smaps) k.out[`smaps_after_${name}`] = smapsSummary(k.kg.pid);
    };
    const step = async (name, fn) => {
      if (!phases.has(name.replace(/_r\d+$/, ''))) return;
      const res = await fn();
      if (res && res.ok === false) k.out[`${name}_error`] = res.error;
      after(name);
    };
    for (let r = 0; r < rounds; r++) {
    const sfx = rounds > 1 ? `_r${r + 1}` : '';
    await step(`c1${sfx}`, () => client({ ...b, mode: 'small', host: 'bench.test', connections: 1, durationMs: ms, warmupMs: 500 }));
    await step(`c32${sfx}`, () => client({ ...b, mode: 'small', host: 'bench.test', connections: 32, durationMs: ms, warmupMs: 500 }));
    await step(`bulk${sfx}`, () => client({ ...b, mode: 'bulk', host: 'bench.test', expectBytes: 100 * 1048576, warmupTransfers: 1 }));
    await step(`tunnel${sfx}`, () => client({ ...b, mode: 'bulk', host: 'plain.test', expectBytes: 100 * 1048576, warmupTransfers: 1 }));
    await step(`hosts${sfx}`, () => client({ ...b, mode: 'fresh', hosts: fresh[r] }));
    if (grpc) {
      const p = { name: 'keygate', pid: k.kg.pid, proxy: b.proxy, ca: k.kg.ca };
      p.h2check = await verifyH2(p, { client, originPort: origin.port, grpcPort: grpc.port, token, originCa: pki.originCa });
      const cfg = { connections: 32, durationMs: ms, warmupMs: 500 };
      const h2 = await measureH2({ ...p, h2check: { ...p.h2check, grpc: false } }, { client, cfg, originPort: origin.port, grpcPort: grpc.port, originCa: pki.originCa });
      if (!h2.h2?.ok) k.out.h2_error = h2.h2?.error ?? p.h2check.h2Skip;
      after(`h2${sfx}`);
      const g = await measureH2({ ...p, h2check: { ...p.h2check, h2: false } }, { client, cfg, originPort: origin.port, grpcPort: grpc.port, originCa: pki.originCa });
      if (!g.grpc?.ok) k.out.grpc_error = g.grpc?.error ?? p.h2check.grpcSkip;
      after(`grpc${sfx}`);
    }
    }
    k.out.end = Math.round(rssMiB(k.kg.pid) * 10) / 10;
    k.out.end_smaps = smapsSummary(k.kg.pid);
    await k.kg.stop();
    console.log(JSON.stringify({ node: k.version, ...k.out }));
  }
} finally {
  for (const k of kgs) await k.kg.stop();
  await grpc?.stop();
  await origin.stop();
}
