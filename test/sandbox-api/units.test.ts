import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { sandboxEnv } from '../../src/certs/env.js';
import { parseResolveList } from '../../src/sandbox-api/area.js';
import { exitCodeOf } from '../../src/sandbox-api/exec.js';
import { CappedOutput } from '../../src/sandbox-api/output.js';
import { proxyConfigOut } from '../../src/sandbox-api/schemas.js';
import { applyResources, DEFAULT_RESOURCES, driversFor, loadTemplates, TemplatesError } from '../../src/sandbox-api/templates.js';
import { PACKAGE_CONFIG_DIR } from '../../src/server/app.js';
import { cleanTmp, tmp } from './helpers.js';

afterAll(() => cleanTmp());

describe('templates.json', () => {
  it('the shipped file has a host template for local (and docker) and two docker-only ones', () => {
    const t = loadTemplates(PACKAGE_CONFIG_DIR);
    expect([...t.keys()]).toEqual(['host', 'python-3.12', 'node-22']);
    expect(driversFor(t.get('host')!)).toEqual(['local', 'docker', 'none']);
    expect(driversFor(t.get('node-22')!)).toEqual(['docker', 'none']);
    expect(t.get('node-22')).toMatchObject({ image: expect.stringContaining('node'), environment: expect.any(Object) });
  });

  it('resources: the template defaults, then the request, each independently', () => {
    const t = loadTemplates(PACKAGE_CONFIG_DIR).get('host')!;
    expect(applyResources(t, undefined)).toEqual({ memory_mb: 1024, cpus: 1, pids: 512, disk_mb: 1024 });
    expect(applyResources(t, { pids: 64 })).toEqual({ memory_mb: 1024, cpus: 1, pids: 64, disk_mb: 1024 });
    expect(applyResources({ name: 'x', description: '', environment: {} }, { cpus: 0.5 })).toEqual({ ...DEFAULT_RESOURCES, cpus: 0.5 });
  });

  it("max_resources: a template's own defaults must be within it; a built-in default above it is the cap", () => {
    const dir = tmp();
    writeFileSync(path.join(dir, 'templates.json'), JSON.stringify([{ name: 'a', description: '', image: 'x', environment: {}, resources: { memory_mb: 1024 }, max_resources: { memory_mb: 512 } }]));
    expect(() => loadTemplates(dir)).toThrow(/\[0\] 'a': resources\.memory_mb 1024 is above max_resources\.memory_mb 512/);
    const capped = { name: 'b', description: '', environment: {}, max_resources: { pids: 64, disk_mb: 100 } };
    expect(applyResources(capped, undefined)).toEqual({ ...DEFAULT_RESOURCES, pids: 64, disk_mb: 100 });
  });

  it('a rootfs is host or an absolute directory', () => {
    const dir = tmp();
    writeFileSync(path.join(dir, 'templates.json'), JSON.stringify([{ name: 'a', description: '', rootfs: 'relative/dir', environment: {} }]));
    expect(() => loadTemplates(dir)).toThrow(/\[0\]\.rootfs/);
  });

  it('a missing file is an empty catalogue; a malformed one names the file and the path', () => {
    const dir = tmp();
    expect(loadTemplates(dir).size).toBe(0);
    writeFileSync(path.join(dir, 'templates.json'), JSON.stringify([{ name: 'a', description: '', image: 'x', environment: { OK: 1 } }]));
    expect(() => loadTemplates(dir)).toThrow(TemplatesError);
    expect(() => loadTemplates(dir)).toThrow(/templates\.json[\s\S]*\[0\]\.environment\.OK/);
    writeFileSync(path.join(dir, 'templates.json'), '[{');
    expect(() => loadTemplates(dir)).toThrow(/not valid JSON/);
    const dup = { name: 'a', description: '', image: 'x', environment: {} };
    writeFileSync(path.join(dir, 'templates.json'), JSON.stringify([dup, dup]));
    expect(() => loadTemplates(dir)).toThrow(/defined twice/);
  });

  it('a missing configuration directory is an error, not an empty catalogue', () => {
    const missing = path.join(tmp(), 'no-such-dir');
    expect(() => loadTemplates(missing)).toThrow(TemplatesError);
    expect(() => loadTemplates(missing)).toThrow(`configuration directory ${missing} does not exist`);
  });
});

describe('KEYGATE_SANDBOX_PROXY_RESOLVE', () => {
  it("parses curl's HOST:PORT:ADDR entries and refuses anything else", () => {
    expect([...parseResolveList('API.test.:443:127.0.0.1, b.test:8443:[::1]')]).toEqual([
      ['api.test:443', '127.0.0.1'],
      ['b.test:8443', '::1'],
    ]);
    expect(parseResolveList(undefined).size).toBe(0);
    expect(() => parseResolveList('api.test=127.0.0.1')).toThrow(/HOST:PORT:ADDR/);
    expect(() => parseResolveList('api.test:99999:127.0.0.1')).toThrow(/KEYGATE_SANDBOX_PROXY_RESOLVE/);
  });

  it('reads a host as the text an operator wrote, as the configuration does (never as wire bytes)', async () => {
    // 'Ü' and a soft hyphen are also the UTF-8 bytes of U+072D: read as wire bytes, the entry
    // pinned another host than the one written (and than `keygate proxy --resolve` and a rule name).
    const { parseResolve } = await import('../../src/cli/proxy.js');
    const { compileHostPattern } = await import('../../src/rules/patterns.js');
    expect([...parseResolveList('Ü\u00ad.example:443:127.0.0.1')]).toEqual([['xn--tda.example:443', '127.0.0.1']]);
    expect(parseResolve('Ü\u00ad.example:443:127.0.0.1')).toEqual(['xn--tda.example:443', '127.0.0.1']);
    expect(compileHostPattern('Ü\u00ad.example').test('xn--tda.example', 443)).toBe(true);
  });
});

describe('response schema of proxy_config', () => {
  it('does not require a header value (opaque values are omitted) and the request schema is untouched', async () => {
    const header = (proxyConfigOut as any).properties.rules.items.properties.headers.items;
    expect(header.required).toEqual(['name', 'type']);
    const { proxyConfigSchema } = await import('../../src/config/schema.js');
    expect((proxyConfigSchema as any).properties.rules.items.properties.headers.items.required).toEqual(['name', 'type', 'value']);
  });
});

describe('the environment every client needs (src/certs/env.ts)', () => {
  it('adds npm, WebSocket and Node variables, and Java options only with a truststore', () => {
    const base = { proxyUrl: 'http://127.0.0.1:3128', caCertPath: '/etc/keygate/ca.pem', bundlePath: '/etc/keygate/ca-bundle.pem', noProxy: ['*.corp.example', 'db.internal'] };
    const env = sandboxEnv(base);
    expect(env).toMatchObject({ NPM_CONFIG_CAFILE: base.bundlePath, WSS_PROXY: base.proxyUrl, WS_PROXY: base.proxyUrl, NODE_USE_ENV_PROXY: '1' });
    expect(env.JAVA_TOOL_OPTIONS).toBeUndefined();
    const java = sandboxEnv({ ...base, javaTrustStorePath: '/etc/keygate/ca-truststore.p12' }).JAVA_TOOL_OPTIONS;
    expect(java.split(' ')).toEqual([
      '-Dhttp.proxyHost=127.0.0.1',
      '-Dhttp.proxyPort=3128',
      '-Dhttps.proxyHost=127.0.0.1',
      '-Dhttps.proxyPort=3128',
      '-Dhttp.nonProxyHosts=*.corp.example|db.internal|localhost|127.0.0.1|::1',
      '-Djavax.net.ssl.trustStore=/etc/keygate/ca-truststore.p12',
      '-Djavax.net.ssl.trustStoreType=PKCS12',
      '-Djavax.net.ssl.trustStorePassword=changeit',
    ]);
  });
});

describe('execute output', () => {
  it('keeps the first bytes up to the cap and counts the rest without holding it', () => {
    const out = new CappedOutput(5);
    expect(out.add(Buffer.from('abc')).toString()).toBe('abc');
    expect(out.add(Buffer.from('defgh')).toString()).toBe('de');
    expect(out.add(Buffer.from('ij')).length).toBe(0);
    expect(out.text()).toBe('abcde');
    expect(out.total).toBe(10);
    expect(out.truncated).toBe(true);
    const exact = new CappedOutput(3);
    exact.add(Buffer.from('xyz'));
    expect(exact.truncated).toBe(false);
  });

  it('a signal becomes 128+N like a shell says', () => {
    expect(exitCodeOf({ exitCode: 3, signal: null, timedOut: false })).toBe(3);
    expect(exitCodeOf({ exitCode: null, signal: 'SIGKILL', timedOut: true })).toBe(137);
    expect(exitCodeOf({ exitCode: null, signal: 'SIGTERM', timedOut: false })).toBe(143);
  });
});
