import { createHash } from 'node:crypto';

/**
 * Namespace for assistant ids (itself uuid v5 of "keygate.assistant" in the RFC 4122 URL
 * namespace). Fixed forever: changing it would change every assistant id clients have stored.
 */
export const ASSISTANT_NAMESPACE = 'a0c7dfbe-c7aa-5abe-a94b-5ecbe78e7958';

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function isUuid(value: string): boolean {
  return UUID_RE.test(value);
}

/** RFC 4122 version 5 (SHA-1, name-based) UUID. */
export function uuidV5(name: string, namespace: string): string {
  if (!isUuid(namespace)) throw new Error('namespace must be a UUID');
  const ns = Buffer.from(namespace.replace(/-/g, ''), 'hex');
  const hash = createHash('sha1').update(ns).update(name, 'utf8').digest();
  const b = hash.subarray(0, 16);
  b[6] = (b[6] & 0x0f) | 0x50;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = b.toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * The stable id of an assistant: the same app name and assistant name give the same id on every
 * machine and every restart, so clients may store it.
 */
export function assistantId(appName: string, assistantName: string): string {
  // The separator cannot occur in either name (both are restricted by the keygate.json schema).
  return uuidV5(`${appName}/${assistantName}`, ASSISTANT_NAMESPACE);
}
