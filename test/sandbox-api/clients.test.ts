import { execFile, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findKeytool } from '../../src/certs/env.js';
import { startEchoOrigin, type EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { runCli, startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { execIn, localBoxesUnavailable } from './box-helpers.js';
import { api, cleanTmp, tmp } from './helpers.js';

// Real clients, with no extra step, inside a real (local) box: the environment the box gets makes
// each go through its proxy and trust its CA. docs/clients.md is the table these results fill.
// Java inside the box (its truststore and JAVA_TOOL_OPTIONS come with the box), and outside a box
// with what `keygate ca env` prints.

const UNAVAILABLE = localBoxesUnavailable();
if (UNAVAILABLE) console.warn(`SKIPPED client tests in real boxes: ${UNAVAILABLE}`);

const KEY = 'clients-test-key-0123456789abcdef';
const SECRET = 'ghp_clients-secret-VALUE-4242';
const ORIGIN_HOST = 'api.example.test';

let origin: EchoOrigin;
let dataDir: string;
let server: RunningCli;
let url: string;

const run = (command: string | string[]) => execIn(server.url, KEY, 'clients', command);
const injected = (stdout: string) => JSON.parse(stdout.slice(stdout.indexOf('{'))).headers.authorization;

/** A Java program fetching its first argument with the JDK's own HTTP client (no proxy set in code). */
const FETCH_JAVA = `public class Fetch { public static void main(String[] a) throws Exception {
  var c = (java.net.HttpURLConnection) new java.net.URL(a[0]).openConnection();
  System.out.println(new String(c.getInputStream().readAllBytes()));
} }`;
/** `java Fetch.java` (source-file mode) needs the JDK's compiler module, which a JRE lacks. */
function javaSourceLauncher(): string | undefined {
  if (!findKeytool()) return 'no JDK (keytool) on this machine';
  try {
    return execFileSync('java', ['--list-modules'], { encoding: 'utf8' }).includes('jdk.compiler') ? undefined : 'the JDK here has no jdk.compiler (a JRE): java cannot run a source file';
  } catch {
    return 'java does not run';
  }
}
const NO_JAVA = javaSourceLauncher();
if (NO_JAVA) console.warn(`SKIPPED java client tests: ${NO_JAVA}`);

describe.skipIf(UNAVAILABLE)('common clients inside a box, no extra step', () => {
  beforeAll(async () => {
    const originDir = tmp();
    origin = await startEchoOrigin({ caDir: originDir, hosts: [ORIGIN_HOST] });
    url = `https://${ORIGIN_HOST}:${origin.port}/api/user`;
    dataDir = tmp();
    const env = {
      DATABASE_URL: '',
      KEYGATE_API_KEY: KEY,
      KEYGATE_SANDBOX_PROXY_RESOLVE: `${ORIGIN_HOST}:${origin.port}:127.0.0.1`,
      KEYGATE_SANDBOX_PROXY_CA_FILE: path.join(originDir, 'ca.pem'),
    };
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'local'], { env });
    await waitForLine(server, (l) => l.startsWith('sandbox driver local'));
    expect((await api(server.url, KEY, 'POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: SECRET }])).status).toBe(200);
    const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes', {
      template_name: 'host',
      name: 'clients',
      wait_for_ready: true,
      idle_ttl_seconds: 0,
      proxy_config: { rules: [{ name: 'r', match_hosts: [ORIGIN_HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GH_TOKEN}' }] }] },
    });
    expect(r.body.status, r.text).toBe('ready');
  }, 60_000);

  afterAll(async () => {
    if (server) expect(await server.stop()).toBe(0);
    await origin?.close();
    cleanTmp();
  });

  it('python3 requests and urllib', async () => {
    const req = await run(['python3', '-c', 'import requests,sys; print(requests.get(sys.argv[1], timeout=10).text)', url]);
    expect(req.exit_code, req.stderr).toBe(0);
    expect(injected(req.stdout)).toBe(`Bearer ${SECRET}`);
    const urllib = await run(['python3', '-c', 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())', url]);
    expect(urllib.exit_code, urllib.stderr).toBe(0);
    expect(injected(urllib.stdout)).toBe(`Bearer ${SECRET}`);
  });

  it('npm (NPM_CONFIG_CAFILE wins over an npmrc cafile)', async () => {
    // A user npmrc naming one public root only: without NPM_CONFIG_CAFILE npm would not trust the proxy.
    await run('awk \'/BEGIN/{n++} n==1\' /etc/keygate/ca-bundle.pem > /workspace/roots.pem; printf "cafile=/workspace/roots.pem\\n" > /workspace/.npmrc');
    const r = await run(`HOME=/workspace npm ping --registry https://${ORIGIN_HOST}:${origin.port}/ 2>&1`);
    expect(r.exit_code, r.stdout).toBe(0);
    expect(r.stdout).toMatch(/PONG/);
    const without = await run(`HOME=/workspace env -u NPM_CONFIG_CAFILE npm ping --registry https://${ORIGIN_HOST}:${origin.port}/ 2>&1`);
    expect(without.exit_code).not.toBe(0);
  }, 60_000);

  it('node: https and fetch with NODE_USE_ENV_PROXY on Node >= 22.21/24; on Node 20 they do not use the proxy (docs/clients.md)', async () => {
    // The node inside the box (the host's, through the `host` template), not the one running vitest.
    const version = (await run(['node', '-p', 'process.versions.node'])).stdout.trim();
    const [major, minor] = version.split('.').map(Number);
    const r = await run(['node', '-e', 'fetch(process.argv[1]).then((r) => r.text()).then(console.log, (e) => { console.error(e.cause?.code ?? e.message); process.exit(1); })', url]);
    if (major >= 24 || (major === 22 && minor >= 21)) {
      expect(r.exit_code, r.stderr).toBe(0);
      expect(injected(r.stdout)).toBe(`Bearer ${SECRET}`);
    } else {
      // Node 20: fetch dials directly, and the box has no way out but its proxy.
      expect(r.exit_code).not.toBe(0);
    }
  });

  it('git over https trusts the proxy through GIT_SSL_CAINFO', async () => {
    const r = await run(`git ls-remote https://${ORIGIN_HOST}:${origin.port}/repo.git 2>&1; true`);
    // The echo origin is no git server: what matters is that TLS through the proxy was accepted.
    expect(r.stdout).not.toMatch(/SSL certificate problem|unable to access.*Failed to connect/);
  });

  it.skipIf(NO_JAVA)('java inside the box: HTTPS through the proxy with the header injected, no extra step (JAVA_TOOL_OPTIONS, /etc/keygate/truststore.p12)', async () => {
    const put = await fetch(`${server.url}/api/v2/sandboxes/boxes/clients/files?path=/workspace/Fetch.java`, { method: 'PUT', headers: { 'x-api-key': KEY }, body: FETCH_JAVA });
    expect(put.status).toBe(201);
    const r = await run(['java', '/workspace/Fetch.java', url]);
    expect(r.exit_code, r.stderr).toBe(0);
    expect(injected(r.stdout)).toBe(`Bearer ${SECRET}`);
    // The JVM says where its settings came from: the box's environment, nothing added here.
    expect(r.stderr).toContain('Picked up JAVA_TOOL_OPTIONS: ');
    // Without them Java ignores the proxy, dials directly, and the box has no way out.
    const direct = await run(['env', '-u', 'JAVA_TOOL_OPTIONS', 'java', '/workspace/Fetch.java', url]);
    expect(direct.exit_code).not.toBe(0);
  }, 120_000);

  it.skipIf(NO_JAVA)('java with what `keygate ca env` prints (truststore + JAVA_TOOL_OPTIONS), against the box proxy', async () => {
    // The box's proxy as the host reaches it (a box elsewhere would be given this address).
    const proxy = `http://127.0.0.1:${JSON.parse(execFileSync('curl', ['-s', '-H', `x-api-key: ${KEY}`, `${server.url}/api/v2/sandboxes/boxes/clients`], { encoding: 'utf8' })).proxy.url.split(':').pop()}`;
    const { status, stdout, stderr } = runCli(['ca', 'env', '--certs', path.join(dataDir, 'ca'), '--proxy', proxy, '--format', 'json']);
    expect(status, stderr).toBe(0);
    const env = JSON.parse(stdout) as Record<string, string>;
    expect(env.JAVA_TOOL_OPTIONS).toMatch(/-Dhttps\.proxyHost=127\.0\.0\.1 /);
    expect(existsSync(path.join(dataDir, 'ca', 'ca-truststore.p12'))).toBe(true);
    const src = path.join(tmp(), 'Fetch.java');
    writeFileSync(src, FETCH_JAVA);
    // Asynchronously: the origin answers from this process's event loop.
    const { stdout: out } = await promisify(execFile)('java', [src, url], { env: { PATH: process.env.PATH, ...env }, encoding: 'utf8', timeout: 60_000 });
    expect(injected(out)).toBe(`Bearer ${SECRET}`);
  }, 90_000);
});
