/**
 * Helpers of property-files.test.ts: a raw HTTP client on the sandbox API, generated box trees and
 * the box's own view of a path (read by executing in the box, the model every API answer is
 * checked against), and the host-side sentinels a files operation must never touch.
 */
import { createHash } from 'node:crypto';
import { lstatSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import fc from 'fast-check';
import { Client } from 'undici';

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
  text: string;
  json: unknown;
}

/** The API as a client reaches it: the request target is sent exactly as given (no re-encoding). */
export class Api {
  private readonly client: Client;
  constructor(
    readonly url: string,
    readonly key: string,
  ) {
    this.client = new Client(url, { pipelining: 0, keepAliveTimeout: 1000 });
  }

  async send(method: string, target: string, body?: Buffer | string, headers: Record<string, string> = {}): Promise<Answer | undefined> {
    let res;
    try {
      res = await this.client.request({ method: method as 'GET', path: target, headers: { 'x-api-key': this.key, ...headers }, body });
    } catch (err) {
      // undici refuses a target it cannot send (a raw space or control character): nothing reached the server.
      if ((err as { code?: string }).code === 'UND_ERR_INVALID_ARG') return undefined;
      throw err;
    }
    const buf = Buffer.from(await res.body.arrayBuffer());
    const text = buf.toString('utf8');
    let json: unknown;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    return { status: res.statusCode, headers: res.headers, body: buf, text, json };
  }

  async json(method: string, target: string, body?: unknown): Promise<Answer> {
    const r = await this.send(method, target, body === undefined ? undefined : JSON.stringify(body), body === undefined ? {} : { 'content-type': 'application/json' });
    return r!;
  }

  /** Runs a command in the box through the execute API. */
  async exec(box: string, command: string | string[], extra: Record<string, unknown> = {}): Promise<{ stdout: string; stderr: string; exit_code: number; signal: string | null; truncated: boolean; timed_out: boolean }> {
    const r = await this.json('POST', `/api/v2/sandboxes/boxes/${box}/execute`, { command, timeout_seconds: 60, ...extra });
    if (r.status !== 200) throw new Error(`execute answered ${r.status}: ${r.text}`);
    return r.json as never;
  }

  close(): Promise<void> {
    return this.client.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Encodings of a query value, as clients write them. Each decodes back to the same string.

export type Encoding = 'component' | 'form' | 'minimal' | 'lowerhex';

export function encodePathParam(p: string, how: Encoding): string {
  switch (how) {
    case 'component':
      return encodeURIComponent(p);
    case 'form':
      return new URLSearchParams({ path: p }).toString().slice('path='.length);
    case 'minimal':
      // Only what a query value must escape; '/' and the rest of the unreserved and sub-delims stay raw.
      return p.replace(/[^A-Za-z0-9/._~!$'()*,;:@-]/gu, (c) => encodeURIComponent(c));
    case 'lowerhex':
      return encodeURIComponent(p).replace(/%[0-9A-F]{2}/g, (m) => m.toLowerCase());
  }
}

// ---------------------------------------------------------------------------------------------
// Generated trees, planted in the box by code running there.

/** File names a box may hold: spaces, quotes, shell and URL metacharacters, unicode, newlines, near NAME_MAX. */
export const nameArb: fc.Arbitrary<string> = fc
  .oneof(
    { weight: 3, arbitrary: fc.constantFrom('a', 'b.txt', 'with space', ' lead', 'trail ', 'new\nline', 'tab\there', 'cr\r', 'é', '日本語', '😀', '-n', '--', '*', '?', '[a]', "'", '"', '\\', '$HOME', '`id`', '%2F', '%', '%25', '%FF', '+', 'a+b', '&', 'a&path=/etc/passwd', '#', '=', ';', '..x', '.hidden', '~', '.kg-upload-x', '\u202e', 'ﬁ', 'A\u0301') },
    { weight: 2, arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 10 }) },
    { weight: 1, arbitrary: fc.integer({ min: 240, max: 255 }).map((n) => 'L'.repeat(n)) },
  )
  .filter((n) => !/\p{Cs}/u.test(n) && !n.includes('/') && !n.includes('\0') && n !== '.' && n !== '..' && Buffer.byteLength(n) <= 255);

/** Targets a planted symlink points at: host-looking paths, the root, `..` chains, loops, dangling. */
export function linkTargetArb(hostPaths: string[]): fc.Arbitrary<string> {
  const targets = ['/', '/etc/passwd', '/etc/shadow', '/proc/self/root', '/proc/1/root', '/proc/self/cwd', '/proc/1/cwd', '/dev/zero', '/nonexistent', '/workspace', '/tmp', '..', '../..', '../../../../../..', '../../../../../../etc/passwd', '.', 'missing', '/proc/self/fd/0', '/proc/version', '/proc/sys/kernel'];
  return fc.oneof(
    fc.constantFrom(...targets),
    fc.constantFrom(...hostPaths),
    fc.integer({ min: 1, max: 12 }).map((n) => '../'.repeat(n) + hostPaths[0].slice(1)),
  );
}

export type Entry = { kind: 'dir' } | { kind: 'file'; data: Uint8Array } | { kind: 'link'; target: string } | { kind: 'fifo' } | { kind: 'hard'; of: number };

export interface PlannedEntry {
  /** Index of the parent among earlier entries that are directories; -1 = the case's root. */
  parent: number;
  name: string;
  entry: Entry;
}

export function treeArb(hostPaths: string[]): fc.Arbitrary<PlannedEntry[]> {
  const entry: fc.Arbitrary<Entry> = fc.oneof(
    { weight: 3, arbitrary: fc.constant<Entry>({ kind: 'dir' }) },
    { weight: 4, arbitrary: fc.uint8Array({ maxLength: 300 }).map<Entry>((data) => ({ kind: 'file', data })) },
    { weight: 4, arbitrary: fc.oneof(linkTargetArb(hostPaths), nameArb).map<Entry>((target) => ({ kind: 'link', target })) },
    { weight: 1, arbitrary: fc.constant<Entry>({ kind: 'fifo' }) },
    { weight: 1, arbitrary: fc.nat(20).map<Entry>((of) => ({ kind: 'hard', of })) },
  );
  return fc.array(fc.record({ parent: fc.integer({ min: -1, max: 20 }), name: nameArb, entry }), { minLength: 2, maxLength: 9 });
}

/** The entries' paths under `root` (parents clamped to an earlier directory) and the plant argv. */
export function plan(root: string, tree: PlannedEntry[]): { paths: string[]; argv: string[] } {
  const paths: string[] = [];
  const dirs: number[] = [];
  const argv: string[] = [];
  tree.forEach((t, i) => {
    const parentIdx = dirs.length && t.parent >= 0 ? dirs[t.parent % dirs.length] : -1;
    const p = `${parentIdx < 0 ? root : paths[parentIdx]}/${t.name}`;
    paths.push(p);
    const e = t.entry;
    if (e.kind === 'dir') {
      dirs.push(i);
      argv.push('d', p, '');
    } else if (e.kind === 'file') argv.push('f', p, Buffer.from(e.data).toString('base64'));
    else if (e.kind === 'link') argv.push('l', p, e.target);
    else if (e.kind === 'fifo') argv.push('p', p, '');
    else {
      const files = tree.map((x, j) => (x.entry.kind === 'file' && j < i ? paths[j] : null)).filter((x): x is string => x !== null);
      argv.push('h', p, files.length ? files[e.of % files.length] : '/etc/passwd');
    }
  });
  return { paths, argv };
}

/** Plants what `plan` gave, from inside the box; an entry the box refuses is skipped (the model reads the box anyway). */
export const PLANT = `while [ $# -ge 3 ]; do k=$1 p=$2 a=$3; shift 3
case $k in d) mkdir -p -- "$p";; f) printf %s "$a" | base64 -d > "$p";; l) ln -s -- "$a" "$p";; p) mkfifo -- "$p";; h) ln -- "$a" "$p";; esac 2>/dev/null
done; exit 0`;

/**
 * The box's own view of each path, one line each: ENOENT, DIR, NOTREG (a fifo, device), NOREAD,
 * or FILE and the content in base64. What a user in the box sees with test(1) and cat.
 */
export const VIEW = `for f in "$@"; do
if [ ! -e "$f" ]; then echo ENOENT
elif [ -d "$f" ]; then echo DIR
elif [ ! -f "$f" ]; then echo NOTREG
elif [ ! -r "$f" ]; then echo NOREAD
else printf 'FILE %s\\n' "$(base64 -w0 -- "$f" || echo ERR)"; fi
done`;

export type View = { kind: 'ENOENT' | 'DIR' | 'NOTREG' | 'NOREAD' } | { kind: 'FILE'; data: Buffer };

export function parseViews(stdout: string, n: number): View[] {
  const lines = stdout.split('\n').filter((l) => l !== '');
  if (lines.length !== n) throw new Error(`the box's view gave ${lines.length} lines for ${n} paths: ${stdout.slice(0, 500)}`);
  return lines.map((l) => {
    if (l.startsWith('FILE ')) {
      const b = l.slice(5);
      if (b === 'ERR' || b.endsWith('ERR')) throw new Error(`the box could not read a file it said readable: ${l}`);
      return { kind: 'FILE', data: Buffer.from(b, 'base64') };
    }
    return { kind: l as 'ENOENT' };
  });
}

// ---------------------------------------------------------------------------------------------
// The host side: what must never change, and what must never appear.

export function fileHash(p: string): string {
  try {
    return createHash('sha256').update(readFileSync(p)).digest('hex');
  } catch (e) {
    return `unreadable:${(e as NodeJS.ErrnoException).code}`;
  }
}

/** Every path under `dir` (not following links; `skip` directories not entered) with its type and size. */
export function listTree(dir: string, skip: (p: string) => boolean = () => false): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (d: string) => {
    let names: string[];
    try {
      names = readdirSync(d);
    } catch {
      return;
    }
    for (const n of names) {
      const p = path.join(d, n);
      let st;
      try {
        st = lstatSync(p);
      } catch {
        continue;
      }
      out.set(p, st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'link' : `file:${st.size}`);
      if (st.isDirectory() && !skip(p)) walk(p);
    }
  };
  walk(dir);
  return out;
}

export function mtimeOf(p: string): number {
  return statSync(p).mtimeMs;
}
