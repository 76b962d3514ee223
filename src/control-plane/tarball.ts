import { closeSync, createReadStream, lstatSync, openSync, readdirSync, readlinkSync, readSync, realpathSync } from 'node:fs';
import path from 'node:path';
import * as tar from 'tar';
import { intSetting } from '../settings.js';

/** The archive is refused; the message says which entry and why (shown to the user as is). */
export class TarballError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TarballError';
  }
}

export interface TarLimits {
  maxEntries: number;
  /** Sum of all file sizes once unpacked. */
  maxUnpackedBytes: number;
}

/** The operator's bounds (a value that cannot be used is a start-up error: src/settings.ts). */
export function tarLimitsFromEnv(env: NodeJS.ProcessEnv): TarLimits {
  return {
    maxEntries: intSetting(env, 'KEYGATE_MAX_TAR_ENTRIES', 50_000, { min: 1 }),
    maxUnpackedBytes: intSetting(env, 'KEYGATE_MAX_UNPACKED_BYTES', 1024 * 1024 * 1024, { min: 1, unit: 'bytes' }),
  };
}

const FILE_TYPES = new Set(['File', 'OldFile', 'ContiguousFile']);
const ALLOWED_TYPES = new Set([...FILE_TYPES, 'Directory', 'SymbolicLink']);

/**
 * `./a/b/` -> `a/b`; refuses absolute paths, `..` components, NUL bytes, drive letters and
 * backslashes. A backslash is an ordinary character of a name on this system but a separator to
 * Windows tools, and tar's own checks treat it as one: a name that means two different paths is
 * refused, so what is checked here is exactly what is written.
 */
export function checkEntryPath(raw: string): string {
  if (raw.includes('\0')) throw new TarballError(`entry name contains a NUL byte`);
  if (raw.length > 4096) throw new TarballError(`entry name is longer than 4096 characters`);
  if (raw.startsWith('/') || /^[A-Za-z]:/.test(raw)) throw new TarballError(`entry "${show(raw)}" has an absolute path`);
  if (raw.includes('\\')) throw new TarballError(`entry "${show(raw)}" has a backslash in its name (paths in the archive are separated by /)`);
  const parts = raw.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw new TarballError(`entry "${show(raw)}" contains ".." (it would escape the application directory)`);
  // NAME_MAX: no file system here takes a longer name; refused now rather than failing the build.
  if (parts.some((p) => Buffer.byteLength(p) > 255)) throw new TarballError(`entry "${show(raw)}" has a name longer than 255 bytes`);
  return parts.join('/');
}

/** A symbolic link must point inside the tree, judged from the link's own directory. */
export function checkLinkTarget(entryPath: string, target: string): void {
  if (!target) throw new TarballError(`symbolic link "${show(entryPath)}" has an empty target`);
  if (target.startsWith('/') || /^[A-Za-z]:/.test(target)) throw new TarballError(`symbolic link "${show(entryPath)}" points to an absolute path`);
  if (target.includes('\\')) throw new TarballError(`symbolic link "${show(entryPath)}" has a backslash in its target (paths are separated by /)`);
  const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(entryPath), target));
  if (resolved === '..' || resolved.startsWith('../')) throw new TarballError(`symbolic link "${show(entryPath)}" points outside the application directory`);
}

const show = (s: string) => s.replace(/[^\x20-\x7e]/g, '?').slice(0, 200);

function isGzip(file: string): boolean {
  const fd = openSync(file, 'r');
  try {
    const b = Buffer.alloc(2);
    return readSync(fd, b, 0, 2, 0) === 2 && b[0] === 0x1f && b[1] === 0x8b;
  } finally {
    closeSync(fd);
  }
}

export interface ScanResult {
  entries: number;
  unpackedBytes: number;
  hasKeygateJson: boolean;
}

/**
 * Reads the whole archive without writing anything and refuses it on the first unsafe entry:
 * absolute paths, `..`, hard links, device files and FIFOs, symlinks out of the tree, entries that
 * go through a symlink, too many entries, too many bytes. Also proves the file is a gzip tar.
 */
export async function scanTarball(file: string, limits: TarLimits): Promise<ScanResult> {
  if (!isGzip(file)) throw new TarballError('not a gzip file (send a .tar.gz of the application directory)');
  let entries = 0;
  let bytes = 0;
  let problem: TarballError | null = null;
  // The tree as the unpack will leave it, entry after entry (a later entry of the same name
  // replaces an earlier one): what each path is, and where each link points.
  const tree = new Map<string, TreeNode>();
  const fail = (e: TarballError) => {
    problem ??= e;
  };
  try {
    await tar.t({
      file,
      strict: true,
      onReadEntry: (e) => {
        if (problem) return;
        try {
          entries++;
          if (entries > limits.maxEntries) throw new TarballError(`archive has more than ${limits.maxEntries} entries`);
          const p = checkEntryPath(e.path);
          if (!ALLOWED_TYPES.has(e.type)) {
            const what = e.type === 'Link' ? 'a hard link' : `a ${e.type} entry`;
            throw new TarballError(`entry "${show(e.path)}" is ${what}; only files, directories and symbolic links inside the tree are allowed`);
          }
          const isDir = e.type === 'Directory';
          if (p === '') {
            if (isDir) return;
            throw new TarballError(`entry "${show(e.path)}" names the application directory itself`);
          }
          const parts = p.split('/');
          for (let i = 1; i < parts.length; i++) {
            const pre = parts.slice(0, i).join('/');
            const n = tree.get(pre);
            if (n?.kind === 'symlink') throw new TarballError(`entry "${show(e.path)}" goes through the symbolic link "${show(pre)}"`);
            if (n?.kind === 'file') throw new TarballError(`entry "${show(e.path)}" is under "${show(pre)}", which is a file`);
            if (n) n.children = true;
            else tree.set(pre, { kind: 'dir', children: true });
          }
          const old = tree.get(p);
          if (old?.kind === 'dir' && old.children && !isDir) throw new TarballError(`entry "${show(e.path)}" would replace the directory "${show(p)}", which is not empty`);
          if (e.type === 'SymbolicLink') {
            const target = e.linkpath ?? '';
            checkLinkTarget(p, target);
            tree.set(p, { kind: 'symlink', target });
          } else if (isDir) {
            if (old?.kind !== 'dir') tree.set(p, { kind: 'dir', children: false });
          } else {
            tree.set(p, { kind: 'file' });
            bytes += e.size ?? 0;
            if (bytes > limits.maxUnpackedBytes) throw new TarballError(`archive unpacks to more than ${limits.maxUnpackedBytes} bytes`);
          }
        } catch (err) {
          if (err instanceof TarballError) fail(err);
          else throw err;
        }
      },
    });
  } catch (err) {
    if (problem) throw problem;
    throw new TarballError(`not a valid tar.gz archive (${(err as Error).message.split('\n')[0].slice(0, 200)})`);
  }
  if (problem) throw problem;
  if (entries === 0) throw new TarballError('archive is empty');
  // Links checked one by one looked inside; together they may not be (`a/b` -> `..` is the top,
  // `s` -> `a/b/..` is then above it), dangling or not.
  for (const [p, n] of tree) {
    if (n.kind === 'symlink' && linkEscapes((q) => tree.get(q), p)) throw new TarballError(`symbolic link "${show(p)}" leads outside the application directory (through other links)`);
  }
  return { entries, unpackedBytes: bytes, hasKeygateJson: tree.get('keygate.json')?.kind === 'file' };
}

type TreeNode = { kind: 'dir'; children: boolean } | { kind: 'file' } | { kind: 'symlink'; target: string };

/**
 * Whether the symlink at `link` (a relative POSIX path in the tree) leads outside the tree,
 * resolved as the kernel resolves it, one component at a time: an absolute target, or a `..` above
 * the top after following the links on the way. A component that does not exist is followed
 * lexically (whoever creates it later makes a directory of it, whose `..` is its parent), so a
 * dangling link is judged by where it would lead. Never looks outside the tree.
 */
export function linkEscapes(lookup: (p: string) => { kind: string; target?: string } | undefined, link: string): boolean {
  let cur = link.split('/').slice(0, -1);
  const first = lookup(link)?.target ?? '';
  if (first.startsWith('/')) return true;
  const queue = first.split('/');
  let hops = 0;
  let missing = false;
  while (queue.length > 0) {
    const c = queue.shift()!;
    if (c === '' || c === '.') continue;
    if (c === '..') {
      if (cur.length === 0) return true;
      cur = cur.slice(0, -1);
      continue;
    }
    const next = [...cur, c];
    const node = missing ? undefined : lookup(next.join('/'));
    if (node?.kind === 'symlink') {
      if (++hops > 40) return false; // ELOOP for the kernel too: leads nowhere
      const t = node.target ?? '';
      if (t.startsWith('/')) return true;
      queue.unshift(...t.split('/'));
      continue;
    }
    if (!node) missing = true;
    cur = next;
  }
  return false;
}

/** Every symlink under `root` that resolves must resolve inside `root` (catches link chains). */
export function checkTreeLinks(root: string): void {
  // realpathSync.native asks the kernel; the JS realpathSync normalises `..` in link targets
  // lexically, which is exactly the mistake a hostile chain exploits.
  const realRoot = realpathSync.native(root);
  const onDisk = (q: string): { kind: string; target?: string } | undefined => {
    const full = path.join(realRoot, q);
    let st;
    try {
      st = lstatSync(full);
    } catch {
      return undefined; // missing, or under a file
    }
    if (st.isSymbolicLink()) return { kind: 'symlink', target: readlinkSync(full) };
    return { kind: st.isDirectory() ? 'dir' : 'file' };
  };
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const full = path.join(dir, name);
      const st = lstatSync(full);
      if (st.isSymbolicLink()) {
        // A dangling link is judged by where it would lead once its target exists.
        if (linkEscapes(onDisk, path.relative(root, full).split(path.sep).join('/'))) {
          throw new TarballError(`symbolic link "${show(path.relative(root, full))}" resolves outside the application directory`);
        }
        let real: string;
        try {
          real = realpathSync.native(full);
        } catch {
          continue; // dangling (or a loop): leads nowhere, and nowhere outside
        }
        if (real !== realRoot && !real.startsWith(realRoot + path.sep)) {
          throw new TarballError(`symbolic link "${show(path.relative(root, full))}" resolves outside the application directory`);
        }
      } else if (st.isDirectory()) {
        walk(full);
      } else if (!st.isFile()) {
        throw new TarballError(`"${show(path.relative(root, full))}" is not a regular file`);
      }
    }
  };
  walk(root);
}

/**
 * tar's Unpack runs entries concurrently, ordered by "path reservations" that queue each entry on
 * its path, its link target and their parent directories. An entry whose link target lies under
 * itself (a symlink `a` -> `a/a`, or `a/b` -> `a`) waits for itself there, and the unpack never
 * ends: a build stuck for good, holding a build slot, and a delete of its deployment waiting on
 * it. Entries here run one after the other instead, in archive order (what a tar reader means by
 * an archive anyway), so nothing can wait for itself.
 */
class SerialReservations {
  private tail: Promise<void> = Promise.resolve();
  reserve(_paths: string[], fn: (done: () => void) => void): boolean {
    this.tail = this.tail.then(() => new Promise<void>((resolve) => fn(resolve)));
    return true;
  }
}

/**
 * Unpacks into `dest` (an empty directory) after `scanTarball` accepted the archive. tar itself runs
 * with its own protections on too (no absolute paths, no writing through symlinks); the filter
 * repeats the type check so nothing the scan refused can be written even if the file changed.
 */
export async function extractTarball(file: string, dest: string, limits: TarLimits): Promise<ScanResult> {
  const scan = await scanTarball(file, limits);
  let written = 0;
  const unpack = new tar.Unpack({
    cwd: dest,
    strict: true,
    preservePaths: false,
    preserveOwner: false,
    dmode: 0o755,
    fmode: 0o644,
    umask: 0o022,
    filter: (_p, e) => {
      const entry = e as tar.ReadEntry;
      if (!ALLOWED_TYPES.has(entry.type)) return false;
      // Apps never need setuid/setgid/sticky bits or files others may write: the archive's mode
      // is masked (tar's dmode/fmode/umask only apply to entries without a mode, and the process
      // umask leaves the special bits alone).
      if (typeof entry.mode === 'number') entry.mode &= 0o755;
      written += entry.size ?? 0;
      return written <= limits.maxUnpackedBytes;
    },
  });
  (unpack as unknown as { reservations: SerialReservations }).reservations = new SerialReservations();
  await new Promise<void>((resolve, reject) => {
    unpack.on('error', reject);
    unpack.on('close', () => resolve());
    const src = createReadStream(file);
    src.on('error', reject);
    src.pipe(unpack);
  });
  checkTreeLinks(dest);
  return scan;
}
