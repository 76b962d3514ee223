/**
 * Measures the docker box driver on the real engine: time to start a ready box (relay listening)
 * and run `true` in it (p50, p99 over 30 runs), and the memory an idle box holds (its cgroup, and
 * on the host the engine's per-container shim). Heavy on a shared machine, so it runs only with
 * KEYGATE_DOCKER_MEASURE=1; the bounds it asserts are loose sanity limits, the numbers are printed.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { DockerEngine, dockerSocketPath } from '../../src/docker/engine.js';
import { DockerBoxDriver } from '../../src/sandbox/docker.js';
import type { BoxSpec } from '../../src/sandbox/driver.js';
import { boxImageUnavailableReason, ensureBoxImage } from '../helpers/box-image.js';
import { announceSkip, engineUnavailableReason } from '../helpers/docker-engine.js';

const RUNS = 30;
const reason = process.env.KEYGATE_DOCKER_MEASURE === '1' ? ((await engineUnavailableReason()) ?? boxImageUnavailableReason()) : 'set KEYGATE_DOCKER_MEASURE=1 to measure';
const skip = announceSkip('docker box measurements', reason);

function rssKb(pid: number): number {
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN);
}

function ppid(pid: number): number {
  const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]);
}

const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];

describe.skipIf(skip)('docker box measurements', () => {
  it(`start a ready box and run true, ${RUNS} times; memory of an idle box`, async () => {
    const engine = new DockerEngine(dockerSocketPath()!);
    const image = await ensureBoxImage(engine);
    const scope = `keygate-test-box-m${randomBytes(3).toString('hex')}`;
    const driver = new DockerBoxDriver({ scope });
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kgbm-'));
    const spec = (id: string): BoxSpec => ({
      id,
      template: { name: 'm', image, environment: {} },
      resources: { memory_mb: 256, cpus: 1, pids: 128, disk_mb: 64 },
      env: {},
      caPem: '',
      caBundlePem: '',
      proxy: { host: '127.0.0.1', port: 9 },
      stateDir: path.join(dir, id),
    });
    try {
      const times: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        const t0 = performance.now();
        const box = await driver.start(spec(`r${i}`));
        const p = await box.exec({ command: ['true'] });
        p.stdout.resume();
        p.stderr.resume();
        expect((await p.done).exitCode).toBe(0);
        times.push(performance.now() - t0);
        await driver.destroy(`r${i}`, path.join(dir, `r${i}`));
      }
      times.sort((a, b) => a - b);

      await driver.start(spec('idle'));
      await new Promise((r) => setTimeout(r, 3000));
      const list = await engine.json<{ Id: string }[]>('GET', `/containers/json?filters=${encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox.scope=${scope}`] }))}`);
      const id = list.body[0].Id;
      const stats = await engine.json<{ memory_stats: { usage: number; stats: Record<string, number> } }>('GET', `/containers/${id}/stats?stream=false&one-shot=true`);
      const ms = stats.body.memory_stats;
      const cache = ms.stats.total_inactive_file ?? ms.stats.inactive_file ?? ms.stats.cache ?? 0;
      const top = await engine.json<{ Processes: string[][]; Titles: string[] }>('GET', `/containers/${id}/top?ps_args=${encodeURIComponent("-o pid,rss,args")}`);
      const pids = top.body.Processes.map((row) => Number(row[0]));
      const shim = ppid(Math.min(...pids));
      const report = {
        start_and_true_ms: { p50: Math.round(pct(times, 50)), p99: Math.round(pct(times, 99)), min: Math.round(times[0]), max: Math.round(times[times.length - 1]) },
        idle_box: {
          cgroup_usage_mib: +(ms.usage / 2 ** 20).toFixed(1),
          cgroup_usage_without_cache_mib: +((ms.usage - cache) / 2 ** 20).toFixed(1),
          processes_rss_mib: pids.map((p) => +(rssKb(p) / 1024).toFixed(1)),
          shim_rss_mib: +(rssKb(shim) / 1024).toFixed(1),
        },
      };
      console.log(JSON.stringify(report, null, 2));
      expect(report.start_and_true_ms.p50).toBeLessThan(10_000);
      expect(report.idle_box.cgroup_usage_without_cache_mib).toBeLessThan(128);
    } finally {
      for (const id of ['idle', ...Array.from({ length: RUNS }, (_, i) => `r${i}`)]) await driver.destroy(id, path.join(dir, id)).catch(() => undefined);
      await driver.close();
      rmSync(dir, { recursive: true, force: true });
      await engine.close();
    }
  }, 600_000);
});
