// The env file keygate.json names (`"env": "config/app.env"`, not only `.env`) holds the values
// `keygate deploy` sends as the deployment's write-only secrets: it is never packed, so those
// values never reach the server's disk in clear. The real CLI against a real `keygate serve`.
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { copyEcho, findUnpacked, listTree, runDeploy } from './helpers.js';

const dirs: string[] = [];
const tmp = (prefix: string) => {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
};
const KEY = `kg_envfile_${randomBytes(12).toString('hex')}`;
const SECRET_VALUE = `EnvFileSecret-${randomBytes(8).toString('hex')}`;

let server: RunningCli;
let dataDir: string;

beforeAll(async () => {
  dataDir = tmp('keygate-envfile-data-');
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock' } });
});
afterAll(async () => {
  await server?.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** Every regular file under `dir` whose bytes contain `needle` (the unpacked sources are plain). */
function filesHolding(dir: string, needle: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const p = path.join(d, name);
      const st = statSync(p);
      if (st.isDirectory()) walk(p);
      else if (st.isFile() && readFileSync(p).includes(needle)) out.push(path.relative(dir, p));
    }
  };
  walk(dir);
  return out;
}

describe('an env file named in keygate.json', () => {
  it('becomes the deployment secrets and is not packed', async () => {
    const appDir = copyEcho(tmp('keygate-envfile-work-'), 'envfile-app');
    const cfg = JSON.parse(readFileSync(path.join(appDir, 'keygate.json'), 'utf8'));
    cfg.env = 'config/app.env';
    writeFileSync(path.join(appDir, 'keygate.json'), JSON.stringify(cfg));
    mkdirSync(path.join(appDir, 'config'));
    writeFileSync(path.join(appDir, 'config/app.env'), `ECHO_PREFIX="${SECRET_VALUE} "\n`);
    writeFileSync(path.join(appDir, 'config/settings.json'), '{"packed": true}\n');

    const r = await runDeploy([], { cwd: appDir, env: { KEYGATE_API_KEY: KEY, KEYGATE_URL: server.url } });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/secrets from .*app\.env: ECHO_PREFIX/);
    expect(r.stdout + r.stderr).not.toContain(SECRET_VALUE);

    const list = await fetch(`${server.url}/v2/deployments?name_contains=envfile-app`, { headers: { 'x-api-key': KEY } }).then((x) => x.json() as Promise<{ resources: { latest_revision_id: string; url: string }[] }>);
    const d = list.resources[0];
    const unpacked = findUnpacked(dataDir, d.latest_revision_id);
    expect(unpacked).toBeDefined();
    const files = listTree(unpacked!);
    expect(files).toContain('config/settings.json');
    expect(files).not.toContain('config/app.env');
    expect(filesHolding(dataDir, SECRET_VALUE)).toEqual([]);
    // The app still has the value, from the deployment's secrets.
    const run = await fetch(`${d.url}/runs/stream`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': KEY },
      body: JSON.stringify({ assistant_id: 'agent', input: { messages: [{ role: 'user', content: 'ping' }] }, stream_mode: 'values' }),
    });
    expect(await run.text()).toContain(`${SECRET_VALUE} ping`);
  });
});
