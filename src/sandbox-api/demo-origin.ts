import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { ensureCa } from '../certs/ca.js';
import { LeafMinter } from '../certs/leaf.js';

export interface EchoOrigin {
  host: string;
  port: number;
  /** The origin's own CA (PEM): proxies must be told to trust it for upstream TLS. */
  caPem: string;
  close(): Promise<void>;
}

/**
 * A local HTTPS API that answers every request with what it received (method, path, headers) as
 * JSON: the quick start's `demo-api.keygate.test`, showing the header the proxy injected. It has
 * its own CA (in `caDir`, separate from the proxy CA) so it is verified like any real upstream.
 * It listens on loopback only.
 */
export async function startEchoOrigin(opts: { caDir: string; hosts: string[]; host?: string; port?: number }): Promise<EchoOrigin> {
  const ca = await ensureCa(opts.caDir);
  const minter = new LeafMinter(ca, { cacheSize: 16 });
  const allowed = new Set(opts.hosts.map((h) => h.toLowerCase()));
  const fallback = await minter.secureContext(opts.hosts[0]);
  const server = https.createServer(
    {
      SNICallback: (name, cb) => {
        const host = name.toLowerCase();
        if (!allowed.has(host)) return cb(null, fallback);
        minter.secureContext(host).then((ctx) => cb(null, ctx), (err: Error) => cb(err, undefined));
      },
    },
    (req, res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      req.on('data', (c: Buffer) => {
        // A demo echo: keep at most 64 KiB of body, never buffer more.
        if (size < 65536) chunks.push(c);
        size += c.length;
      });
      req.on('end', () => {
        const body = JSON.stringify({ method: req.method, path: req.url, headers: req.headers, body_bytes: size, body: Buffer.concat(chunks).toString('utf8').slice(0, 65536) }, null, 2) + '\n';
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
        res.end(body);
      });
    },
  );
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, opts.host ?? '127.0.0.1', () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    host: addr.address,
    port: addr.port,
    caPem: ca.certPem,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
