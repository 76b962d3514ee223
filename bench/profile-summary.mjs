#!/usr/bin/env node
// Summarises a V8 .cpuprofile (from `npm run bench -- --cpu-prof`): self time per function and
// inclusive time per module, the evidence for where keygate's CPU per request goes.
// usage: node bench/profile-summary.mjs FILE.cpuprofile [--top N]
import { readFileSync } from 'node:fs';

const file = process.argv[2];
const top = Number(process.argv[process.argv.indexOf('--top') + 1]) || 40;
if (!file) {
  console.error('usage: node bench/profile-summary.mjs FILE.cpuprofile [--top N]');
  process.exit(2);
}
const prof = JSON.parse(readFileSync(file, 'utf8'));
const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const parent = new Map();
for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);

const selfTicks = new Map();
for (const s of prof.samples) selfTicks.set(s, (selfTicks.get(s) ?? 0) + 1);
const total = prof.samples.length;

const short = (url) => (url ? url.replace(/^file:\/\//, '').replace(/^.*\/node_modules\//, 'nm:').replace(/^.*\/dist\//, 'dist/') : '');
const keyOf = (n) => `${n.callFrame.functionName || '(anonymous)'} ${short(n.callFrame.url)}:${n.callFrame.lineNumber + 1}`;
const moduleOf = (n) => {
  const u = short(n.callFrame.url);
  if (!u) return n.callFrame.functionName.startsWith('(') ? n.callFrame.functionName : '(native)';
  if (u.startsWith('nm:')) return u.split('/').slice(0, u.startsWith('nm:@') ? 2 : 1).join('/');
  if (u.startsWith('node:')) return u;
  return u;
};

const self = new Map();
const inclusiveModule = new Map();
for (const [id, ticks] of selfTicks) {
  const n = byId.get(id);
  const k = keyOf(n);
  self.set(k, (self.get(k) ?? 0) + ticks);
  // Inclusive per module: count each module once per sample stack.
  const seen = new Set();
  for (let cur = id; cur !== undefined; cur = parent.get(cur)) {
    const m = moduleOf(byId.get(cur));
    if (seen.has(m)) continue;
    seen.add(m);
    inclusiveModule.set(m, (inclusiveModule.get(m) ?? 0) + ticks);
  }
}
const pct = (t) => `${((100 * t) / total).toFixed(1).padStart(5)}%`;
console.log(`${total} samples (${((prof.endTime - prof.startTime) / 1e6).toFixed(1)} s)\n\nself time, top ${top}:`);
for (const [k, t] of [...self].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${pct(t)}  ${k}`);
console.log(`\ninclusive time per module, top ${top}:`);
for (const [k, t] of [...inclusiveModule].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${pct(t)}  ${k}`);
