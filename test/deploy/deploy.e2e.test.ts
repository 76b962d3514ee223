// `keygate deploy` end to end: the real CLI against a real `keygate serve` (control plane, builds,
// app processes) on loopback, SQLite in a temp dir.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ControlPlaneClient } from '../../src/deploy/client.js';
import { CLI, startCli, type RunningCli } from '../helpers/cli.js';
import { cleanEnv, copyEcho, fakeDocker, findUnpacked, listTree, runDeploy, spawnDeploy } from './helpers.js';

const dirs: string[] = [];
const tmp = (prefix = 'keygate-deploy-e2e-') => {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
};

const HERE = path.dirname(fileURLToPath(import.meta.url));
const hasPython = spawnSync('python3', ['-c', 'import pty'], { encoding: 'utf8' }).status === 0;
if (!hasPython) console.warn('python3 with the pty module is not available: the terminal prompt test of deploy delete is skipped');

const KEY = `kg_deploytest_${randomBytes(16).toString('hex')}`;
const SECRET_VALUE = `Deployed-${randomBytes(6).toString('hex')} says: `;

let server: RunningCli;
let dataDir: string;
let work: string;

async function api(method: string, p: string, key = KEY): Promise<{ status: number; body: any }> {
  const res = await fetch(`${server.url}${p}`, { method, headers: { 'x-api-key': key } });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

/** JSON lines of a --json run; every stdout line must parse. */
function jsonLines(stdout: string): any[] {
  return stdout
    .split('\n')
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l));
}

function expectNoSecrets(text: string) {
  expect(text).not.toContain(KEY);
  expect(text).not.toContain(SECRET_VALUE.trim());
}

const withKey = () => ({ KEYGATE_API_KEY: KEY, KEYGATE_URL: server.url });

beforeAll(async () => {
  dataDir = tmp('keygate-deploy-data-');
  work = tmp();
  // These tests are about a control plane without a container engine (one may run on the host).
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock' } });
});
afterAll(async () => {
  await server?.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('keygate deploy against a real keygate serve', () => {
  let appDir: string;
  let deploymentId: string;
  let firstRevision: string;

  it('creates the deployment named after the directory, with the key and URL from .env, and waits for DEPLOYED', async () => {
    appDir = copyEcho(work, 'Echo_App');
    // What must never be uploaded: local secrets, installed modules, git data, ignored files.
    writeFileSync(path.join(appDir, '.env'), `KEYGATE_API_KEY=${KEY}\nKEYGATE_URL=${server.url}\nECHO_PREFIX="${SECRET_VALUE}"\n`);
    writeFileSync(path.join(appDir, '.env.local'), 'LOCAL=1\n');
    mkdirSync(path.join(appDir, 'node_modules/left-pad'), { recursive: true });
    writeFileSync(path.join(appDir, 'node_modules/left-pad/index.js'), 'module.exports = 1');
    mkdirSync(path.join(appDir, '.git'));
    writeFileSync(path.join(appDir, '.git/HEAD'), 'ref: refs/heads/main\n');
    writeFileSync(path.join(appDir, '.gitignore'), 'scratch/\n*.tmp\n');
    writeFileSync(path.join(appDir, '.keygateignore'), 'notes.md\n');
    mkdirSync(path.join(appDir, 'scratch'));
    writeFileSync(path.join(appDir, 'scratch/big.bin'), 'x');
    writeFileSync(path.join(appDir, 'draft.tmp'), 'x');
    writeFileSync(path.join(appDir, 'notes.md'), 'x');
    writeFileSync(path.join(appDir, 'README.md'), 'packed');

    const r = await runDeploy([], { cwd: appDir });
    expect(r.stderr).not.toMatch(/unexpected error/);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    for (const step of ['[1/4] Checking prerequisites', '[2/4] Packing', '[3/4] Uploading', '[4/4] Deploying']) expect(r.stdout).toContain(step);
    expect(r.stdout).toMatch(/API key \(from .*\.env\)/);
    expect(r.stdout).toMatch(/uploaded \d+ bytes/);
    expect(r.stdout).toMatch(/created deployment [0-9a-f-]{36} \(echo-app\)/);
    // Every status change with the elapsed time, ending with DEPLOYED and the URL.
    expect(r.stdout).toMatch(/BUILDING \(\d+\.\d+s\)/);
    expect(r.stdout).toMatch(/DEPLOYED \(\d+\.\d+s\)/);
    expect(r.stdout).toMatch(/URL: http:\/\/127\.0\.0\.1:\d+/);
    // The app's env file became the deployment's secrets: names shown, values never.
    expect(r.stdout).toMatch(/secrets from .*\.env: ECHO_PREFIX/);
    expectNoSecrets(r.stdout + r.stderr);

    const list = await api('GET', '/v2/deployments?name_contains=echo-app');
    const d = list.body.resources.find((x: any) => x.name === 'echo-app');
    expect(d).toBeDefined();
    deploymentId = d.id;
    firstRevision = d.latest_revision_id;
    expect(d.source_config.deployment_type).toBe('dev');
    expect(d.active_revision_id).toBe(firstRevision);
    expect((d.secrets ?? []).map((s: any) => s.name)).toEqual(['ECHO_PREFIX']);
    expect((await api('GET', `/v2/deployments/${d.id}/revisions/${firstRevision}`)).body.status).toBe('DEPLOYED');

    // The deployed app answers at the reported URL and got ECHO_PREFIX from the secrets.
    const run = await fetch(`${d.url}/runs/stream`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': KEY },
      body: JSON.stringify({ assistant_id: 'agent', input: { messages: [{ role: 'user', content: 'ping' }] }, stream_mode: 'values' }),
    });
    expect(run.status).toBe(200);
    expect(await run.text()).toContain(`${SECRET_VALUE}ping`);

    // The control plane unpacked exactly what the ignore rules let through.
    const unpacked = findUnpacked(dataDir, firstRevision);
    expect(unpacked, 'unpacked revision directory').toBeDefined();
    const files = listTree(unpacked!).filter((f) => !f.startsWith('node_modules/') || f.includes('left-pad'));
    expect(files).toEqual(expect.arrayContaining(['.gitignore', '.keygateignore', 'README.md', 'keygate.json', 'package.json', 'src/agent.js']));
    for (const never of ['.env', '.env.local', '.env.example', 'node_modules/left-pad/index.js', '.git/HEAD', 'scratch/big.bin', 'draft.tmp', 'notes.md']) {
      expect(files).not.toContain(never);
    }
  });

  it('deploys again: updated in place (same ID, a new revision), --json lines with a final result', async () => {
    writeFileSync(path.join(appDir, 'README.md'), 'changed');
    const r = await runDeploy(['--json'], { cwd: appDir });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    const events = jsonLines(r.stdout); // throws if any stdout line is not JSON
    expect(events.length).toBeGreaterThan(5);
    expect(events.filter((e) => e.event === 'step').map((e) => e.step)).toEqual([1, 2, 3, 4]);
    const statuses = events.filter((e) => e.event === 'status');
    expect(statuses.at(-1)).toMatchObject({ status: 'DEPLOYED' });
    for (const s of statuses) expect(typeof s.elapsed_s).toBe('number');
    const result = events.at(-1);
    expect(result).toMatchObject({ event: 'result', ok: true, deployment_id: deploymentId, status: 'DEPLOYED', created: false });
    expect(result.revision_id).not.toBe(firstRevision);
    expect(result.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+/);
    expectNoSecrets(r.stdout + r.stderr);

    const d = (await api('GET', `/v2/deployments/${deploymentId}`)).body;
    expect(d.latest_revision_id).toBe(result.revision_id);
    expect(d.active_revision_id).toBe(result.revision_id);
    const all = await api('GET', '/v2/deployments?name_contains=echo-app');
    expect(all.body.resources.filter((x: any) => x.name === 'echo-app')).toHaveLength(1);
  });

  it('--name and --deployment-type prod, with the key passed inline and DIR as the argument', async () => {
    const dir = copyEcho(work, 'prod-src');
    const r = await runDeploy([dir, '--name', 'echo-prod', '--deployment-type', 'prod'], { cwd: work, env: withKey() });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain('API key (from the environment)');
    expect(r.stdout).toMatch(/created deployment [0-9a-f-]{36} \(echo-prod\)/);
    const list = await api('GET', '/v2/deployments?name_contains=echo-prod');
    const d = list.body.resources.find((x: any) => x.name === 'echo-prod');
    expect(d.source_config.deployment_type).toBe('prod');
    expect((await api('GET', `/v2/deployments/${d.id}/revisions/${d.latest_revision_id}`)).body.status).toBe('DEPLOYED');
    expect((await api('GET', '/v2/deployments?name_contains=prod-src')).body.resources).toHaveLength(0);
  });

  it('deploy list shows every deployment as a table and as JSON', async () => {
    const r = await runDeploy(['list'], { cwd: work, env: withKey() });
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ID\s+NAME\s+TYPE\s+SERVING\s+LATEST\s+URL\s+UPDATED$/);
    const row = lines.find((l) => l.includes(deploymentId))!;
    expect(row).toMatch(new RegExp(`^${deploymentId}\\s+echo-app\\s+dev\\s+latest \\([0-9a-f]{8}\\)\\s+DEPLOYED\\s+http://127\\.0\\.0\\.1:\\d+\\S*\\s+\\d{4}-`));
    expect(lines.find((l) => /\becho-prod\b/.test(l))).toMatch(/\bprod\s+latest \([0-9a-f]{8}\)\s+DEPLOYED\b/);

    const j = await runDeploy(['list', '--json'], { cwd: work, env: withKey() });
    expect(j.code).toBe(0);
    const rows = JSON.parse(j.stdout);
    expect(rows.find((x: any) => x.id === deploymentId)).toMatchObject({ name: 'echo-app', type: 'dev', status: 'DEPLOYED' });
    expect(rows.map((x: any) => x.name).sort()).toEqual(['echo-app', 'echo-prod']);
  });

  it('finds the deployment of EXACTLY that name across every page of the substring search', async () => {
    // One deployment per page, so the search has to walk all of them.
    const client = new ControlPlaneClient({ baseUrl: server.url, apiKey: KEY, pageSize: 1 });
    try {
      const all = await client.listAllDeployments();
      expect(all.map((d) => d.name).sort()).toEqual(['echo-app', 'echo-prod']);
      expect((await client.findByName('echo-prod'))?.name).toBe('echo-prod');
      expect((await client.findByName('echo-app'))?.id).toBe(deploymentId);
      expect(await client.findByName('echo')).toBeUndefined(); // a substring of both is not a match
    } finally {
      await client.close();
    }
    // So `--name echo` creates its own deployment instead of updating echo-app or echo-prod.
    const r = await runDeploy([appDir, '--name', 'echo', '--no-wait', '--json'], { cwd: work, env: withKey() });
    expect(r.code, r.stderr).toBe(0);
    const result = jsonLines(r.stdout).at(-1);
    expect(result).toMatchObject({ ok: true, created: true });
    expect(result.deployment_id).not.toBe(deploymentId);
    expect((await api('DELETE', `/v2/deployments/${result.deployment_id}`)).status).toBe(204);
  });

  it('deploy logs shows build lines (by ID, by --name, and for the current directory)', async () => {
    const byId = await runDeploy(['logs', deploymentId, '--type', 'build'], { cwd: work, env: withKey() });
    expect(byId.code, byId.stderr).toBe(0);
    const lines = byId.stdout.trim().split('\n');
    expect(lines.length).toBeGreaterThan(0);
    for (const l of lines) expect(l).toMatch(/^\d{4}-\d\d-\d\dT\S+ build  /);

    const byName = await runDeploy(['logs', '--name', 'echo-app', '--type', 'build', '--json'], { cwd: work, env: withKey() });
    expect(byName.code).toBe(0);
    const entries = byName.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(entries.every((e: any) => e.type === 'build')).toBe(true);
    expect(entries.length).toBe(lines.length);

    // In the app directory itself the deployment is found by the directory's name (key from .env).
    const here = await runDeploy(['logs', '--type', 'deploy', '--tail', '3'], { cwd: appDir });
    expect(here.code, here.stderr).toBe(0);
    const hereLines = here.stdout.trim().split('\n').filter(Boolean);
    expect(hereLines.length).toBeGreaterThan(0);
    expect(hereLines.length).toBeLessThanOrEqual(3);
    expectNoSecrets(byId.stdout + byName.stdout + here.stdout);

    // --since: a window back from now includes the build; a time in the future includes nothing.
    const recent = await runDeploy(['logs', deploymentId, '--type', 'build', '--since', '10m'], { cwd: work, env: withKey() });
    expect(recent.code, recent.stderr).toBe(0);
    expect(recent.stdout.trim().split('\n').length).toBeGreaterThanOrEqual(lines.length);
    const future = await runDeploy(['logs', deploymentId, '--type', 'build', '--since', '2999-01-01T00:00:00Z'], { cwd: work, env: withKey() });
    expect(future.code, future.stderr).toBe(0);
    expect(future.stdout).toBe('');
    const bad = await runDeploy(['logs', deploymentId, '--since', 'yesterday'], { cwd: work, env: withKey() });
    expect(bad.code).toBe(2);

    const unknown = await runDeploy(['logs', '--name', 'no-such-app'], { cwd: work, env: withKey() });
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain("no deployment named 'no-such-app'");
  });

  it('deploy logs --follow streams until Ctrl-C and exits 0', async () => {
    const f = spawnDeploy(['logs', deploymentId, '--type', 'build', '--follow'], { cwd: work, env: withKey() });
    const deadline = Date.now() + 20_000;
    while (!/ build  /.test(f.stdout()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect(f.stdout()).toMatch(/ build  /);
    // Let it attach to the stream, then interrupt as a user would.
    await new Promise((r) => setTimeout(r, 500));
    f.proc.kill('SIGINT');
    const r = await f.done;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).not.toMatch(/unexpected error/);
  });

  it('a broken app exits non-zero and shows the tail of the build log', async () => {
    const dir = copyEcho(work, 'broken-app');
    writeFileSync(
      path.join(dir, 'package.json'),
      JSON.stringify({ name: 'broken', private: true, type: 'module', scripts: { build: `node -e "console.error('build-marker-7f3a: compiler exploded'); process.exit(3)"` } }),
    );
    const r = await runDeploy([], { cwd: dir, env: withKey() });
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/BUILD_FAILED \(\d+\.\d+s\)/);
    expect(r.stdout).toMatch(/--- last \d+ lines of the build log/);
    expect(r.stdout).toContain('build-marker-7f3a: compiler exploded');
    expect(r.stderr).toMatch(/ended BUILD_FAILED/);

    const j = await runDeploy(['--json'], { cwd: dir, env: withKey() });
    expect(j.code).toBe(1);
    const events = jsonLines(j.stdout);
    expect(events.some((e) => e.event === 'log' && String(e.message).includes('build-marker-7f3a'))).toBe(true);
    expect(events.at(-1)).toMatchObject({ event: 'result', ok: false, status: 'BUILD_FAILED', created: false });
  });

  it('times out with exit 124 when the revision does not finish in time', async () => {
    const dir = copyEcho(work, 'slow-app');
    const r = await runDeploy(['--timeout', '1ms', '--json'], { cwd: dir, env: withKey() });
    expect(r.code).toBe(124);
    const result = jsonLines(r.stdout).at(-1);
    expect(result).toMatchObject({ event: 'result', ok: false });
    expect(result.error).toMatch(/timed out/);
  });

  it('--no-wait returns after submitting, with the ids', async () => {
    const dir = copyEcho(work, 'nowait-app');
    const r = await runDeploy(['--no-wait', '--json'], { cwd: dir, env: withKey() });
    expect(r.code, r.stderr).toBe(0);
    const result = jsonLines(r.stdout).at(-1);
    expect(result).toMatchObject({ event: 'result', ok: true, created: true, status: null });
    expect(result.deployment_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(result.revision_id).toBeTruthy();
  });

  it('delete refuses without --force when there is no terminal, and deletes with --force', async () => {
    const refused = await runDeploy(['delete', deploymentId], { cwd: work, env: withKey() });
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/refusing to delete .* pass --force/);
    expect((await api('GET', `/v2/deployments/${deploymentId}`)).status).toBe(200);

    const r = await runDeploy(['delete', deploymentId, '--force'], { cwd: work, env: withKey() });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`Deleted deployment ${deploymentId} (echo-app)`);
    expect((await api('GET', `/v2/deployments/${deploymentId}`)).status).toBe(404);

    const again = await runDeploy(['delete', deploymentId, '--force'], { cwd: work, env: withKey() });
    expect(again.code).toBe(1);
    expect(again.stderr.trim()).toBe(`keygate: deployment ${deploymentId} not found`);
  });
});

describe.skipIf(!hasPython)('keygate deploy delete on a terminal', () => {
  /** Runs `keygate deploy ARGS` on a pseudo-terminal and answers the [y/N] question with `answer`. */
  function onTty(args: string[], answer: string) {
    const r = spawnSync('python3', [path.join(HERE, 'pty_run.py'), '[y/N]', answer, '--', process.execPath, CLI, 'deploy', ...args], {
      cwd: work,
      env: cleanEnv(withKey()),
      encoding: 'utf8',
      timeout: 90_000,
    });
    return JSON.parse(r.stdout) as { code: number; answered: boolean; output: string };
  }

  it('on a terminal: a progress bar and colours; NO_COLOR turns colours off', () => {
    const dir = copyEcho(work, 'tty-app');
    const r = spawnSync('python3', [path.join(HERE, 'pty_run.py'), 'NO PROMPT', '', '--', process.execPath, CLI, 'deploy'], { cwd: dir, env: cleanEnv(withKey()), encoding: 'utf8', timeout: 90_000 });
    const tty = JSON.parse(r.stdout) as { code: number; output: string };
    expect(tty.code, tty.output).toBe(0);
    expect(tty.output).toMatch(/\[#+\] 100%/);
    expect(tty.output).toContain('\u001b[32mDEPLOYED\u001b[0m');
    expect(tty.output).toContain('\u001b[1m[1/4] Checking prerequisites');

    const plain = spawnSync('python3', [path.join(HERE, 'pty_run.py'), 'NO PROMPT', '', '--', process.execPath, CLI, 'deploy'], { cwd: dir, env: cleanEnv({ ...withKey(), NO_COLOR: '1' }), encoding: 'utf8', timeout: 90_000 });
    const nc = JSON.parse(plain.stdout) as { code: number; output: string };
    expect(nc.code, nc.output).toBe(0);
    expect(nc.output).toMatch(/DEPLOYED \(\d+\.\d+s\)/);
    expect(nc.output).not.toMatch(/\u001b\[(1|3\d)m/);
  });

  it('asks, defaults to No, and deletes only on y', async () => {
    const list = await api('GET', '/v2/deployments?name_contains=echo-prod');
    const d = list.body.resources.find((x: any) => x.name === 'echo-prod');
    expect(d).toBeDefined();

    for (const answer of ['', 'n', 'nope']) {
      const r = onTty(['delete', d.id], answer);
      expect(r.answered).toBe(true);
      expect(r.output).toContain(`Delete deployment ${d.id} (echo-prod)? [y/N]`);
      expect(r.output).toContain('Not deleted.');
      expect(r.code).toBe(1);
      expect((await api('GET', `/v2/deployments/${d.id}`)).status).toBe(200);
    }
    const yes = onTty(['delete', d.id], 'y');
    expect(yes.code, yes.output).toBe(0);
    expect(yes.output).toContain(`Deleted deployment ${d.id} (echo-prod).`);
    expect((await api('GET', `/v2/deployments/${d.id}`)).status).toBe(404);
  });
});

describe('prerequisites and failures are one clear line', () => {
  it('a wrong API key: one line, no stack trace, the key not echoed', async () => {
    const dir = copyEcho(work, 'wrong-key');
    const wrong = `kg_wrong_${randomBytes(16).toString('hex')}`;
    for (const args of [[], ['list'], ['logs', '--name', 'x'], ['delete', 'x', '--force']]) {
      const r = await runDeploy(args, { cwd: dir, env: { KEYGATE_API_KEY: wrong, KEYGATE_URL: server.url } });
      expect(r.code, args.join(' ')).toBe(1);
      expect(r.stderr).toBe('keygate: the control plane rejected the API key (401)\n');
      expect(r.stdout + r.stderr).not.toContain(wrong);
      expect(r.stderr).not.toMatch(/\n\s+at /);
    }
  });

  it('no API key anywhere: says where it is looked for', async () => {
    const dir = copyEcho(work, 'no-key');
    const r = await runDeploy([], { cwd: dir, env: { KEYGATE_URL: server.url } });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^keygate: no API key: set KEYGATE_API_KEY in the environment .* or in .*no-key\/\.env\n$/);
  });

  it('an unreachable control plane: a clear message naming the address', async () => {
    const port = await new Promise<number>((resolve) => {
      const s = createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
    const dir = copyEcho(work, 'unreachable');
    const r = await runDeploy([], { cwd: dir, env: { KEYGATE_API_KEY: KEY, KEYGATE_URL: `http://127.0.0.1:${port}` } });
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`keygate: cannot reach the control plane at http://127.0.0.1:${port}: connection refused (ECONNREFUSED); is 'keygate serve' running there? (set KEYGATE_URL)\n`);
    const l = await runDeploy(['list', '--json'], { cwd: dir, env: { KEYGATE_API_KEY: KEY, KEYGATE_URL: `http://127.0.0.1:${port}` } });
    expect(l.code).toBe(1);
    expect(l.stdout).toBe('');
  });

  it('an invalid application directory is refused before anything is sent', async () => {
    const dir = path.join(work, 'not-an-app');
    mkdirSync(dir);
    const r = await runDeploy([], { cwd: dir, env: withKey() });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/keygate\.json not found/);
    expect((await api('GET', '/v2/deployments?name_contains=not-an-app')).body.resources).toHaveLength(0);
  });

  it('--image checks the container runtime first, with one message for "missing" and one for "not running"', async () => {
    const missing = await runDeploy(['--image', 'registry.test/app:1', '--name', 'img-app'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: '/nonexistent/docker' } });
    expect(missing.code).toBe(1);
    expect(missing.stderr).toBe("keygate: no container runtime: '/nonexistent/docker' was not found; install Docker (or set KEYGATE_DOCKER) to deploy images\n");
    // `false` stands in for a docker CLI whose daemon does not answer (it exits non-zero).
    const down = await runDeploy(['--image', 'registry.test/app:1', '--name', 'img-app'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: 'false' } });
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/^keygate: the container runtime is not running: false info: exit status 1\n$/);
    expect((await api('GET', '/v2/deployments?name_contains=img-app')).body.resources).toHaveLength(0);
  });

  it('--image deploys an external_docker revision; without an engine on the control plane it fails clearly', async () => {
    // A stand-in docker CLI for the local prerequisite (no Docker here); the control plane's own
    // engine check is the real one.
    const bin = path.join(work, 'fake-docker');
    writeFileSync(bin, '#!/bin/sh\nif [ "$1" = info ]; then echo 27.0.0-test; exit 0; fi\nexit 1\n', { mode: 0o755 });
    const r = await runDeploy(['--image', 'registry.test/app:1', '--name', 'img-app', '--json', '--timeout', '60s'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: bin } });
    const events = jsonLines(r.stdout);
    expect(events.filter((e) => e.event === 'step').map((e) => `${e.step}/${e.total} ${e.title}`)).toEqual(['1/2 Checking prerequisites', '2/2 Deploying']);
    expect(events.some((e) => e.event === 'check' && /container runtime \(docker 27\.0\.0-test\)/.test(e.message))).toBe(true);
    const result = events.at(-1);
    expect(result.event).toBe('result');
    if (result.ok) {
      console.warn('a Docker engine answered the control plane: the image deployment succeeded');
    } else {
      expect(r.code).toBe(1);
      expect(String(result.error ?? result.status)).toMatch(/container engine|DEPLOY_FAILED/);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
    }
    const left = (await api('GET', '/v2/deployments?name_contains=img-app')).body.resources;
    for (const d of left) await api('DELETE', `/v2/deployments/${d.id}`);
  });

  describe('--build-image', () => {
    const TAG = 'registry.test/team/img-build:1';
    let ctx: string;
    const dockerDir = () => mkdtempSync(path.join(work, 'docker-'));
    const noDeployment = async () => expect((await api('GET', '/v2/deployments?name_contains=img-build')).body.resources).toHaveLength(0);

    beforeAll(() => {
      ctx = path.join(work, 'image-app');
      mkdirSync(ctx);
      writeFileSync(path.join(ctx, 'Dockerfile'), 'FROM node:20-slim\nCOPY . /app\nCMD ["node", "/app/server.js"]\n');
      writeFileSync(path.join(ctx, 'server.js'), 'require("http").createServer((q, s) => s.end("ok")).listen(8000);\n');
    });

    it('builds (for linux/amd64 only on ARM hosts), streams the output, pushes to the registry, and deploys the image; the control plane refuses it without an engine in one line', async () => {
      const fake = fakeDocker(dockerDir());
      const r = await runDeploy([ctx, '--build-image', TAG, '--name', 'img-build', '--json', '--timeout', '60s'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: fake.bin } });
      const events = jsonLines(r.stdout);
      expect(events.filter((e) => e.event === 'step').map((e) => `${e.step}/${e.total} ${e.title}`)).toEqual([
        '1/4 Checking prerequisites',
        '2/4 Building image',
        '3/4 Pushing image',
        '4/4 Deploying',
      ]);
      const calls = fake.calls().map((c) => c.args);
      const hostPlatform = process.arch === 'arm64' || process.arch === 'arm' ? ['--platform', 'linux/amd64'] : [];
      expect(calls).toEqual([
        ['info', '--format', '{{.ServerVersion}}'],
        ['build', '--force-rm', ...hostPlatform, '-t', TAG, ctx],
        ['image', 'inspect', '--format', '{{.Os}}/{{.Architecture}}', TAG],
        ['push', TAG],
      ]);
      expect(fake.calls().some((c) => c.apiKeyInEnv)).toBe(false);
      // The tools' output, line by line, as log events in order per stream.
      const logs = events.filter((e) => e.event === 'log');
      expect(logs.filter((e) => e.origin === 'docker build' && e.stream === 'stdout').map((e) => e.message)).toEqual([`build step 1/2 for ${ctx}`, 'build step 2/2 done']);
      expect(logs.filter((e) => e.origin === 'docker build' && e.stream === 'stderr').map((e) => e.message)).toEqual(['build progress on stderr']);
      expect(logs.filter((e) => e.origin === 'docker push').map((e) => e.message).sort()).toEqual(['push progress on stderr', `push step 1/2 for ${TAG}`, 'push step 2/2 done'].sort());
      for (const l of logs) expect(l).toMatchObject({ type: 'build', timestamp: expect.any(String) });
      expect(events.some((e) => e.event === 'check' && e.pushed === true && e.registry === 'registry.test')).toBe(true);
      // The image went to the control plane as external_docker: with no engine there it answers 422.
      const result = events.at(-1);
      expect(result.event).toBe('result');
      if (result.ok) {
        console.warn('a Docker engine answered the control plane: the image deployment succeeded');
      } else {
        expect(r.code).toBe(1);
        expect(result.error).toMatch(/container engine.*\(422\)$/);
        expect(r.stderr).toBe(`keygate: ${result.error}\n`);
        await noDeployment();
      }
      expectNoSecrets(r.stdout + r.stderr);
    });

    it('a tag without a registry is built and deployed as is, not pushed; people see the build output on stderr', async () => {
      const fake = fakeDocker(dockerDir());
      const r = await runDeploy([ctx, '--build-image', 'img-build:dev', '--name', 'img-build'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: fake.bin } });
      expect(fake.calls().map((c) => c.args[0])).toEqual(['info', 'build', 'image']);
      expect(r.stdout).toContain('[2/4] Building image');
      expect(r.stdout).toMatch(/\[3\/4\] Pushing image\n\s+not pushed: img-build:dev names no registry/);
      expect(r.stdout).toContain('[4/4] Deploying');
      const err = r.stderr.split('\n').filter(Boolean);
      expect(err).toContain(`      │ build step 1/2 for ${ctx}`);
      expect(err).toContain('      │ build progress on stderr');
      expect(r.code).toBe(1);
      expect(err.at(-1)).toMatch(/^keygate: .*container engine.*\(422\)$/);
      expect(r.stderr).not.toMatch(/\n\s+at /);
      await noDeployment();
    });

    it('a failed build stops before anything is pushed or deployed, with one line', async () => {
      const fake = fakeDocker(dockerDir());
      const r = await runDeploy([ctx, '--build-image', TAG, '--name', 'img-build'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: fake.bin, FAKE_DOCKER_FAIL: 'build' } });
      expect(r.code).toBe(1);
      expect(r.stderr.split('\n').filter(Boolean).at(-1)).toBe('keygate: the image build failed: docker build exited with status 3 (its output is above)');
      expect(r.stderr).toContain('│ build: something broke');
      expect(fake.calls().map((c) => c.args[0])).toEqual(['info', 'build']);
      await noDeployment();
    });

    it('a failed push stops before anything is deployed', async () => {
      const fake = fakeDocker(dockerDir());
      const r = await runDeploy([ctx, '--build-image', TAG, '--name', 'img-build', '--json'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: fake.bin, FAKE_DOCKER_FAIL: 'push' } });
      expect(r.code).toBe(1);
      const msg = `pushing ${TAG} failed: docker push exited with status 3 (its output is above; are you logged in? docker login registry.test)`;
      expect(r.stderr).toBe(`keygate: ${msg}\n`);
      expect(jsonLines(r.stdout).at(-1)).toMatchObject({ event: 'result', ok: false, error: msg });
      await noDeployment();
    });

    it('prerequisites: a Dockerfile in DIR, a runtime that is installed and running; nothing is built otherwise', async () => {
      const fake = fakeDocker(dockerDir());
      const empty = path.join(work, 'no-dockerfile');
      mkdirSync(empty);
      const noFile = await runDeploy([empty, '--build-image', TAG, '--name', 'img-build'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: fake.bin } });
      expect(noFile.code).toBe(1);
      expect(noFile.stderr).toBe(`keygate: ${path.join(empty, 'Dockerfile')} not found: --build-image builds the Dockerfile in DIR\n`);
      expect(fake.calls()).toEqual([]);

      const missing = await runDeploy([ctx, '--build-image', TAG, '--name', 'img-build'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: '/nonexistent/docker' } });
      expect(missing.code).toBe(1);
      expect(missing.stderr).toBe("keygate: no container runtime: '/nonexistent/docker' was not found; install Docker (or set KEYGATE_DOCKER) to deploy images\n");
      const down = await runDeploy([ctx, '--build-image', TAG, '--name', 'img-build'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: 'false' } });
      expect(down.code).toBe(1);
      expect(down.stderr).toBe('keygate: the container runtime is not running: false info: exit status 1\n');

      // The project's .env (API key, app secrets) must not travel in the build context.
      const leaky = path.join(work, 'leaky-image-app');
      mkdirSync(leaky);
      writeFileSync(path.join(leaky, 'Dockerfile'), 'FROM scratch\nCOPY . .\n');
      writeFileSync(path.join(leaky, '.env'), `KEYGATE_API_KEY=${KEY}\n`);
      const leak = await runDeploy([leaky, '--build-image', TAG, '--name', 'img-build'], { cwd: work, env: { KEYGATE_URL: server.url, KEYGATE_DOCKER: fake.bin } });
      expect(leak.code).toBe(1);
      expect(leak.stderr).toBe(`keygate: refusing to build: .env would be sent to docker with the build context (and could be copied into the image); add '.env*' to ${path.join(leaky, '.dockerignore')}\n`);
      expect(fake.calls()).toEqual([]);
      await noDeployment();
    });

    it('usage errors: both --image and --build-image, or an invalid tag', async () => {
      for (const args of [['--image', 'a:1', '--build-image', 'b:1'], ['--build-image=--platform=linux/arm64'], ['--build-image', 'Bad Tag'], ['--build-image', 'x@sha256:00'], ['--build-image', '']]) {
        const r = await runDeploy([ctx, ...args, '--name', 'img-build'], { cwd: work, env: { ...withKey(), KEYGATE_DOCKER: 'false' } });
        expect(r.code, args.join(' ')).toBe(2);
        expect(r.stderr, args.join(' ')).toMatch(/^keygate: (give either --image or --build-image, not both|--build-image( needs a value|: '))/);
        expect(r.stderr).not.toMatch(/\n\s+at /);
      }
    });
  });

  it('usage errors exit 2', async () => {
    for (const args of [['--deployment-type', 'staging'], ['--timeout', 'soon'], ['--bogus'], ['delete'], ['logs', '--type', 'x']]) {
      const r = await runDeploy(args, { cwd: work, env: withKey() });
      expect(r.code, args.join(' ')).toBe(2);
    }
  });
});
