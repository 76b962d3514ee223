// The timeline of first requests to new hosts through a proxy: TCP connect, CONNECT answered,
// TLS established, first response byte (medians, ms). Used by bench/phase.mjs --mode probe.
import net from 'node:net'; import tls from 'node:tls'; import { readFileSync } from 'node:fs';
export async function probe({ proxyPort, originPort, hosts, ca }) {
  const ctx = tls.createSecureContext({ ca: ca.map((f) => readFileSync(f, 'utf8')) });
  const rows = [];
  for (const host of hosts) {
    const t0 = performance.now(); const r = {};
    const s = net.connect({ host: '127.0.0.1', port: proxyPort }); s.setNoDelay(true);
    await new Promise((res) => s.once('connect', res)); r.tcp = performance.now() - t0;
    s.write(`CONNECT ${host}:${originPort} HTTP/1.1\r\nHost: ${host}:${originPort}\r\n\r\n`);
    await new Promise((res) => s.once('data', res)); r.connect = performance.now() - t0;
    const t = tls.connect({ socket: s, servername: host, secureContext: ctx, ALPNProtocols: ['http/1.1'] });
    await new Promise((res, rej) => { t.once('secureConnect', res); t.once('error', rej); }); r.tls = performance.now() - t0;
    t.write(`GET /small HTTP/1.1\r\nHost: ${host}:${originPort}\r\n\r\n`);
    await new Promise((res) => t.once('data', res)); r.resp = performance.now() - t0;
    t.destroy(); rows.push(r);
  }
  const med = (k) => { const a = rows.map((r) => r[k]).sort((x, y) => x - y); return a[Math.floor(a.length / 2)].toFixed(2); };
  return { tcp: med('tcp'), connect: med('connect'), tls: med('tls'), resp: med('resp') };
}
