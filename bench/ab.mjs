#!/usr/bin/env node
// A/B comparison of keygate variants: REPS interleaved repetitions of one bench/phase.mjs phase
// per variant, medians. A variant is a comma list of environment settings for phase.mjs (and so
// for keygate), e.g. KEYGATE_LOG_FLUSH_MS=0 or KEYGATE_NODE_ARGS=--max-semi-space-size=4; "" is
// the build as it is. Compare CPU per request (the machine's noise moves req/s more).
//
// usage: node bench/ab.mjs REPS "PHASE ARGS" VARIANT...
//   e.g. node bench/ab.mjs 5 "--connections 32 --seconds 4" "" "KEYGATE_LOG_FLUSH_MS=0"
import { spawnSync } from 'node:child_process';
import path from 'node:path';

const [reps, phase = '', ...variants] = process.argv.slice(2);
if (!reps || variants.length === 0) {
  console.error('usage: node bench/ab.mjs REPS "PHASE ARGS" VARIANT...');
  process.exit(2);
}
const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const results = variants.map(() => []);
for (let i = 0; i < Number(reps); i++) {
  variants.forEach((v, j) => {
    const env = { ...process.env };
    for (const kv of v.split(',').filter(Boolean)) {
      const eq = kv.indexOf('=');
      env[kv.slice(0, eq)] = kv.slice(eq + 1);
    }
    const out = spawnSync(process.execPath, [path.join(path.dirname(new URL(import.meta.url).pathname), 'phase.mjs'), ...phase.split(' ').filter(Boolean)], { env, encoding: 'utf8' });
    results[j].push(JSON.parse(out.stdout.trim().split('\n').pop() || '{}'));
  });
}
variants.forEach((v, j) => {
  const rs = results[j];
  const rate = (r) => r.rps ?? (r.runs ? med(r.runs.map((x) => x.mib_s)) : 0);
  console.log(
    `${v || '(as built)'}: rate ${med(rs.map(rate)).toFixed(0)} [${rs.map((r) => Math.round(rate(r))).join(' ')}]  cpu ${med(rs.map((r) => r.cpu_us_per_req ?? 0)).toFixed(0)} [${rs.map((r) => Math.round(r.cpu_us_per_req ?? 0)).join(' ')}]  p50 ${med(rs.map((r) => r.p50_ms ?? 0)).toFixed(2)} ms  idle ${med(rs.map((r) => r.idle)).toFixed(1)}  peak ${med(rs.map((r) => r.peak)).toFixed(1)} MiB`,
  );
});
