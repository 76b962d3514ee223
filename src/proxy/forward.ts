import type { IncomingMessage, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream';
import type { Readable } from 'node:stream';
import type { CompiledRule, Decision } from '../rules/compile.js';
import { formatAuthority } from '../rules/host.js';
import type { ProxyCore, RequestRecord } from './context.js';
import { sendError, upstreamError, type ProxyError } from './errors.js';
import { downstreamResponseHeaders, upstreamRequestHeaders } from './headers.js';

export interface ForwardTarget {
  scheme: 'https' | 'http';
  host: string;
  port: number;
  /** Path and query exactly as they go upstream. */
  pathAndQuery: string;
  /** Path for the log (no query: it can hold tokens). */
  logPath: string;
  decision: Decision;
  rule?: CompiledRule;
  client: string;
}

export function newRecord(req: IncomingMessage, t: Pick<ForwardTarget, 'client' | 'host' | 'port' | 'decision'>, path: string): RequestRecord {
  return {
    type: 'request',
    client: t.client,
    method: req.method ?? '',
    host: t.host,
    port: t.port,
    path,
    decision: t.decision,
    rule: null,
    injected: [],
    status: 0,
    bytes_in: 0,
    bytes_out: 0,
    duration_ms: 0,
  };
}

/** Logs a finished request and emits it (the same object) for metrics. */
export function finishRecord(core: ProxyCore, rec: RequestRecord, started: number): void {
  rec.duration_ms = Math.round((performance.now() - started) * 10) / 10;
  core.events.emit('request', rec);
  if (rec.status >= 500 || rec.error) core.logger.warn(rec, 'request');
  else core.logger.info(rec, 'request');
}

/** Answers with the proxy's own error and records it. */
export function refuse(core: ProxyCore, res: ServerResponse, rec: RequestRecord, started: number, err: ProxyError, close = false): void {
  rec.status = err.status;
  rec.error = err.reason;
  sendError(res, err, close);
  finishRecord(core, rec, started);
}

function hasBody(req: IncomingMessage): boolean {
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

async function* counted(src: Readable, rec: RequestRecord): AsyncGenerator<Buffer> {
  for await (const chunk of src) {
    rec.bytes_in += (chunk as Buffer).length;
    yield chunk as Buffer;
  }
}

/**
 * Sends one request upstream through the shared undici pool and streams the answer back: the
 * request body as it arrives, the response chunk by chunk (headers flushed at once, so
 * server-sent events reach the client as they are written). Nothing is buffered.
 */
export async function forward(core: ProxyCore, req: IncomingMessage, res: ServerResponse, t: ForwardTarget, rec: RequestRecord, started: number): Promise<void> {
  rec.rule = t.rule?.name ?? null;
  rec.injected = t.rule?.headerNames ?? [];
  const headers = upstreamRequestHeaders(req.rawHeaders, { rule: t.rule });
  const abort = new AbortController();
  // The client going away cancels the upstream request (and its pool slot).
  const onClose = () => {
    if (!res.writableFinished) abort.abort();
  };
  res.once('close', onClose);
  let response;
  try {
    response = await core.upstream.agent.request({
      origin: `${t.scheme}://${formatAuthority(t.host, t.port)}`,
      path: t.pathAndQuery,
      method: req.method as 'GET',
      headers,
      // undici streams async iterables; the generator counts bytes without buffering.
      body: hasBody(req) ? (counted(req, rec) as unknown as Readable) : null,
      signal: abort.signal,
    });
  } catch (err) {
    res.off('close', onClose);
    if (abort.signal.aborted) {
      rec.status = 499;
      rec.error = 'client closed the connection';
      finishRecord(core, rec, started);
      return;
    }
    const perr = upstreamError(err, t.host);
    core.events.emit('upstream_error', { host: t.host, reason: perr.reason });
    req.resume();
    refuse(core, res, rec, started, perr);
    return;
  }
  rec.status = response.statusCode;
  const body = response.body;
  if (core.draining()) res.shouldKeepAlive = false;
  try {
    res.writeHead(response.statusCode, downstreamResponseHeaders(response.headers as Record<string, string | string[]>));
  } catch {
    // An upstream header Node refuses to relay: report it instead of half a response.
    body.destroy();
    refuse(core, res, rec, started, upstreamError({ code: 'INVALID_RESPONSE_HEADER' }, t.host));
    return;
  }
  res.flushHeaders();
  body.on('data', (chunk: Buffer) => {
    rec.bytes_out += chunk.length;
  });
  pipeline(body, res, (err) => {
    res.off('close', onClose);
    if (err && !rec.error) rec.error = abort.signal.aborted ? 'client closed the connection' : 'response stream interrupted';
    finishRecord(core, rec, started);
  });
}
