import { lstatSync, openSync, readSync, closeSync, readdirSync, realpathSync } from 'node:fs';
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

/** `./a/b/` -> `a/b`; refuses absolute paths, `..` components, NUL bytes and drive letters. */
export function checkEntryPath(raw: string): string {
  if (raw.includes('\0')) throw new TarballError(`entry name contains a NUL byte`);
  if (raw.length > 4096) throw new TarballError(`entry name is longer than 4096 characters`);
  if (raw.startsWith('/') || /^[A-Za-z]:/.test(raw) || raw.startsWith('\\')) throw new TarballError(`entry "${show(raw)}" has an absolute path`);
  const parts = raw.split(/[/\\]/).filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw new TarballError(`entry "${show(raw)}" contains ".." (it would escape the application directory)`);
  return parts.join('/');
}

/** A symbolic link must point inside the tree, judged from the link's own directory. */
export function checkLinkTarget(entryPath: string, target: string): void {
  if (!target) throw new TarballError(`symbolic link "${show(entryPath)}" has an empty target`);
  if (target.startsWith('/') || /^[A-Za-z]:/.test(target)) throw new TarballError(`symbolic link "${show(entryPath)}" points to an absolute path`);
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
  let hasKeygateJson = false;
  const links = new Set<string>();
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
          const parts = p.split('/');
          for (let i = 1; i < parts.length; i++) {
            if (links.has(parts.slice(0, i).join('/'))) throw new TarballError(`entry "${show(e.path)}" goes through the symbolic link "${parts.slice(0, i).join('/')}"`);
          }
          if (e.type === 'SymbolicLink') {
            checkLinkTarget(p, e.linkpath ?? '');
            links.add(p);
          }
          if (FILE_TYPES.has(e.type)) {
            bytes += e.size ?? 0;
            if (bytes > limits.maxUnpackedBytes) throw new TarballError(`archive unpacks to more than ${limits.maxUnpackedBytes} bytes`);
          }
          if (p === 'keygate.json' && FILE_TYPES.has(e.type)) hasKeygateJson = true;
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
  return { entries, unpackedBytes: bytes, hasKeygateJson };
}

/** Every symlink under `root` that resolves must resolve inside `root` (catches link chains). */
export function checkTreeLinks(root: string): void {
  // realpathSync.native asks the kernel; the JS realpathSync normalises `..` in link targets
  // lexically, which is exactly the mistake a hostile chain exploits.
  const realRoot = realpathSync.native(root);
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const full = path.join(dir, name);
      const st = lstatSync(full);
      if (st.isSymbolicLink()) {
        let real: string;
        try {
          real = realpathSync.native(full);
        } catch {
          continue; // dangling, and lexically inside (checked at scan time)
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
 * Unpacks into `dest` (an empty directory) after `scanTarball` accepted the archive. tar itself runs
 * with its own protections on too (no absolute paths, no writing through symlinks); the filter
 * repeats the type check so nothing the scan refused can be written even if the file changed.
 */
export async function extractTarball(file: string, dest: string, limits: TarLimits): Promise<ScanResult> {
  const scan = await scanTarball(file, limits);
  let written = 0;
  await tar.x({
    file,
    cwd: dest,
    strict: true,
    preservePaths: false,
    preserveOwner: false,
    noChmod: false,
    // Apps never need setuid/setgid/sticky bits or world-writable files.
    dmode: 0o755,
    fmode: 0o644,
    umask: 0o022,
    filter: (_p, e) => {
      const entry = e as tar.ReadEntry;
      if (!ALLOWED_TYPES.has(entry.type)) return false;
      written += entry.size ?? 0;
      return written <= limits.maxUnpackedBytes;
    },
  });
  checkTreeLinks(dest);
  return scan;
}
