import type { FastifyInstance, FastifyReply } from 'fastify';
import { principalOf } from '../server/auth.js';
import type { ServerContext } from '../server/context.js';
import { notFound } from '../server/errors.js';
import { claimFlow, createFlow, finishFlow, getOwnedFlow, type FlowWaiters } from './flows.js';
import { exchangeCode, ProviderCallError, revokeTokens } from './oauth-client.js';
import { authorizeUrl, newState, newVerifier, normaliseScopes, s256Challenge, UUID_PATTERN } from './pkce.js';
import { boundRevocationUrl, flowTokenUrl } from './endpoints.js';
import { clientOf, getProvider } from './providers.js';
import { authenticateBody, authenticateResponse, errorResponse, waitResponse } from './schemas.js';
import { findReusableToken, ProviderGoneError, storeToken } from './tokens.js';

const TAGS = ['Auth Service (v2)'];
export const MAX_WAIT_SECONDS = 60;
const UUID_RE = new RegExp(UUID_PATTERN);

export interface FlowDeps {
  waiters: FlowWaiters;
  httpTimeoutMs: number;
}

/** Where the provider sends the browser back: KEYGATE_PUBLIC_URL, else the address we listen on. */
function callbackUrl(ctx: ServerContext, providerId: string): string {
  const base = (ctx.env.KEYGATE_PUBLIC_URL?.trim() || ctx.publicUrl()).replace(/\/+$/, '');
  return `${base}/v2/auth/callback/${encodeURIComponent(providerId)}`;
}

/**
 * The page the browser lands on. Static text only: nothing from the request is reflected, and the
 * headers keep the URL (which carries the code) out of referrers and caches.
 */
function page(reply: FastifyReply, status: number, message: string) {
  return reply
    .status(status)
    .header('content-type', 'text/html; charset=utf-8')
    .header('cache-control', 'no-store')
    .header('referrer-policy', 'no-referrer')
    .header('content-security-policy', "default-src 'none'")
    .header('x-content-type-options', 'nosniff')
    .send(`<!doctype html><html><head><meta charset="utf-8"><title>keygate</title></head><body><p>${message}</p></body></html>\n`);
}

export function registerFlowRoutes(app: FastifyInstance, ctx: ServerContext, deps: FlowDeps): void {
  app.post<{ Body: { provider: string; scopes: string[] } }>(
    '/v2/auth/authenticate',
    {
      schema: {
        summary: 'Start an OAuth sign-in (authorization code with PKCE)',
        description: "Answers `completed` with a token_id when the caller already holds an unexpired token covering the scopes; otherwise `pending` with the provider URL to open and an auth_id for /v2/auth/wait.",
        tags: TAGS,
        body: authenticateBody,
        response: { 200: authenticateResponse, 404: errorResponse },
      },
    },
    async (req) => {
      const owner = principalOf(req);
      const provider = await getProvider(ctx.db, owner.workspaceId, req.body.provider);
      if (!provider) throw notFound(`Provider '${req.body.provider}' not found.`);
      const requested = normaliseScopes(req.body.scopes ?? []);
      const scopes = requested.length ? requested : (JSON.parse(provider.scopes) as string[]);
      const existing = await findReusableToken(ctx.db, owner, provider.provider_id, scopes);
      if (existing) return { status: 'completed', token_id: existing.id };
      const state = newState();
      const verifier = Number(provider.uses_pkce) ? newVerifier() : undefined;
      const redirectUri = callbackUrl(ctx, provider.provider_id);
      const authId = await createFlow(ctx.db, {
        workspaceId: owner.workspaceId,
        userId: owner.userId,
        providerId: provider.provider_id,
        scopes,
        redirectUri,
        verifierSealed: verifier ? ctx.envelope.seal(verifier) : null,
        state,
        endpoints: { tokenUrl: provider.token_url, revocationUrl: provider.revocation_url },
      });
      const url = authorizeUrl({ authUrl: provider.auth_url, clientId: provider.client_id, redirectUri, scopes, state, codeChallenge: verifier ? s256Challenge(verifier) : undefined });
      req.log.info({ auth_id: authId, provider_id: provider.provider_id }, 'OAuth sign-in started');
      return { status: 'pending', url, auth_id: authId };
    },
  );

  app.get<{ Params: { provider_id: string }; Querystring: { code?: string; state?: string; error?: string } }>(
    '/v2/auth/callback/:provider_id',
    {
      config: { public: true },
      // The URL carries the authorization code and state: keep fastify's request lines (which log
      // the URL) off for this route; what matters is logged below without them.
      logLevel: 'warn',
      schema: {
        summary: 'OAuth redirect target (opened by the browser)',
        tags: TAGS,
        htmlResponses: {
          200: 'Signed in: the token is stored (an HTML page)',
          400: 'Unknown, used or expired sign-in link, or the provider refused (an HTML page)',
          502: 'The code exchange with the provider failed (an HTML page)',
        },
        params: { type: 'object', required: ['provider_id'], properties: { provider_id: { type: 'string', maxLength: 200 } } },
        querystring: {
          type: 'object',
          properties: {
            code: { type: 'string', maxLength: 4096 },
            state: { type: 'string', maxLength: 512 },
            error: { type: 'string', maxLength: 512 },
            error_description: { type: 'string', maxLength: 4096 },
            error_uri: { type: 'string', maxLength: 4096 },
            iss: { type: 'string', maxLength: 2048 },
          },
        },
      },
    },
    async (req, reply) => {
      const { state, code, error } = req.query;
      const log = ctx.logger;
      const flow = state ? await claimFlow(ctx.db, state, req.params.provider_id) : undefined;
      if (!flow) {
        log.warn({ provider_id: req.params.provider_id }, 'OAuth callback with an unknown, used or expired state');
        return page(reply, 400, 'This sign-in link is invalid, was already used or has expired. Start the sign-in again.');
      }
      if (error || !code) {
        await finishFlow(ctx.db, flow.auth_id, 'failed');
        deps.waiters.notify(flow.auth_id);
        log.warn({ auth_id: flow.auth_id, provider_id: flow.provider_id, error: error && /^[a-z_]{1,64}$/.test(error) ? error : error ? 'non-standard' : 'no code' }, 'OAuth sign-in refused by the provider');
        return page(reply, 400, 'The provider did not complete the sign-in. You can close this window.');
      }
      // What the provider issued, until it is stored: a sign-in that fails after the exchange
      // revokes it at once (nothing of ours holds it, and nobody could revoke it later).
      let revokeIssued: (() => Promise<void>) | undefined;
      try {
        const provider = await getProvider(ctx.db, flow.workspace_id, flow.provider_id);
        if (!provider) throw new ProviderCallError('the provider was deleted during the sign-in', 'invalid_response');
        const set = await exchangeCode({
          tokenUrl: flowTokenUrl(flow, provider),
          client: clientOf(provider, ctx.envelope),
          code,
          redirectUri: flow.redirect_uri,
          codeVerifier: flow.verifier_sealed ? ctx.envelope.open(flow.verifier_sealed) : undefined,
          timeoutMs: deps.httpTimeoutMs,
        });
        const revocationUrl = boundRevocationUrl(flow, provider);
        revokeIssued = async () => {
          if (revocationUrl) await revokeTokens({ revocationUrl, client: clientOf(provider, ctx.envelope), accessToken: set.accessToken, refreshToken: set.refreshToken, timeoutMs: deps.httpTimeoutMs });
        };
        const granted = set.scope !== undefined ? normaliseScopes(set.scope.split(' ')) : (JSON.parse(flow.scopes) as string[]);
        const tokenId = await ctx.db.tx(async (tx) => {
          const id = await storeToken(tx, ctx.envelope, { workspaceId: flow.workspace_id, userId: flow.user_id }, flow.provider_id, set, granted, revocationUrl);
          await finishFlow(tx, flow.auth_id, { tokenId: id });
          return id;
        });
        deps.waiters.notify(flow.auth_id);
        log.info({ auth_id: flow.auth_id, provider_id: flow.provider_id, token_id: tokenId }, 'OAuth token stored');
        return page(reply, 200, 'Signed in. You can close this window.');
      } catch (err) {
        const message = err instanceof ProviderCallError || err instanceof ProviderGoneError ? err.message : (err as Error).name;
        log.warn({ auth_id: flow.auth_id, provider_id: flow.provider_id, reason: message }, 'OAuth code exchange failed');
        if (revokeIssued) {
          await revokeIssued().then(
            () => log.info({ auth_id: flow.auth_id, provider_id: flow.provider_id }, 'the tokens issued to the failed sign-in were revoked at the provider'),
            (e: Error) => log.warn({ auth_id: flow.auth_id, provider_id: flow.provider_id, reason: e instanceof ProviderCallError ? e.message : e.name }, 'the tokens issued to the failed sign-in could not be revoked at the provider'),
          );
        }
        await finishFlow(ctx.db, flow.auth_id, 'failed');
        deps.waiters.notify(flow.auth_id);
        return page(reply, 502, 'The sign-in could not be completed with the provider. You can close this window and try again.');
      }
    },
  );

  app.get<{ Params: { auth_id: string }; Querystring: { timeout: number } }>(
    '/v2/auth/wait/:auth_id',
    {
      schema: {
        summary: 'Wait for an OAuth sign-in to finish (long poll)',
        description: `Waits up to \`timeout\` seconds (capped at ${MAX_WAIT_SECONDS}). \`pending\` is answered for timeout=0, \`timeout\` when the wait ran out, \`failed\` when the provider refused or the exchange failed, \`not_found\` for unknown, other users' or expired flows.`,
        tags: TAGS,
        params: { type: 'object', required: ['auth_id'], properties: { auth_id: { type: 'string', maxLength: 200 } } },
        querystring: { type: 'object', properties: { timeout: { type: 'number', minimum: 0, default: 30 } } },
        response: { 200: waitResponse },
      },
    },
    async (req, reply) => {
      const owner = principalOf(req);
      const authId = req.params.auth_id.toLowerCase();
      if (!UUID_RE.test(authId)) return { status: 'not_found' };
      const deadline = Date.now() + Math.min(req.query.timeout, MAX_WAIT_SECONDS) * 1000;
      const gone = new AbortController();
      reply.raw.once('close', () => gone.abort());
      for (;;) {
        const flow = await getOwnedFlow(ctx.db, authId, owner.workspaceId, owner.userId);
        if (!flow) return { status: 'not_found' };
        if (flow.status === 'completed') return { status: 'completed', token_id: flow.token_id! };
        if (flow.status === 'failed') return { status: 'failed' };
        if (flow.expires_at <= new Date().toISOString()) return { status: 'not_found' };
        const left = deadline - Date.now();
        if (left <= 0 || deps.waiters.isClosed || gone.signal.aborted) return { status: req.query.timeout > 0 ? 'timeout' : 'pending' };
        await deps.waiters.wait(authId, Math.min(left, 1000), gone.signal);
      }
    },
  );
}
