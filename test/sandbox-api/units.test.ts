import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parseResolveList } from '../../src/sandbox-api/area.js';
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
    expect(applyResources(t, undefined)).toEqual({ memory_mb: 1024, cpus: 1, pids: 512 });
    expect(applyResources(t, { pids: 64 })).toEqual({ memory_mb: 1024, cpus: 1, pids: 64 });
    expect(applyResources({ name: 'x', description: '', environment: {} }, { cpus: 0.5 })).toEqual({ ...DEFAULT_RESOURCES, cpus: 0.5 });
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
});

describe('response schema of proxy_config', () => {
  it('does not require a header value (opaque values are omitted) and the request schema is untouched', async () => {
    const header = (proxyConfigOut as any).properties.rules.items.properties.headers.items;
    expect(header.required).toEqual(['name', 'type']);
    const { proxyConfigSchema } = await import('../../src/config/schema.js');
    expect((proxyConfigSchema as any).properties.rules.items.properties.headers.items.required).toEqual(['name', 'type', 'value']);
  });
});
