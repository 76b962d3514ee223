import path from 'node:path';
import type { Db } from '../store/db.js';
import { DbSecretStore, migrateSecrets } from './db-store.js';
import { EncryptedFileSecretStore, secretsFilePath } from './file-store.js';
import { loadKeyring } from './keyring.js';
import { DirectorySecretStore, JsonFileSecretStore } from './plain-stores.js';
import { SecretStoreError, type SecretStore } from './types.js';

export * from './types.js';
export { EncryptedFileSecretStore } from './file-store.js';
export { DbSecretStore, migrateSecrets } from './db-store.js';
export { DirectorySecretStore, JsonFileSecretStore } from './plain-stores.js';

export interface OpenSecretStoreOptions {
  /** The data directory (master key, `secrets.json`). */
  dataDir: string;
  /** `--secrets FILE`: plain JSON, read-only. */
  secretsFile?: string;
  /** `--secrets-dir DIR`: one file per key (Kubernetes secret volume), read-only. */
  secretsDir?: string;
  workspaceId?: string;
  /** The server database: secrets live in its `workspace_secrets` table. */
  db?: Db;
  /** Defaults to `process.env` (`KEYGATE_SECRETS_FILE`, `KEYGATE_SECRETS_DIR`, `KEYGATE_MASTER_KEY`). */
  env?: NodeJS.ProcessEnv;
}

/**
 * Picks the backend: an explicit flag first (`secretsFile`, `secretsDir`), then the environment
 * (`KEYGATE_SECRETS_FILE`, `KEYGATE_SECRETS_DIR`), then the database when one is given, else the
 * encrypted file in the data directory. Two sources at the same level are an error rather than a
 * silent choice.
 */
export async function openSecretStore(opts: OpenSecretStoreOptions): Promise<SecretStore> {
  const env = opts.env ?? process.env;
  if (opts.secretsFile && opts.secretsDir) throw new SecretStoreError('give either a secrets file or a secrets directory, not both');
  if (opts.secretsFile) return new JsonFileSecretStore(path.resolve(opts.secretsFile));
  if (opts.secretsDir) return new DirectorySecretStore(path.resolve(opts.secretsDir));
  if (env.KEYGATE_SECRETS_FILE && env.KEYGATE_SECRETS_DIR) throw new SecretStoreError('set either KEYGATE_SECRETS_FILE or KEYGATE_SECRETS_DIR, not both');
  if (env.KEYGATE_SECRETS_FILE) return new JsonFileSecretStore(path.resolve(env.KEYGATE_SECRETS_FILE));
  if (env.KEYGATE_SECRETS_DIR) return new DirectorySecretStore(path.resolve(env.KEYGATE_SECRETS_DIR));
  // Key material is re-read per operation so a rotation by another process takes effect here too.
  const keys = () => loadKeyring(opts.dataDir, env).envelope;
  keys(); // fail now (bad KEYGATE_MASTER_KEY), not on first use
  if (opts.db) {
    await migrateSecrets(opts.db);
    return new DbSecretStore({ db: opts.db, workspaceId: opts.workspaceId, keys });
  }
  return new EncryptedFileSecretStore({ file: secretsFilePath(opts.dataDir), workspaceId: opts.workspaceId, keys });
}
