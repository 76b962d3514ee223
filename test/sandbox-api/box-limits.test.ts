import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { DockerEngine } from '../../src/docker/engine.js';
import { ensureBoxImage } from '../helpers/box-image.js';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { dockerSocket } from '../helpers/docker-engine.js';
import { execIn, driversUnavailable, setUpServe } from './box-helpers.js';
import { api, cleanTmp, tmp } from './helpers.js';

// What a box, or an API caller, can take of the host: disk under /workspace (disk_mb), real
// boxes behind a real `keygate serve`, both real drivers.

const UNAVAILABLE = await driversUnavailable('box limit tests');
const KEY = 'box-limits-key-0123456789abcdef';
const MiB = 1024 * 1024;
/** Sandboxes one workspace may hold, and relayed connections the server carries at once, in this file's server. */
const MAX_PER_WORKSPACE = 4;
const RELAY_TOTAL = 300;

/**
 * Run in a box by node: opens N connections to the relay at 127.0.0.1:3128, holds them at least
 * HOLD ms and until none has changed state for 500 ms (a loaded machine answers the refusals
 * late: counted too early, they would look alive), then says how many are still open, how many
 * were answered 503 (and the first answer's text), and how many were closed without a word.
 */
const HOLD_JS = `
const net = require('net');
const [n, hold] = process.argv.slice(1).map(Number);
let refused = 0, closed = 0, msg = '', changed = Date.now();
const started = Date.now();
const socks = [];
for (let i = 0; i < n; i++) {
  const s = net.connect(3128, '127.0.0.1');
  let data = '';
  s.on('connect', () => (changed = Date.now()));
  s.on('data', (d) => (data += d));
  s.on('error', () => {});
  s.on('close', () => { changed = Date.now(); if (data.startsWith('HTTP/1.1 503')) { refused++; msg = msg || data.split('\\r\\n\\r\\n')[1]; } else closed++; });
  socks.push(s);
}
const check = setInterval(() => {
  const now = Date.now();
  if (now - started < hold || (now - changed < 500 && now - started < hold + 15000)) return;
  clearInterval(check);
  const alive = socks.filter((s) => !s.destroyed && s.readyState === 'open').length;
  console.log(JSON.stringify({ alive, refused, closed, msg }));
  process.exit(0);
}, 50);
`;

/** Host mounts (this process's view) whose line names `dir`. */
function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(dir));
}

describe.each(['local', 'docker'] as const)('box limits (%s driver)', (which) => {
  describe.skipIf(UNAVAILABLE[which])(which, () => {
    let origin: EchoOrigin;
    let server: RunningCli;
    let dataDir: string;
    let keyB: string;
    // The box's node: the host's (local, `host` template), or the one the docker driver lends every box.
    const nodeIn = which === 'local' ? ['node'] : ['/.keygate/lib/ld.so', '--library-path', '/.keygate/lib', '/.keygate/node'];
    const hold = (box: string, n: number, ms: number) =>
      execIn(server.url, KEY, box, [...nodeIn, '-e', HOLD_JS, String(n), String(ms)]).then((r) => JSON.parse(r.stdout) as { alive: number; refused: number; closed: number; msg: string });
    const A = (method: string, url: string, body?: unknown) => api(server.url, KEY, method, url, body);
    const put = (box: string, p: string, body: Buffer) =>
      fetch(`${server.url}/api/v2/sandboxes/boxes/${box}/files?path=${encodeURIComponent(p)}`, { method: 'PUT', headers: { 'x-api-key': KEY }, body });

    beforeAll(async () => {
      const cfg = tmp();
      const image = which === 'docker' ? await ensureBoxImage(new DockerEngine(dockerSocket()!)) : undefined;
      const build = image ? { image } : { rootfs: 'host' };
      writeFileSync(
        path.join(cfg, 'templates.json'),
        JSON.stringify([
          { name: 'box', description: 'limits', ...build, environment: {} },
          { name: 'capped', description: 'capped', ...build, environment: {}, resources: { memory_mb: 256, disk_mb: 64 }, max_resources: { memory_mb: 512, cpus: 1, pids: 128, disk_mb: 128 } },
        ]),
      );
      let env: NodeJS.ProcessEnv;
      ({ origin, dataDir, env, keyB } = await setUpServe(KEY, 'api.example.test', {
        KEYGATE_SANDBOX_MAX_PER_WORKSPACE: String(MAX_PER_WORKSPACE),
        KEYGATE_SANDBOX_RELAY_CONNECTIONS: String(RELAY_TOTAL),
      }));
      server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', which, '--config-dir', cfg], { env });
      await waitForLine(server, (l) => l.startsWith(`sandbox driver ${which}`));
    }, 90_000);

    afterAll(async () => {
      if (server) for (const b of (await A('GET', '/api/v2/sandboxes/boxes?limit=100')).body.resources) await A('DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
      if (server) for (const b of (await api(server.url, keyB, 'GET', '/api/v2/sandboxes/boxes?limit=100')).body.resources) await api(server.url, keyB, 'DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
      if (server) expect(await server.stop(), server.output().slice(-3000)).toBe(0);
      await origin?.close();
      if (dataDir) expect(mountsUnder(dataDir)).toEqual([]);
      cleanTmp();
    });

    it('/workspace holds disk_mb and no more: the box gets ENOSPC, an upload that cannot fit is a 413, the host keeps its disk', async () => {
      const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'disk1', wait_for_ready: true, resources: { disk_mb: 32 } });
      expect(r.body.status, r.text).toBe('ready');
      expect(r.body.resources.disk_mb).toBe(32);
      // A box that writes past its size is stopped by the file system, not by the host's disk filling.
      const dd = await execIn(server.url, KEY, 'disk1', 'dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; echo rc=$?; du -sk /workspace | cut -f1');
      expect(dd.stdout).toMatch(/No space left on device/);
      expect(dd.stdout).not.toMatch(/rc=0/);
      const usedKb = Number(dd.stdout.trim().split('\n').pop());
      expect(usedKb).toBeLessThanOrEqual(32 * 1024);
      if (which === 'local') {
        const hostKb = Number(execFileSync('du', ['-skx', dataDir], { encoding: 'utf8' }).split('\t')[0]);
        expect(hostKb).toBeLessThan(40 * 1024);
      }
      // Through the files API: larger than the whole disk (refused while streaming), then one that
      // does not fit in what is left. Both 413 with wire.md's {"detail": string}.
      const big = await put('disk1', '/workspace/big.bin', Buffer.alloc(40 * MiB, 1));
      expect(big.status).toBe(413);
      expect(typeof ((await big.json()) as { detail: unknown }).detail).toBe('string');
      const rest = await put('disk1', '/workspace/rest.bin', Buffer.alloc(8 * MiB, 1));
      expect(rest.status).toBe(413);
      expect(typeof ((await rest.json()) as { detail: unknown }).detail).toBe('string');
      // Room again once the box frees it; the files survive a stop and a start.
      await execIn(server.url, KEY, 'disk1', 'rm -f /workspace/fill');
      const ok = await put('disk1', '/workspace/ok.bin', Buffer.alloc(8 * MiB, 2));
      expect(ok.status).toBe(201);
      expect((await A('POST', '/api/v2/sandboxes/boxes/disk1/stop')).body.status).toBe('stopped');
      expect((await A('POST', '/api/v2/sandboxes/boxes/disk1/start')).body.status).toBe('ready');
      expect((await execIn(server.url, KEY, 'disk1', 'wc -c </workspace/ok.bin')).stdout.trim()).toBe(String(8 * MiB));
      // The box's own view of its mounts names nothing of the host's data directory.
      const mi = await execIn(server.url, KEY, 'disk1', 'cat /proc/self/mountinfo');
      expect(mi.stdout).toContain(' /workspace ');
      expect(mi.stdout.split('\n').filter((l) => / \/workspace /.test(l))).toEqual([expect.not.stringContaining(dataDir)]);
      expect((await A('DELETE', '/api/v2/sandboxes/boxes/disk1')).status).toBe(204);
      expect(mountsUnder(dataDir)).toEqual([]);
    }, 120_000);

    it("the box's view of its mounts names no path of the host's data directory", async () => {
      const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'mounts1', wait_for_ready: true });
      expect(r.body.status, r.text).toBe('ready');
      const mi = await execIn(server.url, KEY, 'mounts1', 'cat /proc/self/mountinfo; cat /etc/keygate/ca.pem | head -1');
      expect(mi.stdout).toContain('-----BEGIN CERTIFICATE-----');
      const leaks = mi.stdout.split('\n').filter((l) => l.includes(dataDir) || l.includes('/sandboxes/'));
      expect(leaks).toEqual([]);
      expect((await A('DELETE', '/api/v2/sandboxes/boxes/mounts1')).status).toBe(204);
    }, 60_000);

    it("a template's max_resources caps what a create may ask: past it a 422 at the field, nothing made", async () => {
      const over = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'capped', name: 'cap1', wait_for_ready: true, resources: { memory_mb: 4096, pids: 128, disk_mb: 102400 } });
      expect(over.status).toBe(422);
      expect(over.body.detail.map((d: { loc: unknown[] }) => d.loc)).toEqual([
        ['body', 'resources', 'memory_mb'],
        ['body', 'resources', 'disk_mb'],
      ]);
      expect(over.body.detail[0].msg).toBe("Template 'capped' allows at most 512 for memory_mb");
      expect((await A('GET', '/api/v2/sandboxes/boxes/cap1')).status).toBe(404);
      const ok = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'capped', name: 'cap2', wait_for_ready: true, resources: { memory_mb: 512, disk_mb: 128 } });
      expect(ok.body.status, ok.text).toBe('ready');
      // pids: the built-in default (256) is above the template's cap, so the cap.
      expect(ok.body.resources).toEqual({ memory_mb: 512, cpus: 1, pids: 128, disk_mb: 128 });
      expect((await A('DELETE', '/api/v2/sandboxes/boxes/cap2')).status).toBe(204);
    }, 60_000);

    it('a box without disk_mb gets the default, as its record says', async () => {
      const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'disk2', wait_for_ready: true });
      expect(r.body.status, r.text).toBe('ready');
      expect(r.body.resources.disk_mb).toBe(1024);
      const df = await execIn(server.url, KEY, 'disk2', "df -k /workspace | tail -1 | awk '{print $2}'");
      // The file system's own size (less what ext4 keeps for itself), not the host's disk.
      expect(Number(df.stdout.trim())).toBeLessThanOrEqual(1024 * 1024);
      expect(Number(df.stdout.trim())).toBeGreaterThan(900 * 1024);
      expect((await A('DELETE', '/api/v2/sandboxes/boxes/disk2')).status).toBe(204);
    }, 60_000);

    it('a box floods its relay: connections past its own bound, then past the server\'s, are answered 503 saying which; the API answers on', async () => {
      for (const name of ['flood1', 'flood2']) {
        const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name, wait_for_ready: true });
        expect(r.body.status, r.text).toBe('ready');
      }
      // One box alone: 256 carried, the rest refused (a 503 naming the box's bound, or closed at once).
      const one = await hold('flood1', 300, 1500);
      expect(one.alive).toBe(256);
      expect(one.refused + one.closed).toBe(44);
      expect(one.refused).toBeGreaterThan(0);
      expect(one.msg).toMatch(/this sandbox has reached its limit of 256 connections/);
      // Two at once: the first holds its 256, the second gets what is left of the server's 300.
      const first = hold('flood1', 256, 6000);
      await new Promise((r) => setTimeout(r, 2500));
      const second = await hold('flood2', 100, 1500);
      expect(second.alive).toBe(RELAY_TOTAL - 256);
      expect(second.msg).toMatch(new RegExp(`keygate has reached its limit of ${RELAY_TOTAL} sandbox proxy connections`));
      // Meanwhile the API answers.
      expect((await A('GET', '/api/v2/sandboxes/boxes/flood1')).status).toBe(200);
      expect((await first).alive).toBe(256);
      // Once they are gone, the places come back.
      await new Promise((r) => setTimeout(r, 500));
      expect((await hold('flood2', 50, 1000)).alive).toBe(50);
      for (const name of ['flood1', 'flood2']) expect((await A('DELETE', `/api/v2/sandboxes/boxes/${name}`)).status).toBe(204);
    }, 120_000);

    it('a workspace holds at most KEYGATE_SANDBOX_MAX_PER_WORKSPACE sandboxes: the next create is a 403 that says so; other workspaces are not held back', async () => {
      const made: string[] = [];
      for (let i = 0; i < MAX_PER_WORKSPACE; i++) {
        const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: `q${i}` });
        expect(r.status, r.text).toBe(201);
        made.push(`q${i}`);
      }
      const over = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'q-over', wait_for_ready: true });
      expect(over.status).toBe(403);
      expect(over.body).toEqual({ detail: `This workspace has reached its limit of ${MAX_PER_WORKSPACE} sandboxes (KEYGATE_SANDBOX_MAX_PER_WORKSPACE); delete one first.` });
      expect((await A('GET', '/api/v2/sandboxes/boxes/q-over')).status).toBe(404);
      // Concurrent creates cannot both take a freed place.
      expect((await A('DELETE', '/api/v2/sandboxes/boxes/q0')).status).toBe(204);
      const race = await Promise.all(['r1', 'r2', 'r3'].map((name) => A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name })));
      expect(race.map((r) => r.status).sort()).toEqual([201, 403, 403]);
      const b = await api(server.url, keyB, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'other-ws', wait_for_ready: true });
      expect(b.status, b.text).toBe(201);
      expect((await A('GET', '/api/v2/sandboxes/boxes?limit=100')).body.resources).toHaveLength(MAX_PER_WORKSPACE);
    }, 120_000);
  });
});
