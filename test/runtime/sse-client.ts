// A real SSE client for the tests: node:http for the request, eventsource-parser for the framing.
// Records each event with its arrival time so tests can tell streaming from buffering.
import http from 'node:http';
import { createParser } from 'eventsource-parser';

export interface ReceivedEvent {
  event: string;
  data: unknown;
  at: number;
}

export interface StreamResult {
  status: number;
  headers: http.IncomingHttpHeaders;
  events: ReceivedEvent[];
  comments: { text: string; at: number }[];
  /** Raw body (for non-200 answers, the JSON error). */
  body: string;
  started: number;
  ended: number;
}

export interface StreamOptions {
  headers?: Record<string, string>;
  /** Called for each event; return true to disconnect right there. */
  onEvent?(e: ReceivedEvent, all: ReceivedEvent[]): boolean | void;
  rawBody?: string;
}

export function streamRun(baseUrl: string, body: unknown, opts: StreamOptions = {}): Promise<StreamResult> {
  const url = new URL('/runs/stream', baseUrl);
  const payload = opts.rawBody ?? JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const events: ReceivedEvent[] = [];
    const comments: { text: string; at: number }[] = [];
    let raw = '';
    const req = http.request(
      url,
      { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'test-key', ...opts.headers }, agent: false },
      (res) => {
        let stopped = false;
        const finish = () => resolve({ status: res.statusCode ?? 0, headers: res.headers, events, comments, body: raw, started, ended: Date.now() });
        const parser = createParser({
          onEvent(ev) {
            if (stopped) return;
            const e = { event: ev.event ?? 'message', data: JSON.parse(ev.data), at: Date.now() };
            events.push(e);
            if (opts.onEvent?.(e, events)) {
              stopped = true;
              req.destroy();
              finish();
            }
          },
          onComment(text) {
            comments.push({ text, at: Date.now() });
          },
        });
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          raw += chunk;
          parser.feed(chunk);
        });
        res.on('end', () => {
          if (!stopped) finish();
        });
        res.on('error', (err) => {
          if (!stopped) reject(err);
        });
      },
    );
    req.on('error', (err) => reject(err));
    req.end(payload);
  });
}

export function names(r: StreamResult): string[] {
  return r.events.map((e) => e.event);
}

export async function getJson(baseUrl: string, path: string, headers: Record<string, string> = { 'x-api-key': 'test-key' }) {
  const res = await fetch(new URL(path, baseUrl), { headers });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null };
}
