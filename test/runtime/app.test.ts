// Loading an application: keygate.json validation, env files, module checks, stable ids.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppConfigError, findAssistant, loadApp } from '../../src/runtime/app.js';
import { DotenvError, parseDotenv } from '../../src/runtime/dotenv.js';
import { assistantId, uuidV5 } from '../../src/runtime/ids.js';
import { foldUpdate, mergeMessages } from '../../src/runtime/state.js';

let tmp: string;
let n = 0;

beforeAll(() => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-app-load-'));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** A fresh app directory (fresh module URLs too, so imports are never cached across cases). */
function makeApp(config: unknown, files: Record<string, string> = {}): string {
  const dir = path.join(tmp, `app${++n}`);
  mkdirSync(path.join(dir, 'src'), { recursive: true });
  writeFileSync(path.join(dir, 'keygate.json'), typeof config === 'string' ? config : JSON.stringify(config));
  writeFileSync(path.join(dir, 'package.json'), '{"type":"module"}');
  for (const [f, text] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
    writeFileSync(path.join(dir, f), text);
  }
  return dir;
}

async function loadError(dir: string, env: NodeJS.ProcessEnv = {}): Promise<AppConfigError> {
  const err = await loadApp(dir, { targetEnv: env }).then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof AppConfigError)) throw new Error(`expected AppConfigError, got ${String(err)}`);
  return err;
}

const OK_MODULE = 'export default { description: "d", async run() {} };';

describe('loadApp', () => {
  it('loads assistants by default export, named "assistant" export and module:export', async () => {
    const dir = makeApp(
      { name: 'demo', assistants: { a: './src/a.js', b: './src/b.js', c: './src/multi.js:third' } },
      {
        'src/a.js': OK_MODULE,
        'src/b.js': 'export const assistant = { async run() {} };',
        'src/multi.js': 'export const third = { description: "three", run() {} };',
      },
    );
    const app = await loadApp(dir, { targetEnv: {} });
    expect(app.name).toBe('demo');
    expect(app.assistants.map((a) => [a.name, a.description])).toEqual([
      ['a', 'd'],
      ['b', null],
      ['c', 'three'],
    ]);
    expect(app.assistants[0].id).toBe(assistantId('demo', 'a'));
    expect(findAssistant(app, 'b')).toBe(app.assistants[1]);
    expect(findAssistant(app, app.assistants[2].id)).toBe(app.assistants[2]);
    expect(findAssistant(app, app.assistants[2].id.toUpperCase())).toBe(app.assistants[2]);
    expect(findAssistant(app, 'nope')).toBeUndefined();
  });

  it('defaults the app name to the directory name, normalised', async () => {
    const dir = makeApp({ assistants: { a: './src/a.js' } }, { 'src/a.js': OK_MODULE });
    expect((await loadApp(dir, { targetEnv: {} })).name).toBe(path.basename(dir));
  });

  it('applies the env file without overriding variables already set, before importing modules', async () => {
    const name = `KEYGATE_TEST_FIRST_${n}`;
    const dir = makeApp(
      { name: 'envy', assistants: { a: './src/a.js' }, env: '.env' },
      // The module reads the variable at import time: the env must already be applied.
      { '.env': `export ${name}=one\n`, 'src/a.js': `export default { description: String(process.env.${name}), run() {} };` },
    );
    try {
      const app = await loadApp(dir); // module code reads process.env, so the real environment
      expect(app.assistants[0].description).toBe('one');
      expect(app.envApplied).toEqual([name]);
    } finally {
      delete process.env[name];
    }
    const dir2 = makeApp({ name: 'envy2', assistants: { a: './src/a.js' }, env: '.env' }, { '.env': 'KEPT=from-file\nNEW=new\n', 'src/a.js': OK_MODULE });
    const env: NodeJS.ProcessEnv = { KEPT: 'from-env' };
    const app2 = await loadApp(dir2, { targetEnv: env });
    expect(env).toEqual({ KEPT: 'from-env', NEW: 'new' });
    expect(app2.envApplied).toEqual(['NEW']);
  });

  it('accepts inline env and warns (does not fail) about a missing env file', async () => {
    const inline = makeApp({ assistants: { a: './src/a.js' }, env: { GREETING: 'hi' } }, { 'src/a.js': OK_MODULE });
    const env: NodeJS.ProcessEnv = {};
    await loadApp(inline, { targetEnv: env });
    expect(env).toEqual({ GREETING: 'hi' });
    const missing = makeApp({ assistants: { a: './src/a.js' }, env: '.env' }, { 'src/a.js': OK_MODULE });
    const app = await loadApp(missing, { targetEnv: {} });
    expect(app.warnings).toEqual([expect.stringMatching(/keygate\.json: env: file \.env not found/)]);
  });

  it('a malformed env file names the line, never the value', async () => {
    const dir = makeApp({ assistants: { a: './src/a.js' }, env: '.env' }, { '.env': 'GOOD=1\nSECRET="s3cr3t-value\n', 'src/a.js': OK_MODULE });
    const err = await loadError(dir);
    expect(err.message).toContain(path.join(dir, 'keygate.json'));
    expect(err.message).toMatch(/env: \.env: line 2: unterminated double-quoted value/);
    expect(err.message).not.toContain('s3cr3t');
  });

  it('names the file and the field for every kind of mistake', async () => {
    const cases: [unknown, Record<string, string>, RegExp][] = [
      ['not json', {}, /keygate\.json: invalid JSON/],
      [[], {}, /keygate\.json: Must be object/],
      [{}, {}, /keygate\.json: assistants: Field required/],
      [{ assistants: {} }, {}, /keygate\.json: assistants: Must NOT have fewer than 1 properties/],
      [{ assistants: { a: './src/a.js' }, graphs: {} }, { 'src/a.js': OK_MODULE }, /keygate\.json: graphs: Extra inputs are not permitted/],
      [{ name: 'Bad Name', assistants: { a: './src/a.js' } }, { 'src/a.js': OK_MODULE }, /keygate\.json: name: must be lowercase/],
      [{ assistants: { 'a/b': './src/a.js' } }, { 'src/a.js': OK_MODULE }, /keygate\.json: assistants\.a\/b: assistant name must be/],
      [{ assistants: { a: './src/none.js' } }, {}, /keygate\.json: assistants\.a: module \.\/src\/none\.js does not exist/],
      [{ assistants: { a: '/etc/passwd' } }, {}, /assistants\.a: module path must be relative/],
      [{ assistants: { a: '../outside.js' } }, {}, /assistants\.a: module \.\.\/outside\.js (is outside the application directory|does not exist)/],
      [{ assistants: { a: './src/a.js' } }, { 'src/a.js': 'export const x = 1;' }, /assistants\.a: module \.\/src\/a\.js: default export \(or export "assistant"\) is missing/],
      [{ assistants: { a: './src/a.js' } }, { 'src/a.js': 'export default function run() {}' }, /assistants\.a: .* must be an object/],
      [{ assistants: { a: './src/a.js:nope' } }, { 'src/a.js': OK_MODULE }, /assistants\.a: module \.\/src\/a\.js: export "nope" is missing/],
      [{ assistants: { a: './src/a.js' } }, { 'src/a.js': 'export default { description: 5, run() {} }' }, /description that is not a string/],
      [{ assistants: { a: './src/a.js' } }, { 'src/a.js': 'export default {{ syntax' }, /assistants\.a: cannot load module \.\/src\/a\.js: \w*Error: /], // vite reports it in-process; the CLI test checks node's SyntaxError
      [{ assistants: { a: './src/a.js' } }, { 'src/a.js': 'throw new Error("boom at import")' }, /assistants\.a: cannot load module \.\/src\/a\.js: Error: boom at import/],
      [{ assistants: { a: './src/a.js' }, env: { 'BAD-NAME': 'x' } }, { 'src/a.js': OK_MODULE }, /keygate\.json: env\.BAD-NAME: not a valid environment variable name/],
    ];
    for (const [config, files, expected] of cases) {
      const dir = makeApp(config, files);
      const err = await loadError(dir);
      expect(err.message, JSON.stringify(config)).toMatch(expected);
      expect(err.message.startsWith(path.join(dir, 'keygate.json'))).toBe(true);
      expect(err.file).toBe(path.join(dir, 'keygate.json'));
    }
  });

  it('refuses a module that escapes the app directory through a symlink', async () => {
    const outside = path.join(tmp, `outside${++n}.js`);
    writeFileSync(outside, OK_MODULE);
    const dir = makeApp({ assistants: { a: './src/link.js' } });
    symlinkSync(outside, path.join(dir, 'src/link.js'));
    expect((await loadError(dir)).message).toMatch(/assistants\.a: module \.\/src\/link\.js is outside the application directory/);
  });

  it('refuses a directory that does not exist', async () => {
    await expect(loadApp(path.join(tmp, 'nope'))).rejects.toThrow(/application directory does not exist/);
  });
});

describe('assistant ids', () => {
  it('uuidV5 agrees with RFC 4122 (the DNS example and Python uuid.uuid5)', () => {
    // uuid.uuid5(uuid.NAMESPACE_DNS, 'python.org') == 886313e1-3b8a-5372-9b90-0c9aee199e5d
    expect(uuidV5('python.org', '6ba7b810-9dad-11d1-80b4-00c04fd430c8')).toBe('886313e1-3b8a-5372-9b90-0c9aee199e5d');
    // The keygate namespace itself: uuid.uuid5(uuid.NAMESPACE_URL, 'keygate.assistant')
    expect(uuidV5('keygate.assistant', '6ba7b811-9dad-11d1-80b4-00c04fd430c8')).toBe('a0c7dfbe-c7aa-5abe-a94b-5ecbe78e7958');
  });

  it('are stable and distinct per app and assistant', () => {
    expect(assistantId('echo', 'agent')).toBe(assistantId('echo', 'agent'));
    expect(assistantId('echo', 'agent')).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(assistantId('echo', 'agent')).not.toBe(assistantId('echo2', 'agent'));
    expect(assistantId('echo', 'agent')).not.toBe(assistantId('echo', 'agent2'));
  });
});

describe('parseDotenv', () => {
  it('parses the common dialect', () => {
    const text = [
      '# comment',
      '',
      'A=1',
      'export B = two words ',
      "C='single # kept $X'",
      'D="line1\\nline2 \\"q\\""',
      'E="multi',
      'line"',
      'F=value # trailing comment',
      'G=',
      'H=a=b',
    ].join('\r\n');
    expect(Object.fromEntries(parseDotenv(text))).toEqual({
      A: '1',
      B: 'two words',
      C: 'single # kept $X',
      D: 'line1\nline2 "q"',
      E: 'multi\nline',
      F: 'value',
      G: '',
      H: 'a=b',
    });
  });

  it('reports the line of a mistake', () => {
    expect(() => parseDotenv('A=1\nnot a pair\n')).toThrow(new DotenvError(2, 'expected KEY=value'));
    expect(() => parseDotenv("A='open\n")).toThrow(/line 1: unterminated single-quoted value/);
    expect(() => parseDotenv('1A=x')).toThrow(/line 1: invalid variable name/);
    expect(() => parseDotenv('A="x" trailing')).toThrow(/line 1: unexpected text after the closing quote/);
  });
});

describe('state folding', () => {
  it('appends messages, replaces by id, replaces other keys, ignores non-objects', () => {
    const s0 = { messages: [{ id: '1', content: 'a' }], n: 1 };
    const s1 = foldUpdate(s0, { messages: [{ id: '2', content: 'b' }], n: 2 });
    expect(s1).toEqual({ messages: [{ id: '1', content: 'a' }, { id: '2', content: 'b' }], n: 2 });
    expect(s0.messages).toHaveLength(1); // the previous state is not mutated
    expect(foldUpdate(s1, { messages: [{ id: '1', content: 'A' }] }).messages).toEqual([
      { id: '1', content: 'A' },
      { id: '2', content: 'b' },
    ]);
    expect(foldUpdate(s1, 'text')).toBe(s1);
    expect(foldUpdate(s1, [1, 2])).toBe(s1);
    expect(mergeMessages(undefined, [{ content: 'x' }, { content: 'x' }])).toHaveLength(2);
  });
});
