import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createLogger, type Logger } from '../log.js';
import type { ValidationIssue } from '../validation/errors.js';
import { findAssistant, type LoadedApp, type LoadedAssistant } from './app.js';
import { createProxyFetch } from './fetch.js';
import { parseRunRequest } from './request.js';
import { executeRun, RunCancelledError, type RunOutcome } from './run.js';
import { formatEvent, SseStream } from './sse.js';
import { jsonErrorLocation } from '../validation/json.js';

export interface AppServerOptions {
  app: LoadedApp;
  host: string;
  /** 0 picks a free port; the handle reports the real one. */
  port: number;
  /** When set, every route but `GET /ok` requires `X-Api-Key` with this value. */
  apiKey?: string;
  /** Silence after which a `: heartbeat` comment is sent (default 4000 ms, within the 5 s promise). */
  heartbeatMs?: number;
  /** Largest accepted request body (default 10 MiB). */
  maxBodyBytes?: number;
  /** How long a cancelled assistant may take to stop before its run is ended without it. */
  abandonAfterMs?: number;
  logger?: Logger;
  /** The fetch handed to assistants (default: proxy-aware, from the environment at start). */
  fetch?: typeof globalThis.fetch;
}

export interface AppServerHandle {
  readonly host: string;
  readonly port: number;
  /** `http://host:port` */
  readonly url: string;
  /** Runs whose stream has not ended yet. */
  activeRuns(): number;
  /**
   * Stops accepting connections, lets running runs finish for up to `graceMs` (default 10 s),
   * cancels what is left (their clients get `error` CancelledError, then `end`), then closes every
   * connection. Idempotent.
   */
  close(graceMs?: number): Promise<void>;
}

interface ActiveRun {
  controller: AbortController;
  done: Promise<RunOutcome>;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
    readonly headers: Record<string, string> = {},
  ) {
    super(typeof body === 'object' && body && 'detail' in body ? String((body as { detail: unknown }).detail) : 'error');
  }
}

const detail = (status: number, sentence: string, headers?: Record<string, string>) => new HttpError(status, { detail: sentence }, headers);
const invalid = (issues: ValidationIssue[]) => new HttpError(422, { detail: issues });

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': String(Buffer.byteLength(text)),
    'Cache-Control': 'no-store',
    ...headers,
  });
  res.end(text);
}

function assistantView(a: LoadedAssistant, app: LoadedApp) {
  return { assistant_id: a.id, id: a.id, name: a.name, graph_id: a.name, description: a.description, app: app.name };
}

/** Reads a body up to `max` bytes; refuses larger ones without reading them. */
async function readBody(req: IncomingMessage, max: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > max) {
    throw detail(413, `Request body too large (limit ${max} bytes).`, { Connection: 'close' });
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > max) throw detail(413, `Request body too large (limit ${max} bytes).`, { Connection: 'close' });
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

function isJsonContentType(value: string | undefined): boolean {
  if (value === undefined) return true;
  const type = value.split(';')[0].trim().toLowerCase();
  return type === 'application/json' || /^application\/[a-z0-9.+-]+\+json$/.test(type);
}

/** Serves one loaded application: `GET /ok`, `GET /assistants[/{id}]`, `POST /runs/stream`. */
export async function startAppServer(opts: AppServerOptions): Promise<AppServerHandle> {
  const { app } = opts;
  const logger = opts.logger ?? createLogger({ name: 'keygate-app' });
  const heartbeatMs = opts.heartbeatMs ?? 4000;
  const maxBody = opts.maxBodyBytes ?? 10 * 1024 * 1024;
  const assistantFetch = opts.fetch ?? createProxyFetch();
  const keyDigest = opts.apiKey !== undefined ? digest(opts.apiKey) : undefined;
  const active = new Set<ActiveRun>();
  let closing = false;

  const authorised = (req: IncomingMessage): boolean => {
    if (!keyDigest) return true;
    // Node lower-cases header names, so X-Api-Key, x-api-key and X-API-KEY are the same header.
    const given = req.headers['x-api-key'];
    if (typeof given !== 'string') return false;
    // Comparing fixed-length digests keeps the comparison constant-time whatever the length.
    return timingSafeEqual(digest(given), keyDigest);
  };

  async function handleRun(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!isJsonContentType(req.headers['content-type'])) {
      throw detail(415, 'Content-Type must be application/json.');
    }
    const raw = await readBody(req, maxBody);
    let body: unknown;
    if (raw.length === 0) throw invalid([{ loc: ['body'], msg: 'Field required', type: 'missing' }]);
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch (err) {
      throw invalid([{ loc: ['body'], msg: `JSON decode error at ${jsonErrorLocation(raw.toString('utf8'), err)}`, type: 'json_invalid' }]);
    }
    const parsed = parseRunRequest(body);
    if (!parsed.ok) throw invalid(parsed.issues);
    const request = parsed.request;
    const assistant = findAssistant(app, request.assistant_id);
    if (!assistant) throw detail(404, `Assistant '${request.assistant_id}' not found.`);
    if (closing) throw detail(503, 'The application is shutting down.');

    const runId = randomUUID();
    const started = Date.now();
    const controller = new AbortController();
    const sse = new SseStream(res, { heartbeatMs });
    res.on('close', () => {
      if (res.writableFinished) return;
      if (request.on_disconnect === 'cancel') {
        controller.abort(new RunCancelledError('The client disconnected.'));
      } else {
        logger.info({ run_id: runId }, 'client disconnected; run continues (on_disconnect: continue)');
      }
    });
    sse.open({ 'Content-Location': `/runs/${runId}` });

    const done = executeRun({
      runId,
      assistant,
      request,
      signal: controller.signal,
      emit: (event, data) => sse.write(formatEvent(event, data)),
      fetch: assistantFetch,
      env: process.env,
      logger,
      abandonAfterMs: opts.abandonAfterMs,
    });
    const run: ActiveRun = { controller, done };
    active.add(run);
    try {
      const outcome = await done;
      sse.end();
      logger.info(
        {
          run_id: runId,
          assistant: assistant.name,
          stream_mode: request.stream_mode,
          on_disconnect: request.on_disconnect,
          outcome,
          client_disconnected: sse.disconnected,
          duration_ms: Date.now() - started,
        },
        'run finished',
      );
    } finally {
      active.delete(run);
    }
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? '/', 'http://localhost').pathname;
    const method = req.method ?? 'GET';
    if (path === '/ok') {
      if (method !== 'GET' && method !== 'HEAD') throw detail(405, 'Method Not Allowed', { Allow: 'GET, HEAD' });
      return sendJson(res, 200, { ok: true });
    }
    if (!authorised(req)) throw detail(401, 'Missing or invalid API key (X-Api-Key header).');
    if (path === '/runs/stream') {
      if (method !== 'POST') throw detail(405, 'Method Not Allowed', { Allow: 'POST' });
      return handleRun(req, res);
    }
    if (path === '/assistants') {
      if (method !== 'GET') throw detail(405, 'Method Not Allowed', { Allow: 'GET' });
      return sendJson(res, 200, app.assistants.map((a) => assistantView(a, app)));
    }
    const m = /^\/assistants\/([^/]+)$/.exec(path);
    if (m) {
      if (method !== 'GET') throw detail(405, 'Method Not Allowed', { Allow: 'GET' });
      let idOrName: string;
      try {
        idOrName = decodeURIComponent(m[1]);
      } catch {
        throw detail(404, 'Assistant not found.');
      }
      const a = findAssistant(app, idOrName);
      if (!a) throw detail(404, `Assistant '${idOrName}' not found.`);
      return sendJson(res, 200, assistantView(a, app));
    }
    throw detail(404, 'Not Found');
  }

  const server = http.createServer({ noDelay: true, keepAliveTimeout: 5000 }, (req, res) => {
    const started = Date.now();
    route(req, res)
      .catch((err: unknown) => {
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (err instanceof HttpError) {
          sendJson(res, err.status, err.body, err.headers);
          // A refused body that was not read must not be read as the next request.
          if (err.headers.Connection === 'close') req.destroy();
          return;
        }
        logger.error({ err: { name: (err as Error)?.name, message: (err as Error)?.message } }, 'request failed');
        sendJson(res, 500, { detail: 'Internal server error.' });
      })
      .finally(() => {
        const path = new URL(req.url ?? '/', 'http://localhost').pathname;
        if (path === '/runs/stream' && res.statusCode === 200) return; // logged as "run finished"
        logger[path === '/ok' ? 'debug' : 'info']({ method: req.method, path, status: res.statusCode, duration_ms: Date.now() - started }, 'request');
      });
  });
  server.on('clientError', (_err, socket) => {
    if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const hostForUrl = address.family === 'IPv6' ? `[${address.address}]` : address.address;

  let closed: Promise<void> | undefined;
  return {
    host: address.address,
    port: address.port,
    url: `http://${hostForUrl}:${address.port}`,
    activeRuns: () => active.size,
    close(graceMs = 10_000) {
      closed ??= (async () => {
        closing = true;
        const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeIdleConnections();
        const deadline = Date.now() + graceMs;
        while (active.size > 0 && Date.now() < deadline) {
          await Promise.race([Promise.allSettled([...active].map((r) => r.done)), delay(Math.min(100, Math.max(1, deadline - Date.now())))]);
        }
        if (active.size > 0) {
          logger.warn({ runs: active.size }, 'grace period over: cancelling running runs');
          for (const r of active) r.controller.abort(new RunCancelledError('The application is shutting down.'));
          await Promise.allSettled([...active].map((r) => r.done));
        }
        // Give the final frames a moment to reach the socket, then drop whatever is still open.
        await delay(20);
        server.closeAllConnections();
        await serverClosed;
      })();
      return closed;
    },
  };
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
