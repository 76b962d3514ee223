#!/usr/bin/env node
// Memory per idle sandbox in `keygate serve`: the server started as a user starts it (the bin,
// with the Node given by --node or the one running this script first on PATH), then N sandboxes,
// each with its own in-process auth proxy, created through the API and left idle. Prints one JSON
// line: RSS (summed over serve's process tree, the sandboxes' own processes included) with no
// sandbox, with N, settled, and the difference per sandbox. Loopback only.
//
//   node bench/serve-memory.mjs [--sandboxes N] [--node PATH] [--settle-ms MS] [--template NAME]
// --template: the sandboxes' template (default python-3.12; `host` where the server's driver is
// `local`, which builds no rootfs). KEYGATE_BENCH_BASE=DIR runs the bin of another built checkout.
import { spawn } from 'node:child_process';
import { mkdtempSync, realpathSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { REPO_ROOT } from './lib/peers.mjs';
import { rssMiB } from './lib/proc.mjs';

const { values: o } = parseArgs({ options: { sandboxes: { type: 'string', default: '10' }, node: { type: 'string', default: process.execPath }, 'settle-ms': { type: 'string', default: '20000' }, template: { type: 'string', default: 'python-3.12' } } });
const repo = process.env.KEYGATE_BENCH_BASE || REPO_ROOT;
const N = Number(o.sandboxes);
const settleMs = Number(o['settle-ms']);
const KEY = `serve-memory-${process.pid}-0123456789`;
const data = mkdtempSync(path.join(os.tmpdir(), 'kg-serve-memory-'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const child = spawn(path.join(repo, 'dist/cli/main.js'), ['serve', '--listen', '127.0.0.1:0', '--data', data], {
  env: { ...process.env, PATH: `${path.dirname(o.node)}:${process.env.PATH}`, KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_LOG_LEVEL: 'warn' },
  stdio: ['ignore', 'pipe', 'inherit'],
});
let out = '';
child.stdout.on('data', (d) => (out += d));
try {
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start: ${out}`)), 30_000);
    child.stdout.on('data', () => {
      const m = /listening on (\S+?) /.exec(out);
      if (m) (clearTimeout(timer), resolve(`http://${m[1]}`));
    });
    child.once('exit', (code) => reject(new Error(`serve exited with ${code}: ${out}`)));
  });
  const api = async (method, url, body) => {
    const res = await fetch(base + url, { method, headers: { 'x-api-key': KEY, 'content-type': 'application/json' }, body: body && JSON.stringify(body) });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${url}: ${res.status} ${text}`);
    return JSON.parse(text);
  };
  const running = realpathSync(`/proc/${child.pid}/exe`);
  if (running !== realpathSync(o.node)) throw new Error(`the bin ran ${running}, not ${o.node}`);
  await sleep(settleMs);
  const before = rssMiB(child.pid);
  const proxyConfig = { rules: [{ name: 'api', match_hosts: ['api.example.test'], headers: [{ name: 'Authorization', type: 'plaintext', value: 'Bearer x' }] }] };
  for (let i = 0; i < N; i++) await api('POST', '/api/v2/sandboxes/boxes', { template_name: o.template, name: `idle-${i}`, wait_for_ready: true, proxy_config: proxyConfig });
  const loaded = rssMiB(child.pid);
  await sleep(settleMs);
  const settled = rssMiB(child.pid);
  const round = (x) => Math.round(x * 10) / 10;
  console.log(JSON.stringify({ node: o.node, repo, template: o.template, sandboxes: N, rss_mib_no_sandbox: round(before), rss_mib_after_create: round(loaded), rss_mib_settled: round(settled), mib_per_idle_sandbox: round((settled - before) / N) }));
} finally {
  child.kill('SIGTERM');
  await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
  rmSync(data, { recursive: true, force: true });
}
