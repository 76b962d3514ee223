/**
 * Local driver, from inside real boxes (sandbox.md properties 1, 3 and 6): the proxy is the only way
 * out (a real `keygate proxy` injecting a header at a real HTTPS origin), nothing of keygate is
 * inside, and boxes cannot see or reach each other. Needs `npm run build` (the proxy is dist/cli).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { caBundle, sandboxEnv } from '../../src/certs/env.js';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { cleanupTmp, localProbe, run, RUN_DIR, spec, TMP } from './local-helpers.js';

const probe = await localProbe();
const INJECTED = 'kg-injected-value-7f3a';
const MASTER_KEY = 'kg-master-key-bd41c9';
const ADMIN_TOKEN = 'kg-admin-token-55e0aa';
const HOST_ENV_SECRET = 'kg-host-env-secret-91d2';

describe.skipIf(!probe.ok)(`local driver: network and what a box sees (${probe.why})`, () => {
  let origin: TestOrigin;
  let proxy: SpawnedProxy;
  /** Stands for another box's proxy: counts every connection that reaches it. */
  let otherProxy: net.Server;
  let otherProxyHits = 0;
  let driver: LocalDriver;
  let a: Box;
  let b: Box;
  const dataDir = path.join(TMP, 'data');

  beforeAll(async () => {
    const pki = await createTestPki(['api.test.local']);
    origin = await startOrigin(pki);
    proxy = await spawnProxy({
      config: { rules: [{ name: 'api', match_hosts: ['api.test.local'], headers: [{ name: 'X-Api-Key', type: 'plaintext', value: INJECTED }] }] },
      resolve: [`api.test.local:${origin.port}:127.0.0.1`],
      upstreamCa: [pki.caPem],
    });
    otherProxy = net.createServer((s) => {
      otherProxyHits++;
      s.destroy();
    });
    await new Promise<void>((r) => otherProxy.listen(0, '127.0.0.1', r));
    // What must never be seen inside: keygate's data directory with its keys and tokens.
    mkdirSync(path.join(dataDir, 'certs'), { recursive: true });
    writeFileSync(path.join(dataDir, 'master.key'), MASTER_KEY);
    writeFileSync(path.join(dataDir, 'admin-token'), ADMIN_TOKEN);
    writeFileSync(path.join(dataDir, 'certs', 'ca-key.pem'), `-----BEGIN PRIVATE KEY-----\n${MASTER_KEY}\n-----END PRIVATE KEY-----\n`);
    process.env.KG_TEST_HOST_SECRET = HOST_ENV_SECRET;
    driver = new LocalDriver({ runDir: RUN_DIR });
    const env = sandboxEnv({ proxyUrl: 'http://127.0.0.1:3128', caCertPath: '/etc/keygate/ca.pem', bundlePath: '/etc/keygate/ca-bundle.pem' });
    a = await driver.start(spec({ id: 'net-a', proxyPort: proxy.port, env: { ...env, NODE_USE_ENV_PROXY: '1' }, caPem: proxy.caPem, caBundlePem: caBundle(proxy.caPem) }));
    b = await driver.start(spec({ id: 'net-b', proxy: { host: '127.0.0.1', port: (otherProxy.address() as net.AddressInfo).port } }));
    await run(b, `echo b-private-file > /workspace/b-only.txt`);
  });

  afterAll(async () => {
    delete process.env.KG_TEST_HOST_SECRET;
    await driver?.close();
    await proxy?.stop();
    await origin?.close();
    await new Promise((r) => otherProxy?.close(r));
    cleanupTmp();
  });

  it('through 127.0.0.1:3128 a request reaches the origin with the header injected', async () => {
    const before = origin.requests;
    const r = await run(a, `curl -sS --max-time 20 https://api.test.local:${origin.port}/from-box`);
    expect(r.exitCode, r.stderr).toBe(0);
    const echoed = JSON.parse(r.stdout) as { url: string; headers: [string, string][] };
    expect(echoed.url).toBe('/from-box');
    expect(echoed.headers).toContainEqual(['x-api-key', INJECTED]);
    expect(origin.requests).toBe(before + 1);
  });

  it('a program that ignores the proxy gets no connection: to the origin, the proxy, keygate, or another box', async () => {
    const before = origin.requests;
    const hostAddrs = Object.values(os.networkInterfaces())
      .flat()
      .filter((i) => i && i.family === 'IPv4' && !i.internal)
      .map((i) => i!.address);
    const targets = [
      `127.0.0.1:${origin.port}`,
      `127.0.0.1:${proxy.port}`,
      `127.0.0.1:${(otherProxy.address() as net.AddressInfo).port}`,
      ...hostAddrs.map((h) => `${h}:${origin.port}`),
    ];
    const script = `
import socket, sys
for t in sys.argv[1:]:
    host, port = t.rsplit(':', 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print('CONNECTED', t)
    except OSError as e:
        print('refused', t, e.errno)
`;
    const r = await run(a, ['python3', '-c', script, ...targets]);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.split('\n').filter(Boolean)).toHaveLength(targets.length);
    expect(r.stdout).not.toContain('CONNECTED');
    // curl told not to use the proxy: no connection either.
    const direct = await run(a, `curl -sS --noproxy '*' --max-time 5 -k https://127.0.0.1:${origin.port}/direct`);
    expect(direct.exitCode).not.toBe(0);
    expect(origin.requests).toBe(before);
    expect(otherProxyHits).toBe(0);
  });

  it('the network namespace has loopback only, and DNS answers nothing', async () => {
    const r = await run(a, `cat /proc/net/dev; echo ---; cat /etc/resolv.conf 2>&1; echo ---; getent hosts api.test.local example.com; echo "getent=$?"; getent hosts localhost`);
    const [dev, resolv, dns] = r.stdout.split('---\n');
    const ifaces = dev.split('\n').slice(2).map((l) => l.split(':')[0].trim()).filter(Boolean);
    expect(ifaces).toEqual(['lo']);
    expect(resolv).toMatch(/No such file/);
    expect(dns).toMatch(/getent=2/);
    expect(dns).toMatch(/(127\.0\.0\.1|::1)\s+localhost/);
    expect(dns).not.toMatch(/example\.com/);
  });

  it('the box sees its CA files, its proxy environment, and no secret or host environment', async () => {
    const r = await run(a, `cat /etc/keygate/ca.pem; echo @@@; env; echo @@@; cat /proc/1/environ | tr '\\0' '\\n'`);
    const [ca, env, initEnv] = r.stdout.split('@@@\n');
    expect(ca).toBe(proxy.caPem);
    expect(env).toMatch(/^HTTPS_PROXY=http:\/\/127\.0\.0\.1:3128$/m);
    expect(env).toMatch(/^NODE_USE_ENV_PROXY=1$/m);
    expect(env).toMatch(/^SSL_CERT_FILE=\/etc\/keygate\/ca-bundle\.pem$/m);
    for (const secret of [HOST_ENV_SECRET, INJECTED, 'KG_TEST_HOST_SECRET', 'VITEST', process.env.HOME ?? '/root']) {
      expect(env).not.toContain(secret);
      expect(initEnv).not.toContain(secret);
    }
  });

  it('nothing of keygate inside: data directory, keys, tokens, docker socket, other boxes', async () => {
    const hostPaths = [
      path.join(dataDir, 'master.key'),
      path.join(dataDir, 'admin-token'),
      path.join(dataDir, 'certs', 'ca-key.pem'),
      path.join(dataDir, 'sandboxes', 'net-b', 'workspace', 'b-only.txt'),
      RUN_DIR,
      '/run/docker.sock',
      '/var/run/docker.sock',
      '/root',
      '/home',
      '/etc/shadow',
    ];
    const ls = await run(a, ['sh', '-c', 'for p; do if [ -e "$p" ]; then echo "VISIBLE $p"; fi; done', 'sh', ...hostPaths]);
    expect(ls.stdout).toBe('');
    // The planted values are nowhere in the box's own file system (the host's /usr aside, which is public).
    const grep = await run(a, ['sh', '-c', `grep -rsl -e ${MASTER_KEY} -e ${ADMIN_TOKEN} -e b-private-file / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr; cat /proc/1/cmdline | tr '\\0' ' '`]);
    expect(grep.stdout).not.toMatch(/kg-|b-private/);
    expect(grep.stdout).not.toContain(TMP);
    // Only this box's processes: no other box, no host process.
    const ps = await run(a, ['sh', '-c', 'for d in /proc/[0-9]*; do tr "\\0" " " < $d/cmdline; echo; done']);
    expect(ps.stdout).not.toMatch(/node|vitest|keygate|net-b/);
    expect(ps.stdout).toMatch(/sleep infinity/);
    // No unix socket of keygate's or anyone's is reachable.
    const socks = await run(a, `cat /proc/net/unix | tail -n +2 | awk '{print $8}' | grep . ; true`);
    expect(socks.stdout.trim()).toBe('');
  });

  it("box b's 127.0.0.1:3128 is b's own proxy, out of a's reach", async () => {
    // a's relay goes to a's proxy (the real one); b's goes to the counting stand-in.
    const viaB = await run(b, `curl -sS --max-time 5 -x http://127.0.0.1:3128 http://api.test.local/ ; true`);
    expect(viaB.exitCode).toBe(0);
    expect(otherProxyHits).toBe(1);
    const viaA = await run(a, `curl -sS --max-time 10 -o /dev/null -w '%{http_code}' https://api.test.local:${origin.port}/again`);
    expect(viaA.stdout).toBe('200');
    expect(otherProxyHits).toBe(1);
  });
});
