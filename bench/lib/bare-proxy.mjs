#!/usr/bin/env node
// The ceiling of a Node.js intercepting proxy on this machine: what no HTTP work at all costs.
// It answers CONNECT, terminates the client's TLS with the origin's own certificate (the bench
// client trusts that CA), opens one verified TLS connection to the origin per client connection
// and pipes the decrypted bytes both ways. No HTTP parsing, no header injection, no pooling, no
// logging: every cost left is Node's TLS, streams and event loop on two sockets per request,
// which any Node proxy pays. bench/ceiling.mjs runs it beside keygate; it is never a product.
//
// usage: node bench/lib/bare-proxy.mjs ORIGIN_PORT CERT KEY ORIGIN_CA   -> "listening on 127.0.0.1:PORT"
import net from 'node:net';
import tls from 'node:tls';
import { readFileSync } from 'node:fs';

const [originPort, certFile, keyFile, caFile] = process.argv.slice(2);
const serverCtx = tls.createSecureContext({ cert: readFileSync(certFile), key: readFileSync(keyFile) });
const clientCtx = tls.createSecureContext({ ca: readFileSync(caFile) });

const server = net.createServer((client) => {
  client.setNoDelay(true);
  client.on('error', () => client.destroy());
  let buf = Buffer.alloc(0);
  const onData = (d) => {
    buf = buf.length ? Buffer.concat([buf, d]) : d;
    const end = buf.indexOf('\r\n\r\n');
    if (end < 0) return;
    client.removeListener('data', onData);
    client.pause();
    const host = /^CONNECT ([^:\s]+):\d+ /.exec(buf.subarray(0, end).toString('latin1'))?.[1] ?? 'bench.test';
    const rest = buf.subarray(end + 4);
    if (rest.length) client.unshift(rest);
    const up = tls.connect({ host: '127.0.0.1', port: Number(originPort), servername: host, secureContext: clientCtx, ALPNProtocols: ['http/1.1'], checkServerIdentity: (_h, c) => tls.checkServerIdentity(host, c) });
    up.setNoDelay(true);
    up.on('error', () => {
      up.destroy();
      client.destroy();
    });
    up.once('secureConnect', () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      const t = new tls.TLSSocket(client, { isServer: true, secureContext: serverCtx, ALPNProtocols: ['http/1.1'] });
      t.on('error', () => {
        t.destroy();
        up.destroy();
      });
      t.pipe(up).pipe(t);
      t.once('close', () => up.destroy());
      up.once('close', () => t.destroy());
    });
  };
  client.on('data', onData);
});
server.listen(0, '127.0.0.1', () => console.log(`listening on 127.0.0.1:${server.address().port}`));
process.on('SIGTERM', () => process.exit(0));
