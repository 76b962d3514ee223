/**
 * Runs inside `unshare -mn` (a private network and mount namespace: only its own loopback exists,
 * so nothing here can reach any other network). Gives the system resolver a real configuration
 * for the proxy to live with: /etc/resolv.conf with a search list and a DNS server on
 * 127.0.0.1:53 (this script), and an /etc/hosts entry. Then runs the built proxy
 * (`dist/cli/main.js proxy`) and CONNECTs through it to each name given, printing one JSON line:
 * `{ name: { status, reached, at } }` (reached: the bytes came from the loopback origin; at: the
 * loopback address it was reached at).
 *
 * argv: REPO_ROOT CONFIG_JSON NAME...
 * Used by netns-resolver.test.ts.
 */
import { execFileSync, spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const [repo, configJson, ...names] = process.argv.slice(2);
const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-netns-'));

try {
  execFileSync('ip', ['link', 'set', 'lo', 'up'], { stdio: 'ignore' });
} catch {
  // Already up (some kernels bring a new namespace's loopback up themselves).
}
const bind = (file, content) => {
  const f = path.join(dir, path.basename(file));
  writeFileSync(f, content);
  execFileSync('mount', ['--bind', f, file]);
};
bind('/etc/resolv.conf', 'nameserver 127.0.0.1\nsearch corp.internal\noptions ndots:1 timeout:1 attempts:1\n');
bind('/etc/hosts', `${readFileSync('/etc/hosts', 'utf8')}\n127.0.0.1 hostsonly.example\n127.0.0.2 filesfirst\n`);

// The zone: a few A records under the search domain and outside it, one CNAME to a denied name. Anything else: NXDOMAIN. AAAA: no data.
const A = new Map([['secret.corp.internal', '127.0.0.1'], ['open.example.net', '127.0.0.1'], ['svc.corp.internal', '127.0.0.1'], ['deep.sub.corp.internal', '127.0.0.1'], ['hidden.sub.corp.internal', '127.0.0.1'], ['filesfirst.corp.internal', '127.0.0.3']]);
const CNAME = new Map([['alias.example.net', 'secret.corp.internal']]);
const encodeName = (n) => Buffer.concat([...n.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)])), Buffer.from([0])]);
function answer(q) {
  let off = 12;
  const labels = [];
  while (q[off]) {
    labels.push(q.subarray(off + 1, off + 1 + q[off]).toString('latin1'));
    off += q[off] + 1;
  }
  const qname = labels.join('.').toLowerCase();
  const qtype = q.readUInt16BE(off + 1);
  const question = q.subarray(12, off + 5);
  const rrs = [];
  let name = qname;
  const rr = (owner, type, rdata) => {
    const fixed = Buffer.alloc(10);
    fixed.writeUInt16BE(type, 0);
    fixed.writeUInt16BE(1, 2);
    fixed.writeUInt32BE(5, 4);
    fixed.writeUInt16BE(rdata.length, 8);
    rrs.push(Buffer.concat([encodeName(owner), fixed, rdata]));
  };
  if (CNAME.has(name)) {
    rr(name, 5, encodeName(CNAME.get(name)));
    name = CNAME.get(name);
  }
  const known = A.has(name);
  if (known && qtype === 1) rr(name, 1, Buffer.from(A.get(name).split('.').map(Number)));
  const head = Buffer.alloc(12);
  q.copy(head, 0, 0, 2);
  head.writeUInt16BE(0x8180 | (known ? 0 : 3), 2);
  head.writeUInt16BE(1, 4);
  head.writeUInt16BE(rrs.length, 6);
  return Buffer.concat([head, question, ...rrs]);
}
const dns = dgram.createSocket('udp4');
dns.on('message', (msg, rinfo) => dns.send(answer(msg), rinfo.port, rinfo.address));
await new Promise((r) => dns.bind(53, '127.0.0.1', r));

// On every loopback address (the namespace has no other interface): it says which one was dialled.
const origin = net.createServer((s) => s.end(`ORIGIN ${s.localAddress}\n`));
await new Promise((r) => origin.listen(0, '0.0.0.0', r));
const originPort = origin.address().port;

const configPath = path.join(dir, 'config.json');
writeFileSync(configPath, configJson);
const proxy = spawn(process.execPath, [path.join(repo, 'dist/cli/main.js'), 'proxy', '--config', configPath, '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs')], {
  stdio: ['ignore', 'pipe', 'pipe'],
  env: { ...process.env, KEYGATE_LOG_LEVEL: 'info' },
});
let out = '';
proxy.stdout.on('data', (d) => (out += d));
proxy.stderr.on('data', (d) => (out += d));
const proxyPort = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`proxy did not start:\n${out}`)), 20_000);
  proxy.stdout.on('data', () => {
    const m = /listening on 127\.0\.0\.1:(\d+)/.exec(out);
    if (m) {
      clearTimeout(timer);
      resolve(Number(m[1]));
    }
  });
});

function connectThrough(name) {
  return new Promise((resolve) => {
    const s = net.connect(proxyPort, '127.0.0.1', () => s.write(`CONNECT ${name}:${originPort} HTTP/1.1\r\nHost: ${name}:${originPort}\r\n\r\n`));
    let got = '';
    s.on('data', (d) => (got += d));
    s.on('error', () => undefined);
    s.on('close', () => resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0), reached: got.includes('ORIGIN'), ...(/ORIGIN (\S+)/.test(got) ? { at: /ORIGIN (\S+)/.exec(got)[1].replace(/^::ffff:/, '') } : {}) }));
    s.setTimeout(8000, () => s.destroy());
  });
}

const results = {};
for (const n of names) results[n] = await connectThrough(n);
process.stdout.write(`${JSON.stringify(results)}\n`);
proxy.kill('SIGTERM');
origin.close();
dns.close();
process.exit(0);
