import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { chmodSync, existsSync, readFileSync, unlinkSync, lstatSync } from '../builtins/fs.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import http from '../node-http.js';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import type { Logger } from '../log.js';
import { createFileExclusive } from '../secrets/envelope.js';
import { HttpError, HttpValidationError, loggableMessage } from '../server/errors.js';
import { answerParserErrors, sendError } from '../server/http-errors.js';
import { bodyMissing, checkUrlLength, readJsonBody, sendJson } from '../server/http-json.js';
import { unicodeIssues } from '../validation/json.js';
import { ValidationFailure } from '../validation/errors.js';
import { ConfigApplyError, parseConfigPush, type ConfigHolder } from './config-holder.js';
import { METRICS_CONTENT_TYPE, type ProxyMetrics } from './metrics.js';

/**
 * The proxy's admin listener: a separate address (TCP or a unix socket, never the proxy port)
 * where the platform pushes configuration and reads health and metrics. Every endpoint requires
 * `Authorization: Bearer <token>`.
 *
 *   PUT /config    apply a proxy_config (or {proxy_config, secrets}); 422 keeps the old one
 *   GET /config    the configuration in force, opaque values omitted, secrets as {KEY} templates
 *   GET /healthz   the process is alive
 *   GET /readyz    listening and a configuration applied (503 otherwise)
 *   GET /metrics   Prometheus text exposition
 */

export type AdminListen = { host: string; port: number } | { path: string };

export interface AdminOptions {
  listen: AdminListen;
  token: string;
  holder: ConfigHolder;
  metrics: ProxyMetrics;
  /** The proxy's handle: its port is refused as an admin target and the admin address is denied through it. */
  proxy?: { denyTarget?(authority: string): void };
  logger?: Logger;
  /** Largest accepted request body (default 1 MiB). */
  maxBodyBytes?: number;
}

export interface AdminHandle {
  /** `http://host:port`, or `unix:/path`. */
  url: string;
  host?: string;
  port?: number;
  path?: string;
  close(): Promise<void>;
}

export const ADMIN_TOKEN_FILE = 'admin.token';

/** `KEYGATE_ADMIN_TOKEN`, else `<data>/admin.token` (created 0600 with 32 random bytes on first use). */
export function resolveAdminToken(dataDir: string, env: NodeJS.ProcessEnv = process.env): { token: string; source: 'env' | 'file'; file?: string } {
  const fromEnv = env.KEYGATE_ADMIN_TOKEN?.trim();
  if (fromEnv) {
    if (fromEnv.length < 16) throw new Error('KEYGATE_ADMIN_TOKEN is too short (use at least 16 characters, e.g. `openssl rand -base64 32`)');
    return { token: fromEnv, source: 'env' };
  }
  const file = path.join(dataDir, ADMIN_TOKEN_FILE);
  if (!existsSync(file)) createFileExclusive(file, randomBytes(32).toString('base64url') + '\n', 0o600);
  const token = readFileSync(file, 'utf8').trim();
  if (token.length < 16) throw new Error(`${file} holds no usable token (empty or too short); delete it to generate a new one`);
  return { token, source: 'file', file };
}

const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/** Constant-time: both sides hashed to the same length first, so neither length nor content leaks. */
function tokenMatches(header: string | undefined, expected: Buffer): boolean {
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header ?? '');
  return timingSafeEqual(digest(m ? m[1] : ''), expected) && m !== null;
}

export async function startAdmin(opts: AdminOptions): Promise<AdminHandle> {
  const expected = digest(opts.token);
  const maxBody = opts.maxBodyBytes ?? 1024 * 1024;
  const { holder, metrics, logger } = opts;
  let listening = false;

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    checkUrlLength(req);
    const url = new URL(req.url ?? '/', 'http://admin.invalid');
    // Answer 401 before looking at the path, so an unauthenticated caller learns nothing.
    if (!tokenMatches(req.headers.authorization, expected)) {
      logger?.warn({ method: req.method, path: url.pathname, reason: req.headers.authorization ? 'wrong token' : 'no token' }, 'admin request refused');
      throw new HttpError(401, 'Missing or invalid admin credentials: send Authorization: Bearer <admin token>.', { headers: { 'www-authenticate': 'Bearer realm="keygate-admin"' } });
    }
    const route = `${req.method} ${url.pathname}`;
    switch (route) {
      case 'GET /healthz':
        return sendJson(res, 200, { status: 'ok' });
      case 'GET /readyz':
        if (!listening) throw new HttpError(503, 'The proxy is not listening.');
        if (holder.generation === 0) throw new HttpError(503, 'No configuration has been applied yet.');
        return sendJson(res, 200, { status: 'ready', generation: holder.generation });
      case 'GET /metrics': {
        const text = metrics.render();
        res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPE, 'content-length': Buffer.byteLength(text), 'cache-control': 'no-store' });
        res.end(text);
        return;
      }
      case 'GET /config': {
        const current = holder.current();
        if (!current) throw new HttpError(404, 'No configuration has been applied yet.');
        return sendJson(res, 200, current);
      }
      case 'PUT /config': {
        const body = await readJsonBody(req, { maxBytes: maxBody, tooLarge: `The configuration is larger than ${maxBody} bytes.` });
        if (body === undefined) throw bodyMissing();
        // A lone surrogate would reach a log line or the wire as U+FFFD: not what the operator set.
        const notText = unicodeIssues(body, ['body']);
        if (notText.length) throw new HttpValidationError(notText);
        try {
          const push = parseConfigPush(body);
          const applied = await holder.apply(push.config, { source: 'push', secrets: push.secrets, locPrefix: push.locPrefix });
          return sendJson(res, 200, { applied: true, generation: applied.generation });
        } catch (err) {
          if (err instanceof ValidationFailure) throw new HttpValidationError(err.issues);
          if (err instanceof ConfigApplyError) throw new HttpError(503, err.message);
          throw err;
        }
      }
      default: {
        const known = ['/healthz', '/readyz', '/metrics', '/config'];
        if (known.includes(url.pathname)) throw new HttpError(405, `Method ${req.method} is not allowed on ${url.pathname}.`);
        throw new HttpError(404, 'Not found.');
      }
    }
  }

  const server = http.createServer({ requestTimeout: 30_000, headersTimeout: 10_000 }, (req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (sendError(req, res, err).internal) logger?.error({ err: { name: (err as Error).name, message: loggableMessage(err) } }, 'admin request failed');
    });
  });
  // Node's own parser refusals (431, 414, 400, 408) in the same JSON shape as everything else.
  answerParserErrors(server);
  server.keepAliveTimeout = 5_000;

  const l = opts.listen;
  if ('path' in l) {
    // A stale socket file from a crash would make listen fail with EADDRINUSE.
    if (existsSync(l.path) && lstatSync(l.path).isSocket()) unlinkSync(l.path);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      // Created 0600 from the start (umask), not chmod-ed after a window where others could connect.
      const old = process.umask(0o177);
      try {
        server.listen(l.path, () => resolve());
      } finally {
        process.umask(old);
      }
    });
    chmodSync(l.path, 0o600);
  } else {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(l.port, l.host, () => resolve());
    });
  }
  listening = true;
  const addr = server.address();
  const handle_: AdminHandle =
    typeof addr === 'string' || addr === null
      ? { url: `unix:${'path' in l ? l.path : String(addr)}`, path: 'path' in l ? l.path : String(addr), close: () => Promise.resolve() }
      : (() => {
          const a = addr as AddressInfo;
          const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
          return { url: `http://${host}:${a.port}`, host: a.address, port: a.port, close: () => Promise.resolve() };
        })();

  // The admin address must never be reachable through the proxy port.
  if (handle_.port !== undefined && opts.proxy?.denyTarget) {
    const wildcard = handle_.host === '0.0.0.0' || handle_.host === '::';
    const loopback = wildcard || handle_.host === '127.0.0.1' || handle_.host === '::1';
    const hosts = new Set([handle_.host!, ...(loopback ? ['127.0.0.1', 'localhost', '::1'] : [])]);
    for (const h of hosts) opts.proxy.denyTarget(h.includes(':') ? `[${h}]:${handle_.port}` : `${h}:${handle_.port}`);
  }

  let closed: Promise<void> | undefined;
  handle_.close = () =>
    (closed ??= new Promise<void>((resolve) => {
      listening = false;
      server.close(() => resolve());
      server.closeIdleConnections();
    }));
  return handle_;
}
