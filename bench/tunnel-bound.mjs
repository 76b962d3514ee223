#!/usr/bin/env node
// What bounds a blind tunnel on this machine (issue #20: "tunnel >= 95 % of a direct transfer").
// The same 100 MiB HTTPS download from the benchmark's nginx origin, interleaved, through:
//
//   direct          the client straight to the origin (the reference)
//   keygate         keygate's blind CONNECT tunnel (`plain.test`: no rule, bytes relayed untouched)
//   haproxy-splice  haproxy in TCP mode with splice(2) both ways (the kernel moves the bytes from
//                   socket to socket; no copy through user space): the cheapest relay Linux offers
//   haproxy-copy    the same haproxy without splice: read(2)/write(2) through a user-space buffer,
//                   as any Node.js relay (Node has no splice) and squid do
//
// Every relay is pinned to core 0, the client and nginx to core 1 (as in `npm run bench`). haproxy
// takes no CONNECT: the client dials it as it dials the origin (TLS end to end with the origin, the
// relay sees only bytes), which is what a CONNECT tunnel is after its 200. One JSON line per
// repetition, then medians, each relay's share of the direct rate and its CPU per GiB.
//
// usage: node bench/tunnel-bound.mjs [--reps 5] [--node PATH (the node keygate's bin runs on)]
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { writeFileSync, mkdirSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { runClient } from './lib/client-run.mjs';
import { startOrigin, startKeygate, startLocalServer, BENCH_DIR } from './lib/peers.mjs';
import { ensurePki, ensureContent, freePort, has } from './lib/setup.mjs';
import { cpuSeconds } from './lib/proc.mjs';

const { values: o } = parseArgs({ options: { reps: { type: 'string', default: '5' }, node: { type: 'string', default: process.execPath } } });
const WORK = path.join(BENCH_DIR, '.work');
const BULK = 100 * 1048576;
spawnSync('taskset', ['-a', '-pc', '1', String(process.pid)], { stdio: 'ignore' });
if (!has('haproxy')) throw new Error('haproxy is not installed (apt-get install haproxy)');
const pki = ensurePki(WORK);
const content = ensureContent(WORK, BULK);
const origin = await startOrigin({ work: WORK, pki, content });

async function startHaproxy(name, splice) {
  const dir = path.join(WORK, name);
  mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const conf = path.join(dir, 'haproxy.cfg');
  writeFileSync(
    conf,
    [
      'global',
      '  nbthread 1',
      // Larger buffers than the defaults (16 KiB, a 64 KiB pipe): fewer system calls per MiB.
      '  tune.bufsize 262144',
      '  tune.pipesize 1048576',
      ...(splice ? [] : ['  nosplice']),
      'defaults',
      '  mode tcp',
      '  timeout connect 5s',
      '  timeout client 60s',
      '  timeout server 60s',
      ...(splice ? ['  option splice-request', '  option splice-response'] : []),
      `listen relay`,
      `  bind 127.0.0.1:${port}`,
      `  server origin 127.0.0.1:${origin.port}`,
      '',
    ].join('\n'),
  );
  return { name, port, ...(await startLocalServer({ what: name, cmd: 'haproxy', args: ['-f', conf, '-db'], logFile: path.join(dir, 'stdout.log'), core: 0, port })) };
}

const relays = [];
try {
  const kg = await startKeygate({ work: WORK, pki, token: 'tunnel-token', names: ['bench.test', 'plain.test'], originPort: origin.port, node: o.node, name: 'keygate-tunnel' });
  relays.push({ name: 'keygate', pid: kg.pid, stop: kg.stop, spec: { proxy: { host: '127.0.0.1', port: kg.port }, port: origin.port, ca: [pki.originCa] } });
  for (const [name, splice] of [['haproxy-splice', true], ['haproxy-copy', false]]) {
    const h = await startHaproxy(name, splice);
    relays.push({ name, pid: h.pid, stop: h.stop, spec: { proxy: null, port: h.port, ca: [pki.originCa] } });
  }
  const variants = [{ name: 'direct', pid: 0, spec: { proxy: null, port: origin.port, ca: [pki.originCa] } }, ...relays];
  const client = async (spec) => {
    const r = await runClient(spec, { echo: true });
    if (r.ok === false) throw new Error(`client: ${r.error}`);
    return r;
  };
  const rows = Object.fromEntries(variants.map((v) => [v.name, { rate: [], cpu: [] }]));
  for (let rep = 0; rep < Number(o.reps); rep++) {
    // The order alternates each repetition, as in the benchmark's rounds.
    const order = rep % 2 ? [...variants].reverse() : variants;
    for (const v of order) {
      const c0 = v.pid ? cpuSeconds(v.pid) : 0;
      const r = await client({ ...v.spec, mode: 'bulk', host: 'plain.test', expectBytes: BULK, warmupTransfers: 1, repeats: 3 });
      const c1 = v.pid ? cpuSeconds(v.pid) : 0;
      // The relay's CPU over all four transfers (warm-up included), per GiB moved.
      const cpuPerGiB = v.pid ? (c1 - c0) / ((4 * BULK) / 1073741824) : null;
      rows[v.name].rate.push(r.mib_s);
      if (cpuPerGiB !== null) rows[v.name].cpu.push(cpuPerGiB);
      console.log(JSON.stringify({ rep, relay: v.name, mib_s: Math.round(r.mib_s), cpu_s_per_gib: cpuPerGiB && Math.round(cpuPerGiB * 100) / 100, issuer: r.runs[0].issuer }));
    }
  }
  const median = (a) => [...a].sort((x, y) => x - y)[Math.floor((a.length - 1) / 2)];
  const direct = median(rows.direct.rate);
  console.log('\n| path | MiB/s (median) | of direct | relay CPU s/GiB |\n|---|---|---|---|');
  for (const v of variants) {
    const m = median(rows[v.name].rate);
    const cpu = rows[v.name].cpu.length ? median(rows[v.name].cpu).toFixed(2) : '-';
    console.log(`| ${v.name} | ${Math.round(m)} | ${Math.round((m / direct) * 100)} % | ${cpu} |`);
  }
} finally {
  for (const r of relays) await r.stop?.();
  await origin.stop();
}
