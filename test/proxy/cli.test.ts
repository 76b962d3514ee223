import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { createTestPki } from '../helpers/pki.js';
import { startOrigin } from '../helpers/origin.js';
import { REPO_ROOT, runCli, spawnProxy, tempFile } from '../helpers/proxy.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('keygate proxy start-up errors', () => {
  it('an invalid config stops start-up with the JSON path and reason', async () => {
    const config = tempFile(dir, 'bad.json', JSON.stringify({ rules: [{ name: 'r', match_hosts: ['ok.example', 'bad host'], headers: [{ name: 'X', type: 'nope', value: 'v' }] }] }));
    const r = await runCli(['proxy', '--config', config, '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs')]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/rules\[0\]\.headers\[0\]\.type: Input should be/);
    const config2 = tempFile(dir, 'bad2.json', JSON.stringify({ rules: [{ name: 'r', match_hosts: ['bad host'] }] }));
    const r2 = await runCli(['proxy', '--config', config2, '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs')]);
    expect(r2.code).not.toBe(0);
    expect(r2.stderr).toMatch(/rules\[0\]\.match_hosts\[0\]: Invalid host pattern/);
  });

  it('a missing secret names rule, header and key, never a value', async () => {
    const config = tempFile(
      dir,
      'missing.json',
      JSON.stringify({ rules: [{ name: 'gh', match_hosts: ['api.github.com'], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GH_TOKEN} {PRESENT}' }] }] }),
    );
    const secrets = tempFile(dir, 'secrets.json', JSON.stringify({ PRESENT: 'kgPRESENT-value-xyz', OTHER: 'kgOTHER-value-xyz' }));
    const r = await runCli(['proxy', '--config', config, '--secrets', secrets, '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs')]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/rules\[0\]\.headers\[0\]\.value: Secret 'GH_TOKEN' referenced by rule 'gh', header 'Authorization' does not exist/);
    expect(r.stdout + r.stderr).not.toContain('kgPRESENT');
    expect(r.stdout + r.stderr).not.toContain('kgOTHER');
  });

  it('bad flags are usage errors (exit 2)', async () => {
    expect((await runCli(['proxy'])).code).toBe(2);
    expect((await runCli(['proxy', '--config', 'x.json', '--listen', 'nope'])).code).toBe(2);
    expect((await runCli(['proxy', '--config', 'x.json', '--resolve', 'a.com:443'])).code).toBe(2);
  });

  it('the example config is valid', async () => {
    const { readProxyConfigFile } = await import('../../src/config/load.js');
    expect(() => readProxyConfigFile(path.join(REPO_ROOT, 'config/proxy.example.json'))).not.toThrow();
  });
});

describe('keygate proxy shutdown', () => {
  it('on SIGTERM stops accepting, lets an in-flight stream finish, exits 0', async () => {
    const pki = await createTestPki(['api.test.local']);
    const origin = await startOrigin(pki);
    const proxy = await spawnProxy({
      config: { rules: [{ name: 'api', match_hosts: ['api.test.local'], headers: [{ name: 'X-Key', type: 'plaintext', value: 'k' }] }] },
      resolve: [`api.test.local:${origin.port}:127.0.0.1`],
      upstreamCa: [pki.caPem],
    });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
    try {
      const res = await request(`https://api.test.local:${origin.port}/sse?n=2`, { dispatcher: agent });
      const it = res.body[Symbol.asyncIterator]();
      await it.next(); // event 1 is through: the request is in flight
      const exited = new Promise<number | null>((r) => proxy.child.once('exit', (code) => r(code)));
      proxy.child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 300));
      // No new connections once closing.
      const fresh = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem } });
      await expect(request(`https://api.test.local:${origin.port}/x`, { dispatcher: fresh })).rejects.toThrow();
      await fresh.close();
      origin.release();
      let rest = '';
      for (let r = await it.next(); !r.done; r = await it.next()) rest += Buffer.from(r.value as Uint8Array).toString();
      expect(rest).toContain('data: 2');
      expect(await exited).toBe(0);
      expect(proxy.output()).toMatch(/shutting down/);
    } finally {
      await agent.close();
      await proxy.stop();
      await origin.close();
    }
  });
});

describe('keygate ca', () => {
  it('init creates the CA with a private key and prints its fingerprint', async () => {
    const certs = path.join(dir, 'ca-init');
    const r = await runCli(['ca', 'init', '--certs', certs]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/SHA-256: +[0-9A-F:]{95}/);
    expect(statSync(path.join(certs, 'ca-key.pem')).mode & 0o777).toBe(0o600);
    expect(r.stdout).not.toContain('PRIVATE KEY');
  });

  it('env prints the sandbox environment and writes the bundle', async () => {
    const certs = path.join(dir, 'ca-env');
    const config = tempFile(dir, 'np.json', JSON.stringify({ no_proxy: ['db.internal', '*.corp.example'] }));
    const bundle = path.join(dir, 'bundle.pem');
    const r = await runCli(['ca', 'env', '--certs', certs, '--proxy', 'http://keygate:8080', '--bundle', bundle, '--config', config, '--format', 'json']);
    expect(r.code).toBe(0);
    const env = JSON.parse(r.stdout) as Record<string, string>;
    expect(env).toMatchObject({
      HTTPS_PROXY: 'http://keygate:8080',
      http_proxy: 'http://keygate:8080',
      NO_PROXY: 'db.internal,.corp.example,localhost,127.0.0.1,::1',
      NODE_EXTRA_CA_CERTS: path.resolve(certs, 'ca.pem'),
      SSL_CERT_FILE: bundle,
      REQUESTS_CA_BUNDLE: bundle,
      CURL_CA_BUNDLE: bundle,
      GIT_SSL_CAINFO: bundle,
    });
    expect(readFileSync(bundle, 'utf8')).toContain(readFileSync(path.join(certs, 'ca.pem'), 'utf8').trim());
    expect(readFileSync(bundle, 'utf8')).not.toContain('PRIVATE KEY');
    const sh = await runCli(['ca', 'env', '--certs', certs, '--proxy', 'http://keygate:8080', '--bundle', bundle]);
    expect(sh.stdout).toMatch(/^export HTTPS_PROXY='http:\/\/keygate:8080'$/m);
  });
});
