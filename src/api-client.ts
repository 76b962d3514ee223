import { request, type Dispatcher } from 'undici';

/**
 * The request side shared by the command-line clients of keygate's HTTP APIs (`keygate deploy`'s
 * control-plane client, `keygate sandbox`): headers, JSON bodies, error details. Each client keeps
 * its own wording for failures. It depends on nothing of keygate, so that src/deploy and src/cli
 * can both use it.
 */

/** `{detail: "..."}` or `{detail: [{loc, msg}]}` as one sentence. */
export function describeDetail(body: unknown, fallback: string): string {
  const detail = (body as { detail?: unknown } | null)?.detail;
  if (typeof detail === 'string' && detail) return detail;
  if (Array.isArray(detail) && detail.length) {
    return detail
      .map((d: { loc?: unknown[]; msg?: unknown }) => `${Array.isArray(d.loc) ? d.loc.join('.') + ': ' : ''}${String(d.msg ?? '')}`)
      .join('; ');
  }
  return fallback;
}

/** The JSON document in `text`; undefined when it is empty or not JSON. */
export function parseJsonText(text: string): unknown {
  if (!text) return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** An error answer's detail as one sentence (`HTTP <status>` when it has none); reads the body. */
export async function errorDetail(res: Dispatcher.ResponseData): Promise<string> {
  return describeDetail(parseJsonText(await res.body.text()), `HTTP ${res.statusCode}`);
}

export interface ApiRequestOptions {
  /** Sent as the JSON body (with its content type) when given; else `body` is. */
  json?: unknown;
  body?: Dispatcher.DispatchOptions['body'];
  /** The limit for the answer's headers and for its body (ms; 0: none). */
  timeoutMs: number;
}

/** Failures of the network itself, in words, by the code undici or the system gave them. */
const NETWORK_CODES: Readonly<Record<string, string>> = {
  ECONNREFUSED: 'connection refused',
  ENOTFOUND: 'host not found',
  EAI_AGAIN: 'host lookup failed',
  ECONNRESET: 'connection reset',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ETIMEDOUT: 'timed out',
  UND_ERR_CONNECT_TIMEOUT: 'connection timed out',
  UND_ERR_HEADERS_TIMEOUT: 'no answer in time',
  UND_ERR_SOCKET: 'connection closed',
};

/** The network code of `err` or of one of its causes, when it is a failure of the network. */
export function networkCode(err: unknown): string | undefined {
  let e = err as { code?: string; cause?: unknown } | undefined;
  for (let i = 0; e && i < 5; i++, e = e.cause as typeof e) {
    if (e.code && NETWORK_CODES[e.code]) return e.code;
  }
  return undefined;
}

/** What went wrong, in words: a network failure as `connection refused (ECONNREFUSED)`, else the error's message. */
export function networkFailure(err: unknown): string {
  const code = networkCode(err);
  return code ? `${NETWORK_CODES[code]} (${code})` : (err as Error).message;
}

/**
 * One request with the client's `headers` (user agent, API key, the request's own). A network
 * failure is thrown as `unreachable(err)`, any other (the request's own body failing: a local
 * file that cannot be read, or whose length changed) as `failed(err)`: "is the server running?"
 * is the wrong question then. The answer, whatever its status, is the caller's to read.
 */
export async function apiRequest(
  dispatcher: Dispatcher,
  url: string,
  method: Dispatcher.HttpMethod,
  headers: Record<string, string>,
  opts: ApiRequestOptions,
  unreachable: (err: unknown) => Error,
  failed: (err: unknown) => Error = unreachable,
): Promise<Dispatcher.ResponseData> {
  const h = { ...headers };
  let body = opts.body;
  if (opts.json !== undefined) {
    h['content-type'] = 'application/json';
    body = JSON.stringify(opts.json);
  }
  try {
    return await request(url, { method, headers: h, body, dispatcher, headersTimeout: opts.timeoutMs, bodyTimeout: opts.timeoutMs });
  } catch (err) {
    throw networkCode(err) ? unreachable(err) : failed(err);
  }
}
