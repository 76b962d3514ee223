#!/usr/bin/env node
// Measures what the README reports for sandboxes, against the real `keygate serve` (dist/):
//   node scripts/sandbox-measure.mjs latency --driver local|docker|none [--n 30] [--image REF]
//   node scripts/sandbox-measure.mjs memory  --driver local|docker|none [--n 50]
//   node scripts/sandbox-measure.mjs restart --driver local|docker|none [--n 1000] [--restarts 1]
// latency: create a box (wait_for_ready) and run `true` in it, p50/p99 of the whole.
// memory:  resident memory of the server and every process it started, per idle box; for docker
//          also every process of the engine's shims started meanwhile (one per container, and the
//          container's processes under it), the engine's own growth left out.
// restart: N boxes, SIGTERM, start again: time from process start until the API answers (and how
//          many boxes still read `provisioning` then), and until every box is ready. With
//          --restarts K the server is restarted K times (each stopped as soon as it answered, the
//          last one left to restore everything): the API figure is then given for each start.
// Every line also gives the load average: the machine these figures come from is shared.
// Everything stays on loopback and in a temporary data directory, removed at the end.
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const CLI = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'cli', 'main.js');
const KEY = 'measure-key-0123456789abcdef';
const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { driver: { type: 'string', default: 'local' }, n: { type: 'string' }, image: { type: 'string' }, restarts: { type: 'string', default: '1' } },
});
const what = positionals[0];
const driver = values.driver;
const dataDir = mkdtempSync(path.join(os.tmpdir(), 'kg-measure-'));
const configDir = mkdtempSync(path.join(os.tmpdir(), 'kg-measure-cfg-'));
const template = { name: 'm', description: 'measurements', environment: {}, resources: { memory_mb: 256, cpus: 1, pids: 128 } };
if (driver === 'docker') template.image = values.image ?? 'keygate-box:latest';
else template.rootfs = 'host';
writeFileSync(path.join(configDir, 'templates.json'), JSON.stringify([template]));

/** Every server started, so that none outlives the script when it fails half-way. */
const started = [];

function serve() {
  const t0 = performance.now();
  const proc = spawn(process.execPath, [CLI, 'serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--config-dir', configDir, '--sandbox-driver', driver], {
    env: { ...process.env, KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  started.push(proc);
  let out = '';
  return new Promise((resolve, reject) => {
    const on = (d) => {
      out += d;
      const m = /listening on (\S+:\d+)/.exec(out);
      if (m) {
        proc.stdout.off('data', on);
        resolve({ proc, url: `http://${m[1]}`, t0, stop: (sig = 'SIGTERM') => new Promise((r) => (proc.once('exit', r), proc.kill(sig))) });
      }
    };
    proc.stdout.on('data', on);
    proc.stderr.on('data', (d) => (out += d));
    proc.once('exit', (c) => reject(new Error(`serve exited ${c}: ${out}`)));
  });
}

async function api(base, method, url, body) {
  const res = await fetch(base + url, { method, headers: { 'x-api-key': KEY, ...(body ? { 'content-type': 'application/json' } : {}) }, body: body ? JSON.stringify(body) : undefined });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil((p / 100) * xs.length) - 1)];

/** Pids of the engine's per-container shims (containerd-shim-runc-v2) running now. */
function shimPids() {
  const out = [];
  for (const d of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try {
      if (readFileSync(`/proc/${d}/cmdline`, 'utf8').startsWith('/usr/bin/containerd-shim')) out.push(Number(d));
    } catch {
      /* gone */
    }
  }
  return out;
}

/** Resident memory (KiB) of `pid` and all its descendants, from /proc. */
function treeRssKib(pid) {
  const children = new Map();
  for (const d of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(d)]);
    } catch {
      /* gone */
    }
  }
  let total = 0;
  for (const stack = [pid]; stack.length; ) {
    const p = stack.pop();
    try {
      total += Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${p}/status`, 'utf8'))?.[1] ?? 0);
    } catch {
      /* gone */
    }
    stack.push(...(children.get(p) ?? []));
  }
  return total;
}

async function createMany(s, n, wait) {
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < n; i = next++) {
      const r = await api(s.url, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'm', name: `b${i}`, wait_for_ready: wait, idle_ttl_seconds: 0 });
      if (r.status !== 201) throw new Error(`create b${i}: ${r.status} ${JSON.stringify(r.body)}`);
    }
  };
  await Promise.all(Array.from({ length: 4 }, worker));
}

async function countStatus(s) {
  const counts = {};
  for (let offset = 0; ; offset += 100) {
    const page = (await api(s.url, 'GET', `/api/v2/sandboxes/boxes?limit=100&offset=${offset}`)).body.resources;
    for (const b of page) counts[b.status] = (counts[b.status] ?? 0) + 1;
    if (page.length < 100) return counts;
  }
}

const s = await serve();
try {
  if (what === 'latency') {
    const n = Number(values.n ?? 30);
    const times = [];
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      const c = await api(s.url, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'm', name: `l${i}`, wait_for_ready: true });
      if (c.body.status !== 'ready') throw new Error(`l${i}: ${c.body.status} ${c.body.status_reason}`);
      if (driver !== 'none') {
        const e = await api(s.url, 'POST', `/api/v2/sandboxes/boxes/l${i}/execute`, { command: 'true' });
        if (e.body.exit_code !== 0) throw new Error(`true: ${JSON.stringify(e.body)}`);
      }
      times.push(performance.now() - t);
      await api(s.url, 'DELETE', `/api/v2/sandboxes/boxes/l${i}`);
    }
    // The first box of a fresh data directory also waits for the Java truststore (keytool, once per CA).
    const rest = times.slice(1);
    console.log(JSON.stringify({ what, driver, n, p50_ms: Math.round(pct(times, 50)), p99_ms: Math.round(pct(times, 99)), max_ms: Math.round(Math.max(...times)), first_ms: Math.round(times[0]), p99_after_first_ms: Math.round(pct(rest, 99)), loadavg: os.loadavg().map((x) => +x.toFixed(1)) }));
  } else if (what === 'memory') {
    const n = Number(values.n ?? 50);
    await new Promise((r) => setTimeout(r, 2000));
    const before = treeRssKib(s.proc.pid);
    const shimsBefore = new Set(shimPids());
    await createMany(s, n, true);
    await new Promise((r) => setTimeout(r, 3000));
    const server = treeRssKib(s.proc.pid);
    const shims = shimPids().filter((p) => !shimsBefore.has(p));
    const containers = shims.reduce((sum, p) => sum + treeRssKib(p), 0);
    const after = server + containers;
    console.log(JSON.stringify({ what, driver, n, before_mib: +(before / 1024).toFixed(1), after_mib: +(after / 1024).toFixed(1), ...(driver === 'docker' ? { shims: shims.length, shim_trees_mib: +(containers / 1024).toFixed(1) } : {}), per_box_mib: +((after - before) / 1024 / n).toFixed(2), loadavg: os.loadavg().map((x) => +x.toFixed(1)) }));
  } else if (what === 'restart') {
    const n = Number(values.n ?? 1000);
    const restarts = Number(values.restarts);
    const t = performance.now();
    // Real boxes are asked for as a client would, a few at a time, each waiting until ready.
    await createMany(s, n, driver !== 'none');
    for (;;) {
      const c = await countStatus(s);
      if ((c.ready ?? 0) === n) break;
      if (c.failed) {
        const failed = (await api(s.url, 'GET', `/api/v2/sandboxes/boxes?limit=${n}`)).body.resources.filter((b) => b.status === 'failed');
        throw new Error(`failed boxes: ${JSON.stringify(c)}: ${[...new Set(failed.map((b) => b.status_reason))].join('; ')}`);
      }
      await new Promise((r) => setTimeout(r, 500));
    }
    console.log(JSON.stringify({ what, driver, n, created_ms: Math.round(performance.now() - t), server_tree_rss_mib: +(treeRssKib(s.proc.pid) / 1024).toFixed(0), loadavg: os.loadavg().map((x) => +x.toFixed(1)) }));
    let prev = s;
    for (let k = 1; k <= restarts; k++) {
      await prev.stop('SIGTERM');
      const again = await serve();
      prev = again;
      const listening = performance.now() - again.t0;
      let first;
      for (;;) {
        const r = await api(again.url, 'GET', '/api/v2/sandboxes/boxes?limit=100').catch(() => undefined);
        if (r?.status === 200) {
          first = { ms: performance.now() - again.t0, provisioning: r.body.resources.filter((b) => b.status === 'provisioning').length };
          break;
        }
      }
      const line = { what, driver, n, start: k, listening_ms: Math.round(listening), api_answered_ms: Math.round(first.ms), provisioning_of_first_100: first.provisioning, loadavg: os.loadavg().map((x) => +x.toFixed(1)) };
      if (k < restarts) {
        console.log(JSON.stringify(line));
        continue;
      }
      let counts;
      for (;;) {
        counts = await countStatus(again);
        if ((counts.ready ?? 0) + (counts.failed ?? 0) === n) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      console.log(JSON.stringify({ ...line, all_restored_ms: Math.round(performance.now() - again.t0), counts, server_tree_rss_mib: +(treeRssKib(again.proc.pid) / 1024).toFixed(0) }));
    }
    let next = 0;
    const remove = async () => {
      for (let i = next++; i < n; i = next++) await api(prev.url, 'DELETE', `/api/v2/sandboxes/boxes/b${i}`);
    };
    await Promise.all(Array.from({ length: 4 }, remove));
    await prev.stop();
  } else {
    throw new Error('usage: sandbox-measure.mjs latency|memory|restart --driver local|docker|none [--n N] [--image REF]');
  }
} finally {
  if (s.proc.exitCode === null) {
    if (what !== 'restart') for (const b of (await api(s.url, 'GET', '/api/v2/sandboxes/boxes?limit=100').catch(() => ({ body: { resources: [] } }))).body.resources) await api(s.url, 'DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
    await s.stop();
  }
  for (const p of started) if (p.exitCode === null && p.signalCode === null) await new Promise((r) => (p.once('exit', r), p.kill('SIGTERM')));
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(configDir, { recursive: true, force: true });
}
