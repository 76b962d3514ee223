// The spec's workflow against a real `keygate serve` running real application processes.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { api, appProcessesUnder, cleanupTmp, deployDir, echoVariant, echoWithPrefix, packDir, replyOf, runStream, tmpDir, waitRevision, type Api } from './helpers.js';

const KEY = 'kg_test_control_plane_key_0002';
const serveEnv = { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_DRAIN_TIMEOUT_MS: '5000', KEYGATE_STOP_GRACE_MS: '3000' };
afterAll(cleanupTmp);

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
async function until<T>(fn: () => Promise<T> | T, ok: (v: T) => boolean, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = await fn();
  while (!ok(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 150));
    v = await fn();
  }
  return v;
}

describe('deployment workflow (dev, one replica)', () => {
  let server: RunningCli;
  let a: Api;
  let dataDir: string;
  let dep: any;
  const SECRET = 'leak-me-' + 'q7'.repeat(10);

  beforeAll(async () => {
    dataDir = tmpDir();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    a = api(server.url, KEY);
  });
  afterAll(async () => {
    await server.stop();
  });

  it('creates from the echo example, gets it, polls the latest revision to DEPLOYED and streams a run', async () => {
    dep = await deployDir(a, 'echo', echoWithPrefix('v1: '), { secrets: [{ name: 'LEAKY_TOKEN', value: SECRET }] });
    expect(dep.latest_revision_id).toBeTruthy();
    const got = await a.call('GET', `/v2/deployments/${dep.id}`);
    expect(got.body.latest_revision_id).toBe(dep.latest_revision_id);
    const rev = await waitRevision(a, dep.id, dep.latest_revision_id);
    expect(rev).toMatchObject({ status: 'DEPLOYED', replaced_by: null, source: 'internal_source' });
    const after = (await a.call('GET', `/v2/deployments/${dep.id}`)).body;
    expect(after.active_revision_id).toBe(dep.latest_revision_id);
    expect(after.url).toBe(dep.url);

    const run = await runStream(dep.url, KEY, 'hello there');
    expect(run.status).toBe(200);
    expect(run.events[0].event).toBe('metadata');
    expect(run.events.at(-1)!.event).toBe('end');
    expect(run.events.filter((e) => e.event === 'messages/partial').length).toBeGreaterThan(1);
    expect(replyOf(run)).toBe('v1: hello there');
  });

  it('refuses run requests without a key of the workspace', async () => {
    expect((await runStream(dep.url, 'kg_wrong_key_000000000000', 'x')).status).toBe(401);
    const res = await fetch(`${dep.url}/runs/stream`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
    expect(res.status).toBe(401);
    const made = runCli(['serve', 'keys', 'create', '--workspace', 'elsewhere', '--user', 'eve', '--data', dataDir], { env: { DATABASE_URL: '' } });
    // A valid key of another workspace: authenticated, not allowed (wire.md).
    expect((await runStream(dep.url, made.stdout.trim(), 'x')).status).toBe(403);
  });

  it('patches with a changed source while a client keeps sending: no failed request, new reply after DEPLOYED', async () => {
    let stop = false;
    // `at` is when a request started: one that started before the switch may end after it, on v1.
    const results: { status: number; reply?: string; at: number }[] = [];
    const client = (async () => {
      while (!stop) {
        const at = Date.now();
        try {
          const r = await runStream(dep.url, KEY, 'ping');
          results.push({ status: r.status, reply: r.events.at(-1)?.event === 'end' ? replyOf(r) : 'no end event', at });
        } catch (err) {
          results.push({ status: 0, reply: String(err), at });
        }
      }
    })();
    await until(() => results.length, (n) => n >= 2);
    const up = await a.upload(await packDir(echoWithPrefix('v2: ')));
    const patched = await a.call('PATCH', `/v2/deployments/${dep.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    expect(patched.status).toBe(200);
    const newRev = patched.body.latest_revision_id;
    expect(newRev).not.toBe(dep.latest_revision_id);
    const rev = await waitRevision(a, dep.id, newRev);
    expect(rev.status).toBe('DEPLOYED');
    const deployedAt = Date.now();
    await until(() => results.filter((r) => r.at > deployedAt).length, (n) => n >= 3);
    stop = true;
    await client;
    expect(results.length).toBeGreaterThan(5);
    expect(results.filter((r) => r.status !== 200 || (r.reply !== 'v1: ping' && r.reply !== 'v2: ping'))).toEqual([]);
    expect(results.filter((r) => r.at > deployedAt && r.reply !== 'v2: ping')).toEqual([]);
    expect(results.some((r) => r.reply === 'v1: ping')).toBe(true);

    const old = (await a.call('GET', `/v2/deployments/${dep.id}/revisions/${dep.latest_revision_id}`)).body;
    expect(old).toMatchObject({ status: 'DEPLOYED', replaced_by: newRev });
    expect((await a.call('GET', `/v2/deployments/${dep.id}`)).body).toMatchObject({ active_revision_id: newRev, latest_revision_id: newRev, url: dep.url });
    // The old revision's process is gone once drained.
    const oldDir = path.join(dataDir, 'deployments', dep.id, 'revisions', dep.latest_revision_id);
    expect(await until(() => appProcessesUnder(oldDir), (p) => p.length === 0)).toEqual([]);
    dep.latest_revision_id = newRev;
  });

  it('a failing build script ends BUILD_FAILED with the reason in the build log; the old revision keeps serving', async () => {
    const broken = echoVariant({ 'package.json': JSON.stringify({ name: 'x', type: 'module', scripts: { build: 'node -e "console.error(\'compile error: missing semicolon\'); process.exit(3)"' } }) });
    const up = await a.upload(await packDir(broken));
    const patched = await a.call('PATCH', `/v2/deployments/${dep.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    const rev = await waitRevision(a, dep.id, patched.body.latest_revision_id);
    expect(rev.status).toBe('BUILD_FAILED');
    expect(rev.status_message).toContain('npm run build failed (exit code 3)');
    const logs = await a.call('GET', `/v2/deployments/${dep.id}/logs?type=build&revision_id=${rev.id}`);
    expect(logs.body.logs.map((l: { message: string }) => l.message).join('\n')).toContain('compile error: missing semicolon');
    expect((await a.call('GET', `/v2/deployments/${dep.id}`)).body.active_revision_id).toBe(dep.latest_revision_id);
    expect(replyOf(await runStream(dep.url, KEY, 'still'))).toBe('v2: still');
  });

  it('an app that crashes at start ends DEPLOY_FAILED; the old revision keeps serving', async () => {
    const crashing = echoVariant({ 'src/agent.js': 'throw new Error("boom at import");\n' });
    const up = await a.upload(await packDir(crashing));
    const patched = await a.call('PATCH', `/v2/deployments/${dep.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    const rev = await waitRevision(a, dep.id, patched.body.latest_revision_id);
    expect(rev.status).toBe('DEPLOY_FAILED');
    expect(rev.status_message).toMatch(/exited during start/);
    const logs = await a.call('GET', `/v2/deployments/${dep.id}/logs?type=deploy&revision_id=${rev.id}`);
    expect(logs.body.logs.map((l: { message: string }) => l.message).join('\n')).toContain('boom at import');
    expect(replyOf(await runStream(dep.url, KEY, 'still'))).toBe('v2: still');
  });

  it('never lets a secret value reach an API response or a log line, even when the app prints it', async () => {
    const leaky = echoVariant({
      'src/agent.js': readFileSync(path.join(echoVariant(), 'src/agent.js'), 'utf8').replace('async run(input, ctx) {', 'async run(input, ctx) {\n    console.log(`token is ${process.env.LEAKY_TOKEN}!`);'),
    });
    const up = await a.upload(await packDir(leaky));
    const patched = await a.call('PATCH', `/v2/deployments/${dep.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    expect((await waitRevision(a, dep.id, patched.body.latest_revision_id)).status).toBe('DEPLOYED');
    expect((await runStream(dep.url, KEY, 'leak')).status).toBe(200);
    const logs = await until(
      () => a.call('GET', `/v2/deployments/${dep.id}/logs?type=deploy&limit=1000`),
      (r) => r.text.includes('token is [redacted]!'),
    );
    expect(logs.text).toContain('token is [redacted]!');
    for (const p of [`/v2/deployments/${dep.id}`, `/v2/deployments/${dep.id}/revisions`, `/v2/deployments/${dep.id}/logs?limit=1000`, '/v2/deployments']) {
      expect((await a.call('GET', p)).text).not.toContain(SECRET);
    }
    expect(server.output()).not.toContain(SECRET);
    dep.latest_revision_id = patched.body.latest_revision_id;
  });

  it('a restart of serve brings the DEPLOYED app back at the same URL', async () => {
    const depDir = path.join(dataDir, 'deployments', dep.id);
    expect(appProcessesUnder(depDir)).toHaveLength(1);
    expect(await server.stop()).toBe(0);
    expect(await until(() => appProcessesUnder(depDir), (p) => p.length === 0)).toEqual([]);
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    a = api(server.url, KEY);
    const back = await until(
      () => runStream(dep.url, KEY, 'again').catch(() => ({ status: 0, events: [], text: '' })),
      (r) => r.status === 200,
      30_000,
    );
    expect(replyOf(back)).toBe('again');
    const got = (await a.call('GET', `/v2/deployments/${dep.id}`)).body;
    expect(got).toMatchObject({ url: dep.url, active_revision_id: dep.latest_revision_id });
  });

  it('delete stops the processes, removes the files, and answers 404 afterwards', async () => {
    const depDir = path.join(dataDir, 'deployments', dep.id);
    const pids = appProcessesUnder(depDir);
    expect(pids.length).toBe(1);
    expect((await a.call('DELETE', `/v2/deployments/${dep.id}`)).status).toBe(204);
    expect(pids.filter(alive)).toEqual([]);
    expect(existsSync(depDir)).toBe(false);
    expect((await a.call('GET', `/v2/deployments/${dep.id}`)).status).toBe(404);
    expect((await a.call('GET', `/v2/deployments/${dep.id}/revisions`)).status).toBe(404);
    await expect(fetch(`${dep.url}/runs/stream`, { method: 'POST' })).rejects.toThrow();
  });
});

describe('prod deployment (two replicas)', () => {
  let server: RunningCli;
  let a: Api;
  let dataDir: string;
  beforeAll(async () => {
    dataDir = tmpDir();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    a = api(server.url, KEY);
  });
  afterAll(async () => {
    await server.stop();
  });

  it('runs two replicas behind one address and restarts one that is killed, without failing requests', async () => {
    const dep = await deployDir(a, 'echo-prod', echoWithPrefix('p: '), { source_config: { deployment_type: 'prod' } });
    expect((await waitRevision(a, dep.id, dep.latest_revision_id)).status).toBe('DEPLOYED');
    const depDir = path.join(dataDir, 'deployments', dep.id);
    const before = appProcessesUnder(depDir);
    expect(before).toHaveLength(2);

    process.kill(before[0], 'SIGKILL');
    const failures: string[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await runStream(dep.url, KEY, `n${i}`);
      if (r.status !== 200 || replyOf(r) !== `p: n${i}`) failures.push(`${r.status} ${r.text.slice(0, 200)}`);
    }
    expect(failures).toEqual([]);
    const after = await until(() => appProcessesUnder(depDir), (p) => p.length === 2 && !p.includes(before[0]));
    expect(after).toHaveLength(2);
    expect(after).toContain(before[1]);
    const logs = await a.call('GET', `/v2/deployments/${dep.id}/logs?type=deploy&limit=1000`);
    expect(logs.text).toContain('exited unexpectedly (signal SIGKILL)');
    // Requests keep working on the restarted pair.
    for (let i = 0; i < 4; i++) expect((await runStream(dep.url, KEY, 'x')).status).toBe(200);
  });
});

describe('serve restart during a build', () => {
  it('marks the interrupted revision INTERRUPTED and rebuilds the latest as a fresh revision', async () => {
    const dataDir = tmpDir();
    const marker = path.join(tmpDir(), 'built-once');
    // The first build hangs (the restart interrupts it); the rebuild finds the marker and passes.
    const script = `node -e "const f=${JSON.stringify(marker).replace(/"/g, "'")};const fs=require('fs');if(fs.existsSync(f))process.exit(0);fs.writeFileSync(f,'1');setTimeout(()=>{},60000)"`;
    const app = echoVariant({ 'package.json': JSON.stringify({ name: 'x', type: 'module', scripts: { build: script } }) });
    let server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    let a = api(server.url, KEY);
    try {
      const dep = await deployDir(a, 'slow-build', app);
      await until(() => existsSync(marker), (v) => v);
      expect((await a.call('GET', `/v2/deployments/${dep.id}/revisions/${dep.latest_revision_id}`)).body.status).toBe('BUILDING');
      expect(await server.stop()).toBe(0);
      server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
      a = api(server.url, KEY);
      const old = await until(() => a.call('GET', `/v2/deployments/${dep.id}/revisions/${dep.latest_revision_id}`), (r) => r.body.status === 'INTERRUPTED');
      expect(old.body.status).toBe('INTERRUPTED');
      const latest = (await a.call('GET', `/v2/deployments/${dep.id}`)).body.latest_revision_id;
      expect(latest).not.toBe(dep.latest_revision_id);
      expect((await waitRevision(a, dep.id, latest)).status).toBe('DEPLOYED');
      expect(replyOf(await runStream(dep.url, KEY, 'rebuilt'))).toBe('rebuilt');
      expect((await a.call('DELETE', `/v2/deployments/${dep.id}`)).status).toBe(204);
    } finally {
      await server.stop();
    }
  });
});
