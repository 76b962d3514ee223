import { openSecretStore, type SecretStore } from '../secrets/store.js';
import type { Db } from '../store/db.js';

export interface WorkspaceSecretsOptions {
  dataDir: string;
  db: Db;
  env: NodeJS.ProcessEnv;
}

/**
 * Where `keygate serve` keeps a workspace's secrets. With PostgreSQL (DATABASE_URL) the secrets
 * belong with everything else in the database (`workspace_secrets`), so several server replicas
 * share them. On the embedded default they live in the encrypted `<data>/secrets.json`, the same
 * file `keygate secrets set KEY --data DIR` writes, so the CLI and the API see the same secrets.
 */
export function openWorkspaceSecrets(opts: WorkspaceSecretsOptions, workspaceId: string): Promise<SecretStore> {
  // The server's store is always the encrypted one: the read-only file/directory sources that
  // `keygate proxy` accepts (KEYGATE_SECRETS_FILE/DIR) would make the API's writes impossible.
  const env = { ...opts.env, KEYGATE_SECRETS_FILE: '', KEYGATE_SECRETS_DIR: '' };
  if (opts.db.kind === 'postgres') return openSecretStore({ dataDir: opts.dataDir, db: opts.db, workspaceId, env });
  return openSecretStore({ dataDir: opts.dataDir, workspaceId, env });
}
