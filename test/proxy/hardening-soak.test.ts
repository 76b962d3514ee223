/**
 * The short soak in CI (issue #9 part 5): `scripts/soak.mjs` for 30 s of mixed traffic
 * (intercepted, tunnelled, SSE, WebSocket, uploads) through a spawned proxy. Asserts zero
 * errors, no descriptor leak (open fds back within 4 of the start), and RSS growth under 64 MB
 * (the bound the script enforces; a warm proxy plateaus about 45 MB above its idle RSS).
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/proxy.js';

interface SoakReport {
  requests: number;
  by_kind: Record<string, number>;
  errors: number;
  error_samples: string[];
  p99_ms: number;
  rss_mb: { start: number; end: number };
  fds: { start: number; end: number };
  proxy_alive: boolean;
  secret_in_output: boolean;
  ok: boolean;
  problems: string[];
}

function runScript(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(REPO_ROOT, args[0]), ...args.slice(1)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (c) => resolve({ code: c, stdout: out, stderr: err }));
  });
}

describe('soak', () => {
  it('30 s of mixed traffic: no error, no descriptor leak, bounded RSS', async () => {
    const { code, stdout, stderr } = await runScript(['scripts/soak.mjs', '--duration', '30', '--concurrency', '4', '--json', '--max-rss-growth-mb', '64', '--max-fd-growth', '4']);
    const report = JSON.parse(stdout.trim().split('\n').pop() ?? '{}') as SoakReport;
    // The errors first: a failure then shows their samples, not only "N errors".
    expect(report.errors, report.error_samples?.join('; ')).toBe(0);
    expect(report.problems, stderr).toEqual([]);
    for (const kind of ['intercept', 'tunnel', 'sse', 'websocket', 'upload']) expect(report.by_kind[kind], kind).toBeGreaterThan(0);
    expect(report.fds.end - report.fds.start).toBeLessThanOrEqual(4);
    expect(report.rss_mb.end - report.rss_mb.start).toBeLessThan(64);
    expect(report.proxy_alive).toBe(true);
    expect(report.secret_in_output).toBe(false);
    expect(code).toBe(0);
  }, 120_000);
});

describe('fuzz (short)', () => {
  it('300 mutated CONNECT lines, heads and ClientHellos with a fixed seed: the proxy keeps serving good requests', async () => {
    const { code, stdout, stderr } = await runScript(['scripts/fuzz.mjs', '--iterations', '300', '--duration', '20', '--seed', '1234', '--json']);
    const report = JSON.parse(stdout.trim().split('\n').pop() ?? '{}') as { ok: boolean; failures: string[]; iterations: number; good_requests: number; proxy_alive: boolean; by_kind: Record<string, number> };
    expect(report.failures, stderr).toEqual([]);
    expect(report.proxy_alive).toBe(true);
    expect(report.good_requests).toBeGreaterThan(10);
    for (const kind of ['connect', 'head', 'inner', 'hello']) expect(report.by_kind[kind], kind).toBeGreaterThan(0);
    expect(code).toBe(0);
  }, 90_000);
});
