import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import type { EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { DockerEngine } from '../../src/docker/engine.js';
import { ensureBoxImage } from '../helpers/box-image.js';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { dockerSocket } from '../helpers/docker-engine.js';
import { execIn, driversUnavailable, setUpServe, waitStatus } from './box-helpers.js';
import { api, cleanTmp, tmp } from './helpers.js';

// Hostile API input against real boxes behind a real `keygate serve` (both real drivers): requests
// that the API must refuse in wire.md's shape without starting or leaving anything, and lifecycle
// operations that must not undo a stop.

const UNAVAILABLE = await driversUnavailable('hostile input tests');

const KEY = 'hostile-inputs-key-0123456789abcdef';
const ORIGIN_HOST = 'api.example.test';

/** Directories of the cgroup(s) named `id` under this server's cgroup of the pids hierarchy (v1), if any. */
function boxCgroupDirs(serverPid: number, id: string): string[] {
  let own: string | undefined;
  try {
    own = readFileSync(`/proc/${serverPid}/cgroup`, 'utf8').split('\n').map((l) => l.split(':')).find((l) => l[1]?.split(',').includes('pids'))?.[2];
  } catch {
    return [];
  }
  if (own === undefined) return [];
  const base = path.join('/sys/fs/cgroup/pids', own);
  let tags: string[];
  try {
    tags = readdirSync(base).filter((n) => n.startsWith('keygate-'));
  } catch {
    return [];
  }
  return tags.map((t) => path.join(base, t, id)).filter((d) => {
    try {
      readdirSync(d);
      return true;
    } catch {
      return false;
    }
  });
}

describe.each(['local', 'docker'] as const)('hostile API input (%s driver)', (which) => {
  describe.skipIf(UNAVAILABLE[which])(which, () => {
    let origin: EchoOrigin;
    let server: RunningCli;
    const A = (method: string, url: string, body?: unknown) => api(server.url, KEY, method, url, body);

    beforeAll(async () => {
      const cfg = tmp();
      const image = which === 'docker' ? await ensureBoxImage(new DockerEngine(dockerSocket()!)) : undefined;
      writeFileSync(path.join(cfg, 'templates.json'), JSON.stringify([{ name: 'box', description: 'hostile input', ...(image ? { image } : { rootfs: 'host' }), environment: {} }]));
      let env: NodeJS.ProcessEnv;
      let dataDir: string;
      ({ origin, dataDir, env } = await setUpServe(KEY, ORIGIN_HOST));
      server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', which, '--config-dir', cfg], { env });
      await waitForLine(server, (l) => l.startsWith(`sandbox driver ${which}`));
      const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'in1', wait_for_ready: true });
      expect(r.body.status, r.text).toBe('ready');
    }, 90_000);

    afterAll(async () => {
      if (server) for (const b of (await A('GET', '/api/v2/sandboxes/boxes?limit=100')).body.resources) await A('DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
      if (server) expect(await server.stop(), server.output().slice(-3000)).toBe(0);
      await origin?.close();
      cleanTmp();
    });

    // A NUL cannot be passed to exec; "=" in the program name would be read by `env` as a variable.
    const BAD: [string, Record<string, unknown>, (string | number)[]][] = [
      ['NUL in a command line', { command: 'echo hi\u0000' }, ['body', 'command']],
      ['NUL in an argv item', { command: ['echo', 'h\u0000i'] }, ['body', 'command', 1]],
      ['NUL in the program', { command: ['ec\u0000ho', 'hi'] }, ['body', 'command', 0]],
      ['"=" in the program', { command: ['A=B', 'hi'] }, ['body', 'command', 0]],
      ['NUL in an env value', { command: 'echo hi', env: { A: 'x\u0000y' } }, ['body', 'env', 'A']],
      ['NUL in cwd', { command: 'echo hi', cwd: '/tmp\u0000x' }, ['body', 'cwd']],
    ];

    it('execute: what no process can be started with is a 422 at its loc (HTTP), never a 500 or a run', async () => {
      const id = (await A('GET', '/api/v2/sandboxes/boxes/in1')).body.id as string;
      for (const [what, body, loc] of BAD) {
        const r = await A('POST', '/api/v2/sandboxes/boxes/in1/execute', body);
        expect(r.status, `${what}: ${r.text}`).toBe(422);
        expect(r.body.detail.map((d: { loc: unknown }) => JSON.stringify(d.loc)), what).toContain(JSON.stringify(loc));
      }
      // Nothing was left behind by the refusals (the local driver makes a cgroup per execution).
      if (which === 'local') {
        for (const dir of boxCgroupDirs(server.proc.pid!, id)) {
          const left = readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
          expect(left, dir).toEqual([]);
        }
      }
      // ... and the box still runs commands.
      expect((await execIn(server.url, KEY, 'in1', ['echo', 'still here'])).stdout).toBe('still here\n');
    });

    it('execute over the WebSocket: the same requests get an error frame with a 422 detail, then close 1008', async () => {
      for (const [what, body, loc] of BAD) {
        const ws = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/in1/execute/ws`, { headers: { 'x-api-key': KEY } });
        const msgs: any[] = [];
        ws.on('message', (m) => msgs.push(JSON.parse(m.toString())));
        const code = await new Promise<number>((resolve) => {
          ws.on('open', () => ws.send(JSON.stringify(body)));
          ws.on('close', (c) => resolve(c));
          ws.on('error', () => undefined);
        });
        expect(code, what).toBe(1008);
        expect(msgs.map((m) => m.type), what).not.toContain('started');
        const err = msgs.find((m) => m.type === 'error');
        expect(Array.isArray(err?.detail), `${what}: ${JSON.stringify(msgs)}`).toBe(true);
        expect(err.detail.map((d: { loc: unknown }) => JSON.stringify(d.loc)), what).toContain(JSON.stringify(loc));
      }
    });

    it('an upload where the box may not write is a 422 at query.path, the same on both drivers (never a 500)', async () => {
      for (const p of ['/etc/x', '/usr/x', '/proc/x', '/dev/null']) {
        const r = await fetch(`${server.url}/api/v2/sandboxes/boxes/in1/files?path=${encodeURIComponent(p)}`, { method: 'PUT', headers: { 'x-api-key': KEY }, body: 'x' });
        const text = await r.text();
        expect(r.status, `${p}: ${text}`).toBe(422);
        expect(JSON.parse(text).detail[0].loc, p).toEqual(['query', 'path']);
        expect(JSON.parse(text).detail[0].msg, p).toMatch(/not writable/);
      }
    });

    it("one box's download held open by a client that does not read holds up no other box's execute, timeout or stop", async () => {
      const made = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'dl1', wait_for_ready: true });
      expect(made.body.status, made.text).toBe('ready');
      expect((await execIn(server.url, KEY, 'dl1', 'head -c 20000000 /dev/zero > /workspace/big && echo made')).stdout).toBe('made\n');
      const ctl = new AbortController();
      const held = await fetch(`${server.url}/api/v2/sandboxes/boxes/dl1/files?path=/workspace/big`, { headers: { 'x-api-key': KEY }, signal: ctl.signal });
      expect(held.status).toBe(200);
      try {
        // The body is not read: the server's stream and whatever feeds it wait for the client.
        await new Promise((r) => setTimeout(r, 1000));
        const t0 = Date.now();
        const r = await execIn(server.url, KEY, 'in1', ['echo', 'not held up']);
        expect(r.stdout).toBe('not held up\n');
        const timed = await execIn(server.url, KEY, 'in1', 'sleep 30', { timeout_seconds: 1 });
        expect(timed.timed_out).toBe(true);
        expect((await A('POST', '/api/v2/sandboxes/boxes/in1/stop')).body.status).toBe('stopped');
        expect(Date.now() - t0, 'execute, a timeout and a stop of another box').toBeLessThan(15_000);
        expect((await A('POST', '/api/v2/sandboxes/boxes/in1/start')).body.status).toBe('ready');
      } finally {
        ctl.abort();
      }
    }, 90_000);

    it('a box that ends by itself reads stopped, with why: execute is a 409, not a 500; start brings it back', async () => {
      const made = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'self1', wait_for_ready: true });
      expect(made.body.status, made.text).toBe('ready');
      if (which === 'local') {
        // The box's own code can end it: its main process (bwrap's init's one child) is the box's user's.
        await A('POST', '/api/v2/sandboxes/boxes/self1/execute', { command: 'for p in /proc/[0-9]*; do [ "$(cat $p/cmdline | tr "\\0" " ")" = "sleep infinity " ] && kill -9 ${p#/proc/}; done; sleep 5' });
      } else {
        // The container dies under the box (OOM killer, the engine): as if the engine had killed it.
        const engine = new DockerEngine(dockerSocket()!);
        const list = await engine.json<{ Id: string }[]>('GET', `/containers/json?filters=${encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox=${made.body.id}`] }))}`);
        expect(list.body.length).toBe(1);
        expect((await engine.json('POST', `/containers/${list.body[0].Id}/kill`)).status).toBe(204);
        await engine.close();
      }
      const stopped = await waitStatus(server.url, KEY, 'self1', 'stopped', 15_000);
      expect(stopped.body.status_reason).toMatch(/ended by itself/);
      const r = await A('POST', '/api/v2/sandboxes/boxes/self1/execute', { command: 'true' });
      expect(r.status, r.text).toBe(409);
      const f = await A('GET', '/api/v2/sandboxes/boxes/self1/files?path=/workspace/x');
      expect(f.status, f.text).toBe(409);
      expect((await A('POST', '/api/v2/sandboxes/boxes/self1/start')).body.status).toBe('ready');
      expect((await execIn(server.url, KEY, 'self1', ['echo', 'back'])).stdout).toBe('back\n');
    }, 60_000);

    it('a PATCH of a stopped box keeps it stopped (no process, 409 on execute); start applies the new proxy_config', async () => {
      const made = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'st1', wait_for_ready: true });
      expect(made.body.status, made.text).toBe('ready');
      expect((await A('POST', '/api/v2/sandboxes/boxes/st1/stop')).body.status).toBe('stopped');
      const config = { rules: [{ name: 'hunt', match_hosts: [ORIGIN_HOST], headers: [{ name: 'X-Hunt', type: 'plaintext', value: 'patched-while-stopped' }] }] };
      const patched = await A('PATCH', '/api/v2/sandboxes/boxes/st1', { proxy_config: config, idle_ttl_seconds: 900 });
      expect(patched.status, patched.text).toBe(200);
      expect(patched.body.status).toBe('stopped');
      expect(patched.body.proxy_config.rules[0].name).toBe('hunt');
      expect(patched.body.idle_ttl_seconds).toBe(900);
      const refused = await A('POST', '/api/v2/sandboxes/boxes/st1/execute', { command: 'true' });
      expect(refused.status, refused.text).toBe(409);
      expect((await A('GET', '/api/v2/sandboxes/boxes/st1')).body.status).toBe('stopped');
      // start brings it back with the configuration it was given while stopped.
      expect((await A('POST', '/api/v2/sandboxes/boxes/st1/start')).body.status).toBe('ready');
      const r = await execIn(server.url, KEY, 'st1', `curl -sS --max-time 10 https://${ORIGIN_HOST}:${origin.port}/api/user`);
      expect(r.exit_code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout).headers['x-hunt']).toBe('patched-while-stopped');
    }, 60_000);

    it('a file transfer keeps its box from the idle TTL: a slow upload and a slow download go through whole', async () => {
      const made = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'slow1', wait_for_ready: true, idle_ttl_seconds: 1 });
      expect(made.body.status, made.text).toBe('ready');
      const MiB = 1024 * 1024;
      // 4 MiB over ~4 s: four times the idle TTL.
      const chunks = 16;
      async function* trickle() {
        for (let i = 0; i < chunks; i++) {
          await new Promise((r) => setTimeout(r, 250));
          yield Buffer.alloc(MiB / 4, i);
        }
      }
      const up = await fetch(`${server.url}/api/v2/sandboxes/boxes/slow1/files?path=/workspace/slow.bin`, {
        method: 'PUT',
        headers: { 'x-api-key': KEY, 'content-type': 'application/octet-stream' },
        body: Readable.toWeb(Readable.from(trickle())) as ReadableStream,
        duplex: 'half',
      } as RequestInit);
      expect(up.status, await up.clone().text()).toBe(201);
      expect(((await up.json()) as { size: number }).size).toBe(chunks * (MiB / 4));
      // Read back at ~1 MiB/s.
      const down = await fetch(`${server.url}/api/v2/sandboxes/boxes/slow1/files?path=/workspace/slow.bin`, { headers: { 'x-api-key': KEY } });
      expect(down.status).toBe(200);
      let got = 0;
      const reader = down.body!.getReader();
      for (;;) {
        const { done, value } = await reader.read().catch(() => ({ done: true, value: undefined }));
        if (done) break;
        got += value!.length;
        await new Promise((r) => setTimeout(r, Math.ceil(value!.length / MiB * 1000)));
      }
      expect(got).toBe(chunks * (MiB / 4));
      // Idle once nothing moves: then the TTL stops it.
      await waitStatus(server.url, KEY, 'slow1', 'stopped', 15_000);
      // A stop in the middle of an upload: the upload says the box was stopped (409), in wire.md's shape.
      expect((await A('POST', '/api/v2/sandboxes/boxes/slow1/start')).body.status).toBe('ready');
      const cut = fetch(`${server.url}/api/v2/sandboxes/boxes/slow1/files?path=/workspace/cut.bin`, {
        method: 'PUT',
        headers: { 'x-api-key': KEY, 'content-type': 'application/octet-stream' },
        body: Readable.toWeb(Readable.from(trickle())) as ReadableStream,
        duplex: 'half',
      } as RequestInit);
      await new Promise((r) => setTimeout(r, 1000));
      expect((await A('POST', '/api/v2/sandboxes/boxes/slow1/stop')).body.status).toBe('stopped');
      const res = await cut;
      const text = await res.text();
      expect(res.status, text).toBe(409);
      expect(JSON.parse(text).detail).toMatch(/stopped during the file transfer/);
    }, 60_000);
  });
});
