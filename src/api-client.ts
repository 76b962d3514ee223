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

/**
 * One request with the client's `headers` (user agent, API key, the request's own). A network
 * failure is thrown as `unreachable(err)`; the answer, whatever its status, is the caller's to read.
 */
export async function apiRequest(
  dispatcher: Dispatcher,
  url: string,
  method: Dispatcher.HttpMethod,
  headers: Record<string, string>,
  opts: ApiRequestOptions,
  unreachable: (err: unknown) => Error,
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
    throw unreachable(err);
  }
}
