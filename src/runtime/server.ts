import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { statSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import http from '../node-http.js';
import type { AddressInfo } from 'node:net';
import { createLogger, type Logger } from '../log.js';
import { HttpError, HttpValidationError, loggableMessage } from '../server/errors.js';
import { answerParserErrors, sendError } from '../server/http-errors.js';
import { bodyMissing, checkUrlLength, readJsonBody, sendJson } from '../server/http-json.js';
import { jsonBodyIssues } from '../validation/json.js';
import { findAssistant, type LoadedApp, type LoadedAssistant } from './app.js';
import { createProxyFetch } from './fetch.js';
import { assistantView, graphView, searchAssistants } from './langgraph.js';
import { parseRunRequest, type RunRequest } from './request.js';
import { executeRun, RunCancelledError, type RunOutcome } from './run.js';
import { formatEvent, SseStream } from './sse.js';

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
  /**
   * Bytes of events allowed to queue for a `/runs/stream` client that reads slower than the run
   * produces (default 64 MiB); past it the client is treated as gone (SseStream).
   */
  maxQueuedBytes?: number;
  /** How long a cancelled assistant may take to stop before its run is ended without it. */
  abandonAfterMs?: number;
  logger?: Logger;
  /** The fetch handed to assistants (default: proxy-aware, from the environment at start). */
  fetch?: typeof globalThis.fetch;
  /**
   * Removes secret values (deployment secrets, the API key) from the errors the server reports
   * (a run's `error` event, `/runs/wait`'s `__error__`): their text comes from an exception, which
   * the app did not choose to send. Data events are the app's own output and are left as they
   * are (an app may show a secret it was given on purpose). Pass the same function to the
   * logger (createLogger's `redact`) for its lines.
   */
  redact?: (s: string) => string;
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

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/**
 * Serves one loaded application: `GET /ok` (public), `POST /runs/stream`, `POST /runs/wait`,
 * `GET /assistants`, `POST /assistants/search`, `GET /assistants/{id}` and `.../graph`: the
 * stateless part of the LangGraph Platform API (src/runtime/README.md).
 */
export async function startAppServer(opts: AppServerOptions): Promise<AppServerHandle> {
  const { app } = opts;
  const redact = opts.redact;
  const logger = opts.logger ?? createLogger({ name: 'keygate-app', redact });
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

  // keygate.json's modification time, not this process's start: every replica of a revision
  // reports the same timestamps, so a client load-balanced between them sees one assistant.
  const registeredAt = statSync(app.configFile).mtime.toISOString();
  const views = app.assistants.map((a) => assistantView(a, app, registeredAt));
  const viewOf = (a: LoadedAssistant) => views[app.assistants.indexOf(a)];

  /**
   * Reads a JSON body and refuses, before any schema, what could not be written back as it was
   * sent (jsonBodyIssues): a string that is not Unicode text (as the API server refuses it), a
   * number no double holds (`1e400` would come back as `null`), nesting deeper than the events
   * can be serialised (the stream would die after its status line). `undefined`: no body.
   */
  async function readBody(req: IncomingMessage): Promise<unknown> {
    const body = await readJsonBody(req, { maxBytes: maxBody });
    if (body === undefined) return undefined;
    const issues = jsonBodyIssues(body, ['body']);
    if (issues.length) throw new HttpValidationError(issues);
    return body;
  }

  /** Reads and validates a run request body (`/runs/stream` and `/runs/wait` take the same one). */
  async function readRunRequest(req: IncomingMessage): Promise<{ request: RunRequest; assistant: LoadedAssistant }> {
    const body = await readBody(req);
    if (body === undefined) throw bodyMissing();
    const parsed = parseRunRequest(body);
    if (!parsed.ok) throw new HttpValidationError(parsed.issues);
    const request = parsed.request;
    const assistant = findAssistant(app, request.assistant_id);
    if (!assistant) throw new HttpError(404, `Assistant '${request.assistant_id}' not found.`);
    if (closing) throw new HttpError(503, 'The application is shutting down.');
    return { request, assistant };
  }

  /**
   * Runs one request to its end, cancelling it when the client goes away (unless
   * `on_disconnect: continue`). `open` sends the status line before the first event; `emit`
   * receives every event in order.
   */
  async function run(
    route: '/runs/stream' | '/runs/wait',
    res: ServerResponse,
    request: RunRequest,
    assistant: LoadedAssistant,
    open: (runId: string) => void,
    emit: (event: string, data: unknown) => void,
  ): Promise<{ outcome: RunOutcome; runId: string }> {
    const runId = randomUUID();
    const started = Date.now();
    const controller = new AbortController();
    res.on('close', () => {
      if (res.writableFinished) return;
      if (request.on_disconnect === 'cancel') {
        controller.abort(new RunCancelledError('The client disconnected.'));
      } else {
        logger.info({ run_id: runId }, 'client disconnected; run continues (on_disconnect: continue)');
      }
    });
    open(runId);
    const done = executeRun({
      runId,
      assistant,
      request,
      signal: controller.signal,
      emit,
      fetch: assistantFetch,
      env: process.env,
      logger,
      abandonAfterMs: opts.abandonAfterMs,
      redact,
    });
    const entry: ActiveRun = { controller, done };
    active.add(entry);
    try {
      const outcome = await done;
      logger.info(
        {
          run_id: runId,
          route,
          assistant: assistant.name,
          stream_mode: request.stream_mode,
          on_disconnect: request.on_disconnect,
          outcome,
          client_disconnected: !res.writableFinished && res.destroyed,
          duration_ms: Date.now() - started,
        },
        'run finished',
      );
      return { outcome, runId };
    } finally {
      active.delete(entry);
    }
  }

  /** `POST /runs/stream`: the events as server-sent events (wire.md "Deployed application"). */
  async function handleStream(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { request, assistant } = await readRunRequest(req);
    const sse = new SseStream(res, { heartbeatMs, maxQueuedBytes: opts.maxQueuedBytes });
    await run(
      '/runs/stream',
      res,
      request,
      assistant,
      (runId) => sse.open({ 'Content-Location': `/runs/${runId}` }),
      (event, data) => sse.write(formatEvent(event, data)),
    );
    sse.end();
  }

  /**
   * `POST /runs/wait`: the run's final state as one JSON document, as the production API answers
   * a stateless wait. The status line goes out at once and a newline (JSON whitespace) after every
   * silent `heartbeatMs`, so proxies do not time a long run out; a failed run therefore still
   * answers 200, with `{"__error__": {"error", "message"}}` (the SDK raises it as an Error).
   */
  async function handleWait(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { request, assistant } = await readRunRequest(req);
    let last = 'null';
    let failure: string | undefined;
    let beat: NodeJS.Timeout | undefined;
    const waitRequest: RunRequest = { ...request, stream_mode: ['values'] };
    await run(
      '/runs/wait',
      res,
      waitRequest,
      assistant,
      (runId) => {
        res.socket?.setNoDelay(true);
        res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store', 'Content-Location': `/runs/${runId}` });
        res.flushHeaders();
        beat = setInterval(() => {
          if (!res.destroyed) res.write('\n');
        }, heartbeatMs);
        beat.unref();
      },
      (event, data) => {
        // Serialised now, as the stream does, so state that cannot be serialised fails the run.
        if (event === 'values') last = JSON.stringify(data ?? null);
        else if (event === 'error') failure = JSON.stringify({ __error__: data });
      },
    );
    clearInterval(beat);
    if (!res.destroyed) res.end(failure ?? last);
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    checkUrlLength(req);
    const path = new URL(req.url ?? '/', 'http://localhost').pathname;
    const method = req.method ?? 'GET';
    const allow = (...methods: string[]) => {
      if (!methods.includes(method)) throw new HttpError(405, 'Method Not Allowed', { headers: { Allow: methods.join(', ') } });
    };
    if (path === '/ok') {
      allow('GET', 'HEAD');
      return sendJson(res, 200, { ok: true });
    }
    if (!authorised(req)) throw new HttpError(401, 'Missing or invalid API key (X-Api-Key header).');
    if (path === '/runs/stream') {
      allow('POST');
      return handleStream(req, res);
    }
    if (path === '/runs/wait') {
      allow('POST');
      return handleWait(req, res);
    }
    if (path === '/assistants') {
      allow('GET');
      return sendJson(res, 200, views);
    }
    if (path === '/assistants/search') {
      allow('POST');
      // No body is an empty query: the production SDKs always send one, curl users may not.
      const found = searchAssistants(views, (await readBody(req)) ?? {});
      if (!found.ok) throw new HttpValidationError(found.issues);
      return sendJson(res, 200, found.items, found.next !== null ? { 'X-Pagination-Next': String(found.next) } : {});
    }
    const m = /^\/assistants\/([^/]+)(\/graph)?$/.exec(path);
    if (m) {
      allow('GET');
      let idOrName: string;
      try {
        idOrName = decodeURIComponent(m[1]);
      } catch {
        throw new HttpError(404, 'Assistant not found.');
      }
      const a = findAssistant(app, idOrName);
      if (!a) throw new HttpError(404, `Assistant '${idOrName}' not found.`);
      return sendJson(res, 200, m[2] ? graphView(a) : viewOf(a));
    }
    throw new HttpError(404, 'Not Found');
  }

  const server = http.createServer({ noDelay: true, keepAliveTimeout: 5000 }, (req, res) => {
    const started = Date.now();
    route(req, res)
      .catch((err: unknown) => {
        if (sendError(req, res, err).internal) logger.error({ err: { name: (err as Error)?.name, message: loggableMessage(err) } }, 'request failed');
      })
      .finally(() => {
        const path = new URL(req.url ?? '/', 'http://localhost').pathname;
        if ((path === '/runs/stream' || path === '/runs/wait') && res.statusCode === 200) return; // logged as "run finished"
        logger[path === '/ok' ? 'debug' : 'info']({ method: req.method, path, status: res.statusCode, duration_ms: Date.now() - started }, 'request');
      });
  });
  answerParserErrors(server);
  // A client may end its sending side once its request is sent and still read the answer (RFC
  // 9112 9.6; `printf ... | nc -N`). Node's server, by default, takes that end for a disconnect:
  // it ends the connection, so the stream stopped after an event and the run was cancelled. The
  // answer is written instead, and the connection closes after it. A client that really left is
  // still seen: the next event or heartbeat written to it fails, and its run is cancelled then.
  (server as typeof server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;

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
