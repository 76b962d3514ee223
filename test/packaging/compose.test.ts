// docker-compose.yml started for real (Debian's docker-compose) with the keygate image the
// Dockerfile builds. A test override adds only what a machine without internet needs: a local
// origin that answers for api.github.com on the proxy's egress network (made internal, so nothing
// can leave the test's networks), its CA for the proxy, the secret file, and the sandbox image (one
// with curl, through KEYGATE_SANDBOX_IMAGE). The compose file's own proxy config, secret mount, networks and volumes are what is tested.
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';
import { announceSkip, engineUnavailableReason } from '../helpers/docker-engine.js';
import { DEBIAN_IMAGE, docker, ensureKeygateImage, runAsync, uniqueName } from '../helpers/docker-images.js';
import { createTestPki } from '../helpers/pki.js';

function composeUnavailable(): string | null {
  const r = spawnSync('docker-compose', ['version', '--short'], { encoding: 'utf8' });
  return r.status === 0 ? null : `docker-compose is not installed (apt-get install docker-compose): ${r.error?.message ?? r.stderr.trim()}`;
}

const skip = announceSkip('the compose topology tests (real Docker engine)', (await engineUnavailableReason()) ?? composeUnavailable());
const project = uniqueName('compose').replace(/-/g, '');
const tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-compose-'));
const override = path.join(tmp, 'override.yml');
const TOKEN = 'ghp_compose_test_value_4f1c9a';

const ORIGIN = `
import https from 'node:https';
import { readFileSync } from 'node:fs';
https.createServer({ cert: readFileSync('/origin/cert.pem'), key: readFileSync('/origin/key.pem') }, (req, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ path: req.url, headers: req.headers }));
}).listen(443, () => console.log('origin listening'));
`;

// The documented way to pick the sandbox image: one with curl, built by scripts/build-images.sh.
const composeEnv = { ...process.env, KEYGATE_SANDBOX_IMAGE: DEBIAN_IMAGE };
function compose(args: string[], timeoutMs = 120_000): Promise<string> {
  return runAsync('docker-compose', ['-p', project, '-f', path.join(REPO_ROOT, 'docker-compose.yml'), '-f', override, ...args], { timeoutMs, env: composeEnv });
}
/** `docker-compose exec` in the sandbox, synchronously (short commands). */
function inSandbox(script: string): { code: number; out: string } {
  const r = spawnSync('docker-compose', ['-p', project, '-f', path.join(REPO_ROOT, 'docker-compose.yml'), '-f', override, 'exec', '-T', 'sandbox', 'sh', '-c', script], {
    encoding: 'utf8',
    timeout: 60_000,
    env: composeEnv,
  });
  return { code: r.status ?? -1, out: (r.stdout ?? '') + (r.stderr ?? '') };
}
function leftovers(): string[] {
  const label = `label=com.docker.compose.project=${project}`;
  return [
    ...docker(['ps', '-aq', '--filter', label]).stdout.split('\n'),
    ...docker(['network', 'ls', '-q', '--filter', label]).stdout.split('\n'),
    ...docker(['volume', 'ls', '-q', '--filter', label]).stdout.split('\n'),
  ].filter(Boolean);
}

afterAll(async () => {
  if (!skip) await compose(['down', '-v', '--remove-orphans']).catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

describe.skipIf(skip)('docker-compose.yml on a real engine', () => {
  beforeAll(async () => {
    await ensureKeygateImage();
    const pki = await createTestPki(['api.github.com']);
    for (const d of ['secrets', 'origin', 'origin-ca']) mkdirSync(path.join(tmp, d));
    writeFileSync(path.join(tmp, 'secrets/GITHUB_TOKEN'), TOKEN);
    writeFileSync(path.join(tmp, 'origin/server.mjs'), ORIGIN);
    writeFileSync(path.join(tmp, 'origin/cert.pem'), pki.certPem);
    writeFileSync(path.join(tmp, 'origin/key.pem'), pki.keyPem);
    writeFileSync(path.join(tmp, 'origin-ca/ca.pem'), pki.caPem);
    // Default modes (0755 directories, 0644 files): the containers' users (node, root) can read the mounts.
    writeFileSync(
      override,
      JSON.stringify({
        services: {
          'keygate-proxy': {
            environment: { NODE_EXTRA_CA_CERTS: '/origin-ca/ca.pem' },
            volumes: [`${tmp}/secrets:/run/keygate-secrets:ro`, `${tmp}/origin-ca:/origin-ca:ro`],
          },
          origin: {
            image: 'node:24-bookworm-slim',
            command: ['node', '/origin/server.mjs'],
            init: true, // node as PID 1 ignores SIGTERM: down would wait 10 s
            volumes: [`${tmp}/origin:/origin:ro`],
            networks: { egress: { aliases: ['api.github.com'] } },
          },
        },
        networks: { egress: { internal: true } },
      }),
    );
    await compose(['up', '-d', '--no-build'], 300_000);
    // The proxy is up once the sandbox can reach its port.
    const deadline = Date.now() + 60_000;
    while (inSandbox('curl -s -o /dev/null --max-time 2 http://keygate-proxy:3128/').code !== 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 500));
  }, 40 * 60_000);

  it('a request from the sandbox through the proxy reaches the origin with the header from the secret file', () => {
    const r = inSandbox('curl -sS --max-time 20 https://api.github.com/user');
    expect(r.code, r.out).toBe(0);
    const seen = JSON.parse(r.out);
    expect(seen.path).toBe('/user');
    expect(seen.headers.authorization).toBe(`Bearer ${TOKEN}`);
  });

  it('the sandbox can set no credential of its own: the injected header replaces it', () => {
    const r = inSandbox('curl -sS --max-time 20 -H "Authorization: Bearer mine" https://api.github.com/x');
    expect(JSON.parse(r.out).headers.authorization).toBe(`Bearer ${TOKEN}`);
  });

  it('a direct request from the sandbox fails: its network has no route but the proxy', () => {
    const originIp = docker(['inspect', '-f', '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}', `${project}_origin_1`]).stdout.trim();
    expect(originIp).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    const direct = inSandbox(`curl -sS --noproxy '*' --max-time 3 -k https://${originIp}/`);
    expect(direct.code).not.toBe(0);
    const byName = inSandbox(`curl -sS --noproxy '*' --max-time 3 -k https://api.github.com/`);
    expect(byName.code).not.toBe(0);
    // The same request through the proxy works: the failure above is the missing route, nothing else.
    expect(inSandbox('curl -sS --max-time 20 -o /dev/null -w "%{http_code}" https://api.github.com/').out).toBe('200');
  });

  it('the sandbox holds the public CA and the trust bundle, never the CA key nor the secret', () => {
    // A line of the real key (from the proxy's volume), searched for in every file of the sandbox.
    const keyLine = docker(['exec', `${project}_keygate-proxy_1`, 'cat', '/certs/ca-key.pem']).stdout.split('\n')[1];
    expect(keyLine).toMatch(/^[A-Za-z0-9+/=]{40,}$/);
    const search = (s: string) => `grep -rlF -e '${s}' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null`;
    const listing = inSandbox(`ls /ca; echo ---; ${search(keyLine)}; grep -rlI 'PRIVATE KEY-----' /ca /etc /root /home /tmp 2>/dev/null; echo ---; ${search(TOKEN)}; true`);
    const [files, keys, secrets] = listing.out.split('---\n');
    expect(files.trim().split('\n').sort()).toEqual(['bundle.pem', 'ca.pem', 'sandbox.env']);
    expect(keys.trim()).toBe('');
    expect(secrets.trim()).toBe('');
    // The key is where it belongs: in the proxy's volume, 0600, the proxy's user only.
    const inProxy = docker(['exec', `${project}_keygate-proxy_1`, 'stat', '-c', '%U %a', '/certs/ca-key.pem']).stdout.trim();
    expect(inProxy).toBe('node 600');
  });

  it('docker-compose down leaves no container, network or volume behind', async () => {
    expect(leftovers().length).toBeGreaterThan(0);
    await compose(['down', '-v']);
    expect(leftovers()).toEqual([]);
  });
});
