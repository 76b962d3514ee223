// Honest deployment status (issue #17 item 3), through the real `keygate deploy` against a real
// `keygate serve`: what serves is shown apart from how the latest revision ended, a replaced
// revision says so, and failure messages say what really serves.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { copyEcho, runDeploy } from './helpers.js';

const KEY = 'kg_test_deploy_status_key_0001';
const dirs: string[] = [];
const tmp = (p = 'keygate-status-') => {
  const d = mkdtempSync(path.join(os.tmpdir(), p));
  dirs.push(d);
  return d;
};
let server: RunningCli;
let work: string;

beforeAll(async () => {
  work = tmp();
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp('keygate-status-data-')], {
    env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_DEPLOY_TIMEOUT_MS: '15000', KEYGATE_DRAIN_TIMEOUT_MS: '2000', KEYGATE_STOP_GRACE_MS: '2000' },
  });
});
afterAll(async () => {
  await server?.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const env = () => ({ KEYGATE_API_KEY: KEY, KEYGATE_URL: server.url });
async function api(p: string): Promise<any> {
  const res = await fetch(server.url + p, { headers: { 'x-api-key': KEY } });
  return res.json();
}
const breakApp = (dir: string) => writeFileSync(path.join(dir, 'src/agent.js'), "throw new Error('this app fails when it starts');\n");
const fixApp = (dir: string) => writeFileSync(path.join(dir, 'src/agent.js'), "export default { description: 'fixed', async run() { return { messages: [] }; } };\n");

describe('deployment status says what is serving', () => {
  let dir: string;
  let depId: string;
  let good: string;

  it('a first deploy that fails says that nothing serves (there is no previous revision)', async () => {
    dir = copyEcho(work, 'status-app');
    breakApp(dir);
    const r = await runDeploy([], { cwd: dir, env: env() });
    expect(r.code, r.stdout + r.stderr).toBe(1);
    expect(r.stderr).toMatch(/ended DEPLOY_FAILED/);
    expect(r.stdout).toContain('nothing is serving: no revision of status-app is deployed');
    const dep = (await api('/v2/deployments?name_contains=status-app')).resources[0];
    depId = dep.id;
    expect(dep.active_revision_id).toBeNull();
    const logs = (await api(`/v2/deployments/${depId}/logs?type=deploy`)).logs.map((l: any) => l.message).join('\n');
    expect(logs).toContain('nothing is serving');
    expect(logs).not.toContain('previous revision keeps serving');
  }, 90_000);

  it('a failed update leaves the previous revision serving, and list shows both facts', async () => {
    fixApp(dir);
    const ok = await runDeploy([], { cwd: dir, env: env() });
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    good = (await api(`/v2/deployments/${depId}`)).active_revision_id;
    expect(good).toBeTruthy();
    // keygate.json names "env": ".env", which is never uploaded: no replica warns about it.
    const all = (await api(`/v2/deployments/${depId}/logs?revision_id=${good}&limit=1000`)).logs.map((l: any) => l.message).join('\n');
    expect(all).toContain('keygate.json: env file .env is not in the upload');
    expect(all).not.toMatch(/env: file \.env not found/);

    breakApp(dir);
    const bad = await runDeploy([], { cwd: dir, env: env() });
    expect(bad.code).toBe(1);
    expect(bad.stdout).toContain(`revision ${good} keeps serving at http://127.0.0.1:`);
    const logs = (await api(`/v2/deployments/${depId}/logs?type=deploy`)).logs.map((l: any) => l.message).join('\n');
    expect(logs).toContain(`revision ${good} keeps serving`);

    const j = await runDeploy(['list', '--json'], { cwd: dir, env: env() });
    const row = JSON.parse(j.stdout).find((x: any) => x.id === depId);
    expect(row).toMatchObject({ latest_status: 'DEPLOY_FAILED', active_revision_id: good, serving: true });
    expect(row.latest_revision_id).not.toBe(good);
    const t = await runDeploy(['list'], { cwd: dir, env: env() });
    const lines = t.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ID\s+NAME\s+TYPE\s+SERVING\s+LATEST\s+URL\s+UPDATED$/);
    expect(lines.find((l) => l.includes(depId))).toMatch(new RegExp(`\\bolder \\(${good.slice(0, 8)}\\)\\s+DEPLOY_FAILED\\s+http://`));
  }, 120_000);

  it('a replaced revision says so: replaced_by, not serving, and a message', async () => {
    fixApp(dir);
    const ok = await runDeploy([], { cwd: dir, env: env() });
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    const dep = await api(`/v2/deployments/${depId}`);
    expect(dep.active_revision_id).not.toBe(good);
    const old = await api(`/v2/deployments/${depId}/revisions/${good}`);
    expect(old).toMatchObject({ status: 'DEPLOYED', serving: false, replaced_by: dep.active_revision_id });
    expect(old.status_message).toBe(`replaced by revision ${dep.active_revision_id}; no longer serving`);
    const current = await api(`/v2/deployments/${depId}/revisions/${dep.active_revision_id}`);
    expect(current).toMatchObject({ status: 'DEPLOYED', serving: true, replaced_by: null });
    const t = await runDeploy(['list'], { cwd: dir, env: env() });
    expect(t.stdout.split('\n').find((l) => l.includes(depId))).toMatch(/\blatest \([0-9a-f]{8}\)\s+DEPLOYED\s+http:/);
  }, 120_000);
});

describe('small items of keygate deploy', () => {
  it("--name 'Bad Name!' is a usage error: exit 2, nothing sent", async () => {
    const dir = copyEcho(work, 'usage-app');
    const r = await runDeploy(['--name', 'Bad Name!'], { cwd: dir, env: env() });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("invalid deployment name 'Bad Name!'");
    expect((await api('/v2/deployments?name_contains=usage')).resources).toEqual([]);
  });

  it('says which .env variables are not sent as secrets, and why; sends the rest', async () => {
    const dir = copyEcho(work, 'secrets-app');
    const values = ['v-own-key-9f3', 'v-reserved-71c', 'v-path-0aa', 'v-good-5d2'];
    writeFileSync(
      path.join(dir, '.env'),
      `KEYGATE_API_KEY=${KEY}\nKEYGATE_URL=${server.url}\nKEYGATE_FLAVOUR=${values[1]}\nPATH=${values[2]}\nGOOD_SECRET=${values[3]}\n`,
    );
    const r = await runDeploy(['--no-wait'], { cwd: dir, env: {} });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain('not sent as secrets from .env: KEYGATE_API_KEY, KEYGATE_URL (settings of keygate deploy itself)');
    expect(r.stderr).toContain('not sent as secrets from .env: KEYGATE_FLAVOUR, PATH (names reserved by the runtime');
    expect(r.stdout).toContain('secrets from');
    for (const v of [...values, KEY]) expect(r.stdout + r.stderr).not.toContain(v);
    const dep = (await api('/v2/deployments?name_contains=secrets-app')).resources[0];
    expect(dep.secrets).toEqual([{ name: 'GOOD_SECRET' }]);
  });
});
