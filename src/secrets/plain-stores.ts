import { existsSync, readFileSync, readdirSync, realpathSync, statSync } from '../builtins/fs.js';
import path from 'node:path';
import { isSecretKey } from './keys.js';
import { ReadOnlyStoreError, SecretStoreError, assertSecretKey, type SecretStore } from './types.js';

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
    let text: string;
    try {
      text = readFileSync(this.file, 'utf8');
    } catch (err) {
      throw new SecretStoreError(`cannot read the secrets file ${this.file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
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
    let base = this.dir;
    try {
      // Read every key from the one timestamped directory `..data` points at right now, so a
      // snapshot never mixes values from before and after an update of the volume.
      if (existsSync(path.join(this.dir, '..data'))) base = realpathSync(path.join(this.dir, '..data'));
      names = readdirSync(base);
    } catch (err) {
      throw new SecretStoreError(`cannot read the secrets directory ${this.dir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const out = new Map<string, string>();
    for (const name of names.sort()) {
      if (name.startsWith('.') || !isSecretKey(name)) continue;
      const file = path.join(base, name);
      try {
        if (!statSync(file).isFile()) continue;
        out.set(name, trimOneNewline(readFileSync(file, 'utf8')));
      } catch (err) {
        // A dangling link during an update of the volume: the next reload sees the new state.
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
        throw new SecretStoreError(`cannot read secret ${name} in ${this.dir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
      }
    }
    return out;
  }
}
