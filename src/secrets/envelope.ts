import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import { chmodSync, closeSync, existsSync, fsyncSync, linkSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, unlinkSync, writeSync } from '../builtins/fs.js';
import path from 'node:path';
import { pidAlive } from '../proc.js';

/**
 * The one encryption envelope keygate uses for everything it stores encrypted: secret values,
 * opaque header values, OAuth tokens, deployment secrets.
 *
 * Format: `kg1.<keyId>.<nonce>.<ciphertext||tag>` (base64url parts). AES-256-GCM with a random
 * 96-bit nonce per value. `keyId` (first 8 hex chars of SHA-256 of the key) names the key that
 * sealed it, so a keyring can open values written before a rotation and a wrong key is reported as
 * such instead of as corruption. The sealed form uses only `[A-Za-z0-9_.-]`, so it can sit inside
 * JSON documents and be found there by `SEALED_PATTERN` (key rotation relies on this).
 */
export const SEALED_PREFIX = 'kg1.';
export const SEALED_PATTERN = /kg1\.[0-9a-f]{8}\.[A-Za-z0-9_-]{16}\.[A-Za-z0-9_-]+/g;

export class EnvelopeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'EnvelopeError';
  }
}

export function keyIdOf(key: Buffer): string {
  return createHash('sha256').update(key).digest('hex').slice(0, 8);
}

export class Envelope {
  readonly keyId: string;
  private readonly keys: Map<string, Buffer>;

  /** `primary` seals; `older` keys (from before a rotation) can still open. */
  constructor(
    private readonly primary: Buffer,
    older: Buffer[] = [],
  ) {
    if (primary.length !== 32) throw new EnvelopeError('master key must be 32 bytes');
    this.keyId = keyIdOf(primary);
    this.keys = new Map([...older, primary].map((k) => [keyIdOf(k), k]));
  }

  /** Whether this keyring holds the key a value sealed under `keyId` needs. */
  hasKey(keyId: string): boolean {
    return this.keys.has(keyId);
  }

  static isSealed(value: unknown): value is string {
    return typeof value === 'string' && value.startsWith(SEALED_PREFIX);
  }

  /** `aad` binds the value to a context (e.g. a key name); the same `aad` must be given to open. */
  seal(plaintext: string, aad = ''): string {
    const nonce = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.primary, nonce);
    if (aad) cipher.setAAD(Buffer.from(aad, 'utf8'));
    const ct = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final(), cipher.getAuthTag()]);
    return `${SEALED_PREFIX}${this.keyId}.${nonce.toString('base64url')}.${ct.toString('base64url')}`;
  }

  open(sealed: string, aad = ''): string {
    const parts = sealed.split('.');
    if (parts.length !== 4 || parts[0] !== 'kg1') throw new EnvelopeError('not an encrypted value (unknown format)');
    const [, keyId, nonceB64, ctB64] = parts;
    const key = this.keys.get(keyId);
    if (!key) throw new EnvelopeError(`value was encrypted with another master key (key id ${keyId}); this key is ${this.keyId}`);
    const nonce = Buffer.from(nonceB64, 'base64url');
    const body = Buffer.from(ctB64, 'base64url');
    if (nonce.length !== 12 || body.length < 16) throw new EnvelopeError('encrypted value is truncated or corrupted');
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, nonce);
      if (aad) decipher.setAAD(Buffer.from(aad, 'utf8'));
      decipher.setAuthTag(body.subarray(body.length - 16));
      return Buffer.concat([decipher.update(body.subarray(0, body.length - 16)), decipher.final()]).toString('utf8');
    } catch {
      throw new EnvelopeError('encrypted value failed authentication (tampered, or sealed for another context)');
    }
  }
}

export interface MasterKey {
  key: Buffer;
  source: 'env' | 'file';
  /** The key file path when `source` is `file`. */
  file?: string;
}

export const MASTER_KEY_FILE = 'master.key';

/** Parses `KEYGATE_MASTER_KEY`-style base64 into a 32-byte key, with a clear error otherwise. */
export function parseMasterKey(b64: string, what = 'KEYGATE_MASTER_KEY'): Buffer {
  const key = Buffer.from(b64.trim(), 'base64');
  if (key.length !== 32) throw new EnvelopeError(`${what} must be 32 bytes encoded as base64 (got ${key.length} bytes)`);
  return key;
}

function writeTemp(file: string, data: string | Buffer, mode: number): string {
  mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const fd = openSync(tmp, 'wx', mode);
  try {
    writeSync(fd, typeof data === 'string' ? Buffer.from(data, 'utf8') : data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  chmodSync(tmp, mode);
  return tmp;
}

/**
 * Removes the temp files a writer of `file` killed mid-write left beside it (`file.<pid>.<hex>.tmp`).
 * They hold what was being written: a master key (a retired one, after a rotation), or a secrets
 * document with values sealed under a retired key or since deleted, none of which may outlive
 * the operation that replaced them. `everyWriterLocked`: the caller holds the lock every writer
 * of `file` takes, so any temp file is a leftover; otherwise only those of dead processes go.
 */
export function removeLeftoverTemps(file: string, everyWriterLocked: boolean): void {
  const dir = path.dirname(file);
  const base = path.basename(file);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return;
  }
  for (const name of names) {
    if (!name.startsWith(`${base}.`) || !name.endsWith('.tmp')) continue;
    const m = /^\.(\d+)\.[0-9a-f]+\.tmp$/.exec(name.slice(base.length));
    if (!m || (!everyWriterLocked && (Number(m[1]) === process.pid || pidAlive(Number(m[1]))))) continue;
    try {
      unlinkSync(path.join(dir, name));
    } catch {
      /* another cleaner got there first */
    }
  }
}

/** Writes a file atomically: temp file in the same directory, fsync, rename. */
export function writeFileAtomic(file: string, data: string | Buffer, mode = 0o600): void {
  renameSync(writeTemp(file, data, mode), file);
}

/**
 * Creates a file with its full content only if it does not exist yet (temp file, fsync, hard
 * link). Returns false when another process created it first, so racing first starts agree on
 * one key instead of each writing its own.
 */
export function createFileExclusive(file: string, data: string | Buffer, mode = 0o600): boolean {
  const tmp = writeTemp(file, data, mode);
  try {
    linkSync(tmp, file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  } finally {
    unlinkSync(tmp);
  }
}

/**
 * The master key: `KEYGATE_MASTER_KEY` (base64, 32 bytes), else `<dataDir>/master.key`, created
 * with mode 0600 on first use.
 */
export function loadMasterKey(dataDir: string, env: NodeJS.ProcessEnv = process.env): MasterKey {
  if (env.KEYGATE_MASTER_KEY) return { key: parseMasterKey(env.KEYGATE_MASTER_KEY), source: 'env' };
  const file = path.join(dataDir, MASTER_KEY_FILE);
  if (!existsSync(file)) createFileExclusive(file, randomBytes(32).toString('base64') + '\n');
  return { key: parseMasterKey(readFileSync(file, 'utf8'), file), source: 'file', file };
}
