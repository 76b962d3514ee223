/**
 * A stop or a DELETE that a restarted `keygate serve` answers while it is still bringing boxes
 * back (sandbox.md: "boxes come back as they were or as stopped"; found reading the restore path
 * behind the lifecycle property, property-lifecycle-suite.ts, whose RestartThen steps hit it only
 * when the restore is slow). The restore listed the boxes to bring back before it reaped what the
 * killed server left, then started each from that list: a box stopped meanwhile was started
 * again (ready, with processes), and a box deleted meanwhile got its directory written again.
 * The reaping is made to last here for real: the killed server's run directory names a process
 * that is a zombie (SIGKILL cannot end it; the reaper waits up to 5 s for it to go).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { localBoxesUnavailable, setUpServe } from './box-helpers.js';
import { api, cleanTmp, tmp, waitFor } from './helpers.js';

const KEY = 'restore-race-key-0123456789abcdef';
const why = localBoxesUnavailable();
if (why) console.warn(`SKIPPED restore-race: ${why}`);

let server: RunningCli | undefined;
let holder: ChildProcess | undefined;
let origin: { close(): Promise<void> } | undefined;
afterAll(async () => {
  if (server) for (const b of (await api(server.url, KEY, 'GET', '/api/v2/sandboxes/boxes')).body.resources) await api(server.url, KEY, 'DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
  await server?.stop();
  holder?.kill('SIGKILL');
  await origin?.close();
  cleanTmp();
});

const startTime = (pid: number) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')[19];

/** A zombie: a child of `sleep` (which never reaps), exited. Its pid and start time stay readable. */
async function zombie(): Promise<number> {
  holder = spawn('/bin/sh', ['-c', 'sleep 0 & exec sleep 60'], { stdio: 'ignore' });
  const pid = holder.pid!;
  return waitFor(async () => {
    const kids = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
    return kids.find((k) => /^State:\s+Z/m.test(readFileSync(`/proc/${k}/status`, 'utf8')));
  }, 'a zombie');
}

describe.skipIf(why)('a stop or DELETE while a restarted server brings boxes back', () => {
  it('the stopped box stays stopped; nothing of the deleted box comes back', async () => {
    const cfg = tmp();
    writeFileSync(path.join(cfg, 'templates.json'), JSON.stringify([{ name: 'box', description: 'restore race', rootfs: 'host', environment: {} }]));
    const setup = await setUpServe(KEY, 'api.example.test');
    origin = setup.origin;
    const args = ['serve', '--listen', '127.0.0.1:0', '--data', setup.dataDir, '--sandbox-driver', 'local', '--config-dir', cfg];
    server = await startCli(args, { env: setup.env });
    const A = (method: string, url: string) => api(server!.url, KEY, method, `/api/v2/sandboxes/boxes${url}`);
    const ids: Record<string, string> = {};
    for (const name of ['keep-stopped', 'gone']) {
      const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name, wait_for_ready: true, resources: { disk_mb: 16 } });
      expect(r.body.status, r.text).toBe('ready');
      ids[name] = r.body.id;
    }
    const uid = Number(readFileSync(path.join(setup.dataDir, 'boxes', 'local', 'uids', ids['keep-stopped']), 'utf8'));

    await server.stop('SIGKILL');
    // What the killed server "left": a box whose pid 1 will not go (the reaper waits for it).
    const z = await zombie();
    const runDir = path.join(setup.dataDir, 'boxes', 'local');
    writeFileSync(path.join(runDir, 'left-behind.json'), JSON.stringify({ id: 'left-behind', stateDir: tmp(), pid1: z, pid1Start: startTime(z) }));

    server = await startCli(args, { env: setup.env });
    await waitForLine(server, (l) => l.startsWith('sandbox driver local'));
    const stop = await A('POST', '/keep-stopped/stop');
    expect(stop.status, stop.text).toBe(200);
    expect(stop.body.status).toBe('stopped');
    const del = await A('DELETE', '/gone');
    expect(del.status, del.text).toBe(204);

    await waitFor(async () => (await A('GET', '')).body.resources.every((b: { status: string }) => b.status !== 'provisioning'), 'the restore to end', 30_000);
    await waitForLine(server, (l) => l.includes('"msg":"sandboxes restored"'), 15_000);
    const kept = await A('GET', '/keep-stopped');
    expect([kept.body.status, kept.body.status_reason], kept.text).toEqual(['stopped', null]);
    const procs = readdirSync('/proc').filter((p) => /^\d+$/.test(p) && (() => {
      try {
        return Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${p}/status`, 'utf8'))![1]) === uid;
      } catch {
        return false;
      }
    })());
    expect(procs, 'processes of the stopped box').toEqual([]);
    expect((await A('GET', '/gone')).status).toBe(404);
    expect(existsSync(path.join(setup.dataDir, 'sandboxes', ids.gone)), "the deleted box's directory").toBe(false);
  }, 90_000);
});
