import { closeSync, constants, existsSync, fstatSync, openSync, readSync, readdirSync, realpathSync } from '../builtins/fs.js';
import path from 'node:path';
import { isSecretKey } from './keys.js';
import { MAX_SECRET_BYTES, ReadOnlyStoreError, SecretStoreError, assertSecretKey, type SecretStore } from './types.js';

/** Largest plain JSON secrets file read (bytes): a thousand secrets of a few KiB, far from a memory problem. */
export const MAX_PLAIN_FILE_BYTES = 16 * 1024 * 1024;

/**
 * Reads at most `limit` bytes of a regular file: 'not-a-file' for anything else (a directory, a
 * FIFO, a device: opened non-blocking, so a FIFO without a writer cannot hang the reader),
 * 'too-large' when it holds more, so a huge or endless file is never read into memory whole.
 */
function readBounded(file: string, limit: number): Buffer | 'not-a-file' | 'too-large' {
  const fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    if (!fstatSync(fd).isFile()) return 'not-a-file';
    const buf = Buffer.alloc(limit + 1);
    let n = 0;
    for (;;) {
      const got = readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) break;
      n += got;
      if (n > limit) return 'too-large';
    }
    return buf.subarray(0, n);
  } finally {
    closeSync(fd);
  }
}

/** Whether `p` (a real path) is `root` or inside it. */
function within(root: string, p: string): boolean {
  const rel = path.relative(root, p);
  // Not `startsWith('..')`: Kubernetes' own `..2024_01_01...` directories are inside.
  return rel === '' || (rel.split(path.sep)[0] !== '..' && !path.isAbsolute(rel));
}

const codeOf = (err: unknown) => (err as NodeJS.ErrnoException).code ?? (err as Error).message;

/**
 * Read-only stores whose values are plain text managed outside keygate: a JSON file
 * (`--secrets FILE`) and a directory with one file per key (a Kubernetes secret volume). Both are
 * re-read on every call, so a reload picks up what changed on disk.
 */

abstract class ReadOnlyStore implements SecretStore {
  readonly writable = false;
  abstract readonly description: string;
  abstract snapshot(): Promise<Map<string, string>>;

  async get(key: string): Promise<string | undefined> {
    assertSecretKey(key);
    return (await this.snapshot()).get(key);
  }

  async list(): Promise<string[]> {
    return [...(await this.snapshot()).keys()].sort();
  }

  async set(_key: string, _value: string): Promise<void> {
    throw new ReadOnlyStoreError(this.description);
  }

  async delete(_key: string): Promise<boolean> {
    throw new ReadOnlyStoreError(this.description);
  }
}

/** `{ "KEY": "value", ... }`. Anything else is an error naming the file and the offending key. */
export class JsonFileSecretStore extends ReadOnlyStore {
  constructor(readonly file: string) {
    super();
  }

  get description(): string {
    return `JSON file ${this.file}`;
  }

  async snapshot(): Promise<Map<string, string>> {
    let read: ReturnType<typeof readBounded>;
    try {
      read = readBounded(this.file, MAX_PLAIN_FILE_BYTES);
    } catch (err) {
      throw new SecretStoreError(`cannot read the secrets file ${this.file}: ${codeOf(err)}`);
    }
    if (read === 'not-a-file') throw new SecretStoreError(`cannot read the secrets file ${this.file}: not a regular file`);
    if (read === 'too-large') throw new SecretStoreError(`the secrets file ${this.file} is larger than ${MAX_PLAIN_FILE_BYTES} bytes`);
    const text = read.toString('utf8');
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      // JSON.parse's message can quote the text around the error, which may be a value.
      throw new SecretStoreError(`the secrets file ${this.file} is not valid JSON`);
    }
    if (!doc || typeof doc !== 'object' || Array.isArray(doc)) {
      throw new SecretStoreError(`the secrets file ${this.file} must be a JSON object of "KEY": "value" pairs`);
    }
    const out = new Map<string, string>();
    for (const [key, value] of Object.entries(doc as Record<string, unknown>)) {
      if (!isSecretKey(key)) throw new SecretStoreError(`the secrets file ${this.file}: invalid secret name ${JSON.stringify(key.slice(0, 140))}`);
      if (typeof value !== 'string') throw new SecretStoreError(`the secrets file ${this.file}: the value of ${key} must be a string`);
      if (Buffer.byteLength(value, 'utf8') > MAX_SECRET_BYTES) throw new SecretStoreError(`the secrets file ${this.file}: the value of ${key} is larger than ${MAX_SECRET_BYTES} bytes`);
      out.set(key, value);
    }
    return new Map([...out.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  }
}

/** Removes exactly one trailing newline (`\n` or `\r\n`), as `echo` or an editor leaves it. */
export function trimOneNewline(value: string): string {
  if (value.endsWith('\r\n')) return value.slice(0, -2);
  if (value.endsWith('\n')) return value.slice(0, -1);
  return value;
}

/**
 * One file per key. Kubernetes mounts a secret as `KEY -> ..data/KEY` symlinks, where `..data`
 * is itself a symlink to a timestamped directory swapped atomically on update: entries starting
 * with a dot are its machinery and are skipped, the key entries are followed. Names that are not
 * valid secret names (e.g. `tls.crt`) cannot be referenced by a `{KEY}` template and are skipped.
 *
 * Fails closed, never answering with part of the directory: a key entry that leads out of the
 * directory (a symlink to elsewhere, or `..data` pointing out), that is not a regular file (a
 * directory, a FIFO, a device), that cannot be read, or that is larger than a secret may be
 * ({@link MAX_SECRET_BYTES}, plus one trailing newline) is an error naming the entry.
 */
export class DirectorySecretStore extends ReadOnlyStore {
  constructor(readonly dir: string) {
    super();
  }

  get description(): string {
    return `directory ${this.dir}`;
  }

  async snapshot(): Promise<Map<string, string>> {
    let names: string[];
    let root: string;
    let base: string;
    try {
      root = realpathSync(this.dir);
      base = root;
      // Read every key from the one timestamped directory `..data` points at right now, so a
      // snapshot never mixes values from before and after an update of the volume.
      if (existsSync(path.join(root, '..data'))) base = realpathSync(path.join(root, '..data'));
      names = readdirSync(base);
    } catch (err) {
      throw new SecretStoreError(`cannot read the secrets directory ${this.dir}: ${codeOf(err)}`);
    }
    if (!within(root, base)) throw new SecretStoreError(`the secrets directory ${this.dir}: ..data points outside the directory`);
    const out = new Map<string, string>();
    for (const name of names.sort()) {
      if (name.startsWith('.') || !isSecretKey(name)) continue;
      const bad = (why: string) => new SecretStoreError(`secret ${name} in ${this.dir}: ${why}`);
      let read: ReturnType<typeof readBounded>;
      try {
        const real = realpathSync(path.join(base, name));
        if (!within(root, real)) throw bad('a symbolic link to a file outside the directory');
        read = readBounded(real, MAX_SECRET_BYTES + 2);
      } catch (err) {
        if (err instanceof SecretStoreError) throw err;
        // A dangling link during an update of the volume: the next reload sees the new state.
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
        throw bad(`cannot read it: ${codeOf(err)}`);
      }
      if (read === 'not-a-file') throw bad('not a regular file (a directory, a FIFO or a device)');
      const value = read === 'too-large' ? undefined : trimOneNewline(read.toString('utf8'));
      if (value === undefined || Buffer.byteLength(value, 'utf8') > MAX_SECRET_BYTES) throw bad(`larger than ${MAX_SECRET_BYTES} bytes`);
      out.set(name, value);
    }
    return out;
  }
}
