import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as tar from 'tar';
import { afterEach, describe, expect, it } from 'vitest';
import { checkAppDir } from '../../src/deploy/appdir.js';
import { alwaysExcluded, selectFiles } from '../../src/deploy/files.js';
import { packToFile } from '../../src/deploy/pack.js';
import { tarEntries } from './helpers.js';

const dirs: string[] = [];
function tmp(prefix = 'keygate-deploy-files-'): string {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
}
afterEach(() => {
  while (dirs.length) rmSync(dirs.pop()!, { recursive: true, force: true });
});

/** Writes a tree: keys are relative paths, values file contents. */
function tree(root: string, files: Record<string, string>): string {
  for (const [rel, content] of Object.entries(files)) {
    const f = path.join(root, rel);
    mkdirSync(path.dirname(f), { recursive: true });
    writeFileSync(f, content);
  }
  return root;
}

describe('what is packed', () => {
  it('never packs .env, .env.*, node_modules or .git, at any depth, whatever the ignore files say', () => {
    const root = tree(tmp(), {
      'keygate.json': '{}',
      '.env': 'KEYGATE_API_KEY=secret',
      '.env.local': 'X=1',
      '.envrc': 'kept: not a dotenv file of this app',
      'sub/.env': 'Y=2',
      'node_modules/dep/index.js': '',
      'sub/node_modules/x.js': '',
      '.git/config': '',
      'src/agent.js': 'export default {}',
      '.gitignore': '!.env\n!node_modules\n',
      '.keygateignore': '!.env.local\n',
    });
    const sel = selectFiles(root);
    expect(sel.files).toEqual(['.envrc', '.gitignore', '.keygateignore', 'keygate.json', 'src/agent.js']);
    expect(sel.excluded.filter((e) => e.reason === 'always').map((e) => e.path).sort()).toEqual(['.env', '.env.local', '.git', 'node_modules', 'sub/.env', 'sub/node_modules']);
    expect(alwaysExcluded('.env.production')).toBe(true);
    expect(alwaysExcluded('env')).toBe(false);
  });

  it('honours .gitignore and .keygateignore, nested ones relative to their directory, with git precedence', () => {
    const root = tree(tmp(), {
      'keygate.json': '{}',
      '.gitignore': '*.log\nbuild/\n/secret.txt\ncache\n',
      '.keygateignore': 'docs/\n!keep.log\n',
      'a.log': '',
      'keep.log': 'kept by .keygateignore negation',
      'build/out.js': '',
      'src/build': 'a FILE named build: build/ only matches directories',
      'secret.txt': '',
      'src/secret.txt': 'anchored /secret.txt only matches at the root',
      'cache/x': '',
      'docs/readme.md': '',
      'src/.gitignore': 'local.js\n!important.log\n',
      'src/local.js': '',
      'src/important.log': 're-included by the deeper .gitignore',
      'src/other.log': '',
      'src/agent.js': '',
      'lib/local.js': 'the src/ rule does not apply here',
    });
    const sel = selectFiles(root);
    expect(sel.files).toEqual([
      '.gitignore',
      '.keygateignore',
      'keep.log',
      'keygate.json',
      'lib/local.js',
      'src/.gitignore',
      'src/agent.js',
      'src/build',
      'src/important.log',
      'src/secret.txt',
    ]);
    // Ignored directories are not entered at all.
    expect(sel.excluded.map((e) => e.path)).toContain('build');
    expect(sel.excluded.map((e) => e.path)).not.toContain('build/out.js');
  });

  it('keeps in-tree relative symlinks as links and refuses links out of the directory', () => {
    const outside = tmp('keygate-outside-');
    writeFileSync(path.join(outside, 'secret'), 'nope');
    const root = tree(tmp(), { 'keygate.json': '{}', 'src/real.js': 'x' });
    symlinkSync('src/real.js', path.join(root, 'alias.js'));
    expect(selectFiles(root).files).toEqual(['alias.js', 'keygate.json', 'src/real.js']);

    symlinkSync(path.join(outside, 'secret'), path.join(root, 'abs-link'));
    expect(() => selectFiles(root)).toThrow(/refusing to pack symlink abs-link .*absolute/);
    rmSync(path.join(root, 'abs-link'));

    symlinkSync(path.relative(path.join(root, 'src'), path.join(outside, 'secret')), path.join(root, 'src', 'escape'));
    expect(() => selectFiles(root)).toThrow(/refusing to pack symlink src\/escape .*outside the application directory/);
    rmSync(path.join(root, 'src', 'escape'));

    // A dangling link whose text climbs out is refused too, even though nothing is there yet.
    symlinkSync('../../nowhere', path.join(root, 'src', 'dangling'));
    expect(() => selectFiles(root)).toThrow(/outside the application directory/);
    rmSync(path.join(root, 'src', 'dangling'));

    // An ignored escaping link is never looked at.
    symlinkSync('../../etc/passwd', path.join(root, 'ignored-link'));
    writeFileSync(path.join(root, '.keygateignore'), 'ignored-link\n');
    expect(selectFiles(root).files).not.toContain('ignored-link');
  });

  it('packs exactly the selected files into a gzip tarball with relative paths', async () => {
    const root = tree(tmp(), {
      'keygate.json': '{"assistants":{"a":"./src/a.js"}}',
      'src/a.js': 'export default 1',
      '.env': 'TOP=secret',
      '.gitignore': 'dist/\n',
      'dist/x.js': '',
      'node_modules/m/index.js': '',
    });
    symlinkSync('src/a.js', path.join(root, 'link.js'));
    const out = path.join(tmp(), 'src.tar.gz');
    const size = await packToFile(selectFiles(root), out);
    expect(size).toBeGreaterThan(0);
    const entries = await tarEntries(out);
    expect([...entries.keys()].sort()).toEqual(['.gitignore', 'keygate.json', 'link.js', 'src/a.js']);
    expect(entries.get('src/a.js')!.body).toBe('export default 1');
    expect(entries.get('link.js')).toMatchObject({ type: 'SymbolicLink', linkpath: 'src/a.js' });
    for (const p of entries.keys()) expect(p.startsWith('/') || p.includes('..')).toBe(false);
  });
});

describe('application directory check', () => {
  it('accepts a keygate.json naming existing assistant modules', () => {
    const root = tree(tmp(), {
      'keygate.json': JSON.stringify({ name: 'x', assistants: { agent: './src/agent.js', other: './src/o.js:named' }, env: '.env' }),
      'src/agent.js': '',
      'src/o.js': '',
    });
    const info = checkAppDir(root);
    expect(info.assistants).toEqual(['agent', 'other']);
    expect(info.modules).toEqual(['src/agent.js', 'src/o.js']);
    expect(info.envFile).toBe(path.join(root, '.env'));
  });
  it.each([
    [{}, /keygate.json not found/],
    [{ 'keygate.json': '{nope' }, /invalid JSON/],
    [{ 'keygate.json': '[]' }, /must be a JSON object/],
    [{ 'keygate.json': '{"assistants":{}}' }, /must name at least one assistant/],
    [{ 'keygate.json': '{"assistants":{"a":"./missing.js"}}' }, /assistants\.a: \.\/missing\.js does not exist/],
    [{ 'keygate.json': '{"assistants":{"a":"../outside.js"}}' }, /outside the application directory/],
    [{ 'keygate.json': '{"assistants":{"a":5}}' }, /assistants\.a: must be a path/],
  ])('refuses %j', (files, err) => {
    const root = tree(tmp(), files as Record<string, string>);
    expect(() => checkAppDir(root)).toThrow(err);
  });
  it('refuses a missing directory', () => {
    expect(() => checkAppDir(path.join(os.tmpdir(), 'keygate-no-such-dir-' + process.pid))).toThrow(/does not exist/);
  });
});
