/**
 * Storage of the Auth Service (migrate namespace 'oauth'). Append-only: never edit a step that has
 * shipped, add a new one. Secrets (client secrets, PKCE verifiers, access and refresh tokens) are
 * envelope-sealed strings without aad, so generic key rotation can re-seal them.
 */
export const OAUTH_MIGRATIONS = [
  `CREATE TABLE oauth_providers (
     workspace_id TEXT NOT NULL REFERENCES workspaces(id),
     provider_id TEXT NOT NULL,
     name TEXT NOT NULL,
     client_id TEXT NOT NULL,
     client_secret_sealed TEXT,
     auth_url TEXT NOT NULL,
     token_url TEXT NOT NULL,
     revocation_url TEXT,
     uses_pkce INTEGER NOT NULL,
     token_endpoint_auth_method TEXT NOT NULL,
     scopes TEXT NOT NULL,
     source TEXT NOT NULL,
     created_at TEXT NOT NULL,
     updated_at TEXT NOT NULL,
     PRIMARY KEY (workspace_id, provider_id));
   CREATE TABLE oauth_auth_flows (
     auth_id TEXT PRIMARY KEY,
     state_hash TEXT NOT NULL UNIQUE,
     verifier_sealed TEXT,
     workspace_id TEXT NOT NULL,
     user_id TEXT NOT NULL,
     provider_id TEXT NOT NULL,
     scopes TEXT NOT NULL,
     redirect_uri TEXT NOT NULL,
     status TEXT NOT NULL,
     token_id TEXT,
     created_at TEXT NOT NULL,
     expires_at TEXT NOT NULL,
     updated_at TEXT NOT NULL);
   CREATE TABLE oauth_tokens (
     id TEXT PRIMARY KEY,
     workspace_id TEXT NOT NULL,
     user_id TEXT NOT NULL,
     provider_id TEXT NOT NULL,
     access_token_sealed TEXT NOT NULL,
     refresh_token_sealed TEXT,
     token_type TEXT,
     scopes TEXT NOT NULL,
     expires_at TEXT,
     provider_account_label TEXT,
     is_default INTEGER NOT NULL,
     deleting_at TEXT,
     created_at TEXT NOT NULL,
     updated_at TEXT NOT NULL,
     FOREIGN KEY (workspace_id, provider_id) REFERENCES oauth_providers(workspace_id, provider_id));
   CREATE INDEX oauth_tokens_owner ON oauth_tokens (workspace_id, user_id, provider_id);
   CREATE INDEX oauth_auth_flows_expiry ON oauth_auth_flows (expires_at)`,
  // A sign-in and the token it yields are bound to the provider's endpoints when the sign-in
  // started: a later change of the provider (any member of the workspace may make one) reaches
  // neither a code already on its way nor a token already stored (endpoints.ts). Rows from before
  // this step have endpoints_bound 0 and use the provider's endpoints as they are.
  `ALTER TABLE oauth_auth_flows ADD COLUMN token_url TEXT;
   ALTER TABLE oauth_auth_flows ADD COLUMN revocation_url TEXT;
   ALTER TABLE oauth_auth_flows ADD COLUMN endpoints_bound INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE oauth_tokens ADD COLUMN revocation_url TEXT;
   ALTER TABLE oauth_tokens ADD COLUMN endpoints_bound INTEGER NOT NULL DEFAULT 0`,
  // At most one default token per user and provider. Concurrent sign-ins (or default changes) on
  // PostgreSQL could each set theirs (fixed by lockProvider in tokens.ts): keep the oldest default
  // of each group, then let the database refuse a second one.
  `UPDATE oauth_tokens SET is_default = 0
     WHERE is_default = 1 AND EXISTS (SELECT 1 FROM oauth_tokens o
       WHERE o.workspace_id = oauth_tokens.workspace_id AND o.user_id = oauth_tokens.user_id AND o.provider_id = oauth_tokens.provider_id
         AND o.is_default = 1 AND (o.created_at < oauth_tokens.created_at OR (o.created_at = oauth_tokens.created_at AND o.id < oauth_tokens.id)));
   CREATE UNIQUE INDEX oauth_tokens_one_default ON oauth_tokens (workspace_id, user_id, provider_id) WHERE is_default = 1`,
];
