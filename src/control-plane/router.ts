import type * as Http from 'node:http';
import http from '../node-http.js';
import type { AddressInfo } from 'node:net';
import type { Readable } from 'node:stream';
import type { Logger } from '../log.js';
import { filterResponseHeaderObject, upstreamRequestHeaders } from '../proxy/headers.js';
import { errorResponse, HttpError } from '../server/errors.js';
import { answerParserErrors, writeErrorResponse } from '../server/http-errors.js';
import type { ReplicaSet, Slot } from './supervisor.js';

/** Bodies up to this size are held so a request refused by a dying replica can go to another. */
const RETRYABLE_BODY = 1024 * 1024;
const CONNECT_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED', 'UND_ERR_DESTROYED', 'EPIPE']);

/** What an API key is to a deployment: one of its workspace's, another workspace's, or none. */
export type KeyVerdict = 'ok' | 'other-workspace' | 'unknown';

export interface FrontRouterOptions {
  deploymentId: string;
  authenticate(key: string): Promise<KeyVerdict>;
  logger: Logger;
  host: string;
}

function send(res: Http.ServerResponse, status: number, detail: string, headers: Record<string, string> = {}): void {
  writeErrorResponse(res, errorResponse(new HttpError(status, detail, { code: `router_${status}`, headers })));
}

/** Headers the router sets itself; a client's copies never reach the app. */
const OWN_HEADERS = new Set(['x-api-key', 'content-length', 'x-forwarded-for', 'x-forwarded-proto']);

/**
 * The header list sent to a replica, flat `[name, value, ...]`: the proxy's filter (hop-by-hop
 * headers, those named in `Connection`, `Host` and `Expect` removed; the router has already answered
 * `100 Continue` to the client), then the router's own: the app's key instead of the caller's,
 * the body's length when known, and where the request came from. Pure.
 */
export function appRequestHeaders(rawHeaders: string[], own: { apiKey: string; contentLength?: number; remoteAddress: string }): string[] {
  const kept = upstreamRequestHeaders(rawHeaders);
  const out: string[] = [];
  for (let i = 0; i < kept.length; i += 2) {
    if (!OWN_HEADERS.has(kept[i].toLowerCase())) out.push(kept[i], kept[i + 1]);
  }
  out.push('x-api-key', own.apiKey, 'x-forwarded-for', own.remoteAddress, 'x-forwarded-proto', 'http');
  if (own.contentLength !== undefined) out.push('content-length', String(own.contentLength));
  return out;
}

/** `GET /ok` of an app is public (`app serve` documents it so): health checks need no key. */
function isPublic(req: Http.IncomingMessage): boolean {
  if (req.method !== 'GET' && req.method !== 'HEAD') return false;
  const url = req.url ?? '';
  return url === '/ok' || url.startsWith('/ok?');
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
  private readonly server: Http.Server;
  port = 0;

  constructor(private readonly o: FrontRouterOptions) {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    // `Expect: 100-continue`: Node would send the 100 at once, so a caller refused below (no key,
    // a wrong one, nothing deployed) was told to send a body only to have it dropped. The 100 is
    // sent once the request is accepted (handle); Node closes the connection after a final answer
    // that came without it, since the caller may or may not send the body then.
    this.server.on('checkContinue', (req: Http.IncomingMessage, res: Http.ServerResponse) => void this.handle(req, res, true));
    answerParserErrors(this.server);
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

  private async handle(req: Http.IncomingMessage, res: Http.ServerResponse, continueOwed = false): Promise<void> {
    res.socket?.setNoDelay(true);
    if (!isPublic(req)) {
      const rawKey = req.headers['x-api-key'];
      const key = (Array.isArray(rawKey) ? rawKey[0] : rawKey)?.trim();
      if (!key) return send(res, 401, 'Missing credentials: send an API key in the X-Api-Key header.');
      let verdict: KeyVerdict;
      try {
        verdict = await this.o.authenticate(key);
      } catch {
        return send(res, 503, 'Deployment is not ready (credential check failed).');
      }
      if (verdict === 'unknown') return send(res, 401, 'Invalid API key.');
      if (verdict === 'other-workspace') return send(res, 403, 'This API key belongs to another workspace than the deployment.');
    }

    const set = this.active;
    if (!set) return send(res, 503, 'No revision of this deployment is deployed yet.', { 'retry-after': '2' });

    const controller = new AbortController();
    const abort = () => controller.abort();
    res.once('close', () => {
      if (!res.writableFinished) abort();
    });

    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    if (continueOwed) res.writeContinue();
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
    // The caller's key stays here: the app sees only the key this router holds for it.
    const headers = appRequestHeaders(req.rawHeaders, {
      apiKey: set.o.spec.apiKey,
      contentLength: Buffer.isBuffer(body) ? body.length : body && Number.isFinite(len) ? len : undefined,
      remoteAddress: req.socket.remoteAddress ?? '',
    });

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
        // The app's answer, 4xx included, goes back as it is, minus its hop-by-hop headers.
        res.writeHead(up.statusCode, filterResponseHeaderObject(up.headers));
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
