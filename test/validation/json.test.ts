import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadProxyConfigFile } from '../../src/config/load.js';
import { jsonErrorLocation, parseJsonSafely, unicodeIssues } from '../../src/validation/json.js';

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

describe('unicodeIssues', () => {
  it('reports each lone surrogate with its loc, never the value; a paired one is text', () => {
    const body = JSON.parse('{"a": ["ok", "x\\ud800"], "b\\udc00": 1, "c": {"d": "\\ud83d\\ude00", "e": "\\udfff"}}');
    const found = unicodeIssues(body, ['body']).map((i) => [i.loc, i.type]);
    expect(found).toHaveLength(3);
    expect(found).toEqual(expect.arrayContaining([
      [['body', 'a', 1], 'string_unicode'],
      [['body', 'b\udc00'], 'string_unicode'],
      [['body', 'c', 'e'], 'string_unicode'],
    ]));
    expect(JSON.stringify(unicodeIssues(body, ['body']))).not.toContain('x\\ud800');
  });

  // Each place used to copy its parent's loc: quadratic in the depth, 10 s of a blocked event
  // loop for a body nested 30,000 deep, and a 1 MiB body can nest 500,000 deep.
  it('walks a body nested 300,000 deep (the most a 1 MiB body holds is 500,000) and reports the loc at its bottom', () => {
    const depth = 300_000;
    const body = JSON.parse('['.repeat(depth) + '"\\ud800"' + ']'.repeat(depth));
    const [issue, ...rest] = unicodeIssues(body, ['body']);
    expect(rest).toEqual([]);
    expect(issue.loc.length).toBe(depth + 1);
    expect(issue.loc.slice(0, 3)).toEqual(['body', 0, 0]);
  });
});
