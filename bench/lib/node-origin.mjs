// Fallback HTTPS origin when nginx cannot be installed: the same documents as the nginx
// configuration. Slower than nginx, so the results say which origin served them. It speaks h2 to
// clients that offer it (the h2 phase) and HTTP/1.1 to the others, as nginx's `http2` listen does.
// usage: node node-origin.mjs PORT CERT KEY WWWDIR
import http2 from 'node:http2';
import { createReadStream, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

const [port, cert, key, www] = process.argv.slice(2);
const small = readFileSync(path.join(www, 'small.txt'));
const bulkPath = path.join(www, 'bulk.bin');
const bulkSize = statSync(bulkPath).size;

const server = http2.createSecureServer({ cert: readFileSync(cert), key: readFileSync(key), allowHTTP1: true }, (req, res) => {
  if (req.url === '/small') {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': small.length });
    res.end(small);
  } else if (req.url === '/echo') {
    const seen = Buffer.from(req.headers.authorization ?? '');
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': seen.length });
    res.end(seen);
  } else if (req.url === '/proto') {
    const proto = Buffer.from(`HTTP/${req.httpVersion}`);
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': proto.length });
    res.end(proto);
  } else if (req.url === '/bulk.bin') {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': bulkSize });
    createReadStream(bulkPath, { highWaterMark: 1 << 20 }).pipe(res);
  } else {
    res.writeHead(404, { 'content-length': 0 });
    res.end();
  }
});
// For its HTTP/1.1 connections (allowHTTP1 serves them with Node's HTTP/1.1 server code).
server.keepAliveTimeout = 120_000;
server.listen(Number(port), '127.0.0.1', () => process.stdout.write(`origin listening on 127.0.0.1:${port}\n`));
process.on('SIGTERM', () => process.exit(0));
