/**
 * The server commands' V8 settings (src/cli/v8-flags.ts), in effect however keygate is started.
 *
 * Heap flags (SERVER_NODE_FLAGS: `--max-semi-space-size=2 --heap-growing-percent=20`) are
 * checked on the real processes: which node binary runs (`/proc/PID/exe`) and with which
 * command line (`/proc/PID/cmdline`, what node read its flags from), for the bin
 * (node_modules/.bin/keygate in a project that depends on keygate), `npx keygate`, the
 * `--workers` processes, `node dist/cli/main.js` and `keygate serve`; and by their effect, the
 * peak memory of a proxy under a burst of requests. Each on every Node this machine has: the
 * one running the tests, /usr/bin/node and the Node 24 that scripts/node24.sh installs.
 *
 * Wasm tier-up (`--liftoff-only`): a burst of first requests through a fresh `keygate proxy`
 * must not cost the memory spike of V8 recompiling undici's WebAssembly HTTP parser.
 * Intercepted requests normally take the fast path (src/proxy/h1), which does not use undici;
 * undici still carries every request the fast path hands over, plain HTTP and WebSockets, so
 * that burst is sent with the fast path off to exercise that parser.
 */
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { missingServerFlags, missingSidecarEnv, SERVER_NODE_FLAGS, SIDECAR_ENV } from '../../src/cli/v8-flags.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { machineNodes, type NodeBin } from '../helpers/nodes.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { CLI, memoryOf, REPO_ROOT, spawnProxy, type SpawnedProxy, type SpawnProxyOptions } from '../helpers/proxy.js';

const HOST = 'api.test.local';
const CONCURRENT = 48;

const NODES = machineNodes();
const RUNNING = NODES.find((n) => n.bin === realpathSync(process.execPath))!;

/** PATH with this node's directory first: what `#!/usr/bin/env node` and `npx` resolve. */
function pathFor(node: NodeBin): string {
  return `${path.dirname(node.bin)}:${process.env.PATH ?? ''}`;
}

interface Proc {
  pid: number;
  exe: string;
  argv: string[];
}

/** A process and all its descendants, from /proc. */
function processTree(root: number): Proc[] {
  const children = new Map<number, number[]>();
  for (const d of readdirSync('/proc').filter((e) => /^\d+$/.test(e))) {
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(d)]);
    } catch {
      // gone meanwhile
    }
  }
  const out: Proc[] = [];
  const visit = (pid: number) => {
    try {
      out.push({ pid, exe: readlinkSync(`/proc/${pid}/exe`), argv: readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean) });
    } catch {
      return;
    }
    for (const c of children.get(pid) ?? []) visit(c);
  };
  visit(root);
  return out;
}

/** A process's environment (what glibc read at its start). */
function environOf(pid: number): Record<string, string> {
  return Object.fromEntries(
    readFileSync(`/proc/${pid}/environ`, 'utf8')
      .split('\0')
      .filter(Boolean)
      .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
  );
}

/** The node processes running keygate's CLI in a tree, with their node flags (before the script). */
function keygateProcesses(root: number): (Proc & { nodeFlags: string[] })[] {
  return processTree(root)
    .filter((p) => /\/node$/.test(p.exe) && p.argv.some((a) => /(dist\/cli\/main\.js|\.bin\/keygate)$/.test(a)))
    .map((p) => ({ ...p, nodeFlags: p.argv.slice(1, p.argv.findIndex((a) => /(main\.js|keygate)$/.test(a))) }));
}

let pki: TestPki;
let origin: TestOrigin;
/** A project that depends on keygate, linked as `npm install <path>` links a local package. */
let project: string;

beforeAll(async () => {
  pki = await createTestPki([HOST]);
  origin = await startOrigin(pki);
  project = mkdtempSync(path.join(os.tmpdir(), 'kg-project-'));
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'uses-keygate', private: true, dependencies: { keygate: `file:${REPO_ROOT}` } }));
  mkdirSync(path.join(project, 'node_modules/.bin'), { recursive: true });
  symlinkSync(REPO_ROOT, path.join(project, 'node_modules/keygate'));
  const bin = JSON.parse(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8')).bin.keygate as string;
  symlinkSync(path.join('../keygate', bin), path.join(project, 'node_modules/.bin/keygate'));
});
afterAll(async () => {
  await origin?.close();
  if (project) rmSync(project, { recursive: true, force: true });
});

const proxyConfig = { rules: [{ name: 'api', match_hosts: [HOST], headers: [{ name: 'Authorization', type: 'plaintext', value: 'Bearer t' }] }] };

function startProxy(how: Pick<SpawnProxyOptions, 'command' | 'cwd' | 'env' | 'extraArgs'>): Promise<SpawnedProxy> {
  return spawnProxy({ config: proxyConfig, resolve: [`${HOST}:${origin.port}:127.0.0.1`], upstreamCa: [pki.caPem], ...how });
}

/** The first request, then `rounds` of CONCURRENT concurrent ones on as many connections. */
async function burst(proxy: SpawnedProxy, rounds = 5): Promise<void> {
  const warm = new ProxyAgent({ uri: proxy.url, requestTls: { ca: [proxy.caPem] } });
  const r = await request(`https://${HOST}:${origin.port}/warm`, { dispatcher: warm });
  await r.body.dump();
  await warm.close();
  const agents = Array.from({ length: CONCURRENT }, () => new ProxyAgent({ uri: proxy.url, requestTls: { ca: [proxy.caPem] } }));
  for (let round = 0; round < rounds; round++) {
    await Promise.all(
      agents.map(async (a, i) => {
        const res = await request(`https://${HOST}:${origin.port}/r${round}-${i}`, { dispatcher: a });
        expect(res.statusCode).toBe(200);
        await res.body.dump();
      }),
    );
  }
  await Promise.all(agents.map((a) => a.close()));
  await new Promise((res) => setTimeout(res, 300));
}

describe('the heap flags', () => {
  it('the bin carries exactly SERVER_NODE_FLAGS in its shebang', () => {
    const first = readFileSync(CLI, 'utf8').split('\n')[0];
    expect(first).toBe(`#!/usr/bin/env -S node ${SERVER_NODE_FLAGS.join(' ')}`);
  });

  it('the sidecar\'s allocator setting: added when unset or empty, a value the user set is kept', () => {
    expect(SIDECAR_ENV).toEqual({ MALLOC_ARENA_MAX: '1' });
    expect(missingSidecarEnv({})).toEqual({ MALLOC_ARENA_MAX: '1' });
    expect(missingSidecarEnv({ MALLOC_ARENA_MAX: '' })).toEqual({ MALLOC_ARENA_MAX: '1' });
    expect(missingSidecarEnv({ MALLOC_ARENA_MAX: '8' })).toEqual({});
  });

  it('a value given on the command line or in NODE_OPTIONS is kept, the other flag still added', () => {
    expect(missingServerFlags([])).toEqual([...SERVER_NODE_FLAGS]);
    expect(missingServerFlags([...SERVER_NODE_FLAGS])).toEqual([]);
    expect(missingServerFlags(['--max_semi_space_size=8'])).toEqual(['--heap-growing-percent=20']);
    expect(missingServerFlags(['--cpu-prof'], '--max-semi-space-size=4  --heap-growing-percent=50')).toEqual([]);
  });
});

describe.each(NODES)('$name: the heap flags however keygate proxy is started', (node) => {
  // Whatever the test runner's own environment says, glibc's allocator setting starts unset.
  const env = { PATH: pathFor(node), MALLOC_ARENA_MAX: undefined };

  it('node_modules/.bin/keygate (the bin)', async () => {
    const proxy = await startProxy({ command: [path.join(project, 'node_modules/.bin/keygate')], cwd: project, env });
    try {
      const [p, ...more] = keygateProcesses(proxy.pid);
      expect(more).toEqual([]);
      expect(p.pid).toBe(proxy.pid); // env execs node in place: one process
      expect(realpathSync(p.exe)).toBe(node.bin);
      expect(p.nodeFlags).toEqual([...SERVER_NODE_FLAGS]);
      // One malloc arena: re-executed with it where Node can (same pid), glibc's default on Node 20.
      expect(environOf(p.pid).MALLOC_ARENA_MAX).toBe(node.execve ? '1' : undefined);
    } finally {
      expect(await proxy.stop()).toBe(0);
    }
  }, 30_000);

  it('npx keygate', async () => {
    const proxy = await startProxy({ command: ['npx', '--no', '--', 'keygate'], cwd: project, env });
    const found = keygateProcesses(proxy.pid);
    try {
      expect(found).toHaveLength(1);
      expect(realpathSync(found[0].exe)).toBe(node.bin);
      expect(found[0].nodeFlags).toEqual([...SERVER_NODE_FLAGS]);
    } finally {
      // npx does not pass a SIGTERM on to the command it runs: stop keygate itself, as a
      // supervisor stopping the process group would, and npx exits with it.
      for (const p of found) process.kill(p.pid, 'SIGTERM');
      const gone = (pid: number) => {
        try {
          process.kill(pid, 0);
          return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('Z') ?? true;
        } catch {
          return true;
        }
      };
      const deadline = Date.now() + 15_000;
      while (!found.every((p) => gone(p.pid)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      await proxy.stop();
      expect(found.filter((p) => !gone(p.pid))).toEqual([]); // none left behind
    }
  }, 30_000);

  it('--workers 2 through the bin: the primary and every worker', async () => {
    const proxy = await startProxy({ command: [path.join(project, 'node_modules/.bin/keygate')], cwd: project, env, extraArgs: ['--workers', '2'] });
    try {
      const found = keygateProcesses(proxy.pid);
      expect(found).toHaveLength(3);
      for (const p of found) {
        expect(realpathSync(p.exe)).toBe(node.bin);
        expect(p.nodeFlags).toEqual([...SERVER_NODE_FLAGS]);
        expect(environOf(p.pid).MALLOC_ARENA_MAX).toBe(node.execve ? '1' : undefined);
      }
    } finally {
      expect(await proxy.stop()).toBe(0);
    }
  }, 30_000);

  it(`node dist/cli/main.js proxy: ${node.execve ? 're-executes itself with the flags (same pid), signals and exit code intact' : 'no process.execve on this Node: runs as started'}`, async () => {
    const proxy = await startProxy({ command: [node.bin, CLI], env });
    try {
      const [p, ...more] = keygateProcesses(proxy.pid);
      expect(more).toEqual([]);
      expect(p.pid).toBe(proxy.pid);
      expect(p.nodeFlags).toEqual(node.execve ? [...SERVER_NODE_FLAGS] : []);
    } finally {
      expect(await proxy.stop('SIGTERM')).toBe(0);
    }
    expect(proxy.output()).toMatch(/"msg":"stopped"/);
  }, 30_000);

  it.runIf(node.execve)('node with its own --max-semi-space-size: kept, the other flag added; KEYGATE_NODE_FLAGS=0: none', async () => {
    const own = await startProxy({ command: [node.bin, '--max-semi-space-size=4', CLI], env });
    try {
      expect(keygateProcesses(own.pid)[0].nodeFlags).toEqual(['--heap-growing-percent=20', '--max-semi-space-size=4']);
    } finally {
      await own.stop();
    }
    const off = await startProxy({ command: [node.bin, CLI], env: { ...env, KEYGATE_NODE_FLAGS: '0' } });
    try {
      expect(keygateProcesses(off.pid)[0].nodeFlags).toEqual([]);
      expect(environOf(off.pid).MALLOC_ARENA_MAX).toBeUndefined();
    } finally {
      await off.stop();
    }
    // The user's own allocator setting is kept through the bin, and nothing else re-executes it.
    const mine = await startProxy({ command: [path.join(project, 'node_modules/.bin/keygate')], cwd: project, env: { ...env, MALLOC_ARENA_MAX: '4' } });
    try {
      expect(environOf(mine.pid).MALLOC_ARENA_MAX).toBe('4');
    } finally {
      await mine.stop();
    }
  }, 30_000);

  it('in effect: the bin\'s proxy peaks lower under a burst than the same proxy without the flags', async () => {
    const peakMib = async (how: Pick<SpawnProxyOptions, 'command' | 'cwd' | 'env'>) => {
      const proxy = await startProxy(how);
      try {
        // Long enough for V8 to grow the young generation as far as it is allowed to.
        await burst(proxy, 25);
        return { peak: memoryOf(proxy.pid).hwmKb / 1024, flags: keygateProcesses(proxy.pid)[0].nodeFlags };
      } finally {
        await proxy.stop();
      }
    };
    const lean = await peakMib({ command: [path.join(project, 'node_modules/.bin/keygate')], cwd: project, env });
    const plain = await peakMib({ command: [node.bin, CLI], env: { ...env, KEYGATE_NODE_FLAGS: '0' } });
    const why = `peak RSS under the burst: ${lean.peak.toFixed(1)} MiB with the flags, ${plain.peak.toFixed(1)} MiB without (${node.name})`;
    console.log(why);
    expect(lean.flags).toEqual([...SERVER_NODE_FLAGS]);
    expect(plain.flags).toEqual([]);
    // Measured here, on a machine loaded by other jobs: 4.5 to 10 MiB lower (Node 20) and 5 to
    // 9 MiB (Node 24); 2 MiB keeps the check clear of that noise.
    expect(lean.peak, why).toBeLessThan(plain.peak - 2);
  }, 60_000);
});

describe.each(NODES)('$name: an idle proxy gives memory back', (node) => {
  // src/proxy/idle-gc.ts. On Node 24 V8's own memory reducer never starts in a quiet process
  // (it keeps judging the allocation rate high), so without the idle collection a fresh proxy
  // runs no full collection at all: only the scavenges of start-up (measured: none in 20 s).
  // Node 20's reducer runs one by itself; there this checks nothing breaks.
  it('a memory-reducing full collection within seconds of going quiet after start-up', async () => {
    const proxy = await startProxy({ command: [node.bin, '--trace-gc', CLI], env: { PATH: pathFor(node) } });
    try {
      const deadline = Date.now() + 20_000;
      while (!/Mark-Compact/.test(proxy.output()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 250));
      expect(proxy.output(), `no full collection within 20 s of start (${node.name})`).toMatch(/Mark-Compact/);
    } finally {
      await proxy.stop();
    }
  }, 40_000);
});

describe.each(NODES)('$name: no TurboFan during start-up, TurboFan for the requests', (node) => {
  // src/cli/v8-flags.ts holdOptimizer/releaseOptimizer: start-up's module resolution made
  // path normalisation hot enough for TurboFan, whose code pages (about 5 MiB of the node binary)
  // then stayed resident in an idle sidecar. Checked by V8's own trace of its compilations.
  // `(target TURBOFAN)` on Node 20, `(target TURBOFAN_JS)` on Node 24.
  const TURBOFAN = /completed (optimizing|compiling) .*\(target TURBOFAN(_JS)?\)/g;
  it('an idle proxy has compiled nothing with TurboFan; once requests come, TurboFan compiles them', async () => {
    const proxy = await startProxy({ command: [node.bin, '--trace-opt', CLI], env: { PATH: pathFor(node) } });
    try {
      await new Promise((r) => setTimeout(r, 1500));
      const idle = proxy.output().match(TURBOFAN) ?? [];
      expect(idle, `TurboFan ran during start-up (${node.name})`).toEqual([]);
      // Maglev (Node 24) is held from the same point, but Node compiles two of its path helpers
      // with it while it loads the main module, before any keygate code runs: not checked here.
      await burst(proxy, 10);
      const busy = proxy.output().match(TURBOFAN) ?? [];
      expect(busy.length, `no TurboFan compilation under a burst of requests (${node.name})`).toBeGreaterThan(0);
    } finally {
      await proxy.stop();
    }
  }, 60_000);
});

describe(`keygate serve (${RUNNING.name}, the Node the native database driver was built for)`, () => {
  it('the bin starts serve with the flags; its per-sandbox proxies run in that process', async () => {
    const data = mkdtempSync(path.join(os.tmpdir(), 'kg-serve-'));
    const child = spawn(path.join(project, 'node_modules/.bin/keygate'), ['serve', '--listen', '127.0.0.1:0', '--data', data], { cwd: project, env: { ...process.env, PATH: pathFor(RUNNING) }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`serve did not start:\n${out}`)), 30_000);
        child.stdout.on('data', () => /listening on/.test(out) && (clearTimeout(timer), resolve()));
        void exited.then(() => (clearTimeout(timer), reject(new Error(`serve exited:\n${out}`))));
      });
      const [p, ...more] = keygateProcesses(child.pid!);
      expect(more).toEqual([]);
      expect(realpathSync(p.exe)).toBe(RUNNING.bin);
      expect(p.nodeFlags).toEqual([...SERVER_NODE_FLAGS]);
    } finally {
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      rmSync(data, { recursive: true, force: true });
    }
  }, 40_000);
});

describe.each(NODES)('$name: wasm tier-up', (node) => {
  /** Peak RSS growth (MiB) of a fresh proxy over its first request and a burst of concurrent ones. */
  async function burstGrowthMib(env: NodeJS.ProcessEnv): Promise<number> {
    const proxy = await startProxy({ command: [path.join(project, 'node_modules/.bin/keygate')], cwd: project, env: { PATH: pathFor(node), KEYGATE_FAST_PATH: '0', ...env } });
    try {
      const before = memoryOf(proxy.pid).hwmKb;
      await burst(proxy);
      return (memoryOf(proxy.pid).hwmKb - before) / 1024;
    } finally {
      await proxy.stop();
    }
  }

  // Node 20 (V8 11.3): about 8 MiB of growth lean against 39 with tier-up. Node 24 (V8 13.6)
  // shows no spike either way (26 MiB both, measured here): the setting only matters before it.
  const spike = node.major < 24;
  it(`a burst of requests does not cost a compiler memory spike${spike ? '; with V8 default tiering it does' : ' (nor with tier-up, on this V8)'}`, async () => {
    const lean = await burstGrowthMib({});
    const tiered = await burstGrowthMib({ KEYGATE_V8_WASM_TIERUP: '1' });
    const why = `peak growth: ${lean.toFixed(1)} MiB lean, ${tiered.toFixed(1)} MiB with tier-up (${node.name})`;
    console.log(why);
    // Growth from a fresh proxy's RSS: since session 5 the start leaves out what the first
    // requests load (TurboFan's code pages, the upstream trust store, undici's connector: about
    // 9 MiB on Node 24, bench/README.md), so the growth includes them (35 MiB measured on Node 24,
    // 16 on Node 20; the peak itself did not grow).
    expect(lean, why).toBeLessThan(42);
    if (spike) expect(tiered - lean, why).toBeGreaterThan(15);
    else expect(Math.abs(tiered - lean), why).toBeLessThan(10);
  }, 60_000);
});
