/**
 * Model-based property test of the lifecycle of REAL boxes (sandbox.md, "States" and property 5)
 * behind a real `keygate serve` (the built CLI, SQLite, one data directory for the whole run), on
 * the local driver (bubblewrap) and on docker (a real engine). fast-check generates short
 * sequences of: create (with and without wait_for_ready, and two creates of one name at once),
 * execute (a quick write to /workspace, a background child left running, a timeout over a tree),
 * stop, start, PATCH (idle_ttl_seconds, proxy_config), DELETE, an idle TTL running out, a stop or a
 * DELETE during an execution, a start during a stop, and a hard restart of the server (SIGKILL,
 * then `keygate serve` again on the same data directory). After every step the API, the host and
 * the engine are compared with a model written from the reference:
 * - status and status_reason of every box (GET), 404 for a box the model does not hold;
 * - the host's process table: a ready box has processes, a stopped or deleted one none (local: by
 *   the box's own host uid; docker: no running container of the box), and each background child an
 *   execution left (a unique `sleep` on the host's `ps`) lives exactly while its box is ready and
 *   was not stopped, deleted, timed out or restarted;
 * - /workspace: what executions wrote is there, exactly, after stop/start and a restart;
 * - DELETE leaves nothing: no record, no state directory, no uid file, no run record, no staging
 *   directory, no mount naming the box, no cgroup (local); no container, no volume (docker);
 * - an operation the state does not allow is an error in wire.md's shape (409 or 404 with a
 *   sentence), and changes nothing.
 * The default run is small (KEYGATE_FUZZ_RUNS for more, KEYGATE_FUZZ_SEED=random to explore).
 */
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerEngine } from '../../src/docker/engine.js';
import { ensureBoxImage } from '../helpers/box-image.js';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { dockerSocket } from '../helpers/docker-engine.js';
import { propertyParams } from '../helpers/property.js';
import { driversUnavailable, hostProcesses, setUpServe } from './box-helpers.js';
import { api, cleanTmp, tmp, waitFor, type ApiResult } from './helpers.js';

type Kind = 'local' | 'docker';
const KEY = 'lifecycle-key-0123456789abcdef';
const ORIGIN = 'api.example.test';
const BOXES = '/api/v2/sandboxes/boxes';

interface BoxModel {
  id: string;
  status: 'ready' | 'stopped' | 'failed';
  /** What status_reason must match (null: must be null). */
  reason: RegExp | null;
  /** File name in /workspace -> content. */
  files: Map<string, string>;
  /** Markers of background children that must be alive. */
  bg: string[];
  idleTtl: number;
  /** The value of the header its proxy injects (set at create, changed by PATCH of proxy_config). */
  header: string;
}

interface Model {
  boxes: Map<string, BoxModel>;
}

/** The world under test, shared by every command of a run. */
interface Real {
  kind: Kind;
  server: RunningCli;
  dataDir: string;
  args: string[];
  env: NodeJS.ProcessEnv;
  engine: DockerEngine | null;
  prefix: string;
  /** Markers that must be gone (their box stopped, deleted, restarted, or their execution timed out). */
  dead: Set<string>;
  /** The HTTPS origin the boxes' proxies reach as api.example.test (it echoes what it got). */
  originPort: number;
}

let markerNo = 0;
/** A `sleep` whose argument no other process on the host has (fixed width: no marker is a prefix of another). */
function marker(): string {
  markerNo++;
  return `sleep ${String(700_000_000 + ((process.pid % 1000) * 10_000 + markerNo) % 100_000_000)}`;
}

const call = (r: Real, method: string, url: string, body?: unknown) => api(r.server.url, KEY, method, url, body);
const boxUrl = (r: Real, n: string) => `${BOXES}/${r.prefix}${n}`;

/** wire.md: `{"detail": "a sentence"}` with the expected status. */
function expectError(res: ApiResult, status: number, what: string): void {
  expect(res.status, `${what}: ${res.text}`).toBe(status);
  expect(typeof res.body?.detail, `${what}: ${res.text}`).toBe('string');
  expect(res.body.detail.length, what).toBeGreaterThan(5);
}

/** Host uids of the processes on this machine (real uid). */
function processesOfUid(uid: number): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const m = /^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${e}/status`, 'utf8'));
      if (m && Number(m[1]) === uid) out.push(Number(e));
    } catch {
      /* gone */
    }
  }
  return out;
}

function uidOf(r: Real, id: string): number | null {
  try {
    return Number(readFileSync(path.join(r.dataDir, 'boxes', 'local', 'uids', id), 'utf8').trim());
  } catch {
    return null;
  }
}

async function containersOf(r: Real, id: string): Promise<{ Id: string; State: string }[]> {
  const f = encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox=${id}`] }));
  const res = await r.engine!.json<{ Id: string; State: string }[]>('GET', `/containers/json?all=1&filters=${f}`);
  return res.body;
}

/** Whether the box's processes run (local: its host uid; docker: a running container). */
async function boxRuns(r: Real, b: BoxModel): Promise<boolean> {
  if (r.kind === 'local') {
    const uid = uidOf(r, b.id);
    if (uid === null) return false;
    return processesOfUid(uid).length > 0;
  }
  return (await containersOf(r, b.id)).some((c) => c.State === 'running');
}

async function workspaceFiles(r: Real, n: string): Promise<Map<string, string>> {
  const res = await call(r, 'POST', `${boxUrl(r, n)}/execute`, { command: 'cd /workspace && for f in lc-*; do [ -e "$f" ] && printf "%s=%s\\n" "$f" "$(cat "$f")"; done; true', timeout_seconds: 30 });
  expect(res.status, res.text).toBe(200);
  const m = new Map<string, string>();
  for (const l of res.body.stdout.split('\n').filter(Boolean)) {
    const i = l.indexOf('=');
    m.set(l.slice(0, i), l.slice(i + 1));
  }
  return m;
}

/** Everything the model says, checked against the API, the host and the engine. */
async function checkAll(m: Model, r: Real, what: string, opts: { files?: boolean } = {}): Promise<void> {
  // Markers that must be gone: given a moment (a killed tree is reaped asynchronously).
  await waitFor(async () => [...r.dead].every((mk) => hostProcesses(mk).length === 0), `${what}: no process left of ${[...r.dead].filter((mk) => hostProcesses(mk).length).join(', ')}`, 15_000);
  for (const [n, b] of m.boxes) {
    const g = await call(r, 'GET', boxUrl(r, n));
    expect(g.status, `${what}: GET ${n}: ${g.text}`).toBe(200);
    expect(g.body.id, what).toBe(b.id);
    expect({ box: n, status: g.body.status }, `${what}: ${g.text}`).toEqual({ box: n, status: b.status });
    if (b.reason === null) expect(g.body.status_reason, `${what}: ${n}`).toBeNull();
    else expect(String(g.body.status_reason), `${what}: ${n}`).toMatch(b.reason);
    if (b.status === 'ready') {
      expect(await boxRuns(r, b), `${what}: ready box ${n} has processes`).toBe(true);
    } else {
      await waitFor(async () => !(await boxRuns(r, b)), `${what}: stopped box ${n} has no process`, 15_000);
    }
    for (const mk of b.bg) expect(hostProcesses(mk).length, `${what}: ${n}'s background '${mk}' alive`).toBeGreaterThanOrEqual(1);
    expect(g.body.idle_ttl_seconds, `${what}: ${n}`).toBe(b.idleTtl);
    expect(g.body.proxy_config?.rules?.[0]?.headers?.[0]?.value, `${what}: ${n}'s proxy_config`).toBe(b.header);
    if (opts.files && b.status === 'ready') {
      expect(await workspaceFiles(r, n), `${what}: ${n}'s /workspace`).toEqual(b.files);
      // Its proxy runs, with the configuration on record (PATCH is applied to the running proxy).
      const res = await call(r, 'POST', `${boxUrl(r, n)}/execute`, { command: `curl -sS --max-time 10 https://${ORIGIN}:${r.originPort}/lc`, timeout_seconds: 30 });
      expect(res.body?.exit_code, `${what}: ${n} reaches its origin: ${res.text}`).toBe(0);
      expect(JSON.parse(res.body.stdout).headers['x-lc'], `${what}: ${n}'s proxy injects`).toBe(b.header);
    }
  }
  const list = await call(r, 'GET', `${BOXES}?limit=100`);
  const names = (list.body.resources as { name: string }[]).map((x) => x.name).filter((x) => x.startsWith(r.prefix)).sort();
  expect(names, what).toEqual([...m.boxes.keys()].map((n) => r.prefix + n).sort());
}

/** DELETE left nothing of the box on the host or in the engine. */
async function checkGone(r: Real, id: string, uid: number | null): Promise<void> {
  expect(existsSync(path.join(r.dataDir, 'sandboxes', id)), 'state directory').toBe(false);
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(id));
  expect(mounts, 'mounts naming the box').toEqual([]);
  if (r.kind === 'local') {
    expect(existsSync(path.join(r.dataDir, 'boxes', 'local', 'uids', id)), 'uid file').toBe(false);
    expect(existsSync(path.join(r.dataDir, 'boxes', 'local', `${id}.json`)), 'run record').toBe(false);
    const staged = existsSync('/run/keygate-stage') ? readdirSync('/run/keygate-stage').filter((d) => d.endsWith(id)) : [];
    expect(staged, 'staging directory').toEqual([]);
    if (uid !== null) await waitFor(async () => processesOfUid(uid).length === 0, `no process of uid ${uid}`, 15_000);
    const cg = readFileSync(`/proc/${r.server.proc.pid}/cgroup`, 'utf8');
    for (const line of cg.split('\n').filter(Boolean)) {
      const [, ctrls, own] = line.split(':');
      const ctrl = ctrls.split(',').find((c) => c && !c.startsWith('name='));
      if (!ctrl) continue;
      const base = path.join('/sys/fs/cgroup', ctrl, own);
      let tags: string[] = [];
      try {
        tags = readdirSync(base).filter((t) => t.startsWith('keygate-'));
      } catch {
        continue;
      }
      for (const t of tags) expect(existsSync(path.join(base, t, id)), `cgroup ${ctrl}/${t}/${id}`).toBe(false);
    }
  } else {
    expect(await containersOf(r, id), 'containers').toEqual([]);
    const f = encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox=${id}`] }));
    const vols = await r.engine!.json<{ Volumes: { Name: string }[] | null }>('GET', `/volumes?filters=${f}`);
    expect((vols.body.Volumes ?? []).map((v) => v.Name), 'volumes').toEqual([]);
  }
}

function killMarkers(r: Real, b: BoxModel): void {
  for (const mk of b.bg.splice(0)) r.dead.add(mk);
}

// ---------------------------------------------------------------------------------------------
// Commands

type Cmd = fc.AsyncCommand<Model, Real, false>;
/** `c` is made from a template no driver can build (a missing root, a missing image): it goes `failed`. */
const NAMES = ['a', 'b', 'c'] as const;
const templateOf = (n: string) => (n === 'c' ? 'broken' : 'box');
const FAILED_REASON = /^Box failed to start: /;
/** What a box of this name is once made. */
const made = (n: string, id: string): BoxModel =>
  n === 'c' ? { id, status: 'failed', reason: FAILED_REASON, files: new Map(), bg: [], idleTtl: 600, header: 'h0' } : { id, status: 'ready', reason: null, files: new Map(), bg: [], idleTtl: 600, header: 'h0' };
/** A configuration whose one rule injects `x-lc: value` into requests to the origin. */
const proxyConfig = (value: string) => ({ rules: [{ name: 'r', match_hosts: [ORIGIN], headers: [{ name: 'x-lc', type: 'plaintext', value }] }] });
const createBody = (r: Real, n: string, wait: boolean) => ({ template_name: templateOf(n), name: r.prefix + n, wait_for_ready: wait, resources: { disk_mb: 32 }, proxy_config: proxyConfig('h0') });

class Create implements Cmd {
  constructor(readonly n: string, readonly wait: boolean) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const before = m.boxes.get(this.n);
    const res = await call(r, 'POST', BOXES, createBody(r, this.n, this.wait));
    if (before) {
      expectError(res, 409, 'create of a taken name');
      return checkAll(m, r, this.toString());
    }
    expect(res.status, res.text).toBe(201);
    if (this.wait) expect(res.body.status, res.text).toBe(made(this.n, '').status);
    else {
      expect(['provisioning', 'ready'], res.text).toContain(res.body.status);
      await waitFor(async () => (await call(r, 'GET', boxUrl(r, this.n))).body?.status !== 'provisioning', 'the box to leave provisioning', 60_000);
    }
    m.boxes.set(this.n, made(this.n, res.body.id));
    await checkAll(m, r, this.toString());
  }
  toString = () => `Create(${this.n}, wait=${this.wait})`;
}

class TwoCreates implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => !m.boxes.has(this.n);
  async run(m: Model, r: Real) {
    const body = createBody(r, this.n, true);
    const both = await Promise.all([call(r, 'POST', BOXES, body), call(r, 'POST', BOXES, body)]);
    const created = both.filter((x) => x.status === 201);
    expect(created.length, both.map((x) => x.text).join(' | ')).toBe(1);
    expectError(both.find((x) => x.status !== 201)!, 409, 'the second create');
    expect(created[0].body.status, created[0].text).toBe(made(this.n, '').status);
    m.boxes.set(this.n, made(this.n, created[0].body.id));
    await checkAll(m, r, this.toString());
  }
  toString = () => `TwoCreates(${this.n})`;
}

/** An operation on a box the model does not hold: 404, nothing else changes. */
async function absent(r: Real, n: string, method: string, suffix: string, body?: unknown): Promise<void> {
  const res = await call(r, method, `${boxUrl(r, n)}${suffix}`, body);
  expectError(res, 404, `${method} ${suffix} of an unknown box`);
}

/** An operation that needs a ready box on one that is not: 409 that says what it is; nothing changes. */
async function notReady(res: ApiResult, b: BoxModel, what: string): Promise<void> {
  expectError(res, 409, what);
  expect(res.body.detail, what).toContain(` is ${b.status}`);
}

class ExecWrite implements Cmd {
  constructor(readonly n: string, readonly file: string, readonly content: string) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n);
    const res = await call(r, 'POST', `${boxUrl(r, this.n)}/execute`, { command: ['/bin/sh', '-c', 'printf %s "$1" > "/workspace/$2"', 'sh', this.content, this.file], timeout_seconds: 30 });
    if (!b) expectError(res, 404, 'execute in an unknown box');
    else if (b.status !== 'ready') await notReady(res, b, 'execute in a box not ready');
    else {
      expect(res.status, res.text).toBe(200);
      expect(res.body.exit_code, res.text).toBe(0);
      b.files.set(this.file, this.content);
    }
    await checkAll(m, r, this.toString());
  }
  toString = () => `ExecWrite(${this.n}, ${this.file}, ${JSON.stringify(this.content)})`;
}

class ExecBackground implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    const mk = marker();
    const res = await call(r, 'POST', `${boxUrl(r, this.n)}/execute`, { command: `${mk} >/dev/null 2>&1 </dev/null & echo started`, timeout_seconds: 30 });
    expect(res.status, res.text).toBe(200);
    expect(res.body.stdout, res.text).toBe('started\n');
    await waitFor(async () => hostProcesses(mk).length >= 1, `background '${mk}' running`);
    b.bg.push(mk);
    await checkAll(m, r, this.toString());
  }
  toString = () => `ExecBackground(${this.n})`;
}

class ExecTimeout implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const [child, fg] = [marker(), marker()];
    const res = await call(r, 'POST', `${boxUrl(r, this.n)}/execute`, { command: `${child} >/dev/null 2>&1 </dev/null & ${fg}`, timeout_seconds: 1 });
    expect(res.status, res.text).toBe(200);
    expect(res.body.timed_out, res.text).toBe(true);
    // The whole tree of the execution, its background child included.
    r.dead.add(child);
    r.dead.add(fg);
    await checkAll(m, r, this.toString());
  }
  toString = () => `ExecTimeout(${this.n})`;
}

class Stop implements Cmd {
  constructor(readonly n: string) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n);
    if (!b) await absent(r, this.n, 'POST', '/stop');
    else {
      const res = await call(r, 'POST', `${boxUrl(r, this.n)}/stop`);
      expect(res.status, res.text).toBe(200);
      expect(res.body.status, res.text).toBe('stopped');
      // A stop of a box already stopped changes nothing (its reason stays).
      if (b.status !== 'stopped') b.reason = null;
      b.status = 'stopped';
      killMarkers(r, b);
    }
    await checkAll(m, r, this.toString());
  }
  toString = () => `Stop(${this.n})`;
}

class Start implements Cmd {
  constructor(readonly n: string) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n);
    if (!b) await absent(r, this.n, 'POST', '/start');
    else {
      const res = await call(r, 'POST', `${boxUrl(r, this.n)}/start`);
      expect(res.status, res.text).toBe(200);
      const want = made(this.n, b.id);
      expect(res.body.status, res.text).toBe(want.status);
      // A ready box is left as it is: its processes go on.
      b.status = want.status;
      b.reason = want.reason;
    }
    await checkAll(m, r, this.toString(), { files: true });
  }
  toString = () => `Start(${this.n})`;
}

class Patch implements Cmd {
  constructor(readonly n: string, readonly ttl: number | undefined, readonly header: string | undefined) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const body: Record<string, unknown> = {};
    if (this.ttl !== undefined) body.idle_ttl_seconds = this.ttl;
    if (this.header !== undefined) body.proxy_config = proxyConfig(this.header);
    const b = m.boxes.get(this.n);
    if (!b) await absent(r, this.n, 'PATCH', '', body);
    else {
      const res = await call(r, 'PATCH', boxUrl(r, this.n), body);
      expect(res.status, res.text).toBe(200);
      expect(res.body.status, res.text).toBe(b.status);
      if (this.ttl !== undefined) b.idleTtl = this.ttl;
      if (this.header !== undefined) b.header = this.header;
    }
    await checkAll(m, r, this.toString(), { files: true });
  }
  toString = () => `Patch(${this.n}, ttl=${this.ttl}, header=${this.header})`;
}

class Delete implements Cmd {
  constructor(readonly n: string) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n);
    if (!b) await absent(r, this.n, 'DELETE', '');
    else {
      const uid = r.kind === 'local' ? uidOf(r, b.id) : null;
      const res = await call(r, 'DELETE', boxUrl(r, this.n));
      expect(res.status, res.text).toBe(204);
      killMarkers(r, b);
      m.boxes.delete(this.n);
      expectError(await call(r, 'GET', boxUrl(r, this.n)), 404, 'GET of a deleted box');
      await checkGone(r, b.id, uid);
    }
    await checkAll(m, r, this.toString());
  }
  toString = () => `Delete(${this.n})`;
}

class IdleTtl implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    expect((await call(r, 'PATCH', boxUrl(r, this.n), { idle_ttl_seconds: 1 })).status).toBe(200);
    await waitFor(async () => (await call(r, 'GET', boxUrl(r, this.n))).body?.status === 'stopped', 'the idle TTL to stop the box', 20_000);
    expect((await call(r, 'PATCH', boxUrl(r, this.n), { idle_ttl_seconds: b.idleTtl })).status).toBe(200);
    b.status = 'stopped';
    b.reason = /idle_ttl_seconds/;
    killMarkers(r, b);
    await checkAll(m, r, this.toString());
  }
  toString = () => `IdleTtl(${this.n})`;
}

/** An execution longer than the idle TTL runs to its end: the TTL counts from the last execution's end. */
class IdleTtlDuringExec implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    expect((await call(r, 'PATCH', boxUrl(r, this.n), { idle_ttl_seconds: 1 })).status).toBe(200);
    const res = await call(r, 'POST', `${boxUrl(r, this.n)}/execute`, { command: 'sleep 3; echo done', timeout_seconds: 30 });
    expect(res.status, res.text).toBe(200);
    expect([res.body.exit_code, res.body.stdout], res.text).toEqual([0, 'done\n']);
    await waitFor(async () => (await call(r, 'GET', boxUrl(r, this.n))).body?.status === 'stopped', 'the idle TTL to stop the box', 20_000);
    expect((await call(r, 'PATCH', boxUrl(r, this.n), { idle_ttl_seconds: b.idleTtl })).status).toBe(200);
    b.status = 'stopped';
    b.reason = /idle_ttl_seconds/;
    killMarkers(r, b);
    await checkAll(m, r, this.toString());
  }
  toString = () => `IdleTtlDuringExec(${this.n})`;
}

/** An execution under way (its marker running), then `op` on its box; the execution answers in wire.md's shape. */
async function duringExec(m: Model, r: Real, n: string, op: () => Promise<ApiResult>): Promise<ApiResult> {
  const mk = marker();
  const exec = call(r, 'POST', `${boxUrl(r, n)}/execute`, { command: mk, timeout_seconds: 60 });
  let answered: ApiResult | undefined;
  void exec.then((a) => (answered = a));
  await waitFor(async () => {
    if (answered) throw new Error(`the execution ended first: ${answered.status} ${answered.text}`);
    return hostProcesses(mk).length >= 1;
  }, `'${mk}' running`);
  r.dead.add(mk);
  const res = await op();
  const e = await exec;
  if (e.status === 200) expect(e.body.timed_out, e.text).toBe(false);
  else expectError(e, 409, 'an execution cut by a stop');
  return res;
}

class StopDuringExec implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    const res = await duringExec(m, r, this.n, () => call(r, 'POST', `${boxUrl(r, this.n)}/stop`));
    expect(res.status, res.text).toBe(200);
    expect(res.body.status).toBe('stopped');
    b.status = 'stopped';
    b.reason = null;
    killMarkers(r, b);
    await checkAll(m, r, this.toString());
  }
  toString = () => `StopDuringExec(${this.n})`;
}

class DeleteDuringExec implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    const uid = r.kind === 'local' ? uidOf(r, b.id) : null;
    const res = await duringExec(m, r, this.n, () => call(r, 'DELETE', boxUrl(r, this.n)));
    expect(res.status, res.text).toBe(204);
    killMarkers(r, b);
    m.boxes.delete(this.n);
    await checkGone(r, b.id, uid);
    await checkAll(m, r, this.toString());
  }
  toString = () => `DeleteDuringExec(${this.n})`;
}

class StartDuringStop implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.get(this.n)?.status === 'ready';
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    const [stop, start] = await Promise.all([call(r, 'POST', `${boxUrl(r, this.n)}/stop`), call(r, 'POST', `${boxUrl(r, this.n)}/start`)]);
    expect(stop.status, stop.text).toBe(200);
    expect(start.status, start.text).toBe(200);
    // Whichever went first, the box ends in a state it can be in, and the host agrees with it.
    const now = (await call(r, 'GET', boxUrl(r, this.n))).body.status;
    expect(['ready', 'stopped'], now).toContain(now);
    b.status = now;
    b.reason = null;
    // Stopped at least once, or stopped last: its children are gone either way if the stop ran.
    killMarkers(r, b);
    await checkAll(m, r, this.toString(), { files: true });
  }
  toString = () => `StartDuringStop(${this.n})`;
}

class Restart implements Cmd {
  check = (_m: Readonly<Model>) => true;
  async run(m: Model, r: Real) {
    await r.server.stop('SIGKILL');
    r.server = await startServer(r.kind, r.args, r.env);
    await this.meanwhile(m, r);
    await waitFor(async () => {
      const l = await call(r, 'GET', `${BOXES}?limit=100`);
      return l.status === 200 && (l.body.resources as { status: string }[]).every((x) => x.status !== 'provisioning');
    }, 'every box restored', 60_000);
    // Boxes come back as they were; nothing a killed server ran survives it.
    for (const b of m.boxes.values()) killMarkers(r, b);
    await checkAll(m, r, this.toString(), { files: true });
  }
  /** What is done while the new server brings the boxes back. */
  async meanwhile(_m: Model, _r: Real): Promise<void> {}
  toString = () => 'Restart';
}

/** A restart, and at once (the boxes still being brought back) an operation on one of them. */
class RestartThen extends Restart {
  constructor(readonly n: string, readonly op: 'stop' | 'delete' | 'execute') {
    super();
  }
  override check = (m: Readonly<Model>) => m.boxes.has(this.n);
  override async meanwhile(m: Model, r: Real): Promise<void> {
    const b = m.boxes.get(this.n)!;
    if (this.op === 'stop') {
      const res = await call(r, 'POST', `${boxUrl(r, this.n)}/stop`);
      expect(res.status, res.text).toBe(200);
      expect(res.body.status, res.text).toBe('stopped');
      if (b.status !== 'stopped') b.reason = null;
      b.status = 'stopped';
    } else if (this.op === 'delete') {
      const uid = r.kind === 'local' ? uidOf(r, b.id) : null;
      const res = await call(r, 'DELETE', boxUrl(r, this.n));
      expect(res.status, res.text).toBe(204);
      m.boxes.delete(this.n);
      // Once the restore is over: nothing of it came back.
      await waitFor(async () => (await call(r, 'GET', `${BOXES}?limit=100`)).body.resources.every((x: { status: string }) => x.status !== 'provisioning'), 'every box restored', 60_000);
      await checkGone(r, b.id, uid);
    } else {
      const res = await call(r, 'POST', `${boxUrl(r, this.n)}/execute`, { command: 'echo hi', timeout_seconds: 10 });
      if (res.status === 200) expect(res.body.stdout, res.text).toBe('hi\n');
      else {
        expectError(res, 409, 'execute while the box is brought back');
        expect(res.body.detail, res.text).toMatch(/ is (provisioning|stopped|failed)/);
      }
    }
  }
  override toString = () => `RestartThen(${this.n}, ${this.op})`;
}

class DoubleDelete implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => m.boxes.has(this.n);
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n)!;
    const uid = r.kind === 'local' ? uidOf(r, b.id) : null;
    const both = await Promise.all([call(r, 'DELETE', boxUrl(r, this.n)), call(r, 'DELETE', boxUrl(r, this.n))]);
    // One deletes it; the other finds it gone (wire.md: 404 for an unknown resource).
    expect(both.map((x) => x.status).sort(), both.map((x) => x.text).join(' | ')).toEqual([204, 404]);
    expectError(both.find((x) => x.status === 404)!, 404, 'the second DELETE');
    killMarkers(r, b);
    m.boxes.delete(this.n);
    await checkGone(r, b.id, uid);
    await checkAll(m, r, this.toString());
  }
  toString = () => `DoubleDelete(${this.n})`;
}

/** A create that does not wait, then `then` at once, while the box is still being started. */
abstract class WhileProvisioning implements Cmd {
  constructor(readonly n: string) {}
  check = (m: Readonly<Model>) => !m.boxes.has(this.n);
  async create(r: Real): Promise<string> {
    const res = await call(r, 'POST', BOXES, createBody(r, this.n, false));
    expect(res.status, res.text).toBe(201);
    return res.body.id as string;
  }
  abstract run(m: Model, r: Real): Promise<void>;
}

class CreateThenStop extends WhileProvisioning {
  override async run(m: Model, r: Real) {
    const id = await this.create(r);
    // An execution now: refused while it is provisioning (409 that says so), or run if it is ready already.
    const ex = await call(r, 'POST', `${boxUrl(r, this.n)}/execute`, { command: 'true', timeout_seconds: 10 });
    if (ex.status !== 200) expectError(ex, 409, 'execute in a provisioning box');
    const res = await call(r, 'POST', `${boxUrl(r, this.n)}/stop`);
    expect(res.status, res.text).toBe(200);
    expect(res.body.status, res.text).toBe('stopped');
    m.boxes.set(this.n, { ...made(this.n, id), status: 'stopped', reason: null });
    await checkAll(m, r, this.toString());
  }
  override toString = () => `CreateThenStop(${this.n})`;
}

class CreateThenDelete extends WhileProvisioning {
  override async run(m: Model, r: Real) {
    const id = await this.create(r);
    const res = await call(r, 'DELETE', boxUrl(r, this.n));
    expect(res.status, res.text).toBe(204);
    await checkGone(r, id, null);
    await checkAll(m, r, this.toString());
  }
  override toString = () => `CreateThenDelete(${this.n})`;
}

class CreateThenRestart extends WhileProvisioning {
  override async run(m: Model, r: Real) {
    const id = await this.create(r);
    m.boxes.set(this.n, made(this.n, id));
    await new Restart().run(m, r);
  }
  override toString = () => `CreateThenRestart(${this.n})`;
}

class FilePut implements Cmd {
  constructor(readonly n: string, readonly file: string, readonly content: string) {}
  check = () => true;
  async run(m: Model, r: Real) {
    const b = m.boxes.get(this.n);
    const res = await fetch(`${r.server.url}${boxUrl(r, this.n)}/files?path=${encodeURIComponent(`/workspace/${this.file}`)}`, { method: 'PUT', headers: { 'x-api-key': KEY }, body: this.content });
    const text = await res.text();
    const a: ApiResult = { status: res.status, text, body: text ? JSON.parse(text) : undefined };
    if (!b) expectError(a, 404, 'upload to an unknown box');
    else if (b.status !== 'ready') await notReady(a, b, 'upload to a box not ready');
    else {
      expect(a.status, text).toBeLessThan(300);
      b.files.set(this.file, this.content);
    }
    await checkAll(m, r, this.toString(), { files: b?.status === 'ready' });
  }
  toString = () => `FilePut(${this.n}, ${this.file}, ${JSON.stringify(this.content)})`;
}

const name = fc.constantFrom(...NAMES);
// An idle TTL a PATCH sets is never short enough to run out during a sequence (IdleTtl tests that).
export const commandArbs = [
  fc.tuple(name, fc.boolean()).map(([n, w]) => new Create(n, w)),
  name.map((n) => new TwoCreates(n)),
  fc.tuple(name, fc.constantFrom('lc-1', 'lc-2'), fc.stringMatching(/^[a-z0-9 ]{0,12}$/)).map(([n, f, c]) => new ExecWrite(n, f, c)),
  name.map((n) => new ExecBackground(n)),
  name.map((n) => new ExecTimeout(n)),
  name.map((n) => new Stop(n)),
  name.map((n) => new Start(n)),
  fc.tuple(name, fc.option(fc.oneof(fc.constant(0), fc.integer({ min: 300, max: 3600 })), { nil: undefined }), fc.option(fc.stringMatching(/^[a-z]{1,8}$/), { nil: undefined })).map(([n, t, h]) => new Patch(n, t, h)),
  name.map((n) => new Delete(n)),
  name.map((n) => new IdleTtl(n)),
  name.map((n) => new IdleTtlDuringExec(n)),
  name.map((n) => new StopDuringExec(n)),
  name.map((n) => new DeleteDuringExec(n)),
  name.map((n) => new StartDuringStop(n)),
  fc.constant(new Restart()),
  fc.tuple(name, fc.constantFrom('stop' as const, 'delete' as const, 'execute' as const)).map(([n, op]) => new RestartThen(n, op)),
  name.map((n) => new DoubleDelete(n)),
  name.map((n) => new CreateThenStop(n)),
  name.map((n) => new CreateThenDelete(n)),
  name.map((n) => new CreateThenRestart(n)),
  fc.tuple(name, fc.constantFrom('lc-1', 'lc-3'), fc.stringMatching(/^[a-z0-9 ]{0,12}$/)).map(([n, f, c]) => new FilePut(n, f, c)),
];

/** Sequences that once failed, run before the generated ones (each names what failed). */
const EXAMPLES: [Cmd[]][] = [
  // A stop of a box the idle TTL had stopped erased its status_reason.
  [[new IdleTtl('a'), new Stop('a')]],
  // Two DELETEs at once both answered 204.
  [[new DoubleDelete('a')]],
  // A stop while the restarted server was bringing the box back was undone: the box came back ready.
  [[new RestartThen('a', 'stop')]],
  // A DELETE while the restarted server was bringing the box back left its directory behind.
  [[new RestartThen('a', 'delete')]],
];

async function startServer(kind: Kind, args: string[], env: NodeJS.ProcessEnv): Promise<RunningCli> {
  const s = await startCli(args, { env });
  await waitForLine(s, (l) => l.startsWith(`sandbox driver ${kind}`));
  return s;
}

export async function lifecycleSuite(kind: Kind): Promise<void> {
  const why = (await driversUnavailable(`lifecycle property (${kind})`))[kind];
  describe.skipIf(why)(`box lifecycle against a model (${kind} driver)`, () => {
    let real: Real;
    let origin: { close(): Promise<void> } | undefined;
    let run = 0;

    beforeAll(async () => {
      const cfg = tmp();
      const engine = kind === 'docker' ? new DockerEngine(dockerSocket()!) : null;
      const image = engine ? await ensureBoxImage(engine) : undefined;
      writeFileSync(
        path.join(cfg, 'templates.json'),
        JSON.stringify([
          { name: 'box', description: 'lifecycle', ...(image ? { image } : { rootfs: 'host' }), environment: {} },
          // Nothing can build it: its boxes go failed, with why.
          { name: 'broken', description: 'lifecycle, failing', ...(image ? { image: 'keygate-lifecycle-missing:none' } : { rootfs: '/nonexistent-keygate-lifecycle-root' }), environment: {} },
        ]),
      );
      const setup = await setUpServe(KEY, ORIGIN);
      origin = setup.origin;
      const args = ['serve', '--listen', '127.0.0.1:0', '--data', setup.dataDir, '--sandbox-driver', kind, '--config-dir', cfg];
      real = { kind, server: await startServer(kind, args, setup.env), dataDir: setup.dataDir, args, env: setup.env, engine, prefix: '', dead: new Set(), originPort: setup.origin.port };
    }, 120_000);

    afterAll(async () => {
      if (real?.server) {
        for (const b of (await call(real, 'GET', `${BOXES}?limit=100`)).body.resources) await call(real, 'DELETE', `${BOXES}/${b.name}`);
        expect(await real.server.stop(), real.server.output().slice(-3000)).toBe(0);
      }
      await real?.engine?.close();
      await origin?.close();
      cleanTmp();
    });

    it('random sequences of lifecycle operations keep the API, the host and the model in agreement', async () => {
      // Few short sequences by default (each step is real boxes, and a restart is a new server).
      const params = propertyParams<[Cmd[]]>(kind === 'docker' ? 1 : 2, { endOnFailure: true, examples: EXAMPLES });
      await fc.assert(
        fc.asyncProperty(fc.array(fc.oneof(...commandArbs), { minLength: 4, maxLength: 8 }), async (cmds) => {
          real.prefix = `r${run++}-`;
          real.dead.clear();
          const model: Model = { boxes: new Map() };
          try {
            // Every run starts with one ready box (`a`); `b` is yet to be made.
            await new Create('a', true).run(model, real);
            await fc.asyncModelRun(() => ({ model, real }), cmds);
          } finally {
            if (process.env.KEYGATE_LIFECYCLE_TRACE) console.log(`run ${real.prefix}: ${cmds.map(String).join(', ')}`);
            // Whatever the run left: deleted, and checked gone.
            for (const [n, b] of model.boxes) {
              const uid = kind === 'local' ? uidOf(real, b.id) : null;
              await call(real, 'DELETE', boxUrl(real, n));
              await checkGone(real, b.id, uid);
            }
          }
        }),
        // The examples count among fast-check's runs: added to the generated ones, not taken from them.
        { ...params, numRuns: params.numRuns! + EXAMPLES.length },
      );
    }, 600_000);
  });
}
