import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parseResolveList } from '../../src/sandbox-api/area.js';
import { proxyConfigOut } from '../../src/sandbox-api/schemas.js';
import { loadTemplates, TemplatesError } from '../../src/sandbox-api/templates.js';
import { PACKAGE_CONFIG_DIR } from '../../src/server/app.js';
import { cleanTmp, tmp } from './helpers.js';

afterAll(() => cleanTmp());

describe('templates.json', () => {
  it('the shipped file has two templates', () => {
    const t = loadTemplates(PACKAGE_CONFIG_DIR);
    expect([...t.keys()]).toEqual(['python-3.12', 'node-22']);
    expect(t.get('node-22')).toMatchObject({ image: expect.stringContaining('node'), environment: expect.any(Object) });
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
