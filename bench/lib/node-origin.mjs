// Fallback HTTPS origin when nginx cannot be installed: the same three documents as the nginx
// configuration. Slower than nginx, so the results say which origin served them.
// usage: node node-origin.mjs PORT CERT KEY WWWDIR
import https from 'node:https';
import { createReadStream, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

const [port, cert, key, www] = process.argv.slice(2);
const small = readFileSync(path.join(www, 'small.txt'));
const bulkPath = path.join(www, 'bulk.bin');
const bulkSize = statSync(bulkPath).size;

const server = https.createServer({ cert: readFileSync(cert), key: readFileSync(key), keepAliveTimeout: 120_000 }, (req, res) => {
  if (req.url === '/small') {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': small.length });
    res.end(small);
  } else if (req.url === '/echo') {
    const seen = Buffer.from(req.headers.authorization ?? '');
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': seen.length });
    res.end(seen);
  } else if (req.url === '/bulk.bin') {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': bulkSize });
    createReadStream(bulkPath, { highWaterMark: 1 << 20 }).pipe(res);
  } else {
    res.writeHead(404, { 'content-length': 0 });
    res.end();
  }
});
server.listen(Number(port), '127.0.0.1', () => process.stdout.write(`origin listening on 127.0.0.1:${port}\n`));
process.on('SIGTERM', () => process.exit(0));
