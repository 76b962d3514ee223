import { existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, realpathSync, type Dirent } from 'node:fs';
import path from 'node:path';
import ignore, { type Ignore } from 'ignore';
import { CliError } from '../command-error.js';

/** Ignore files read in every directory, in this order (so `.keygateignore` can re-include with `!`). */
export const IGNORE_FILES = ['.gitignore', '.keygateignore'] as const;

/**
 * Never packed, whatever an ignore file says (a `!.env` cannot bring it back): local secrets,
 * installed dependencies (the build installs them from the lockfile) and version-control data.
 */
export function alwaysExcluded(name: string): boolean {
  return isLocalEnvFile(name) || name === 'node_modules' || name === '.git';
}

/** A local env file by its name (`.env`, `.env.*`): it holds the API key and the app's secrets. */
export function isLocalEnvFile(name: string): boolean {
  return name === '.env' || name.startsWith('.env.');
}

export interface Excluded {
  path: string;
  reason: 'always' | 'ignored' | 'special';
}

export interface FileSelection {
  /** Real path of the application directory (everything is relative to it). */
  root: string;
  /** Files and symlinks to pack, relative POSIX paths, sorted. */
  files: string[];
  excluded: Excluded[];
  /** Sum of the regular files' sizes (before compression). */
  bytes: number;
}

interface Level {
  /** The directory the rules belong to, relative to the root ('' for the root). */
  base: string;
  ig: Ignore;
}

function loadLevel(absDir: string): Ignore | null {
  let ig: Ignore | null = null;
  for (const name of IGNORE_FILES) {
    const f = path.join(absDir, name);
    if (!existsSync(f)) continue;
    ig ??= ignore();
    ig.add(readFileSync(f, 'utf8'));
  }
  return ig;
}

/**
 * git semantics: the deepest ignore file with a rule matching the path decides; a later `!rule`
 * re-includes. Directories are tested with a trailing slash so `build/` rules apply to them only.
 */
export function isIgnored(levels: Level[], rel: string, isDir: boolean): boolean {
  for (let i = levels.length - 1; i >= 0; i--) {
    const { base, ig } = levels[i];
    const sub = base ? rel.slice(base.length + 1) : rel;
    const r = ig.test(isDir ? `${sub}/` : sub);
    if (r.ignored) return true;
    if (r.unignored) return false;
  }
  return false;
}

function inside(root: string, p: string): boolean {
  const rel = path.relative(root, p);
  return rel === '' || (!rel.startsWith(`..${path.sep}`) && rel !== '..' && !path.isAbsolute(rel));
}

/**
 * Walks the application directory and decides what goes into the tarball. Ignored directories are
 * not entered (as with git, a file inside an excluded directory cannot be re-included). A symlink
 * is kept as a link when it points inside the directory with a relative target; one pointing
 * outside (or with an absolute target, which would dangle once unpacked elsewhere) is refused.
 */
export function selectFiles(dir: string, opts: { never?: string[] } = {}): FileSelection {
  let root: string;
  try {
    root = realpathSync(path.resolve(dir));
  } catch {
    throw new CliError(`application directory ${path.resolve(dir)} does not exist`);
  }
  // Files never packed whatever their name (the env file keygate.json names: its values travel as
  // the deployment's write-only secrets, never in clear in the upload), by their real path.
  const never = new Set(
    (opts.never ?? []).map((f) => {
      try {
        return realpathSync(path.resolve(f));
      } catch {
        return path.resolve(f);
      }
    }),
  );
  const files: string[] = [];
  const excluded: Excluded[] = [];
  let bytes = 0;

  const walk = (absDir: string, relDir: string, parentLevels: Level[]) => {
    const ig = loadLevel(absDir);
    const levels = ig ? [...parentLevels, { base: relDir, ig }] : parentLevels;
    let entries: Dirent[];
    try {
      entries = readdirSync(absDir, { withFileTypes: true });
    } catch (err) {
      throw new CliError(`cannot read directory ${absDir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const rel = relDir ? `${relDir}/${e.name}` : e.name;
      const abs = path.join(absDir, e.name);
      if (alwaysExcluded(e.name) || never.has(abs)) {
        excluded.push({ path: rel, reason: 'always' });
        continue;
      }
      if (isIgnored(levels, rel, e.isDirectory())) {
        excluded.push({ path: rel, reason: 'ignored' });
        continue;
      }
      if (e.isSymbolicLink()) {
        const target = readlinkSync(abs);
        if (path.isAbsolute(target)) throw new CliError(`refusing to pack symlink ${rel} -> ${target}: absolute link targets do not survive the upload; use a relative link inside the directory`);
        const lexical = path.resolve(absDir, target);
        let real: string | undefined;
        try {
          real = realpathSync(abs);
        } catch {
          real = undefined; // dangling: the lexical check below still applies
        }
        if (!inside(root, lexical) || (real !== undefined && !inside(root, real))) {
          throw new CliError(`refusing to pack symlink ${rel} -> ${target}: it points outside the application directory`);
        }
        files.push(rel);
      } else if (e.isDirectory()) {
        walk(abs, rel, levels);
      } else if (e.isFile()) {
        files.push(rel);
        bytes += lstatSync(abs).size;
      } else {
        excluded.push({ path: rel, reason: 'special' }); // sockets, FIFOs, devices: not application source
      }
    }
  };
  walk(root, '', []);
  return { root, files, excluded, bytes };
}
