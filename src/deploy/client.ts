import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { Transform } from 'node:stream';
import { Agent, request, type Dispatcher } from 'undici';
import { apiRequest, describeDetail, errorDetail, networkCode, networkFailure, parseJsonText } from '../api-client.js';
import { CliError } from '../command-error.js';

// Shapes of the control-plane API (see the control plane's route schemas); only what the CLI reads.
export interface Deployment {
  id: string;
  name: string;
  source?: string;
  source_config?: { deployment_type?: string; custom_url?: string | null; [k: string]: unknown };
  status?: string;
  latest_revision_id: string | null;
  active_revision_id?: string | null;
  url?: string | null;
  created_at?: string;
  updated_at?: string;
}

export interface Revision {
  id: string;
  status: string;
  status_message?: string | null;
  replaced_by?: string | null;
  /** The deployment's active revision (the one answering requests). */
  serving?: boolean;
  created_at?: string;
  updated_at?: string;
}

export interface LogEntry {
  timestamp: string;
  type: string;
  revision_id?: string | null;
  level?: string;
  message: string;
}

export interface UploadResult {
  source_tarball_path: string;
  size: number;
  sha256: string;
}

export interface Secret {
  name: string;
  value: string;
}

export interface CreateDeployment {
  name: string;
  source: 'internal_source' | 'external_docker';
  source_config: { deployment_type: 'dev' | 'prod' };
  source_revision_config: { source_tarball_path?: string; image_uri?: string };
  secrets?: Secret[];
}

export interface PatchDeployment {
  source_revision_config: { source_tarball_path?: string; image_uri?: string };
  secrets?: Secret[];
}

/** An error answer of the control plane. A CliError, so an unhandled one is still a single line. */
export class ApiError extends CliError {
  constructor(
    readonly status: number,
    readonly detail: string,
    what: string,
  ) {
    super(status === 401 ? 'the control plane rejected the API key (401)' : `${what}: ${detail} (${status})`);
    this.name = 'ApiError';
  }
}

export { describeDetail };

export interface ClientOptions {
  baseUrl: string;
  apiKey?: string;
  /** Per-request limit for ordinary calls (ms). */
  timeoutMs?: number;
  /** Page size when listing every deployment (the API's maximum, 100, unless a test wants more pages). */
  pageSize?: number;
}

/**
 * The control plane's public HTTP API, nothing else. The API key only ever travels in the
 * X-Api-Key header; it is never part of an error message.
 */
export class ControlPlaneClient {
  readonly baseUrl: string;
  readonly #apiKey?: string;
  readonly #agent: Agent;
  readonly #timeoutMs: number;
  readonly #pageSize: number;

  constructor(opts: ClientOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, '');
    this.#apiKey = opts.apiKey;
    this.#timeoutMs = opts.timeoutMs ?? 30_000;
    this.#pageSize = opts.pageSize ?? 100;
    this.#agent = new Agent({ connectTimeout: 10_000, keepAliveTimeout: 2_000 });
  }

  async close(): Promise<void> {
    await this.#agent.close().catch(() => undefined);
  }

  #headers(extra: Record<string, string> = {}): Record<string, string> {
    const h: Record<string, string> = { accept: 'application/json', 'user-agent': 'keygate-deploy', ...extra };
    if (this.#apiKey) h['x-api-key'] = this.#apiKey;
    return h;
  }

  #unreachable(err: unknown): CliError {
    return new CliError(`cannot reach the control plane at ${this.baseUrl}: ${networkFailure(err)}; is 'keygate serve' running there? (set KEYGATE_URL)`);
  }

  async #send(
    what: string,
    method: Dispatcher.HttpMethod,
    pathAndQuery: string,
    opts: { json?: unknown; body?: Dispatcher.DispatchOptions['body']; headers?: Record<string, string>; timeoutMs?: number } = {},
  ): Promise<{ status: number; body: unknown }> {
    const res = await apiRequest(
      this.#agent,
      this.baseUrl + pathAndQuery,
      method,
      this.#headers(opts.headers),
      { json: opts.json, body: opts.body, timeoutMs: opts.timeoutMs ?? this.#timeoutMs },
      (err) => this.#unreachable(err),
      (err) => new CliError(`${what}: ${(err as Error).message}`),
    );
    const text = await res.body.text();
    const parsed = parseJsonText(text);
    if (res.statusCode >= 400) {
      throw new ApiError(res.statusCode, describeDetail(parsed, `HTTP ${res.statusCode}`), what);
    }
    if (text && parsed === undefined) throw new CliError(`${what}: the control plane answered with something that is not JSON (HTTP ${res.statusCode}); is KEYGATE_URL the control plane?`);
    return { status: res.statusCode, body: parsed };
  }

  /** GET /healthz (public): is anything keygate-like answering at the base URL? */
  async health(): Promise<void> {
    let res: Dispatcher.ResponseData;
    try {
      res = await request(`${this.baseUrl}/healthz`, { method: 'GET', dispatcher: this.#agent, headersTimeout: 10_000, bodyTimeout: 10_000 });
    } catch (err) {
      throw this.#unreachable(err);
    }
    await res.body.dump();
    if (res.statusCode !== 200) throw new CliError(`the control plane at ${this.baseUrl} is not healthy: GET /healthz answered ${res.statusCode}`);
  }

  /**
   * POST /v2/uploads with the tarball streamed from disk; `onProgress(sent)` as bytes leave.
   * The local SHA-256 is compared with the server's, so a corrupted upload never becomes a revision.
   */
  async upload(file: string, size: number, onProgress?: (sent: number) => void): Promise<UploadResult> {
    const hash = createHash('sha256');
    let sent = 0;
    const meter = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        hash.update(chunk);
        sent += chunk.length;
        onProgress?.(sent);
        cb(null, chunk);
      },
    });
    const source = createReadStream(file);
    source.on('error', (err) => meter.destroy(err));
    source.pipe(meter);
    const { body } = await this.#send('upload failed', 'POST', '/v2/uploads', {
      body: meter,
      headers: { 'content-type': 'application/gzip', 'content-length': String(size) },
      timeoutMs: 300_000,
    });
    const result = body as UploadResult;
    if (!result || typeof result.source_tarball_path !== 'string') throw new CliError('upload failed: the control plane did not return a source_tarball_path');
    const local = hash.digest('hex');
    if (typeof result.sha256 === 'string' && result.sha256.toLowerCase() !== local) {
      throw new CliError(`upload failed: the control plane received different bytes (sha256 ${result.sha256} != local ${local})`);
    }
    return result;
  }

  async listDeployments(q: { limit?: number; offset?: number; nameContains?: string } = {}): Promise<{ resources: Deployment[]; offset?: number }> {
    const p = new URLSearchParams();
    p.set('limit', String(q.limit ?? 100));
    p.set('offset', String(q.offset ?? 0));
    if (q.nameContains) p.set('name_contains', q.nameContains);
    const { body } = await this.#send('cannot list deployments', 'GET', `/v2/deployments?${p}`);
    const b = body as { resources?: Deployment[]; offset?: number };
    if (!b || !Array.isArray(b.resources)) throw new CliError('cannot list deployments: unexpected answer from the control plane');
    return { resources: b.resources, offset: b.offset };
  }

  /** Every deployment (optionally filtered), page after page of 100. */
  async listAllDeployments(nameContains?: string): Promise<Deployment[]> {
    const all: Deployment[] = [];
    const seen = new Set<string>();
    const limit = this.#pageSize;
    for (let offset = 0; ; offset += limit) {
      const page = await this.listDeployments({ limit, offset, nameContains });
      for (const d of page.resources) {
        // Newest-first pagination shifts when a deployment is created meanwhile; never list one twice.
        if (!seen.has(d.id)) {
          seen.add(d.id);
          all.push(d);
        }
      }
      if (page.resources.length < limit) return all;
      if (offset > 1_000_000 * limit) throw new CliError('cannot list deployments: the control plane keeps returning full pages');
    }
  }

  /** The deployment with exactly this name (the server's filter is a substring match). */
  async findByName(name: string): Promise<Deployment | undefined> {
    const all = await this.listAllDeployments(name);
    return all.find((d) => d.name === name);
  }

  async getDeployment(id: string): Promise<Deployment> {
    return (await this.#send('cannot read the deployment', 'GET', `/v2/deployments/${encodeURIComponent(id)}`)).body as Deployment;
  }

  async createDeployment(body: CreateDeployment): Promise<Deployment> {
    return (await this.#send('cannot create the deployment', 'POST', '/v2/deployments', { json: body })).body as Deployment;
  }

  async patchDeployment(id: string, body: PatchDeployment): Promise<Deployment> {
    return (await this.#send('cannot update the deployment', 'PATCH', `/v2/deployments/${encodeURIComponent(id)}`, { json: body })).body as Deployment;
  }

  async deleteDeployment(id: string): Promise<void> {
    await this.#send('cannot delete the deployment', 'DELETE', `/v2/deployments/${encodeURIComponent(id)}`);
  }

  async getRevision(deploymentId: string, revisionId: string): Promise<Revision> {
    return (await this.#send('cannot read the revision', 'GET', `/v2/deployments/${encodeURIComponent(deploymentId)}/revisions/${encodeURIComponent(revisionId)}`)).body as Revision;
  }

  async getLogs(deploymentId: string, q: LogQuery & { limit?: number }): Promise<{ logs: LogEntry[]; next_since?: string | null }> {
    const { body } = await this.#send('cannot read the logs', 'GET', `/v2/deployments/${encodeURIComponent(deploymentId)}/logs?${logParams(q, q.limit)}`);
    const b = body as { logs?: LogEntry[]; next_since?: string | null };
    if (!b || !Array.isArray(b.logs)) throw new CliError('cannot read the logs: unexpected answer from the control plane');
    return { logs: b.logs, next_since: b.next_since };
  }

  /**
   * Every log line matching the query, oldest first, paging with `next_since`; only the last
   * `keep` lines are kept (a build log can be long, the caller wants its tail).
   */
  async tailLogs(deploymentId: string, q: LogQuery, keep: number): Promise<{ lines: LogEntry[]; nextSince?: string }> {
    const lines: LogEntry[] = [];
    const limit = 1000;
    let since = q.since;
    const seen = new Set<string>();
    for (let page = 0; page < 1000; page++) {
      const r = await this.getLogs(deploymentId, { ...q, since, limit });
      let fresh = 0;
      for (const l of r.logs) {
        // `since` may be inclusive: lines at the boundary timestamp come back on the next page.
        const k = logKey(l);
        if (seen.has(k)) continue;
        seen.add(k);
        fresh++;
        lines.push(l);
        if (lines.length > keep) lines.shift();
      }
      const next = r.next_since ?? undefined;
      if (r.logs.length < limit || fresh === 0 || !next || next === since) return { lines, nextSince: next ?? since };
      since = next;
    }
    return { lines, nextSince: since };
  }

  /**
   * GET .../logs/stream (server-sent events): calls `onLog` for each `event: log` until `signal`
   * aborts (resolves) or the server ends the stream (resolves too; the caller decides).
   */
  async streamLogs(deploymentId: string, q: LogQuery, onLog: (l: LogEntry) => void, signal: AbortSignal): Promise<void> {
    let res: Dispatcher.ResponseData;
    try {
      res = await request(`${this.baseUrl}/v2/deployments/${encodeURIComponent(deploymentId)}/logs/stream?${logParams(q)}`, {
        method: 'GET',
        headers: this.#headers({ accept: 'text/event-stream' }),
        dispatcher: this.#agent,
        signal,
        headersTimeout: this.#timeoutMs,
        bodyTimeout: 0, // a quiet log is not an error; the server's heartbeats keep the line alive
      });
    } catch (err) {
      if (signal.aborted) return;
      throw this.#unreachable(err);
    }
    if (res.statusCode >= 400) throw new ApiError(res.statusCode, await errorDetail(res), 'cannot follow the logs');
    const parser = new SseParser((event, data) => {
      if (event !== 'log') return;
      try {
        onLog(JSON.parse(data) as LogEntry);
      } catch {
        // a malformed line is skipped rather than ending the tail
      }
    });
    try {
      for await (const chunk of res.body) parser.push((chunk as Buffer).toString('utf8'));
    } catch (err) {
      if (signal.aborted) return;
      throw new CliError(`the log stream broke: ${networkCode(err) ?? (err as Error).message}`);
    }
  }
}

export interface LogQuery {
  type?: string;
  revisionId?: string;
  since?: string;
}

function logParams(q: LogQuery, limit?: number): URLSearchParams {
  const p = new URLSearchParams();
  if (q.type) p.set('type', q.type);
  if (q.revisionId) p.set('revision_id', q.revisionId);
  if (q.since) p.set('since', q.since);
  if (limit !== undefined) p.set('limit', String(limit));
  return p;
}

export function logKey(l: LogEntry): string {
  return `${l.timestamp}\u0000${l.type}\u0000${l.revision_id ?? ''}\u0000${l.message}`;
}

/** Minimal text/event-stream framing: `event:` / `data:` lines, dispatched on a blank line; comments ignored. */
export class SseParser {
  #buf = '';
  #event = '';
  #data: string[] = [];

  constructor(private readonly onEvent: (event: string, data: string) => void) {}

  push(text: string): void {
    this.#buf += text;
    let nl: number;
    while ((nl = this.#buf.search(/\r\n|\n|\r/)) >= 0) {
      const line = this.#buf.slice(0, nl);
      const sepLen = this.#buf.startsWith('\r\n', nl) ? 2 : 1;
      // A lone '\r' at the end of a chunk may be the first half of '\r\n': wait for more.
      if (sepLen === 1 && this.#buf[nl] === '\r' && nl === this.#buf.length - 1) break;
      this.#buf = this.#buf.slice(nl + sepLen);
      this.#line(line);
    }
  }

  #line(line: string): void {
    if (line === '') {
      if (this.#data.length) this.onEvent(this.#event || 'message', this.#data.join('\n'));
      this.#event = '';
      this.#data = [];
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.#event = value;
    else if (field === 'data') this.#data.push(value);
  }
}
