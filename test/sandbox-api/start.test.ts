import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openSecretStore } from '../../src/secrets/store.js';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { localBoxesUnavailable } from './box-helpers.js';
import { cleanTmp, tmp } from './helpers.js';

// `keygate start` from a fresh data directory: the printed commands are executed as printed, by
// a shell, and must show the demo token injected by the sandbox's proxy.

const READY = /API listening on (\S+:\d+)[\s\S]*Press Ctrl-C to stop\./;

/** The block that starts with `prefix` and continues while lines end in a backslash. */
function block(output: string, prefix: string): string {
  const lines = output.split('\n');
  const start = lines.findIndex((l) => l.startsWith(prefix));
  expect(start, `no line starting with ${prefix}`).toBeGreaterThanOrEqual(0);
  const out = [lines[start]];
  for (let i = start; lines[i].endsWith('\\'); i++) out.push(lines[i + 1]);
  return out.join('\n');
}

function shell(script: string, cwd: string): string {
  // No proxy variables from the test environment: the commands must stand on their own.
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: cwd };
  return execFileSync('sh', ['-c', script], { cwd, env, encoding: 'utf8', timeout: 30_000 });
}

let running: RunningCli | undefined;
afterAll(async () => {
  if (running) await running.stop('SIGINT');
  cleanTmp();
});

const UNAVAILABLE = localBoxesUnavailable();
if (UNAVAILABLE) console.warn(`SKIPPED keygate start with a real box: ${UNAVAILABLE}`);

async function demoToken(dataDir: string): Promise<string | undefined> {
  return (await openSecretStore({ dataDir, env: { ...process.env, KEYGATE_MASTER_KEY: '', KEYGATE_SECRETS_FILE: '', KEYGATE_SECRETS_DIR: '' } })).get('DEMO_TOKEN');
}

describe('keygate start', () => {
  it.skipIf(UNAVAILABLE)('with a real box (local): the printed commands run curl inside it, through the proxy (header injected) and directly (no connection)', async () => {
    const dataDir = path.join(tmp(), 'data');
    running = await startCli(['start', '--data', dataDir, '--listen', '127.0.0.1:0'], { env: { DATABASE_URL: '', KEYGATE_API_KEY: '', KEYGATE_SANDBOX_DRIVER: '' }, ready: READY });
    const out = running.output();
    expect(out).toContain('Sandbox driver  local');
    // start created the box itself, through its own API: the first printed command already runs in it.
    expect(out).toMatch(/Demo box +'demo' created \(status ready\)/);
    const box = JSON.parse(shell(`curl -s ${running.url}/api/v2/sandboxes/boxes/demo -H "x-api-key: $(cat ${dataDir}/api-key)"`, dataDir));
    expect(box).toMatchObject({ name: 'demo', status: 'ready', driver: 'local', template_name: 'host' });
    const execs = out.split('\n').map((l, i) => (l.startsWith('curl -s -X POST') && l.includes('/execute') ? i : -1)).filter((i) => i >= 0);
    expect(execs.length).toBe(2);
    const lines = out.split('\n');
    const blockAt = (i: number) => block(lines.slice(i).join('\n'), 'curl -s -X POST');
    const through = JSON.parse(shell(blockAt(execs[0]), dataDir));
    expect(through.exit_code, through.stderr).toBe(0);
    expect(JSON.parse(through.stdout).headers.authorization).toBe(`Bearer ${await demoToken(dataDir)}`);
    const direct = JSON.parse(shell(blockAt(execs[1]), dataDir));
    expect(direct.exit_code).not.toBe(0);
    expect(direct.stdout).toBe('');
    // The CLI line streams the same request and exits 0.
    const cliLine = lines.find((l) => l.includes(' sandbox exec demo -- '))!;
    expect(JSON.parse(shell(cliLine, dataDir)).headers.authorization).toBe(`Bearer ${await demoToken(dataDir)}`);
    expect(running.output()).not.toContain((await demoToken(dataDir))!);
    expect(await running.stop('SIGINT')).toBe(0);
    running = undefined;

    // A second start keeps the box it finds (it survives restarts) and says so.
    running = await startCli(['start', '--data', dataDir, '--listen', '127.0.0.1:0'], { env: { DATABASE_URL: '', KEYGATE_API_KEY: '', KEYGATE_SANDBOX_DRIVER: '' }, ready: READY });
    expect(running.output()).toMatch(/Demo box +'demo' already there \(status (ready|provisioning)\)/);
    expect(await running.stop('SIGINT')).toBe(0);
    running = undefined;
  }, 120_000);

  it('driver none: creates the demo sandbox and prints commands that, pasted into a shell, show the injected header', async () => {
    const dataDir = path.join(tmp(), 'data'); // does not exist yet: zero set-up
    running = await startCli(['start', '--data', dataDir, '--listen', '127.0.0.1:0', '--sandbox-driver', 'none'], { env: { DATABASE_URL: '', KEYGATE_API_KEY: '' }, ready: READY });
    const out = running.output();
    expect(out).toMatch(/Demo box +'demo' created \(status ready\)/);
    const step2 = [block(out, 'PROXY_URL='), block(out, 'curl -s -x')].join('\n');
    expect(step2).toContain(`--cacert ${dataDir}/ca/ca.pem`);
    expect(step2).toMatch(/https:\/\/demo-api\.keygate\.test:\d+\/hello/);
    const created = JSON.parse(shell(`curl -s ${running.url}/api/v2/sandboxes/boxes/demo -H "x-api-key: $(cat ${dataDir}/api-key)"`, dataDir));
    expect(created).toMatchObject({ name: 'demo', status: 'ready', driver: 'none' });
    expect(created.proxy_config.rules[0].headers[0]).toEqual({ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {DEMO_TOKEN}' });

    const echoed = JSON.parse(shell(step2, dataDir));
    const token = await demoToken(dataDir);
    expect(token).toMatch(/^demo_[0-9a-f]{32}$/);
    expect(echoed.path).toBe('/hello');
    expect(echoed.headers.authorization).toBe(`Bearer ${token}`);
    // keygate itself never printed the token or the API key.
    expect(running.output()).not.toContain(token);
    const { readFileSync } = await import('node:fs');
    expect(running.output()).not.toContain(readFileSync(path.join(dataDir, 'api-key'), 'utf8').trim());

    // The rotation command of "what to do next" works too, and the running proxy picks it up.
    const rotate = out.split('\n').find((l) => l.includes('/api/v1/workspaces/current/secrets') && l.includes('rotated-demo-value'))!.trim();
    shell(rotate, dataDir);
    expect(JSON.parse(shell(step2, dataDir)).headers.authorization).toBe('Bearer rotated-demo-value');

    // The printed create command (under "what to do next") makes the box again once deleted.
    const del = out.split('\n').find((l) => l.includes('curl -s -X DELETE'))!.trim();
    shell(del, dataDir);
    const create = block(out.split('\n').map((l) => l.replace(/^ {4}/, '')).join('\n'), `curl -s -X POST ${running.url}/api/v2/sandboxes/boxes \\`);
    expect(create).toContain(`$(cat ${dataDir}/api-key)`);
    const again = JSON.parse(shell(create, dataDir));
    expect(again).toMatchObject({ name: 'demo', status: 'ready' });
    expect(JSON.parse(shell(step2, dataDir)).headers.authorization).toBe('Bearer rotated-demo-value');

    // Ctrl-C stops everything: the API and the sandbox's proxy.
    expect(await running.stop('SIGINT')).toBe(0);
    expect(running.output()).toContain('stopped.');
    running = undefined;
    const proxyPort = Number(new URL(again.proxy.url).port);
    const net = await import('node:net');
    const accepts = await new Promise<boolean>((resolve) => {
      const s = net.connect({ host: '127.0.0.1', port: proxyPort });
      s.once('connect', () => (s.destroy(), resolve(true)));
      s.once('error', () => resolve(false));
    });
    expect(accepts).toBe(false);
  });
});
