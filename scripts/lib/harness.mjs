// Shared by scripts/soak.mjs and scripts/fuzz.mjs: a throw-away origin PKI, a loopback HTTPS
// origin (echo, SSE, upload, WebSocket echo), a spawned `keygate proxy` (dist/, run
// `npm run build` first) and /proc readings. Loopback only: nothing here reaches another host.
import 'reflect-metadata';
import { spawn } from 'node:child_process';
import { webcrypto } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import * as x509 from '@peculiar/x509';
import { WebSocketServer } from 'ws';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const CLI = path.join(REPO_ROOT, 'dist/cli/main.js');

x509.cryptoProvider.set(webcrypto);
const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };

function toPem(der, label) {
  const b64 = Buffer.from(der).toString('base64').replace(/(.{64})/g, '$1\n');
  return `-----BEGIN ${label}-----\n${b64.replace(/\n$/, '')}\n-----END ${label}-----\n`;
}

/** An origin CA and one server certificate for `names`. */
export async function createPki(names) {
  const caKeys = await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify']);
  const now = Date.now();
  const ca = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: '01',
    name: 'CN=keygate soak origin CA',
    notBefore: new Date(now - 3600_000),
    notAfter: new Date(now + 2 * 24 * 3600_000),
    signingAlgorithm: ALG,
    keys: caKeys,
    extensions: [new x509.BasicConstraintsExtension(true, 0, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true), await x509.SubjectKeyIdentifierExtension.create(caKeys.publicKey)],
  });
  const keys = await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify']);
  const leaf = await x509.X509CertificateGenerator.create({
    serialNumber: '02',
    subject: `CN=${names[0]}`,
    issuer: ca.subject,
    notBefore: new Date(now - 3600_000),
    notAfter: new Date(now + 2 * 24 * 3600_000),
    signingAlgorithm: ALG,
    publicKey: keys.publicKey,
    signingKey: caKeys.privateKey,
    extensions: [
      new x509.BasicConstraintsExtension(false),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(names.map((n) => ({ type: 'dns', value: n }))),
    ],
  });
  return { caPem: ca.toString('pem') + '\n', certPem: leaf.toString('pem') + '\n', keyPem: toPem(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey), 'PRIVATE KEY') };
}

/**
 * HTTPS origin on 127.0.0.1: `/echo` (JSON of method, url, header names), `/sse?n=N&ms=M` (N
 * events M ms apart), `/upload` (counts the body), WebSocket echo on any path.
 */
export async function startOrigin(pki) {
  const server = https.createServer({ key: pki.keyPem, cert: pki.certPem, requestTimeout: 0, keepAliveTimeout: 2000 }, (req, res) => {
    const url = new URL(req.url ?? '/', 'https://origin.invalid');
    if (url.pathname === '/upload') {
      let bytes = 0;
      req.on('data', (c) => (bytes += c.length));
      req.on('end', () => res.end(JSON.stringify({ bytes })));
      return;
    }
    if (url.pathname === '/sse') {
      const n = Number(url.searchParams.get('n') ?? '3');
      const ms = Number(url.searchParams.get('ms') ?? '20');
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.flushHeaders();
      let i = 0;
      const tick = () => {
        if (res.destroyed) return;
        i++;
        res.write(`data: ${i}\n\n`);
        if (i >= n) res.end();
        else setTimeout(tick, ms);
      };
      setTimeout(tick, ms);
      return;
    }
    req.resume();
    req.on('end', () => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ method: req.method, url: req.url, names: req.rawHeaders.filter((_, i) => i % 2 === 0).map((h) => h.toLowerCase()) }));
    });
  });
  const wss = new WebSocketServer({ noServer: true });
  server.on('upgrade', (req, socket, head) => wss.handleUpgrade(req, socket, head, (ws) => ws.on('message', (d, bin) => ws.send(d, { binary: bin }))));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: server.address().port,
    async close() {
      wss.clients.forEach((c) => c.terminate());
      server.closeAllConnections();
      await new Promise((r) => server.close(() => r()));
    },
  };
}

/** Spawns `keygate proxy` on 127.0.0.1:0 and waits for its `listening on` line. */
export async function spawnProxy({ config, resolve = [], upstreamCa = [], limits = [] }) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-soak-'));
  const configPath = path.join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify(config));
  const args = [CLI, 'proxy', '--config', configPath, '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs'), '--no-watch', '--grace', '2'];
  for (const r of resolve) args.push('--resolve', r);
  upstreamCa.forEach((pem, i) => {
    const f = path.join(dir, `upstream-ca-${i}.pem`);
    writeFileSync(f, pem);
    args.push('--upstream-ca', f);
  });
  for (const l of limits) args.push('--limit', l);
  const child = spawn(process.execPath, args, { env: { ...process.env, KEYGATE_LOG_LEVEL: 'warn' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let exitCode;
  child.stdout.on('data', (d) => (out = (out + d).slice(-200_000)));
  child.stderr.on('data', (d) => (out = (out + d).slice(-200_000)));
  const exited = new Promise((r) => child.on('exit', (code, sig) => r((exitCode = code ?? sig))));
  // The listening line is logged at info; with level warn it is not printed: find the port from /proc instead.
  const port = await new Promise((resolve, reject) => {
    const until = Date.now() + 20_000;
    const poll = () => {
      if (exitCode !== undefined) return reject(new Error(`proxy exited (${exitCode}):\n${out}`));
      const p = listeningPort(child.pid);
      if (p) return resolve(p);
      if (Date.now() > until) return reject(new Error(`proxy did not start:\n${out}`));
      setTimeout(poll, 50);
    };
    poll();
  });
  return {
    pid: child.pid,
    port,
    url: `http://127.0.0.1:${port}`,
    caPem: readFileSync(path.join(dir, 'certs', 'ca.pem'), 'utf8'),
    output: () => out,
    alive: () => exitCode === undefined,
    exitCode: () => exitCode,
    async stop() {
      if (exitCode === undefined) child.kill('SIGTERM');
      const code = await exited;
      rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** The TCP port a process listens on (from /proc/net/tcp and its socket inodes). */
function listeningPort(pid) {
  let inodes;
  try {
    inodes = new Set(
      readdirSync(`/proc/${pid}/fd`)
        .map((fd) => {
          try {
            return /socket:\[(\d+)\]/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
          } catch {
            return undefined;
          }
        })
        .filter(Boolean),
    );
  } catch {
    return 0;
  }
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10 || f[3] !== '0A') continue; // 0A = LISTEN
      if (inodes.has(f[9])) return parseInt(f[1].split(':')[1], 16);
    }
  }
  return 0;
}

export function fdCount(pid) {
  return readdirSync(`/proc/${pid}/fd`).length;
}

export function rssMb(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN) / 1024;
}

/** CONNECT through the proxy; resolves with the tunnel socket (status 200) or rejects with the status line. */
export function connectTunnel(proxyPort, authority) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(proxyPort, '127.0.0.1');
    let buf = Buffer.alloc(0);
    const onData = (d) => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      const head = buf.subarray(0, end).toString('latin1');
      if (!/^HTTP\/1\.[01] 200/.test(head)) {
        socket.destroy();
        return reject(new Error(`CONNECT ${authority}: ${head.split('\r\n')[0]}`));
      }
      const rest = buf.subarray(end + 4);
      if (rest.length) socket.unshift(rest);
      resolve(socket);
    };
    socket.on('data', onData);
    socket.once('error', reject);
    socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  });
}

export function tlsOver(socket, servername, ca) {
  return new Promise((resolve, reject) => {
    const t = tls.connect({ socket, servername, ca, ALPNProtocols: ['http/1.1'] }, () => resolve(t));
    t.once('error', reject);
  });
}

export function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
