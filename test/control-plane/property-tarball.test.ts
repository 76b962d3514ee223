// Property test of the source-archive unpacker (src/control-plane/tarball.ts; README "Unpacking"):
// generated hostile gzip tars (PAX and GNU long names that override a harmless header, duplicate
// entries where a file becomes a symlink or a directory and is then written through, symlinks to
// `..` chains and absolute paths, hard links, devices, FIFOs, NUL bytes, backslashes, `.` segments,
// long names, case variants, sizes that lie, truncated archives, entry and byte limits) are
// unpacked for real next to canary files. Checked every time: the unpack refuses with an error or
// produces exactly the model's tree, every symlink it leaves resolves inside (walked component by
// component, dangling ones included), and nothing beside the destination is created or changed.
import fc from 'fast-check';
import { lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkTreeLinks, extractTarball, scanTarball, type TarLimits } from '../../src/control-plane/tarball.js';
import { propertyParams } from '../helpers/property.js';
import { cleanupTmp, tmpDir } from './helpers.js';
import { fitsUstar, hostileTarGz, type Encoding, type HostileEntry, type HostileType } from './hostile-tar.js';

afterAll(cleanupTmp);

const CANARY = 'CANARY-do-not-read-or-write-7f3a';

// ---------------------------------------------------------------- what is on disk, as a map

type Node = { kind: 'dir' } | { kind: 'file'; data: string } | { kind: 'symlink'; target: string };
type Tree = Map<string, Node>;

/** Everything under `dir` (relative POSIX paths), never following a link. */
function snapshot(dir: string, skip?: string): Tree {
  const out: Tree = new Map();
  const walk = (abs: string, rel: string) => {
    for (const name of readdirSync(abs).sort()) {
      const a = path.join(abs, name);
      const r = rel ? `${rel}/${name}` : name;
      if (skip && a === skip) continue;
      const st = lstatSync(a);
      if (st.isSymbolicLink()) out.set(r, { kind: 'symlink', target: readlinkSync(a) });
      else if (st.isDirectory()) {
        out.set(r, { kind: 'dir' });
        walk(a, r);
      } else if (st.isFile()) out.set(r, { kind: 'file', data: readFileSync(a, 'latin1') });
      else out.set(r, { kind: 'file', data: `<special ${st.mode.toString(8)}>` });
    }
  };
  walk(dir, '');
  return out;
}

/**
 * Where a symlink leads, resolved the way the kernel would, one component at a time, inside the
 * tree only: 'escapes' as soon as a step would leave it (an absolute target, `..` above the top),
 * whether or not the rest exists. Missing components are followed lexically (whoever creates them
 * later makes them directories or files, and `..` from those is their parent).
 */
function escapes(tree: Tree, link: string): boolean {
  let cur = link.split('/').slice(0, -1);
  const queue = (tree.get(link) as { target: string }).target.split('/');
  if (queue[0] === '') return true; // absolute
  let hops = 0;
  let missing = false;
  while (queue.length) {
    const c = queue.shift()!;
    if (c === '' || c === '.') continue;
    if (c === '..') {
      if (cur.length === 0) return true;
      cur = cur.slice(0, -1);
      continue;
    }
    const next = [...cur, c];
    const node = missing ? undefined : tree.get(next.join('/'));
    if (node?.kind === 'symlink') {
      if (++hops > 40) return false; // ELOOP: resolves nowhere
      if (node.target.startsWith('/')) return true;
      queue.unshift(...node.target.split('/'));
      continue;
    }
    if (!node) missing = true;
    cur = next;
  }
  return false;
}

// ---------------------------------------------------------------- the model (README "Unpacking")

interface Gen {
  entries: HostileEntry[];
  truncateAt?: number;
  limits: TarLimits;
}

/** The tree an archive must unpack to, or null when it must be refused. */
function model(g: Gen): Tree | null {
  const tree: Tree = new Map();
  let bytes = 0;
  if (g.entries.length === 0 || g.entries.length > g.limits.maxEntries) return null;
  for (const e of g.entries) {
    const raw = e.path.replace(/\0.*/s, ''); // every tar reader cuts a name at its first NUL
    if (raw.includes('\\') || raw.startsWith('/') || raw.length > 4096) return null;
    const parts = raw.split('/').filter((p) => p !== '' && p !== '.');
    if (parts.includes('..')) return null;
    if (parts.some((p) => Buffer.byteLength(p) > 255)) return null; // no file system takes it
    const p = parts.join('/');
    // A regular file named with a trailing slash is a directory (old tars wrote them so).
    const type = e.type === 'File' && raw.endsWith('/') ? 'Directory' : e.type;
    if (!['File', 'Directory', 'SymbolicLink'].includes(type)) return null;
    if (p === '') {
      if (type === 'Directory') continue;
      return null; // a file or link that would be the destination itself
    }
    for (let i = 1; i < parts.length; i++) {
      const pre = parts.slice(0, i).join('/');
      const n = tree.get(pre);
      if (n && n.kind !== 'dir') return null; // through a link, or under a file
      if (!n) tree.set(pre, { kind: 'dir' });
    }
    const old = tree.get(p);
    if (old?.kind === 'dir') {
      if (type === 'Directory') continue;
      if ([...tree.keys()].some((k) => k.startsWith(p + '/'))) return null; // a full directory cannot become a file
    }
    if (type === 'Directory') tree.set(p, { kind: 'dir' });
    else if (type === 'File') {
      const data = (e.body ?? Buffer.alloc(0)).toString('latin1');
      bytes += data.length;
      if (bytes > g.limits.maxUnpackedBytes) return null;
      tree.set(p, { kind: 'file', data });
    } else {
      const t = (e.linkpath ?? '').replace(/\0.*/s, '');
      if (t === '' || t.includes('\\')) return null;
      tree.set(p, { kind: 'symlink', target: t });
      if (escapes(tree, p)) return null; // lexically, from where it stands
    }
  }
  for (const [k, n] of tree) if (n.kind === 'symlink' && escapes(tree, k)) return null;
  return tree;
}

// ---------------------------------------------------------------- generators

const component = fc.oneof(
  { weight: 20, arbitrary: fc.constantFrom('a', 'b', 'A', 'keygate.json', 'x.js') },
  { weight: 2, arbitrary: fc.constantFrom('.', '', '') },
  { weight: 1, arbitrary: fc.constant('..') },
  { weight: 1, arbitrary: fc.constantFrom('c\\d', '..\\..', 'x\u0000y', 'é', 'n'.repeat(120), 'm'.repeat(256)) },
);
const relPath = fc.array(component, { minLength: 1, maxLength: 3 }).map((c) => c.join('/'));
const entryPath = fc.tuple(fc.constantFrom('', '', '', '', '', '', './', './', '/', './/'), relPath, fc.constantFrom('', '', '', '/')).map(([a, b, c]) => a + b + c);

function linkTarget(outside: string): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 8, arbitrary: relPath },
    { weight: 3, arbitrary: fc.constantFrom('..', '../..', '../canary.txt', '../canary-dir/f', '../../outer-canary', '../created-outside', 'a/..', 'a/../..', 'b/../../canary.txt', 'a/b/../../../created') },
    { weight: 1, arbitrary: fc.constantFrom(outside, `${outside}/new`, '/etc/passwd', '\\etc\\passwd', '') },
  );
}

function entry(outside: string): fc.Arbitrary<HostileEntry> {
  const type = fc.oneof(
    { weight: 10, arbitrary: fc.constant<HostileType>('File') },
    { weight: 3, arbitrary: fc.constant<HostileType>('Directory') },
    { weight: 4, arbitrary: fc.constant<HostileType>('SymbolicLink') },
    { weight: 1, arbitrary: fc.constantFrom<HostileType>('Link', 'CharacterDevice', 'FIFO') },
  );
  return fc
    .record({
      path: entryPath,
      type,
      body: fc.oneof(fc.constant(''), fc.string({ maxLength: 24 }), fc.constant(CANARY)).map((s) => Buffer.from(s, 'latin1')),
      linkpath: linkTarget(outside),
      encoding: fc.constantFrom<Encoding>('ustar', 'ustar', 'pax', 'gnu'),
    })
    .map((r) => {
      const isLink = r.type === 'SymbolicLink' || r.type === 'Link';
      const e: HostileEntry = { path: r.path, type: r.type, encoding: r.encoding, body: r.type === 'File' ? r.body : undefined, linkpath: isLink ? r.linkpath : undefined };
      // A plain header cannot carry it: the writer would cut it.
      const tooLong = !fitsUstar(e.path) || Buffer.byteLength(e.linkpath ?? '') > 100 || /\0/.test(e.path + (e.linkpath ?? ''));
      if (e.encoding === 'ustar' && tooLong) e.encoding = 'pax';
      return e;
    });
}

/** Sequences that overwrite: a name used again as another type, then written through. */
function archive(outside: string): fc.Arbitrary<Gen> {
  const ep = entry(outside);
  const replay = fc.tuple(ep, fc.constantFrom<HostileType>('SymbolicLink', 'Directory', 'File'), fc.constantFrom('x', '../x', 'sub/x')).map(([e, t, sub]) => {
    const again: HostileEntry = { ...e, type: t, body: t === 'File' ? Buffer.from('again') : undefined, linkpath: t === 'SymbolicLink' ? e.linkpath || '..' : undefined, encoding: 'pax' };
    const through: HostileEntry = { path: `${e.path.replace(/\/+$/, '')}/${sub}`, type: 'File', body: Buffer.from('through'), encoding: 'pax' };
    return [e, again, through];
  });
  return fc
    .record({
      chunks: fc.array(fc.oneof({ weight: 3, arbitrary: ep.map((e) => [e]) }, { weight: 1, arbitrary: replay }), { minLength: 1, maxLength: 6 }),
      lie: fc.oneof({ weight: 12, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.tuple(fc.nat(20), fc.constantFrom(1, -1, 512, 1000)) }),
      truncate: fc.oneof({ weight: 15, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.nat(4000) }),
      maxEntries: fc.constantFrom(4, 50, 50, 50),
      maxUnpackedBytes: fc.constantFrom(30, 10_000, 10_000, 10_000),
    })
    .map((r) => {
      const entries = [{ path: 'keygate.json', type: 'File', body: Buffer.from('{}'), encoding: 'ustar' } as HostileEntry, ...r.chunks.flat()];
      if (r.lie) {
        const target = entries[r.lie[0] % entries.length];
        entries[r.lie[0] % entries.length] = { ...target, type: 'File', body: target.body ?? Buffer.from('body'), sizeLie: r.lie[1] };
      }
      return { entries, truncateAt: r.truncate ?? undefined, limits: { maxEntries: r.maxEntries, maxUnpackedBytes: r.maxUnpackedBytes } };
    });
}

// ---------------------------------------------------------------- the property

/** outer/{outer-canary, root/{canary.txt, canary-dir/f, app/}}: the unpack goes into app. */
function stage(): { outer: string; dest: string } {
  const outer = tmpDir('keygate-untar-');
  const root = path.join(outer, 'root');
  mkdirSync(path.join(root, 'canary-dir'), { recursive: true });
  writeFileSync(path.join(outer, 'outer-canary'), CANARY);
  writeFileSync(path.join(root, 'canary.txt'), CANARY);
  writeFileSync(path.join(root, 'canary-dir', 'f'), CANARY);
  mkdirSync(path.join(root, 'app'));
  return { outer, dest: path.join(root, 'app') };
}

describe('unpacking hostile archives', () => {
  it('refuses, or unpacks exactly the model tree; never touches what is beside the destination', async () => {
    const probe = stage();
    const outside = path.join(path.dirname(probe.dest), 'canary.txt');
    let accepted = 0;
    await fc.assert(
      fc.asyncProperty(archive(outside), async (g) => {
        const { outer, dest } = stage();
        // The absolute targets name this run's canary.
        const entries = g.entries.map((e) => (e.linkpath?.startsWith(path.dirname(probe.dest)) ? { ...e, linkpath: e.linkpath.replace(path.dirname(probe.dest), path.dirname(dest)) } : e));
        const file = path.join(outer, 'src.tar.gz');
        writeFileSync(file, hostileTarGz(entries, { truncateAt: g.truncateAt }));
        const before = snapshot(outer, dest);
        let error: unknown = null;
        try {
          await extractTarball(file, dest, g.limits);
        } catch (err) {
          error = err;
        }
        // Nothing beside the destination created, changed or removed.
        expect(snapshot(outer, dest)).toEqual(before);
        const got = snapshot(dest);
        for (const [k, n] of got) {
          if (n.kind === 'symlink') expect(escapes(got, k), `symlink ${k} -> ${n.target} leads outside`).toBe(false);
        }
        if (error) {
          expect(error).toBeInstanceOf(Error);
          expect((error as Error).message).not.toBe('');
        } else {
          accepted++;
          const malformed = g.truncateAt !== undefined || g.entries.some((e) => e.sizeLie);
          if (!malformed) expect(got).toEqual(model({ ...g, entries }));
          for (const [k, n] of got) if (n.kind === 'file' && n.data.startsWith('<special')) throw new Error(`${k} is not a regular file`);
        }
        rmSync(outer, { recursive: true, force: true });
      }),
      propertyParams(300, { timeout: 10_000 }),
    );
    expect(accepted).toBeGreaterThan(10);
  }, 120_000);

  it('the upload scan and the unpack agree: what the scan accepts unpacks', async () => {
    await fc.assert(
      fc.asyncProperty(archive('/nonexistent-abs'), async (g) => {
        const { outer, dest } = stage();
        const file = path.join(outer, 'src.tar.gz');
        writeFileSync(file, hostileTarGz(g.entries, { truncateAt: g.truncateAt }));
        const scanned = await scanTarball(file, g.limits).then(
          () => true,
          () => false,
        );
        const unpacked = await extractTarball(file, dest, g.limits).then(
          () => true,
          (e: Error) => e.message,
        );
        const malformed = g.truncateAt !== undefined || g.entries.some((e) => e.sizeLie);
        const m = model(g);
        // An upload the scan takes must build: the unpack may not refuse it afterwards.
        if (scanned && !malformed) expect(unpacked, `scan accepted, unpack said: ${unpacked}`).toBe(true);
        // And the scan takes nothing the model refuses.
        if (scanned && !malformed) expect(m, 'the scan accepted what the model refuses').not.toBeNull();
        rmSync(outer, { recursive: true, force: true });
      }),
      propertyParams(200, { timeout: 10_000 }),
    );
  }, 120_000);
});

describe('archives that once got through', () => {
  const kj: HostileEntry = { path: 'keygate.json', type: 'File', body: Buffer.from('{}'), encoding: 'ustar' };
  const limits = { maxEntries: 100, maxUnpackedBytes: 10_000 };
  async function unpack(entries: HostileEntry[]): Promise<{ error: string | null; dest: string; outer: string }> {
    const { outer, dest } = stage();
    const file = path.join(outer, 'src.tar.gz');
    writeFileSync(file, hostileTarGz(entries));
    const error = await extractTarball(file, dest, limits).then(
      () => null,
      (e: Error) => e.message,
    );
    return { error, dest, outer };
  }

  it('a symlink whose target lies under itself is unpacked, not waited on forever', async () => {
    // tar's path reservations queued `a` behind itself: the unpack never ended.
    for (const [p, t] of [['a', 'a/a'], ['d/l', 'd'], ['x', 'x/../x/y']]) {
      const r = await unpack([kj, { path: p, type: 'SymbolicLink', linkpath: t, encoding: 'ustar' }]);
      expect(r.error).toBeNull();
      expect(readlinkSync(path.join(r.dest, p))).toBe(t);
    }
  });

  it('a dangling symlink that leads outside through another link is refused, at upload and at unpack', async () => {
    // p/q/r/s -> ../../.. is the top; p/q/r/t -> s/../../../X is lexically p/X but physically
    // three levels above the top: a link out of the tree that nothing resolved, since X is missing.
    const entries: HostileEntry[] = [kj, { path: 'p/q/r/s', type: 'SymbolicLink', linkpath: '../../..', encoding: 'ustar' }, { path: 'p/q/r/t', type: 'SymbolicLink', linkpath: 's/../../../created-outside', encoding: 'ustar' }];
    const { outer } = stage();
    const file = path.join(outer, 'src.tar.gz');
    writeFileSync(file, hostileTarGz(entries));
    await expect(scanTarball(file, limits)).rejects.toThrow(/"p\/q\/r\/t" leads outside/);
    const dest = path.join(outer, 'root', 'app');
    mkdirSync(path.join(dest, 'p/q/r'), { recursive: true });
    symlinkSync('../../..', path.join(dest, 'p/q/r/s'));
    symlinkSync('s/../../../created-outside', path.join(dest, 'p/q/r/t'));
    expect(() => checkTreeLinks(dest)).toThrow(/"p\/q\/r\/t" resolves outside/);
  });

  it('a backslash in a name or a link target is refused at upload, not at build', async () => {
    for (const e of [
      { path: 'c\\d', type: 'SymbolicLink', linkpath: '..', encoding: 'ustar' },
      { path: 'l', type: 'SymbolicLink', linkpath: '..\\..\\etc', encoding: 'ustar' },
      { path: 'src\\index.js', type: 'File', body: Buffer.from('x'), encoding: 'ustar' },
    ] as HostileEntry[]) {
      const { outer } = stage();
      const file = path.join(outer, 'src.tar.gz');
      writeFileSync(file, hostileTarGz([kj, e]));
      await expect(scanTarball(file, limits)).rejects.toThrow(/backslash/);
    }
  });

  it('what the unpack would refuse later is refused by the upload scan', async () => {
    const cases: [HostileEntry[], RegExp][] = [
      // a file, then a link of the same name: the directory is not empty
      [[{ path: 'a/a', type: 'File', body: Buffer.from('x'), encoding: 'ustar' }, { path: 'a', type: 'SymbolicLink', linkpath: 'b', encoding: 'ustar' }], /would replace the directory "a"/],
      [[{ path: 'a', type: 'File', body: Buffer.from('x'), encoding: 'ustar' }, { path: 'a/b', type: 'File', body: Buffer.from('x'), encoding: 'ustar' }], /under "a", which is a file/],
      [[{ path: '.', type: 'File', body: Buffer.from('x'), encoding: 'ustar' }], /the application directory itself/],
    ];
    for (const [entries, re] of cases) {
      const { outer } = stage();
      const file = path.join(outer, 'src.tar.gz');
      writeFileSync(file, hostileTarGz([kj, ...entries]));
      await expect(scanTarball(file, limits)).rejects.toThrow(re);
    }
  });

  it('a keygate.json replaced by a directory does not count as one', async () => {
    const { outer } = stage();
    const file = path.join(outer, 'src.tar.gz');
    writeFileSync(file, hostileTarGz([kj, { path: 'keygate.json', type: 'Directory', encoding: 'ustar' }]));
    expect((await scanTarball(file, limits)).hasKeygateJson).toBe(false);
  });

  it('no setuid, setgid, sticky or world-writable modes from the archive', async () => {
    const r = await unpack([kj, { path: 'suid', type: 'File', body: Buffer.from('x'), encoding: 'ustar', mode: 0o7777 }, { path: 'dir', type: 'Directory', encoding: 'ustar', mode: 0o7777 }]);
    expect(r.error).toBeNull();
    for (const p of ['suid', 'dir']) expect(lstatSync(path.join(r.dest, p)).mode & 0o7002, p).toBe(0);
  });
});

describe('names no file system takes', () => {
  it('a name longer than 255 bytes is refused at upload, not at build', async () => {
    const { outer } = stage();
    const file = path.join(outer, 'src.tar.gz');
    writeFileSync(file, hostileTarGz([{ path: 'keygate.json', type: 'File', body: Buffer.from('{}'), encoding: 'ustar' }, { path: `${'m'.repeat(256)}/a`, type: 'File', body: Buffer.from('x'), encoding: 'pax' }]));
    await expect(scanTarball(file, { maxEntries: 10, maxUnpackedBytes: 100 })).rejects.toThrow(/longer than 255 bytes/);
  });
});
