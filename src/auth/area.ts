import { ensureWorkspace } from '../server/auth.js';
import type { Area } from '../server/area.js';
import { migrate } from '../store/db.js';
import { FlowWaiters } from './flows.js';
import { bearerAuthenticator, jwtConfigFromEnv } from './jwt.js';
import { OAUTH_MIGRATIONS } from './migrations.js';
import { loadConfiguredProviders } from './provider-config.js';
import { registerFlowRoutes } from './routes-flow.js';
import { registerProviderRoutes } from './routes-providers.js';
import { registerTokenRoutes } from './routes-tokens.js';
import { intSetting } from '../settings.js';

/** Default bound for every call to a provider (code exchange, each revocation request). */
export const DEFAULT_OAUTH_HTTP_TIMEOUT_MS = 10_000;

export function oauthTimeoutMs(env: NodeJS.ProcessEnv): number {
  return intSetting(env, 'KEYGATE_OAUTH_HTTP_TIMEOUT_MS', DEFAULT_OAUTH_HTTP_TIMEOUT_MS, { min: 100, max: 120_000, unit: 'milliseconds' });
}

/**
 * Auth Service (v2): OAuth provider registry, the authorization-code flow with PKCE, the token
 * store and token deletion revoking at the provider first. Also adds the `Authorization: Bearer`
 * (JWT) scheme for the whole server. See src/auth/README.md.
 */
export const authArea: Area = {
  name: 'auth',
  async register(app, ctx, hooks) {
    const httpTimeoutMs = oauthTimeoutMs(ctx.env);
    await migrate(ctx.db, 'oauth', OAUTH_MIGRATIONS);
    hooks.addAuthenticator(bearerAuthenticator(ctx.db, jwtConfigFromEnv(ctx.env)));
    await loadConfiguredProviders(ctx.db, ctx.envelope, ctx.logger, ctx.configDir, ctx.env, async (idOrName) => {
      const byId = await ctx.db.get<{ id: string }>('SELECT id FROM workspaces WHERE id = ?', [idOrName]);
      return byId ? byId.id : (await ensureWorkspace(ctx.db, idOrName)).id;
    });

    const waiters = new FlowWaiters();
    // Long polls would hold shutdown for up to a minute; answer them now instead.
    app.addHook('preClose', async () => waiters.close());

    registerProviderRoutes(app, ctx);
    registerFlowRoutes(app, ctx, { waiters, httpTimeoutMs });
    registerTokenRoutes(app, ctx, { httpTimeoutMs });
  },
};
