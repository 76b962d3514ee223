import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';

export const tmpDirs: string[] = [];
export function tmp(prefix = 'keygate-sbx-'): string {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}
export function cleanTmp(): void {
  for (const d of tmpDirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

export interface ApiResult {
  status: number;
  body: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  text: string;
}

/** One call to the API; `key` null sends no credential. */
export async function api(base: string, key: string | null, method: string, url: string, body?: unknown): Promise<ApiResult> {
  const headers: Record<string, string> = {};
  if (key !== null) headers['x-api-key'] = key;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(base + url, { method, headers, body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = text;
  }
  return { status: res.status, body: parsed, text };
}

/** A request from "inside the sandbox": through its proxy URL, trusting only the proxy CA. */
export async function viaProxy(proxyUrl: string, caPem: string, url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const agent = new ProxyAgent({ uri: proxyUrl, requestTls: { ca: caPem } });
  try {
    const res = await request(url, { dispatcher: agent, headers });
    const text = await res.body.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      /* keep text */
    }
    return { status: res.statusCode, body };
  } finally {
    await agent.close();
  }
}

export function portAccepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

export async function waitFor<T>(fn: () => Promise<T | undefined | false>, what: string, ms = 15_000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
