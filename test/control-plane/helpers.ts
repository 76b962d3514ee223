// Shared by the control-plane tests: archives (well-formed and hostile), API calls, polling.
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import * as tar from 'tar';
import { Header } from 'tar';
import { createParser } from 'eventsource-parser';
import { REPO_ROOT } from '../helpers/cli.js';

export const ECHO_AGENT = path.join(REPO_ROOT, 'examples/echo-agent');

const dirs: string[] = [];
export function tmpDir(prefix = 'keygate-cp-'): string {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
}
export function cleanupTmp(): void {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

/** A copy of the echo agent with `edit` applied (file name -> new content). */
export function echoVariant(edit: Record<string, string> = {}): string {
  const dir = tmpDir('keygate-app-');
  cpSync(ECHO_AGENT, dir, { recursive: true });
  for (const [f, content] of Object.entries(edit)) writeFileSync(path.join(dir, f), content);
  return dir;
}

/** The echo agent whose keygate.json sets ECHO_PREFIX, so its replies differ. */
export function echoWithPrefix(prefix: string): string {
  const cfg = JSON.parse(readFileSync(path.join(ECHO_AGENT, 'keygate.json'), 'utf8'));
  cfg.env = { ECHO_PREFIX: prefix, ECHO_DELAY_MS: '5' };
  return echoVariant({ 'keygate.json': JSON.stringify(cfg) });
}

export async function packDir(dir: string): Promise<Buffer> {
  const out = path.join(tmpDir('keygate-tgz-'), 'app.tar.gz');
  await tar.c({ gzip: true, file: out, cwd: dir, portable: true }, readdirSync(dir));
  return readFileSync(out);
}

/** A hand-made archive: entries exactly as given (no sanitising by a tar writer). */
export function rawTarGz(entries: { path: string; type?: string; body?: string; linkpath?: string }[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? '');
    const h = new Header({ path: e.path, type: (e.type ?? 'File') as never, size: body.length, mode: 0o644, mtime: new Date(0), linkpath: e.linkpath });
    const b = Buffer.alloc(512);
    h.encode(b);
    blocks.push(b, Buffer.concat([body, Buffer.alloc((512 - (body.length % 512)) % 512)]));
  }
  blocks.push(Buffer.alloc(1024));
  return zlib.gzipSync(Buffer.concat(blocks));
}

export interface Api {
  base: string;
  key: string;
  call(method: string, p: string, body?: unknown, headers?: Record<string, string>): Promise<{ status: number; body: any; text: string }>;
  upload(tgz: Buffer, contentType?: string): Promise<{ status: number; body: any; text: string }>;
}

export function api(base: string, key: string): Api {
  const call = async (method: string, p: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(base + p, {
      method,
      headers: { 'x-api-key': key, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = undefined;
    }
    return { status: res.status, body: parsed as any, text };
  };
  return {
    base,
    key,
    call,
    async upload(tgz, contentType = 'application/gzip') {
      const res = await fetch(base + '/v2/uploads', { method: 'POST', headers: { 'x-api-key': key, 'content-type': contentType }, body: tgz });
      const text = await res.text();
      return { status: res.status, body: text ? JSON.parse(text) : undefined, text };
    },
  };
}

/** Uploads a directory and creates a deployment from it; returns the created deployment. */
export async function deployDir(a: Api, name: string, dir: string, extra: Record<string, unknown> = {}): Promise<any> {
  const up = await a.upload(await packDir(dir));
  if (up.status !== 201) throw new Error(`upload failed: ${up.status} ${up.text}`);
  const res = await a.call('POST', '/v2/deployments', { name, source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path }, ...extra });
  if (res.status !== 201) throw new Error(`create failed: ${res.status} ${res.text}`);
  return res.body;
}

const TERMINAL = new Set(['DEPLOYED', 'BUILD_FAILED', 'DEPLOY_FAILED', 'SKIPPED', 'INTERRUPTED', 'CREATE_FAILED']);

/** Polls a revision (spec workflow) until it reaches a terminal status; returns it. */
export async function waitRevision(a: Api, depId: string, revId: string, timeoutMs = 45_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  let last: any;
  while (Date.now() < deadline) {
    const r = await a.call('GET', `/v2/deployments/${depId}/revisions/${revId}`);
    last = r.body;
    if (r.status === 200 && TERMINAL.has(r.body.status)) return r.body;
    await new Promise((res) => setTimeout(res, 150));
  }
  throw new Error(`revision ${revId} did not finish: ${JSON.stringify(last)}`);
}

export interface RunResult {
  status: number;
  events: { event: string; data: string }[];
  text: string;
}

/** POST /runs/stream on a deployment URL; collects the SSE events. */
export async function runStream(url: string, key: string, content: string): Promise<RunResult> {
  const res = await fetch(`${url}/runs/stream`, {
    method: 'POST',
    headers: { 'x-api-key': key, 'content-type': 'application/json' },
    body: JSON.stringify({ assistant_id: 'agent', input: { messages: [{ role: 'user', content }] }, stream_mode: ['messages', 'updates'], config: { configurable: { delay_ms: 0 } } }),
  });
  const events: { event: string; data: string }[] = [];
  const text = await res.text();
  const parser = createParser({ onEvent: (e) => events.push({ event: e.event ?? 'message', data: e.data }) });
  parser.feed(text);
  return { status: res.status, events, text };
}

/** The complete reply of a run (content of the messages/complete event). */
export function replyOf(r: RunResult): string | undefined {
  const done = r.events.find((e) => e.event === 'messages/complete');
  return done ? JSON.parse(done.data)[0].content : undefined;
}

/** Live `keygate app serve` processes whose app lives under `dir` (from /proc). */
export function appProcessesUnder(dir: string): number[] {
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      const i = cmd.indexOf('--app');
      if (cmd.includes('serve') && i >= 0 && cmd[i + 1]?.startsWith(dir)) out.push(Number(p));
    } catch {
      /* gone */
    }
  }
  return out;
}
