import { isSecretKey } from './keys.js';

// The SecretStore contract and its errors (re-exported by store.ts, which also holds the factory).

/**
 * Where workspace secrets live. Every backend answers the same questions; none ever puts a value
 * into an error message, a log line or its `description`.
 */
export interface SecretStore {
  /** Where the secrets come from (a path, a table): for logs and messages, never a value. */
  readonly description: string;
  readonly writable: boolean;
  get(key: string): Promise<string | undefined>;
  /** Secret names, sorted. */
  list(): Promise<string[]>;
  /** Every value at once: one consistent read for resolving a configuration. */
  snapshot(): Promise<Map<string, string>>;
  set(key: string, value: string): Promise<void>;
  /** True when the secret existed. */
  delete(key: string): Promise<boolean>;
}

/** A store failure that is safe to show as is (it names files and keys, never values). */
export class SecretStoreError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SecretStoreError';
  }
}

export class ReadOnlyStoreError extends SecretStoreError {
  constructor(description: string) {
    super(`the secret store ${description} is read-only; change it where it comes from`);
    this.name = 'ReadOnlyStoreError';
  }
}

/** Largest value a store accepts (bytes of UTF-8): header values, tokens, small certificates. */
export const MAX_SECRET_BYTES = 64 * 1024;

export function assertSecretKey(key: string): void {
  if (typeof key !== 'string' || !isSecretKey(key)) {
    throw new SecretStoreError(`invalid secret name ${JSON.stringify(String(key).slice(0, 140))}: use letters, digits and _ (not starting with a digit), at most 128 characters`);
  }
}

/**
 * Control characters a header value cannot carry (RFC 9110 5.5: a field value is VCHAR, SP, HTAB
 * and obs-text): every C0 control but HTAB, and DEL. A secret's use is a header the proxy injects,
 * so such a value could only be refused later, or worse, split a request.
 */
const FIELD_CONTROL_CHAR = /[\x00-\x08\x0a-\x1f\x7f]/;

export function assertSecretValue(key: string, value: string): void {
  if (typeof value !== 'string') throw new SecretStoreError(`secret ${key}: the value must be a string`);
  if (value.length === 0) throw new SecretStoreError(`secret ${key}: the value is empty`);
  if (FIELD_CONTROL_CHAR.test(value)) {
    throw new SecretStoreError(`secret ${key}: the value contains a control character (such as NUL, CR, LF, ESC or DEL); a header value can only carry visible characters, spaces and tabs`);
  }
  if (Buffer.byteLength(value, 'utf8') > MAX_SECRET_BYTES) throw new SecretStoreError(`secret ${key}: the value is larger than ${MAX_SECRET_BYTES} bytes`);
}

export const DEFAULT_WORKSPACE = 'default';

/** Workspace ids name a JSON key and a database value; keep them boring. */
export const WORKSPACE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;

export function assertWorkspaceId(id: string): void {
  if (!WORKSPACE_ID_RE.test(id)) throw new SecretStoreError(`invalid workspace id ${JSON.stringify(id.slice(0, 140))}`);
}
