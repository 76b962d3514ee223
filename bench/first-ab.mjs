#!/usr/bin/env node
// First requests through two keygate builds side by side, alternated connection by connection,
// so that a busy machine's noise falls on both alike (bench/ab.mjs alternates whole phases, which
// on a shared machine left a 1 ms difference within its noise). Each pair: a new connection to a
// name neither proxy has seen (certificate minting) and one to the known bench.test, through this
// build and through KEYGATE_BENCH_BASE's, in alternating order. Prints the medians of the
// timeline (CONNECT answered, TLS established, response) per build, and in how many pairs this
// build was the slower one.
//
// usage: KEYGATE_BENCH_BASE=DIR node bench/first-ab.mjs [--count 100]
// env: BENCH_NODE  the node binary both bins run on (default: the one running this script)
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import { startOrigin, startKeygate, BENCH_DIR } from './lib/peers.mjs';
import { ensurePki, ensureContent } from './lib/setup.mjs';

const { values: o } = parseArgs({ options: { count: { type: 'string', default: '100' } } });
const base = process.env.KEYGATE_BENCH_BASE;
if (!base) {
  console.error('usage: KEYGATE_BENCH_BASE=DIR node bench/first-ab.mjs [--count 100]');
  process.exit(2);
}
const count = Number(o.count);
const WORK = path.join(BENCH_DIR, '.work');
spawnSync('taskset', ['-a', '-pc', '1', String(process.pid)], { stdio: 'ignore' });
const pki = ensurePki(WORK);
const content = ensureContent(WORK, 100 * 1048576);
const origin = await startOrigin({ work: WORK, pki, content });
const stamp = Date.now().toString(36);
const fresh = (who) => Array.from({ length: count }, (_, i) => `f${who}${i}-${stamp}.bench.test`);
const hosts = { now: fresh('n'), base: fresh('b') };
const node = process.env.BENCH_NODE ?? process.execPath;
const proxies = {};
try {
  proxies.now = await startKeygate({ work: WORK, pki, token: 'first-ab', names: ['bench.test', ...hosts.now], originPort: origin.port, node, name: 'keygate' });
  proxies.base = await startKeygate({ work: WORK, pki, token: 'first-ab', names: ['bench.test', ...hosts.base], originPort: origin.port, node, name: 'keygate-base', repo: base });
  await new Promise((r) => setTimeout(r, 1500));
  const ctx = {
    now: tls.createSecureContext({ ca: [readFileSync(proxies.now.ca, 'utf8'), readFileSync(pki.originCa, 'utf8')] }),
    base: tls.createSecureContext({ ca: [readFileSync(proxies.base.ca, 'utf8'), readFileSync(pki.originCa, 'utf8')] }),
  };
  /** One new connection through `who` to `host`: ms to CONNECT answered, TLS established, first response byte. */
  const once = async (who, host) => {
    const t0 = performance.now();
    const s = net.connect({ host: '127.0.0.1', port: proxies[who].port });
    s.setNoDelay(true);
    await new Promise((res, rej) => s.once('connect', res).once('error', rej));
    s.write(`CONNECT ${host}:${origin.port} HTTP/1.1\r\nHost: ${host}:${origin.port}\r\n\r\n`);
    await new Promise((res) => s.once('data', res));
    const connect = performance.now() - t0;
    const t = tls.connect({ socket: s, servername: host, secureContext: ctx[who], ALPNProtocols: ['http/1.1'] });
    await new Promise((res, rej) => t.once('secureConnect', res).once('error', rej));
    const secured = performance.now() - t0;
    t.write(`GET /small HTTP/1.1\r\nHost: ${host}:${origin.port}\r\n\r\n`);
    await new Promise((res) => t.once('data', res));
    const resp = performance.now() - t0;
    t.destroy();
    return { connect, tls: secured, resp };
  };
  // Warm-up: one of each through both, unmeasured.
  for (const who of ['now', 'base']) await once(who, 'bench.test');
  const rows = { now: { new: [], known: [] }, base: { new: [], known: [] } };
  for (let i = 0; i < count; i++) {
    const order = i % 2 ? ['now', 'base'] : ['base', 'now'];
    for (const who of order) rows[who].new.push(await once(who, hosts[who][i]));
    for (const who of order) rows[who].known.push(await once(who, 'bench.test'));
  }
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  const out = { count, load: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ') };
  for (const kind of ['new', 'known']) {
    for (const who of ['now', 'base']) out[`${kind}_${who}`] = Object.fromEntries(['connect', 'tls', 'resp'].map((k) => [k, Number(med(rows[who][kind].map((r) => r[k])).toFixed(2))]));
    out[`${kind}_resp_ratio`] = Number((out[`${kind}_now`].resp / out[`${kind}_base`].resp).toFixed(2));
    out[`${kind}_now_slower_in`] = `${rows.now[kind].filter((r, i) => r.resp > rows.base[kind][i].resp).length}/${count}`;
  }
  console.log(JSON.stringify(out));
} finally {
  await proxies.now?.stop();
  await proxies.base?.stop();
  await origin.stop();
}
