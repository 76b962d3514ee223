import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { readEnvFile, requireApiKey, resolveSettings } from '../../src/deploy/settings.js';

const dirs: string[] = [];
function project(envText?: string): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'keygate-deploy-settings-'));
  dirs.push(d);
  if (envText !== undefined) writeFileSync(path.join(d, '.env'), envText);
  return d;
}
afterEach(() => {
  while (dirs.length) rmSync(dirs.pop()!, { recursive: true, force: true });
});

describe('.env parsing for the CLI settings', () => {
  it('reads the dotenv dialect: comments, export, quotes, inline comments', () => {
    const d = project(
      [
        '# a comment',
        'export KEYGATE_API_KEY=kg_from_file_0123456789',
        "SINGLE='lit $x # not a comment'",
        'DOUBLE="a\\nb"',
        'PLAIN=value # trailing comment',
        'EMPTY=',
        '',
      ].join('\n'),
    );
    const vars = readEnvFile(path.join(d, '.env'));
    expect(Object.fromEntries(vars)).toEqual({
      KEYGATE_API_KEY: 'kg_from_file_0123456789',
      SINGLE: 'lit $x # not a comment',
      DOUBLE: 'a\nb',
      PLAIN: 'value',
      EMPTY: '',
    });
  });

  it('names the file and line of a syntax error but never the value', () => {
    const d = project('GOOD=1\nthis line holds hunter2 and no equals sign\n');
    let msg = '';
    try {
      readEnvFile(path.join(d, '.env'));
    } catch (err) {
      msg = (err as Error).message;
    }
    expect(msg).toContain(path.join(d, '.env'));
    expect(msg).toContain('line 2');
    expect(msg).not.toContain('hunter2');
  });

  it('treats a missing file as empty', () => {
    expect(readEnvFile(path.join(project(), '.env')).size).toBe(0);
  });
});

describe('KEYGATE_API_KEY and KEYGATE_URL lookup', () => {
  it('prefers the environment (inline KEY=... keygate deploy), then .env, then the default URL', () => {
    const d = project('KEYGATE_API_KEY=kg_file_key_0123456789\nKEYGATE_URL=http://127.0.0.1:9999/\n');
    expect(resolveSettings(d, {})).toMatchObject({ apiKey: 'kg_file_key_0123456789', apiKeySource: '.env', url: 'http://127.0.0.1:9999', urlSource: '.env' });
    expect(resolveSettings(d, { KEYGATE_API_KEY: 'kg_env_key_0123456789' })).toMatchObject({ apiKey: 'kg_env_key_0123456789', apiKeySource: 'environment' });
    // An empty inline value does not hide the file's.
    expect(resolveSettings(d, { KEYGATE_API_KEY: '' })).toMatchObject({ apiKeySource: '.env' });
    expect(resolveSettings(project(), {})).toMatchObject({ apiKey: undefined, url: 'http://127.0.0.1:8080', urlSource: 'default' });
  });

  it('explains where the key is looked for when there is none', () => {
    const d = project('OTHER=1\n');
    expect(() => requireApiKey(resolveSettings(d, {}), d)).toThrow(/no API key: set KEYGATE_API_KEY in the environment .* or in .*\.env/);
  });

  it('refuses URLs that are not plain http(s) base addresses', () => {
    const d = project();
    expect(() => resolveSettings(d, { KEYGATE_URL: 'ftp://x' })).toThrow(/http:\/\/ or https:\/\//);
    expect(() => resolveSettings(d, { KEYGATE_URL: 'not a url' })).toThrow(/not a URL/);
    expect(() => resolveSettings(d, { KEYGATE_URL: 'http://user:pw@h' })).toThrow(/must not carry credentials/);
    expect(resolveSettings(d, { KEYGATE_URL: 'https://cp.example.test/base/' }).url).toBe('https://cp.example.test/base');
  });
});
