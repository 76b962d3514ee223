/**
 * Low-level clients for proxy tests: a raw CONNECT, TLS through a tunnel, and one HTTP request
 * over it with full control of the request line and headers (to send what well-behaved clients
 * never would: a mismatching Host, an absolute URI to another authority, duplicate headers).
 */
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';

export interface ConnectResult {
  status: number;
  /** Response head (status line and headers) of the CONNECT answer. */
  head: string;
  /** Body of a refusal (the proxy closes after it). */
  body: string;
  socket: net.Socket;
}

/** Sends `CONNECT authority` and resolves with the proxy's answer; on 200 the socket is the tunnel. */
export function connectTunnel(proxyPort: number, authority: string, proxyHost = '127.0.0.1'): Promise<ConnectResult> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(proxyPort, proxyHost);
    let buf = Buffer.alloc(0);
    let answered = false;
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      answered = true;
      const head = buf.subarray(0, end).toString('latin1');
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? 0);
      socket.off('data', onData);
      const rest = buf.subarray(end + 4);
      if (status === 200) {
        if (rest.length) socket.unshift(rest);
        resolve({ status, head, body: '', socket });
        return;
      }
      let body = rest.toString('utf8');
      socket.on('data', (more: Buffer) => (body += more.toString('utf8')));
      socket.on('close', () => resolve({ status, head, body, socket }));
    };
    socket.on('data', onData);
    socket.on('error', reject);
    // Closed before any answer head: a failure to see, not a wait forever.
    socket.once('close', () => {
      if (!answered) reject(new Error(`CONNECT ${authority}: the proxy closed the connection without an answer`));
    });
    socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  });
}

/** TLS over an established tunnel, trusting `ca`, checking the certificate for `servername`. */
export function tlsOverTunnel(socket: net.Socket, servername: string, ca: string | string[]): Promise<tls.TLSSocket> {
  return new Promise((resolve, reject) => {
    const t = tls.connect({ socket, servername: net.isIP(servername) ? undefined : servername, ca, ALPNProtocols: ['http/1.1'], checkServerIdentity: (_h, cert) => tls.checkServerIdentity(servername, cert) }, () => resolve(t));
    t.on('error', reject);
  });
}

/** CONNECT host:port through the proxy, then TLS to it trusting `ca`; fails unless the CONNECT got 200. */
export async function interceptedTls(proxyPort: number, host: string, port: number, ca: string | string[]): Promise<tls.TLSSocket> {
  const c = await connectTunnel(proxyPort, `${host}:${port}`);
  if (c.status !== 200) throw new Error(`CONNECT ${host}:${port} answered ${c.status}: ${c.body.slice(0, 200)}`);
  return tlsOverTunnel(c.socket, host, ca);
}

export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  body: string;
}

function dechunk(body: Buffer): Buffer {
  const parts: Buffer[] = [];
  let i = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', i);
    if (eol < 0) break;
    const size = parseInt(body.subarray(i, eol).toString('latin1'), 16);
    if (!size) break;
    parts.push(body.subarray(eol + 2, eol + 2 + size));
    i = eol + 2 + size + 2;
  }
  return Buffer.concat(parts);
}

/**
 * Writes `raw` (a whole request that asks for `Connection: close`) on `socket`, reads until the
 * server closes, and parses the one response (Content-Length or chunked body).
 */
export function rawExchange(socket: net.Socket | tls.TLSSocket, raw: string | Buffer): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    socket.on('data', (d: Buffer) => chunks.push(d));
    socket.on('error', reject);
    socket.on('close', () => {
      const all = Buffer.concat(chunks);
      const end = all.indexOf('\r\n\r\n');
      if (end < 0) return reject(new Error(`no HTTP response: ${all.toString('latin1').slice(0, 200)}`));
      const lines = all.subarray(0, end).toString('latin1').split('\r\n');
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0])?.[1] ?? 0);
      const rawHeaders: string[] = [];
      const headers: http.IncomingHttpHeaders = {};
      for (const line of lines.slice(1)) {
        const c = line.indexOf(':');
        const name = line.slice(0, c);
        const value = line.slice(c + 1).trim();
        rawHeaders.push(name, value);
        const lower = name.toLowerCase();
        const prev = headers[lower];
        headers[lower] = prev === undefined ? value : Array.isArray(prev) ? [...prev, value] : `${prev}, ${value}`;
      }
      let body: Buffer = all.subarray(end + 4);
      if (String(headers['transfer-encoding'] ?? '').toLowerCase().includes('chunked')) body = dechunk(body);
      else if (headers['content-length'] !== undefined) body = body.subarray(0, Number(headers['content-length']));
      resolve({ status, headers, rawHeaders, body: body.toString('utf8') });
    });
    socket.write(raw);
  });
}

/** CONNECT + TLS + one request built from `head` lines. Closes the tunnel afterwards. */
export async function requestThroughTunnel(opts: {
  proxyPort: number;
  authority: string;
  servername: string;
  ca: string | string[];
  requestLine: string;
  headers: [string, string][];
  body?: string;
}): Promise<RawResponse> {
  const c = await connectTunnel(opts.proxyPort, opts.authority);
  if (c.status !== 200) return { status: c.status, headers: {}, rawHeaders: [], body: c.body };
  const t = await tlsOverTunnel(c.socket, opts.servername, opts.ca);
  const body = opts.body ?? '';
  const head = [opts.requestLine, ...opts.headers.map(([k, v]) => `${k}: ${v}`), ...(body ? [`Content-Length: ${Buffer.byteLength(body)}`] : []), 'Connection: close', '', ''].join('\r\n');
  try {
    return await rawExchange(t, head + body);
  } finally {
    t.destroy();
  }
}

/** `b` from `from` on, cut in pieces of `size` bytes. */
export function piecesOf(b: Buffer, from: number, size: number): Buffer[] {
  const out: Buffer[] = [];
  for (let i = from; i < b.length; i += size) out.push(b.subarray(i, i + size));
  return out;
}

/**
 * The same bytes cut the ways that once changed a parser's 414-or-431 answer: in one write, the
 * request line alone then the rest, the request line then 16 KiB pieces, 1000-byte pieces
 * throughout, and (for heads up to 24 KiB) byte by byte.
 */
export function segmentations(raw: string): [string, Buffer[]][] {
  const b = Buffer.from(raw, 'latin1');
  const eol = b.indexOf('\r\n') + 2;
  const pieces = (from: number, size: number) => piecesOf(b, from, size);
  return [
    ['one write', [b]],
    ['request line, then the rest', [b.subarray(0, eol), b.subarray(eol)]],
    ['request line, then 16 KiB pieces', [b.subarray(0, eol), ...pieces(eol, 16384)]],
    ['1000-byte pieces', pieces(0, 1000)],
    ...(b.length <= 24 * 1024 ? [['byte by byte', pieces(0, 1)] as [string, Buffer[]]] : []),
  ];
}

/** Writes `parts` one by one (each its own segment) to 127.0.0.1:`port`; the status of the answer, 0 if none came. */
export function statusAfterPieces(port: number, parts: Buffer[], gapMs = 2): Promise<number> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.setNoDelay(true);
    let out = '';
    const done = () => {
      s.destroy();
      resolve(Number(/^HTTP\/1\.[01] (\d{3})/.exec(out)?.[1] ?? 0));
    };
    s.on('data', (d: Buffer) => {
      out += d.toString('latin1');
      if (out.includes('\r\n\r\n')) done();
    });
    s.on('error', done);
    s.on('close', done);
    s.on('connect', async () => {
      for (const p of parts) {
        if (s.destroyed || out) break;
        s.write(p);
        // Small pieces go out back to back (setImmediate: still one segment each on loopback with no delay).
        await new Promise((r) => (parts.length > 100 ? setImmediate(r) : setTimeout(r, gapMs)));
      }
    });
  });
}
