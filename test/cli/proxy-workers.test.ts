/**
 * `keygate proxy --workers N` end to end: the real CLI (run `npm run build` first), a trusted local
 * HTTPS origin, real clients through undici's ProxyAgent. Each request uses a fresh client, hence a
 * fresh connection, which the cluster hands out round-robin.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { runCli, spawnProxy, tempFile, type SpawnedProxy } from '../helpers/proxy.js';

const SECRET1 = 'kgWORKERS-first-3b9e1d';
const SECRET2 = 'kgWORKERS-second-7c4a20';
const CONFIG = { rules: [{ name: 'api', match_hosts: ['api.test.local'], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }] }] };

/** Live (not zombie) children of a process, from /proc. */
function childrenOf(ppid: number): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const [state, parent] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(parent) === ppid && state !== 'Z') out.push(Number(e));
    } catch {
      /* gone meanwhile */
    }
  }
  return out.sort((a, b) => a - b);
}

/** Processes whose command line contains `needle` (a test's unique temp path). */
function processesWith(needle: string): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${e}/cmdline`, 'utf8').includes(needle) && alive(Number(e))) out.push(Number(e));
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

async function waitFor<T>(what: string, probe: () => T | undefined | false, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = probe();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

let pki: TestPki;
let origin: TestOrigin;
const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-workers-'));

beforeAll(async () => {
  pki = await createTestPki(['api.test.local']);
  origin = await startOrigin(pki);
});
afterAll(async () => {
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
});

function startCluster(extraArgs: string[] = []): Promise<SpawnedProxy> {
  return spawnProxy({
    config: CONFIG,
    secrets: { API_TOKEN: SECRET1 },
    resolve: [`api.test.local:${origin.port}:127.0.0.1`],
    upstreamCa: [pki.caPem],
    extraArgs: ['--workers', '2', ...extraArgs],
  });
}

/** One request on its own connection: the Authorization header the origin received. */
async function injected(proxy: SpawnedProxy): Promise<string | undefined> {
  const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
  try {
    const res = await request(`https://api.test.local:${origin.port}/repos/x`, { dispatcher: agent });
    expect(res.statusCode).toBe(200);
    const body = (await res.body.json()) as { headers: [string, string][] };
    return body.headers.find(([k]) => k.toLowerCase() === 'authorization')?.[1];
  } finally {
    await agent.close();
  }
}

const requestLines = (proxy: SpawnedProxy) => proxy.logs().filter((l) => l.msg === 'request');

describe('keygate proxy --workers 2', () => {
  let proxy: SpawnedProxy;
  beforeAll(async () => {
    // --no-watch: a reload below can only come from the forwarded SIGHUP.
    proxy = await startCluster(['--no-watch']);
  });
  afterAll(async () => {
    const output = proxy?.output() ?? '';
    await proxy?.stop('SIGKILL');
    for (const v of [SECRET1, SECRET2]) expect(output).not.toContain(v);
  });

  it('injects through two worker processes sharing one port, announced once', async () => {
    const workers = childrenOf(proxy.pid);
    expect(workers).toHaveLength(2);
    const ready = await waitFor('two ready lines', () => {
      const r = proxy.logs().filter((l) => typeof l.msg === 'string' && /^worker \d+ ready$/.test(l.msg));
      return r.length === 2 && r;
    });
    expect(ready.map((l) => l.pid).sort()).toEqual(workers);
    expect(new Set(ready.map((l) => l.worker)).size).toBe(2);
    for (const l of ready) expect(l.url).toBe(proxy.url); // --listen 127.0.0.1:0: one port for all
    const listening = proxy.logs().filter((l) => typeof l.msg === 'string' && l.msg.startsWith('listening on'));
    expect(listening).toHaveLength(1);
    expect(listening[0]).toMatchObject({ workers: 2, url: proxy.url, rules: ['api'] });

    for (let i = 0; i < 12; i++) expect(await injected(proxy)).toBe(`Bearer ${SECRET1}`);
    const lines = await waitFor('12 access-log lines', () => requestLines(proxy).length >= 12 && requestLines(proxy));
    expect(new Set(lines.map((l) => l.worker)).size).toBe(2);
    expect(new Set(lines.map((l) => l.pid))).toEqual(new Set(workers));
  });

  it('SIGHUP to the primary reloads every worker', async () => {
    writeFileSync(path.join(proxy.dir, 'secrets.json'), JSON.stringify({ API_TOKEN: SECRET2 }));
    const workers = childrenOf(proxy.pid);
    process.kill(proxy.pid, 'SIGHUP');
    const reloaded = await waitFor('both workers reloaded', () => {
      const r = proxy.logs().filter((l) => l.msg === 'configuration applied' && l.source === 'sighup');
      return r.length === 2 && r;
    });
    expect(reloaded.map((l) => l.pid).sort()).toEqual(workers);
    const before = requestLines(proxy).length;
    for (let i = 0; i < 12; i++) expect(await injected(proxy)).toBe(`Bearer ${SECRET2}`);
    const lines = await waitFor('12 more access-log lines', () => requestLines(proxy).length >= before + 12 && requestLines(proxy).slice(before));
    expect(new Set(lines.map((l) => l.worker)).size).toBe(2);
  });

  it('a killed worker is replaced while the other keeps serving', async () => {
    const [victim, survivor] = childrenOf(proxy.pid);
    process.kill(victim, 'SIGKILL');
    const warn = await waitFor('the restart warning', () => proxy.logs().find((l) => l.level === 40 && l.worker_pid === victim));
    expect(warn).toMatchObject({ signal: 'SIGKILL', code: null });
    // Served in the gap by the survivor.
    expect(await injected(proxy)).toBe(`Bearer ${SECRET2}`);
    const replacement = await waitFor('a replacement', () => proxy.logs().find((l) => l.msg === 'worker 3 ready'));
    expect(childrenOf(proxy.pid)).toEqual([survivor, replacement.pid as number].sort((a, b) => a - b));
    expect(alive(victim)).toBe(false);
    const before = requestLines(proxy).length;
    // The replacement read the current secret itself.
    for (let i = 0; i < 8; i++) expect(await injected(proxy)).toBe(`Bearer ${SECRET2}`);
    const lines = await waitFor('8 more access-log lines', () => requestLines(proxy).length >= before + 8 && requestLines(proxy).slice(before));
    expect(new Set(lines.map((l) => l.pid))).toEqual(new Set([survivor, replacement.pid]));
  });

  it('SIGTERM lets a stream in flight finish, then exits 0 with every worker gone', async () => {
    const workers = childrenOf(proxy.pid);
    expect(workers).toHaveLength(2);
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
    try {
      const res = await request(`https://api.test.local:${origin.port}/sse?n=2`, { dispatcher: agent });
      const it = res.body[Symbol.asyncIterator]();
      await it.next(); // event 1 arrived: the request is in flight in one of the workers
      const exited = new Promise<number | null>((r) => proxy.child.once('exit', (code) => r(code)));
      proxy.child.kill('SIGTERM');
      await waitFor('both workers draining', () => proxy.logs().filter((l) => typeof l.msg === 'string' && l.msg.startsWith('shutting down: no new connections')).length === 2);
      origin.release();
      let rest = '';
      for (let r = await it.next(); !r.done; r = await it.next()) rest += Buffer.from(r.value as Uint8Array).toString();
      expect(rest).toContain('data: 2');
      expect(await exited).toBe(0);
    } finally {
      await agent.close();
    }
    for (const pid of workers) expect(alive(pid)).toBe(false);
    expect(proxy.logs().filter((l) => l.msg === 'stopped' && l.worker !== undefined)).toHaveLength(2);
  });
});

describe('keygate proxy --workers 1', () => {
  it('is the single process of old: no worker, no cluster fields', async () => {
    const proxy = await startCluster(['--workers', '1']);
    try {
      expect(await injected(proxy)).toBe(`Bearer ${SECRET1}`);
      expect(childrenOf(proxy.pid)).toEqual([]);
      const listening = proxy.logs().find((l) => typeof l.msg === 'string' && l.msg.startsWith('listening on'));
      expect(listening).toBeDefined();
      expect(listening).not.toHaveProperty('workers');
      expect(proxy.logs().some((l) => 'worker' in l)).toBe(false);
    } finally {
      expect(await proxy.stop()).toBe(0);
    }
  });
});

describe('keygate proxy --workers: failures', () => {
  it('a bad count or --admin with several workers is a usage error (exit 2)', async () => {
    const config = tempFile(dir, 'ok.json', JSON.stringify({ rules: [] }));
    for (const bad of ['0', 'abc', '1.5', '257', '']) {
      const r = await runCli(['proxy', '--config', config, '--workers', bad]);
      expect(r.code, bad).toBe(2);
      expect(r.stderr).toBe(`keygate: --workers must be a whole number from 1 to 256, or auto (got '${bad}')\n`);
    }
    for (const n of ['2', 'auto']) {
      const r = await runCli(['proxy', '--config', config, '--workers', n, '--admin', '127.0.0.1:0']);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain('--admin needs --workers 1 for now');
    }
  });

  it('a bad configuration fails once, in the primary, before any worker starts', async () => {
    const config = tempFile(dir, 'bad.json', JSON.stringify({ rules: [{ name: 'r', match_hosts: ['bad host'] }] }));
    const r = await runCli(['proxy', '--config', config, '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs-bad'), '--workers', '2']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/rules\[0\]\.match_hosts\[0\]: Invalid host pattern/);
    expect(r.stderr.match(/keygate: /g)).toHaveLength(1);
    expect(r.stdout).toBe('');
    expect(existsSync(path.join(dir, 'certs-bad'))).toBe(false);
  });

  it('a port in use fails start-up with the worker reason, no worker left behind', async () => {
    const taken = net.createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const port = (taken.address() as net.AddressInfo).port;
    const config = tempFile(dir, 'plain.json', JSON.stringify({ rules: [] }));
    try {
      const r = await runCli(['proxy', '--config', config, '--listen', `127.0.0.1:${port}`, '--certs', path.join(dir, 'certs-port'), '--workers', '2', '--grace', '1']);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`cannot listen on 127.0.0.1:${port}: EADDRINUSE`);
      expect(r.stderr).toMatch(/proxy worker \d+ stopped during start-up \(exit code 1\)/);
      // The CA was created once, by the primary.
      expect(existsSync(path.join(dir, 'certs-port', 'ca.pem'))).toBe(true);
      expect(processesWith(path.join(dir, 'certs-port'))).toEqual([]);
    } finally {
      taken.close();
    }
  });

  it('gives up with exit 1 when workers keep crashing', async () => {
    const proxy = await startCluster();
    try {
      const exited = new Promise<number | null>((r) => proxy.child.once('exit', (code) => r(code)));
      // Log lines are written in batches: a worker killed at once would take its 'ready' line along.
      await waitFor('both ready lines', () => proxy.logs().filter((l) => typeof l.msg === 'string' && /^worker \d+ ready$/.test(l.msg)).length === 2);
      for (let k = 1; k <= 5; k++) {
        const [victim] = childrenOf(proxy.pid);
        process.kill(victim, 'SIGKILL');
        if (k < 5) await waitFor(`replacement ${k}`, () => proxy.logs().some((l) => l.msg === `worker ${k + 2} ready`));
      }
      expect(await exited).toBe(1);
      expect(proxy.output()).toContain('keygate: proxy workers stopped unexpectedly 5 times within 60 s; giving up');
      expect(proxy.logs().filter((l) => l.level === 40 && l.signal === 'SIGKILL').map((l) => l.restart_in_ms)).toEqual([100, 200, 400, 800]);
      const seen = proxy.logs().filter((l) => typeof l.msg === 'string' && /^worker \d+ ready$/.test(l.msg)).map((l) => l.pid as number);
      expect(seen, proxy.output()).toHaveLength(6);
      for (const pid of seen) expect(alive(pid)).toBe(false);
      expect(proxy.output()).not.toContain(SECRET1);
    } finally {
      await proxy.stop('SIGKILL');
    }
  });
});
