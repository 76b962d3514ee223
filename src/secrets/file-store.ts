import { readFileSync } from '../builtins/fs.js';
import path from 'node:path';
import { Envelope, EnvelopeError, removeLeftoverTemps, writeFileAtomic } from './envelope.js';
import { withFileLock, type LockOptions } from './lock.js';
import {
  DEFAULT_WORKSPACE,
  SecretStoreError,
  assertSecretKey,
  assertSecretValue,
  assertWorkspaceId,
  type SecretStore,
} from './types.js';

/**
 * The embedded default store: `<data>/secrets.json`,
 * `{"version":1,"workspaces":{"<workspace>":{"KEY":"kg1...."}}}`.
 *
 * Each value is sealed with the envelope and the key name as associated data, so a sealed value
 * copied under another name fails authentication instead of silently answering for it. Writers
 * (the CLI, a running server) do read-modify-write under a lock file and replace the file
 * atomically; readers need no lock because they only ever see a whole old or a whole new file.
 */
export const SECRETS_FILE = 'secrets.json';

export interface SecretsDoc {
  version: 1;
  workspaces: Record<string, Record<string, string>>;
}

export function secretsFilePath(dataDir: string): string {
  return path.join(dataDir, SECRETS_FILE);
}

export function lockFileFor(file: string): string {
  return `${file}.lock`;
}

/** Reads and checks the document's shape; a missing file is an empty store. Never echoes content. */
export function readSecretsDoc(file: string): SecretsDoc {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { version: 1, workspaces: {} };
    throw new SecretStoreError(`cannot read the secrets file ${file}: ${(err as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new SecretStoreError(`the secrets file ${file} is not valid JSON (damaged or edited by hand)`);
  }
  const bad = (why: string) => new SecretStoreError(`the secrets file ${file} is not a keygate secrets file: ${why}`);
  if (!doc || typeof doc !== 'object' || Array.isArray(doc)) throw bad('not a JSON object');
  const d = doc as Record<string, unknown>;
  if (d.version !== 1) throw bad(`unsupported version ${JSON.stringify(d.version)}`);
  const ws = d.workspaces;
  if (!ws || typeof ws !== 'object' || Array.isArray(ws)) throw bad('"workspaces" is not an object');
  for (const [id, entries] of Object.entries(ws as Record<string, unknown>)) {
    if (!entries || typeof entries !== 'object' || Array.isArray(entries)) throw bad(`workspace ${JSON.stringify(id)} is not an object`);
    for (const [key, value] of Object.entries(entries as Record<string, unknown>)) {
      if (typeof value !== 'string') throw bad(`workspace ${JSON.stringify(id)}, secret ${JSON.stringify(key)}: not a string`);
    }
  }
  return { version: 1, workspaces: ws as SecretsDoc['workspaces'] };
}

/** Writes the document atomically; the caller holds the file's lock (every writer takes it). */
export function writeSecretsDoc(file: string, doc: SecretsDoc): void {
  // Sorted keys keep diffs and backups stable.
  const sorted: SecretsDoc = { version: 1, workspaces: {} };
  for (const id of Object.keys(doc.workspaces).sort()) {
    const entries = doc.workspaces[id];
    if (Object.keys(entries).length === 0) continue;
    sorted.workspaces[id] = Object.fromEntries(Object.keys(entries).sort().map((k) => [k, entries[k]]));
  }
  writeFileAtomic(file, JSON.stringify(sorted, null, 2) + '\n', 0o600);
  // A writer killed mid-write left its temp file: values since deleted, or sealed under a key
  // since retired. Under the lock every temp file is such a leftover.
  removeLeftoverTemps(file, true);
}

export interface EncryptedFileStoreOptions {
  file: string;
  workspaceId?: string;
  /** The envelope, or a function returning the current one (re-read per operation so a key rotated by another process is picked up). */
  keys: Envelope | (() => Envelope);
  lock?: LockOptions;
}

export class EncryptedFileSecretStore implements SecretStore {
  readonly writable = true;
  readonly file: string;
  readonly workspaceId: string;
  private readonly keys: () => Envelope;
  private readonly lockOpts: LockOptions;

  constructor(opts: EncryptedFileStoreOptions) {
    this.file = opts.file;
    this.workspaceId = opts.workspaceId ?? DEFAULT_WORKSPACE;
    assertWorkspaceId(this.workspaceId);
    const k = opts.keys;
    this.keys = typeof k === 'function' ? k : () => k;
    this.lockOpts = opts.lock ?? {};
  }

  get description(): string {
    return `encrypted file ${this.file} (workspace ${this.workspaceId})`;
  }

  private entries(doc: SecretsDoc): Record<string, string> {
    return Object.prototype.hasOwnProperty.call(doc.workspaces, this.workspaceId) ? doc.workspaces[this.workspaceId] : {};
  }

  private open(envelope: Envelope, key: string, sealed: string): string {
    try {
      return envelope.open(sealed, key);
    } catch (err) {
      if (err instanceof EnvelopeError) throw new SecretStoreError(`secret ${key} in ${this.file}: ${err.message}`);
      throw err;
    }
  }

  /** Refuses to add values under a key that cannot open what the file already holds (a wrong KEYGATE_MASTER_KEY). */
  private assertSameKey(doc: SecretsDoc, envelope: Envelope): void {
    for (const entries of Object.values(doc.workspaces)) {
      for (const sealed of Object.values(entries)) {
        const keyId = sealed.split('.')[1] ?? '';
        if (!envelope.hasKey(keyId)) {
          throw new SecretStoreError(`${this.file} holds values encrypted with another master key (key id ${keyId}); this key is ${envelope.keyId}. Nothing was written`);
        }
      }
    }
  }

  async get(key: string): Promise<string | undefined> {
    assertSecretKey(key);
    const entries = this.entries(readSecretsDoc(this.file));
    if (!Object.prototype.hasOwnProperty.call(entries, key)) return undefined;
    return this.open(this.keys(), key, entries[key]);
  }

  async list(): Promise<string[]> {
    return Object.keys(this.entries(readSecretsDoc(this.file))).sort();
  }

  async snapshot(): Promise<Map<string, string>> {
    const entries = this.entries(readSecretsDoc(this.file));
    const envelope = this.keys();
    const out = new Map<string, string>();
    for (const key of Object.keys(entries).sort()) out.set(key, this.open(envelope, key, entries[key]));
    return out;
  }

  async set(key: string, value: string): Promise<void> {
    assertSecretKey(key);
    assertSecretValue(key, value);
    await withFileLock(lockFileFor(this.file), () => {
      const doc = readSecretsDoc(this.file);
      // Keys are loaded under the lock: a rotation holds the same lock, so this seals with the
      // key that is current once it has finished, never with the one it just retired.
      const envelope = this.keys();
      this.assertSameKey(doc, envelope);
      const sealed = envelope.seal(value, key);
      doc.workspaces[this.workspaceId] = { ...this.entries(doc), [key]: sealed };
      writeSecretsDoc(this.file, doc);
    }, this.lockOpts);
  }

  async delete(key: string): Promise<boolean> {
    assertSecretKey(key);
    return withFileLock(lockFileFor(this.file), () => {
      const doc = readSecretsDoc(this.file);
      const entries = { ...this.entries(doc) };
      if (!Object.prototype.hasOwnProperty.call(entries, key)) return false;
      delete entries[key];
      doc.workspaces[this.workspaceId] = entries;
      writeSecretsDoc(this.file, doc);
      return true;
    }, this.lockOpts);
  }
}
