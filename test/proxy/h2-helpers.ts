/**
 * HTTP/2 clients through a real keygate proxy: CONNECT, TLS with ALPN, then Node's http2 client
 * on that socket (it sends what a well-behaved client sends; hostile frames are built by hand in
 * the tests that need them).
 */
import http2, { type ClientHttp2Session, type IncomingHttpHeaders, type OutgoingHttpHeaders } from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import { connectTunnel } from '../helpers/connect.js';

/** CONNECT host:port, then TLS offering `alpn` (both protocols by default). */
export async function tunnelTls(proxyPort: number, host: string, port: number, ca: string | string[], alpn = ['h2', 'http/1.1']): Promise<tls.TLSSocket> {
  const c = await connectTunnel(proxyPort, `${host}:${port}`);
  if (c.status !== 200) throw new Error(`CONNECT ${host}:${port} answered ${c.status}`);
  return new Promise((resolve, reject) => {
    const t = tls.connect({ socket: c.socket, servername: net.isIP(host) ? undefined : host, ca, ALPNProtocols: alpn }, () => resolve(t));
    t.once('error', (err) => {
      // As a real client does when the handshake fails: the connection closes (a TLS socket over
      // a given socket would leave that one open).
      c.socket.destroy();
      reject(err);
    });
  });
}

/** An HTTP/2 session to https://host:port through the proxy (fails unless h2 was negotiated). */
export async function h2Through(proxyPort: number, host: string, port: number, ca: string | string[], opts: http2.ClientSessionOptions = {}): Promise<ClientHttp2Session> {
  const t = await tunnelTls(proxyPort, host, port, ca);
  if (t.alpnProtocol !== 'h2') throw new Error(`ALPN chose ${String(t.alpnProtocol)}, not h2`);
  const s = http2.connect(`https://${host}:${port}`, { ...opts, createConnection: () => t });
  s.on('error', () => undefined);
  return s;
}

export interface H2Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
  trailers: IncomingHttpHeaders;
  /** The RST_STREAM code if the stream was reset, else 0. */
  rstCode: number;
}

/** One request on a session; `body` chunks are written one by one (a stream, not one buffer). */
export function h2Request(s: ClientHttp2Session, headers: OutgoingHttpHeaders, body?: (string | Buffer)[]): Promise<H2Answer> {
  return new Promise((resolve) => {
    const req = s.request(headers, { endStream: body === undefined });
    const out: H2Answer = { status: 0, headers: {}, body: '', trailers: {}, rstCode: 0 };
    req.on('response', (h) => {
      out.headers = h;
      out.status = Number(h[':status']);
    });
    req.on('trailers', (t) => (out.trailers = t));
    req.setEncoding('utf8');
    req.on('data', (d: string) => (out.body += d));
    req.on('error', () => undefined);
    req.on('close', () => {
      out.rstCode = req.rstCode ?? 0;
      resolve(out);
    });
    if (body) {
      for (const chunk of body) req.write(chunk);
      req.end();
    }
  });
}
