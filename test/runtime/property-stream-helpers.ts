// Helpers of property-stream.test.ts: a raw HTTP client that keeps the exact bytes, a strict
// server-sent-event parser (WHATWG HTML "Server-sent events", refusing what keygate never sends),
// and JSON bodies built as text from a syntax tree, so a number can be written as `1e400` or `-0`
// and a string with escapes a JSON.stringify would never choose.
import http from 'node:http';
import net from 'node:net';

// ---------------------------------------------------------------------------------------------
// Raw HTTP
// ---------------------------------------------------------------------------------------------

export interface RawAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  bytes: Buffer;
  /** The response ended cleanly (for a chunked body: its last chunk arrived). */
  complete: boolean;
}

/** One POST over its own connection, body sent as given; every byte of the answer kept. */
export function postRaw(baseUrl: string, path: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(path, baseUrl), { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      const done = () => resolve({ status: res.statusCode ?? 0, headers: res.headers, bytes: Buffer.concat(chunks), complete: res.complete });
      res.on('end', done);
      res.on('aborted', done);
      res.on('error', done);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * A client that sends a run request over a raw socket and then does not read: the server's
 * writes pile up in its own buffers (and the kernel's). `resume()` reads everything that is left.
 */
export function stalledClient(baseUrl: string, body: string): Promise<{ socket: net.Socket; drain(): Promise<Buffer> }> {
  const port = Number(new URL(baseUrl).port);
  return new Promise((resolve, reject) => {
    const socket = net.connect({ port, host: '127.0.0.1' }, () => {
      socket.pause();
      socket.write(`POST /runs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      resolve({
        socket,
        drain: () =>
          new Promise((done) => {
            const chunks: Buffer[] = [];
            socket.on('data', (c: Buffer) => chunks.push(c));
            socket.on('close', () => done(Buffer.concat(chunks)));
            socket.on('error', () => undefined);
            socket.resume();
          }),
      });
    });
    // A small receive buffer: what the server queues shows up in the server, not in this client.
    socket.setNoDelay(true);
    socket.once('error', reject);
  });
}

/**
 * Sends a run request over a raw socket and ends the sending side at once (a half-close, as
 * `printf ... | nc -N` does), then reads until the server closes. Returns everything after the
 * head (chunked framing removed) and whether the chunked body was complete.
 */
export function halfClosedRun(baseUrl: string, body: string): Promise<{ head: string; body: Buffer; complete: boolean }> {
  const port = Number(new URL(baseUrl).port);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true }, () => {
      socket.end(`POST /runs/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: test-key\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => {
      const all = Buffer.concat(chunks);
      const headEnd = all.indexOf('\r\n\r\n');
      const head = all.subarray(0, headEnd).toString('latin1');
      const out: Buffer[] = [];
      let at = headEnd + 4;
      let complete = false;
      while (at < all.length) {
        const eol = all.indexOf('\r\n', at);
        if (eol < 0) break;
        const size = parseInt(all.subarray(at, eol).toString('latin1'), 16);
        if (size === 0) {
          complete = true;
          break;
        }
        if (eol + 2 + size > all.length) break;
        out.push(all.subarray(eol + 2, eol + 2 + size));
        at = eol + 2 + size + 2;
      }
      resolve({ head, body: Buffer.concat(out), complete });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Strict SSE
// ---------------------------------------------------------------------------------------------

export interface SseEvent {
  event: string;
  data: unknown;
  id?: string;
}

export interface SseParse {
  events: SseEvent[];
  comments: string[];
}

/**
 * Parses an event stream as the HTML standard defines it (lines end in CRLF, LF or CR; `data:`
 * lines of one event are joined with LF; one optional space after the colon is dropped), and
 * throws on anything a keygate stream must not hold: bytes that are not UTF-8, a BOM, a line
 * without a colon, a field other than `event`/`data`/`id`, an event without a name or without
 * data, a name given twice, data that is not JSON, data whose lines the official SDK (which joins
 * them without LF) would read as another value, `id`s that are not increasing integers, and a
 * stream that stops inside an event (no blank line after it).
 */
export function parseSseStrict(bytes: Buffer): SseParse {
  const text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  if (text.startsWith('\ufeff')) throw new Error('the stream starts with a BOM');
  const lines = text.split(/\r\n|\n|\r/);
  // A complete stream ends with a line terminator, so the last piece is empty.
  if (lines.pop() !== '') throw new Error('the stream ends inside a line');
  const events: SseEvent[] = [];
  const comments: string[] = [];
  let name: string | undefined;
  let data: string[] = [];
  let id: string | undefined;
  let open = false;
  let lastId = -1;
  for (const line of lines) {
    if (line === '') {
      if (name !== undefined || data.length || id !== undefined) {
        if (name === undefined) throw new Error(`an event without a name: ${JSON.stringify(data).slice(0, 200)}`);
        if (!data.length) throw new Error(`event ${name} has no data`);
        const joined = data.join('\n');
        let value: unknown;
        try {
          value = JSON.parse(joined);
        } catch {
          throw new Error(`event ${name}: data is not JSON: ${joined.slice(0, 200)}`);
        }
        if (data.length > 1 && JSON.stringify(JSON.parse(data.join(''))) !== JSON.stringify(value)) {
          throw new Error(`event ${name}: the SDK would join its data lines into another value`);
        }
        if (id !== undefined) {
          const n = Number(id);
          if (!/^\d+$/.test(id) || n <= lastId) throw new Error(`event ids must increase: ${id} after ${lastId}`);
          lastId = n;
        } else if (lastId >= 0) throw new Error(`event ${name} has no id after events with ids`);
        events.push({ event: name, data: value, ...(id !== undefined ? { id } : {}) });
      }
      name = undefined;
      data = [];
      id = undefined;
      open = false;
      continue;
    }
    open = true;
    if (line.startsWith(':')) {
      comments.push(line.slice(1).replace(/^ /, ''));
      continue;
    }
    const colon = line.indexOf(':');
    if (colon < 0) throw new Error(`a line without a colon: ${JSON.stringify(line.slice(0, 100))}`);
    const field = line.slice(0, colon);
    const value = line.slice(colon + 1).replace(/^ /, '');
    if (field === 'event') {
      if (name !== undefined) throw new Error(`two event names in one event: ${name}, ${value}`);
      if (value === '') throw new Error('an empty event name');
      name = value;
    } else if (field === 'data') {
      data.push(value);
    } else if (field === 'id') {
      if (id !== undefined || value.includes('\0')) throw new Error(`a bad id line: ${JSON.stringify(value)}`);
      id = value;
    } else {
      throw new Error(`an unexpected field: ${JSON.stringify(field.slice(0, 100))}`);
    }
  }
  if (open) throw new Error('the stream ends inside an event (no blank line after it)');
  return { events, comments };
}

// ---------------------------------------------------------------------------------------------
// JSON as text
// ---------------------------------------------------------------------------------------------

/** A JSON document as written: numbers keep their text, objects their entries (duplicates too). */
export type Ast =
  | { t: 'null' }
  | { t: 'bool'; v: boolean }
  | { t: 'num'; text: string }
  | { t: 'str'; v: string; escape?: number[] }
  | { t: 'arr'; items: Ast[] }
  | { t: 'obj'; entries: [string, Ast][] };

export const A = {
  null: (): Ast => ({ t: 'null' }),
  bool: (v: boolean): Ast => ({ t: 'bool', v }),
  num: (text: string): Ast => ({ t: 'num', text }),
  str: (v: string, escape?: number[]): Ast => ({ t: 'str', v, escape }),
  arr: (items: Ast[]): Ast => ({ t: 'arr', items }),
  obj: (entries: [string, Ast][]): Ast => ({ t: 'obj', entries }),
};

/** A JS value (from JSON.parse or a generator) as a tree. */
export function astOf(v: unknown): Ast {
  if (v === null || v === undefined) return A.null();
  if (typeof v === 'boolean') return A.bool(v);
  if (typeof v === 'number') return A.num(Object.is(v, -0) ? '-0' : JSON.stringify(v));
  if (typeof v === 'string') return A.str(v);
  if (Array.isArray(v)) return A.arr(v.map(astOf));
  return A.obj(Object.entries(v as object).map(([k, x]) => [k, astOf(x)]));
}

const SHORT: Record<string, string> = { '"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t' };

/**
 * A JSON string literal. Code units in `escape` (indexes, taken modulo the length) are written as
 * `\uXXXX` even when they need no escape; control characters, `"` and `\` always are; a lone
 * surrogate is written as an escape (UTF-8 cannot carry it, and the body must be UTF-8).
 */
export function quote(s: string, escape: number[] = []): string {
  // Without forced escapes, JSON.stringify writes the same (lone surrogates escaped, since ES2019).
  if (!escape.length || !s.length) return JSON.stringify(s);
  const forced = new Set(escape.map((i) => i % s.length));
  // Half of a pair escaped and half not would leave a lone surrogate in the text: escape both.
  for (const i of [...forced]) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) forced.add(i + 1);
    if (c >= 0xdc00 && c <= 0xdfff && i > 0) forced.add(i - 1);
  }
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const ch = s[i];
    const high = c >= 0xd800 && c <= 0xdbff;
    const low = c >= 0xdc00 && c <= 0xdfff;
    const paired = (high && i + 1 < s.length && s.charCodeAt(i + 1) >= 0xdc00 && s.charCodeAt(i + 1) <= 0xdfff) || (low && i > 0 && s.charCodeAt(i - 1) >= 0xd800 && s.charCodeAt(i - 1) <= 0xdbff);
    if (forced.has(i) || ((high || low) && !paired) || c < 0x20) out += `\\u${c.toString(16).padStart(4, '0')}`;
    else if (SHORT[ch] !== undefined) out += SHORT[ch];
    else if (ch === '/' && forced.size) out += '\\/';
    else out += ch;
  }
  return out + '"';
}

/** The tree as JSON text; `ws` (cycled) is the whitespace put around tokens. */
export function toText(a: Ast, ws: string[] = ['']): string {
  let n = 0;
  const w = () => ws[n++ % ws.length];
  const go = (x: Ast): string => {
    switch (x.t) {
      case 'null':
        return 'null';
      case 'bool':
        return String(x.v);
      case 'num':
        return x.text;
      case 'str':
        return quote(x.v, x.escape);
      case 'arr':
        return `[${w()}${x.items.map((i) => go(i) + w()).join(`,${w()}`)}]`;
      case 'obj':
        return `{${w()}${x.entries.map(([k, v]) => `${quote(k)}${w()}:${w()}${go(v)}${w()}`).join(`,${w()}`)}}`;
    }
  };
  return go(a);
}

/**
 * What the text means (the model's JSON.parse): numbers by value, an object's last duplicate key
 * winning, every key an own property (`__proto__` included, as JSON.parse makes it).
 */
export function valueOf(a: Ast): unknown {
  switch (a.t) {
    case 'null':
      return null;
    case 'bool':
      return a.v;
    case 'num':
      return Number(a.text);
    case 'str':
      return a.v;
    case 'arr':
      return a.items.map(valueOf);
    case 'obj':
      return Object.fromEntries(a.entries.map(([k, v]) => [k, valueOf(v)]));
  }
}

/**
 * A canonical text of a JSON value for comparison: keys sorted, `-0` as `0` (JSON numbers compare
 * by value), own `__proto__` keys kept.
 */
export function canon(v: unknown): string {
  if (typeof v === 'number') return Object.is(v, -0) ? '0' : JSON.stringify(v);
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'undefined';
  if (Array.isArray(v)) return `[${v.map(canon).join(',')}]`;
  const keys = Object.keys(v).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canon((v as Record<string, unknown>)[k])}`).join(',')}}`;
}
