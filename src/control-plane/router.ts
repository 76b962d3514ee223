import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Readable } from 'node:stream';
import type { Logger } from '../log.js';
import type { ReplicaSet, Slot } from './supervisor.js';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'proxy-authorization', 'proxy-authenticate', 'host', 'content-length']);
/** Bodies up to this size are held so a request refused by a dying replica can go to another. */
const RETRYABLE_BODY = 1024 * 1024;
const CONNECT_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED', 'UND_ERR_DESTROYED', 'EPIPE']);

export interface FrontRouterOptions {
  deploymentId: string;
  /** True when `key` is an API key of the deployment's workspace. */
  authenticate(key: string): Promise<boolean>;
  logger: Logger;
  host: string;
}

function send(res: http.ServerResponse, status: number, detail: string, extra: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify({ detail });
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

function errCode(err: unknown): string {
  const e = err as { code?: string; cause?: { code?: string } };
  return e?.code ?? e?.cause?.code ?? '';
}

/**
 * The stable address of one deployment: a small reverse proxy on its own loopback port that sends
 * each request to a healthy replica of the active revision (round robin), streaming both ways (SSE
 * passes through unbuffered; a client going away aborts the upstream request). Switching revisions
 * swaps one reference: requests that started keep their replica, new ones go to the new set.
 */
export class FrontRouter {
  private active: ReplicaSet | null = null;
  private readonly server: http.Server;
  port = 0;

  constructor(private readonly o: FrontRouterOptions) {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    this.server.keepAliveTimeout = 5000;
    this.server.headersTimeout = 30_000;
    this.server.requestTimeout = 0; // runs stream for as long as they last
  }

  get url(): string {
    return `http://${this.o.host}:${this.port}`;
  }

  /** Listens on `preferred` when it is free (same URL across restarts), else on a new port. */
  async listen(preferred: number | null): Promise<number> {
    const attempt = (port: number) =>
      new Promise<void>((resolve, reject) => {
        const onErr = (e: Error) => reject(e);
        this.server.once('error', onErr);
        this.server.listen({ host: this.o.host, port, exclusive: true }, () => {
          this.server.off('error', onErr);
          resolve();
        });
      });
    try {
      if (!preferred) throw new Error('no port yet');
      await attempt(preferred);
    } catch {
      await attempt(0);
    }
    this.port = (this.server.address() as AddressInfo).port;
    return this.port;
  }

  setActive(set: ReplicaSet | null): ReplicaSet | null {
    const old = this.active;
    this.active = set;
    return old;
  }

  get activeSet(): ReplicaSet | null {
    return this.active;
  }

  async close(): Promise<void> {
    this.active = null;
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    res.socket?.setNoDelay(true);
    const rawKey = req.headers['x-api-key'];
    const key = (Array.isArray(rawKey) ? rawKey[0] : rawKey)?.trim();
    if (!key) return send(res, 401, 'Missing credentials: send an API key in the X-Api-Key header.');
    let ok = false;
    try {
      ok = await this.o.authenticate(key);
    } catch {
      return send(res, 503, 'Deployment is not ready (credential check failed).');
    }
    if (!ok) return send(res, 401, 'Invalid API key.');

    const set = this.active;
    if (!set) return send(res, 503, 'No revision of this deployment is deployed yet.', { 'retry-after': '2' });

    const controller = new AbortController();
    const abort = () => controller.abort();
    res.once('close', () => {
      if (!res.writableFinished) abort();
    });

    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (v === undefined || HOP_BY_HOP.has(k) || k === 'x-api-key') continue;
      headers[k] = v;
    }
    // The caller's key stays here: the app sees only the key this router holds for it.
    headers['x-api-key'] = set.o.spec.apiKey;
    headers['x-forwarded-for'] = req.socket.remoteAddress ?? '';
    headers['x-forwarded-proto'] = 'http';

    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    const len = Number(req.headers['content-length'] ?? NaN);
    let body: Buffer | Readable | null = null;
    let retryable = true;
    if (hasBody) {
      if (Number.isFinite(len) && len <= RETRYABLE_BODY) {
        const chunks: Buffer[] = [];
        try {
          for await (const c of req) chunks.push(c as Buffer);
        } catch {
          return;
        }
        body = Buffer.concat(chunks);
      } else if (req.headers['transfer-encoding'] || Number.isFinite(len)) {
        body = req;
        retryable = false;
      }
    }
    if (body && Buffer.isBuffer(body)) headers['content-length'] = String(body.length);
    else if (body && Number.isFinite(len)) headers['content-length'] = String(len);

    const tried = new Set<Slot>();
    for (let attempt = 0; attempt < 4; attempt++) {
      const slot = set.pick(tried);
      if (!slot || !slot.pool) {
        return send(res, 503, 'No healthy replica is available right now; retry shortly.', { 'retry-after': '1' });
      }
      tried.add(slot);
      set.enter(slot);
      try {
        const up = await slot.pool.request({
          path: req.url ?? '/',
          method: (req.method ?? 'GET') as 'GET',
          headers,
          body,
          signal: controller.signal,
          headersTimeout: 300_000,
          bodyTimeout: 0,
        });
        const outHeaders: Record<string, string | string[]> = {};
        for (const [k, v] of Object.entries(up.headers)) {
          if (v === undefined || HOP_BY_HOP.has(k)) continue;
          outHeaders[k] = v;
        }
        if (up.headers['content-length'] !== undefined) outHeaders['content-length'] = up.headers['content-length'] as string;
        res.writeHead(up.statusCode, outHeaders);
        res.flushHeaders();
        try {
          for await (const chunk of up.body) {
            if (!res.write(chunk)) await new Promise<void>((r) => res.once('drain', r).once('close', r));
            if (res.destroyed) break;
          }
          res.end();
        } catch {
          // Upstream died or the client left mid-stream: the client sees a cut stream, not a lie.
          res.destroy();
        } finally {
          up.body.destroy();
        }
        return;
      } catch (err) {
        if (controller.signal.aborted) return;
        const code = errCode(err);
        if (retryable && CONNECT_ERRORS.has(code)) {
          // The replica is going away; its exit event takes it out of rotation. Try another.
          await new Promise((r) => setTimeout(r, 50 * (attempt + 1)));
          tried.clear();
          tried.add(slot);
          continue;
        }
        this.o.logger.warn({ deployment_id: this.o.deploymentId, code }, 'upstream request failed');
        return send(res, 502, 'The application did not answer.');
      } finally {
        set.leave(slot);
      }
    }
    send(res, 502, 'The application did not answer.');
  }
}
