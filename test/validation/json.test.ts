import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadProxyConfigFile } from '../../src/config/load.js';
import { jsonErrorLocation, parseJsonSafely } from '../../src/validation/json.js';

const SECRET = 'opaque-VALUE-that-must-not-leak-1234';
const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-json-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function errorOf(text: string): Error {
  try {
    JSON.parse(text);
  } catch (err) {
    return err as Error;
  }
  throw new Error('parsed');
}

describe('JSON syntax errors never quote the input', () => {
  const broken = `{\n  "rules": [{"headers": [{"value": "${SECRET}" oops}]}]\n}`;

  it('reports line and column of a real parser error', () => {
    expect(jsonErrorLocation(broken, errorOf(broken))).toBe(`line 2, column ${broken.split('\n')[1].indexOf(' oops') + 2}`);
    expect(jsonErrorLocation('', errorOf(''))).toBe('unexpected end of input');
  });

  it('drops the snippet V8 quotes in its newer message format', () => {
    // Node 22's V8 says: Unexpected token 'o', ..."${SECRET}" oops}]}]"... is not valid JSON
    const quoting = new SyntaxError(`Unexpected token 'o', ..."${SECRET}" oops}]}]"... is not valid JSON`);
    const where = jsonErrorLocation(broken, quoting);
    expect(where).toBe('syntax error');
    expect(where).not.toContain(SECRET);
  });

  it('parseJsonSafely and the proxy config loader name only the place', () => {
    expect(() => parseJsonSafely(broken)).toThrow(/^invalid JSON at line 2, column \d+$/);
    const file = path.join(dir, 'proxy.json');
    writeFileSync(file, broken);
    let message = '';
    try {
      loadProxyConfigFile(file, () => undefined);
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/not valid JSON \(line 2, column \d+\)/);
    expect(message).not.toContain(SECRET);
    expect(message).not.toContain('oops');
  });
});
