// Replica processes left behind by a `keygate serve` that was killed outright: recorded while they
// run, stopped by the next serve before it restores the deployments. Real processes, real /proc.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { REPLICA_TOKEN_ENV, ReplicaRecords, type ReplicaRecord } from '../../src/control-plane/orphans.js';
import { bootId, environHas, isSameProcess, parseProcStat, readProcStat } from '../../src/proc.js';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { api, appProcessesUnder, cleanupTmp, deployDir, echoVariant, echoWithPrefix, packDir, replyOf, runStream, tmpDir, waitRevision } from './helpers.js';

afterAll(cleanupTmp);

const alive = (pid: number) => {
  const st = readProcStat(pid);
  return Boolean(st && st.state !== 'Z');
};
async function until<T>(fn: () => Promise<T> | T, ok: (v: T) => boolean, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = await fn();
  while (!ok(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    v = await fn();
  }
  return v;
}

describe('/proc parsing', () => {
  it('counts stat fields from the last parenthesis, whatever the command name holds', () => {
    const tail = Array.from({ length: 50 }, (_, i) => String(i + 3));
    tail[0] = 'S'; // field 3
    tail[1] = '10'; // 4 ppid
    tail[2] = '11'; // 5 pgrp
    tail[3] = '12'; // 6 session
    tail[22 - 3] = '987654'; // 22 starttime
    expect(parseProcStat(`42 (we ird) (name)) ${tail.join(' ')}\n`)).toEqual({ pid: 42, state: 'S', ppid: 10, pgrp: 11, session: 12, startTime: '987654' });
    expect(parseProcStat('garbage')).toBeNull();
    expect(parseProcStat('1 (x) S 1 2')).toBeNull();
  });

  it('reads this process and its environment', () => {
    const me = readProcStat('self')!;
    expect(me.pid).toBe(process.pid);
    expect(isSameProcess(process.pid, me.startTime)).toBe(true);
    expect(isSameProcess(process.pid, String(BigInt(me.startTime) + 1n))).toBe(false);
    expect(bootId()).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('ReplicaRecords.reap', () => {
  const spawned: ChildProcess[] = [];
  afterEach(() => {
    for (const c of spawned.splice(0)) {
      try {
        process.kill(-c.pid!, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  });

  /** A process in its own group, like a replica; `script` runs in node. */
  function start(script: string, env: Record<string, string> = {}): ChildProcess {
    const c = spawn(process.execPath, ['-e', script], { detached: true, stdio: 'ignore', env: { PATH: process.env.PATH ?? '', ...env } });
    spawned.push(c);
    return c;
  }
  const until_started = (pid: number) => until(() => readProcStat(pid), (s) => s !== null, 5000);
  const writeRecord = (dir: string, rec: Partial<ReplicaRecord> & { token: string; pid: number; start_time: string }) => {
    mkdirSync(dir, { recursive: true });
    const full: ReplicaRecord = {
      v: 1,
      boot_id: bootId()!,
      // A server that is no longer running (pid 1 did not start this late).
      owner: { pid: 1, start_time: '999999999999' },
      deployment_id: 'd',
      revision_id: 'r',
      replica: 1,
      recorded_at: new Date().toISOString(),
      ...rec,
    };
    writeFileSync(path.join(dir, `${rec.token}.json`), JSON.stringify(full));
  };

  it('stops an orphaned replica and everything it started (its group, and a child that left it but kept the token); drops the record', async () => {
    const dir = path.join(tmpDir(), 'replicas');
    const token = ReplicaRecords.newToken();
    // The replica starts a child in its group and a grandchild in a new session (detached).
    const leader = start(
      `const { spawn } = require('child_process');
       const a = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
       const b = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore', detached: true });
       require('fs').writeFileSync(process.env.PIDS, JSON.stringify([a.pid, b.pid]));
       setInterval(() => {}, 1000);`,
      { [REPLICA_TOKEN_ENV]: token, PIDS: path.join(path.dirname(dir), 'pids.json') },
    );
    const st = (await until_started(leader.pid!))!;
    const pidsFile = path.join(path.dirname(dir), 'pids.json');
    await until(() => existsSync(pidsFile), (v) => v, 5000);
    const [inGroup, outOfGroup] = JSON.parse(readFileSync(pidsFile, 'utf8')) as number[];
    expect(readProcStat(outOfGroup)!.pgrp).not.toBe(leader.pid);
    expect(environHas(outOfGroup, `${REPLICA_TOKEN_ENV}=${token}`)).toBe(true);
    expect(environHas(outOfGroup, `${REPLICA_TOKEN_ENV}=${token.slice(0, -1)}`)).toBe(false);
    writeRecord(dir, { token, pid: leader.pid!, start_time: st.startTime });

    const recs = new ReplicaRecords(dir);
    const res = await recs.reap(3000);
    expect(res.stopped.map((s) => s.pid).sort()).toEqual([leader.pid!, inGroup, outOfGroup].sort());
    expect(res.stopped.every((s) => s.how === 'SIGTERM')).toBe(true);
    expect(res.records).toBe(1);
    for (const p of [leader.pid!, inGroup, outOfGroup]) expect(alive(p), `pid ${p}`).toBe(false);
    expect(readdirSync(dir)).toEqual([]);
  });

  it('uses SIGKILL after the grace period for a replica that ignores SIGTERM', async () => {
    const dir = path.join(tmpDir(), 'replicas');
    const token = ReplicaRecords.newToken();
    const c = start(`process.on('SIGTERM', () => {}); setInterval(() => {}, 1000);`, { [REPLICA_TOKEN_ENV]: token });
    const st = (await until_started(c.pid!))!;
    await new Promise((r) => setTimeout(r, 300)); // the handler is installed
    writeRecord(dir, { token, pid: c.pid!, start_time: st.startTime });
    const t0 = Date.now();
    const res = await new ReplicaRecords(dir).reap(500);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(450);
    expect(res.stopped).toEqual([{ pid: c.pid, how: 'SIGKILL' }]);
    expect(alive(c.pid!)).toBe(false);
  });

  it('never touches a process whose pid was recycled, a live server’s replicas, or records of an earlier boot', async () => {
    const dir = path.join(tmpDir(), 'replicas');
    // "Recycled": the recorded pid runs, but with another start time and without the token.
    const stranger = start('setInterval(() => {}, 1000)');
    const sst = (await until_started(stranger.pid!))!;
    writeRecord(dir, { token: ReplicaRecords.newToken(), pid: stranger.pid!, start_time: String(BigInt(sst.startTime) - 5n) });
    // A replica whose server is alive (another serve on this data dir): left alone, record kept.
    const ownerProc = start('setInterval(() => {}, 1000)');
    const ost = (await until_started(ownerProc.pid!))!;
    const ownedToken = ReplicaRecords.newToken();
    const owned = start('setInterval(() => {}, 1000)', { [REPLICA_TOKEN_ENV]: ownedToken });
    const ownedSt = (await until_started(owned.pid!))!;
    writeRecord(dir, { token: ownedToken, pid: owned.pid!, start_time: ownedSt.startTime, owner: { pid: ownerProc.pid!, start_time: ost.startTime } });
    // Another boot: start times mean nothing any more.
    const oldBootToken = ReplicaRecords.newToken();
    const oldBoot = start('setInterval(() => {}, 1000)', { [REPLICA_TOKEN_ENV]: oldBootToken });
    const obSt = (await until_started(oldBoot.pid!))!;
    writeRecord(dir, { token: oldBootToken, pid: oldBoot.pid!, start_time: obSt.startTime, boot_id: '00000000-0000-0000-0000-000000000000' });
    // Garbage in the directory is removed, not trusted.
    writeFileSync(path.join(dir, 'junk.json'), '{"v":1,"pid":1}');

    const res = await new ReplicaRecords(dir).reap(1000);
    expect(res.stopped).toEqual([]);
    expect(alive(stranger.pid!)).toBe(true);
    expect(alive(owned.pid!)).toBe(true);
    expect(alive(oldBoot.pid!)).toBe(true);
    expect(readdirSync(dir)).toEqual([`${ownedToken}.json`]);
  });

  it('records and forgets replicas it starts itself, and never reaps its own', async () => {
    const dir = path.join(tmpDir(), 'replicas');
    const recs = new ReplicaRecords(dir);
    expect(recs.supported).toBe(true);
    const token = ReplicaRecords.newToken();
    const c = start('setInterval(() => {}, 1000)', { [REPLICA_TOKEN_ENV]: token });
    await until_started(c.pid!);
    expect(recs.add(token, c.pid!, { deploymentId: 'd', revisionId: 'r', replica: 1 })).toBe(true);
    const [rec] = recs.list();
    expect(rec).toMatchObject({ token, pid: c.pid, start_time: readProcStat(c.pid!)!.startTime, boot_id: bootId(), owner: { pid: process.pid } });
    expect((await recs.reap(500)).stopped).toEqual([]);
    expect(alive(c.pid!)).toBe(true);
    recs.remove(token);
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe('keygate serve killed outright (SIGKILL)', () => {
  const KEY = 'kg_test_control_plane_orphans_01';
  const serveEnv = { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_STOP_GRACE_MS: '3000' };
  let server: RunningCli | undefined;
  let dataDir: string;
  let builder: { pid: number; start: string } | undefined;
  beforeAll(() => {
    dataDir = tmpDir();
  });
  afterAll(async () => {
    await server?.stop();
    // Whatever a failed assertion left behind.
    if (builder && isSameProcess(builder.pid, builder.start)) process.kill(builder.pid, 'SIGKILL');
    for (const pid of appProcessesUnder(dataDir)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  });

  it('the next serve stops the replicas it left, then serves the deployment again at the same URL with exactly one replica', async () => {
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    let a = api(server.url, KEY);
    const dep = await deployDir(a, 'echo-orphan', echoWithPrefix('o: '));
    expect((await waitRevision(a, dep.id, dep.latest_revision_id)).status).toBe('DEPLOYED');
    expect(replyOf(await runStream(dep.url, KEY, 'one'))).toBe('o: one');
    const depDir = path.join(dataDir, 'deployments', dep.id);
    const [old] = appProcessesUnder(depDir);
    expect(appProcessesUnder(depDir)).toEqual([old]);
    const oldStart = readProcStat(old)!.startTime;
    const recordsDir = path.join(dataDir, 'run', 'replicas');
    expect(readdirSync(recordsDir)).toHaveLength(1);

    expect(await server.stop('SIGKILL')).toBe(null);
    // Nothing stopped it: it is still running, in its own process group, with its record.
    expect(isSameProcess(old, oldStart)).toBe(true);
    expect(readdirSync(recordsDir)).toHaveLength(1);

    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    a = api(server.url, KEY);
    const back = await until(
      () => runStream(dep.url, KEY, 'two').catch(() => ({ status: 0, events: [], text: '' })),
      (r) => r.status === 200,
      30_000,
    );
    expect(replyOf(back)).toBe('o: two');
    expect(isSameProcess(old, oldStart)).toBe(false);
    const now = appProcessesUnder(depDir);
    expect(now).toHaveLength(1);
    expect(now[0]).not.toBe(old);
    expect(readdirSync(recordsDir)).toEqual([expect.stringMatching(/\.json$/)]);
    expect(server.output()).toContain('left running by a previous server');

    // A build command is recorded the same way: killed mid-build, the next serve stops it too.
    const marker = path.join(tmpDir(), 'build-pid');
    const script = `node -e "const f=${JSON.stringify(marker).replace(/"/g, "'")};const fs=require('fs');if(fs.existsSync(f))process.exit(0);fs.writeFileSync(f,String(process.pid));setTimeout(()=>{},60000)"`;
    const hanging = echoVariant({ 'package.json': JSON.stringify({ name: 'x', type: 'module', scripts: { build: script } }) });
    const up = await a.upload(await packDir(hanging));
    const patched = await a.call('PATCH', `/v2/deployments/${dep.id}`, { source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    expect(patched.status).toBe(200);
    await until(() => existsSync(marker) && readFileSync(marker, 'utf8').length > 0, (v) => v);
    const builderPid = Number(readFileSync(marker, 'utf8'));
    builder = { pid: builderPid, start: readProcStat(builderPid)!.startTime };
    expect(await server.stop('SIGKILL')).toBe(null);
    expect(isSameProcess(builder.pid, builder.start)).toBe(true);
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: serveEnv });
    a = api(server.url, KEY);
    const b = builder;
    expect(await until(() => isSameProcess(b.pid, b.start), (v) => !v, 15_000)).toBe(false);
    const rebuilt = await until(() => a.call('GET', `/v2/deployments/${dep.id}`), (r) => r.body.latest_revision_id !== patched.body.latest_revision_id);
    expect((await waitRevision(a, dep.id, rebuilt.body.latest_revision_id)).status).toBe('DEPLOYED');

    // A graceful stop leaves neither processes nor records.
    expect(await server.stop()).toBe(0);
    server = undefined;
    expect(await until(() => appProcessesUnder(depDir), (p) => p.length === 0)).toEqual([]);
    expect(readdirSync(recordsDir)).toEqual([]);
  });
});
