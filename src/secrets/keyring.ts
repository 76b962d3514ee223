import { existsSync, readFileSync } from '../builtins/fs.js';
import path from 'node:path';
import { Envelope, EnvelopeError, MASTER_KEY_FILE, keyIdOf, loadMasterKey, parseMasterKey, type MasterKey } from './envelope.js';
import { readSecretsDoc, secretsFilePath } from './file-store.js';

/**
 * Key files around a rotation (see rotate.ts):
 * - `master.key.prev`: the key being replaced, kept until every value is re-sealed;
 * - `master.key.next`: the new key, written before anything is sealed with it, renamed over
 *   `master.key` once everything has been re-sealed.
 * Every process opens with all of them, so values stay readable at any point of an interrupted
 * rotation; only `master.key` (or `KEYGATE_MASTER_KEY`) ever seals.
 */
export const PREV_KEY_FILE = `${MASTER_KEY_FILE}.prev`;
export const NEXT_KEY_FILE = `${MASTER_KEY_FILE}.next`;

export interface Keyring {
  envelope: Envelope;
  master: MasterKey;
  /** Open-only keys (previous / next / KEYGATE_NEW_MASTER_KEY), for diagnostics by key id. */
  extraKeyIds: string[];
}

function readKeyFile(file: string): Buffer | undefined {
  if (!existsSync(file)) return undefined;
  return parseMasterKey(readFileSync(file, 'utf8'), file);
}

/**
 * A new master key is only ever created for a data directory that holds nothing sealed with an
 * old one: a `master.key` deleted, lost in a restore, or not mounted next to a secrets file that
 * has values would otherwise be replaced silently, and every value sealed before would be
 * unreadable while new ones were sealed with the new key. Refuses then, naming the key ids.
 */
function assertNoKeyIsLost(dataDir: string): void {
  const masterFile = path.join(dataDir, MASTER_KEY_FILE);
  if (existsSync(masterFile)) return;
  const left = [PREV_KEY_FILE, NEXT_KEY_FILE].filter((f) => existsSync(path.join(dataDir, f)));
  if (left.length) {
    throw new EnvelopeError(`${masterFile} is missing but a key rotation left ${left.join(' and ')} in ${dataDir}; restore master.key (or set KEYGATE_MASTER_KEY) before keygate uses this data directory`);
  }
  const file = secretsFilePath(dataDir);
  const keyIds = new Set<string>();
  for (const entries of Object.values(readSecretsDoc(file).workspaces)) for (const sealed of Object.values(entries)) keyIds.add(sealed.split('.')[1] ?? '?');
  if (keyIds.size) {
    throw new EnvelopeError(
      `${masterFile} is missing but ${file} holds values sealed with master key ${[...keyIds].sort().join(', ')}; restore that key to ${masterFile} (or set KEYGATE_MASTER_KEY). A new key is only created for a data directory without secrets`,
    );
  }
}

/**
 * The envelope every keygate process uses: seals with the master key (`KEYGATE_MASTER_KEY`, else
 * `<data>/master.key`, created 0600 on first use), opens with it plus any key of a rotation in
 * progress, so a crash half-way through `keygate secrets rotate-key` never makes a value unreadable.
 */
export function loadKeyring(dataDir: string, env: NodeJS.ProcessEnv = process.env): Keyring {
  if (!env.KEYGATE_MASTER_KEY) assertNoKeyIsLost(dataDir);
  const master = loadMasterKey(dataDir, env);
  const extra: Buffer[] = [];
  if (env.KEYGATE_NEW_MASTER_KEY) extra.push(parseMasterKey(env.KEYGATE_NEW_MASTER_KEY, 'KEYGATE_NEW_MASTER_KEY'));
  for (const name of [PREV_KEY_FILE, NEXT_KEY_FILE]) {
    const key = readKeyFile(path.join(dataDir, name));
    if (key) extra.push(key);
  }
  const older = extra.filter((k) => !k.equals(master.key));
  return { envelope: new Envelope(master.key, older), master, extraKeyIds: older.map(keyIdOf) };
}

/** Re-exported so callers get every envelope failure type from one place. */
export { EnvelopeError };
