import { existsSync, mkdirSync, readFileSync, realpathSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkTreeLinks, extractTarball, scanTarball, TarballError } from '../../src/control-plane/tarball.js';
import { cleanupTmp, rawTarGz, tmpDir } from './helpers.js';

const limits = { maxEntries: 100, maxUnpackedBytes: 10_000 };
afterAll(cleanupTmp);

function file(buf: Buffer): string {
  const f = path.join(tmpDir(), 'a.tar.gz');
  writeFileSync(f, buf);
  return f;
}
const ok = { path: 'keygate.json', body: '{"assistants":{"a":"./a.js"}}' };

async function refused(entries: Parameters<typeof rawTarGz>[0]): Promise<string> {
  const err = await scanTarball(file(rawTarGz(entries)), limits).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(TarballError);
  return (err as Error).message;
}

describe('tarball safety', () => {
  it('accepts files, directories and in-tree symlinks, and unpacks them', async () => {
    const f = file(rawTarGz([ok, { path: 'src/', type: 'Directory' }, { path: 'src/a.js', body: 'x' }, { path: 'src/link.js', type: 'SymbolicLink', linkpath: 'a.js' }]));
    const scan = await scanTarball(f, limits);
    expect(scan).toEqual({ entries: 4, unpackedBytes: ok.body.length + 1, hasKeygateJson: true });
    const dest = tmpDir();
    await extractTarball(f, dest, limits);
    expect(readFileSync(path.join(dest, 'src/link.js'), 'utf8')).toBe('x');
  });

  it('refuses absolute paths', async () => {
    expect(await refused([ok, { path: '/etc/evil', body: 'x' }])).toContain('absolute path');
  });

  it('refuses .. anywhere in a path', async () => {
    expect(await refused([ok, { path: '../evil', body: 'x' }])).toContain('".."');
    expect(await refused([ok, { path: 'a/../../evil', body: 'x' }])).toContain('".."');
  });

  it('refuses symlinks pointing out of the tree, absolute or relative', async () => {
    expect(await refused([ok, { path: 'l', type: 'SymbolicLink', linkpath: '/etc/passwd' }])).toContain('absolute path');
    expect(await refused([ok, { path: 'a/l', type: 'SymbolicLink', linkpath: '../../x' }])).toContain('outside the application directory');
  });

  it('refuses entries written through a symlink', async () => {
    expect(await refused([ok, { path: 'd', type: 'SymbolicLink', linkpath: 'real' }, { path: 'd/x', body: 'x' }])).toContain('goes through the symbolic link');
  });

  it('refuses hard links and device files', async () => {
    expect(await refused([ok, { path: 'h', type: 'Link', linkpath: 'keygate.json' }])).toContain('hard link');
    expect(await refused([ok, { path: 'dev', type: 'CharacterDevice' }])).toContain('CharacterDevice');
  });

  it('never leaves a symlink chain that escapes once resolved on disk', async () => {
    // a/b -> .. (the root), s -> a/b/.. (lexically "a", physically the root's parent)
    const f = file(rawTarGz([ok, { path: 'a/', type: 'Directory' }, { path: 'a/b', type: 'SymbolicLink', linkpath: '..' }, { path: 's', type: 'SymbolicLink', linkpath: 'a/b/..' }]));
    const root = tmpDir();
    const dest = path.join(root, 'app');
    mkdirSync(dest);
    const err = await extractTarball(f, dest, limits).catch((e: unknown) => e);
    if (!(err instanceof TarballError)) {
      for (const l of ['a/b', 's']) {
        const p = path.join(dest, l);
        if (existsSync(p)) expect(realpathSync(p).startsWith(realpathSync(dest))).toBe(true);
      }
    }
  });

  it('the on-disk check refuses a link that resolves outside', () => {
    const root = tmpDir();
    const dest = path.join(root, 'app');
    mkdirSync(path.join(dest, 'a'), { recursive: true });
    symlinkSync('..', path.join(dest, 'a', 'b'));
    symlinkSync('a/b/..', path.join(dest, 's'));
    expect(() => checkTreeLinks(dest)).toThrow(/"s" resolves outside/);
  });

  it('enforces entry-count and size limits', async () => {
    expect(await refused([ok, { path: 'big', body: 'x'.repeat(10_001) }])).toContain('more than 10000 bytes');
    const many = Array.from({ length: 101 }, (_, i) => ({ path: `f${i}`, body: '' }));
    expect(await refused(many)).toContain('more than 100 entries');
  });

  it('refuses what is not a gzip tar, and empty archives', async () => {
    const err = await scanTarball(file(Buffer.from('plain text')), limits).catch((e: unknown) => e);
    expect((err as Error).message).toContain('not a gzip file');
    expect(await refused([])).toMatch(/empty|not a valid tar/);
  });

  it('writes nothing outside the destination for a refused archive', async () => {
    const root = tmpDir();
    const dest = path.join(root, 'app');
    mkdirSync(dest);
    await expect(extractTarball(file(rawTarGz([ok, { path: '../outside', body: 'x' }])), dest, limits)).rejects.toThrow(TarballError);
    expect(existsSync(path.join(root, 'outside'))).toBe(false);
    expect(existsSync(path.join(dest, 'keygate.json'))).toBe(false);
  });
});
