import type { FastifyInstance } from 'fastify';
import { principalOf } from '../server/auth.js';
import type { ServerContext } from '../server/context.js';
import { badGateway, conflict, notFound } from '../server/errors.js';
import { boundRevocationUrl } from './endpoints.js';
import { ProviderCallError, revokeTokens } from './oauth-client.js';
import { clientOf, getProvider } from './providers.js';
import { errorResponse, tokenMetadataBody, tokenParams, tokenRecord } from './schemas.js';
import { claimForDeletion, deleteClaimed, getOwnedToken, listTokens, releaseClaim, toTokenRecord, updateMetadata, type MetadataPatch } from './tokens.js';

const TAGS = ['Auth Service (v2)'];

/** Same answer for unknown ids and other people's tokens: a caller learns nothing about either. */
const tokenNotFound = () => notFound('Token not found.');

export interface TokenDeps {
  httpTimeoutMs: number;
}

export function registerTokenRoutes(app: FastifyInstance, ctx: ServerContext, deps: TokenDeps): void {
  app.get<{ Querystring: { provider_id?: string } }>(
    '/v2/auth/tokens',
    {
      schema: {
        summary: "List the caller's OAuth tokens (never their values)",
        tags: TAGS,
        querystring: { type: 'object', properties: { provider_id: { type: 'string', minLength: 1, maxLength: 200 } } },
        response: { 200: { type: 'array', items: tokenRecord } },
      },
    },
    async (req) => (await listTokens(ctx.db, principalOf(req), req.query.provider_id)).map(toTokenRecord),
  );

  app.patch<{ Params: { token_id: string }; Body: MetadataPatch }>(
    '/v2/auth/tokens/:token_id/metadata',
    { schema: { summary: "Update a token's label or default flag (owner only)", tags: TAGS, params: tokenParams, body: tokenMetadataBody, response: { 200: tokenRecord, 404: errorResponse } } },
    async (req) => {
      const row = await updateMetadata(ctx.db, principalOf(req), req.params.token_id, req.body);
      if (!row) throw tokenNotFound();
      return toTokenRecord(row);
    },
  );

  // A claim is abandoned when its holder had time for both revocation calls and then some.
  const staleClaimMs = deps.httpTimeoutMs * 2 + 60_000;

  app.delete<{ Params: { token_id: string } }>(
    '/v2/auth/tokens/:token_id',
    {
      schema: {
        summary: 'Revoke a token at its provider, then delete it (owner only)',
        description:
          'Revokes the refresh token, then the access token at the provider (RFC 7009), then deletes the token: 204. Unknown or not yours: 404. The provider failing or not answering: 502 and the token is kept, so the call can be retried. A provider without a revocation endpoint: the token is deleted and the missing revocation logged. A delete of the same token already under way: 409.',
        tags: TAGS,
        params: tokenParams,
        response: { 204: { type: 'null' }, 404: errorResponse, 409: errorResponse, 502: errorResponse },
      },
    },
    async (req, reply) => {
      const owner = principalOf(req);
      const claim = await claimForDeletion(ctx.db, owner, req.params.token_id, staleClaimMs);
      if (!claim.claimed) {
        if (claim.reason === 'busy') throw conflict('A deletion of this token is already in progress.');
        throw tokenNotFound();
      }
      const { row } = claim;
      const where = { token_id: row.id, provider_id: row.provider_id };
      let deleted = false;
      try {
        const provider = await getProvider(ctx.db, row.workspace_id, row.provider_id);
        if (!provider) throw badGateway(`Provider '${row.provider_id}' is not configured; the token cannot be revoked.`);
        // Where the token's sign-in said, not wherever the provider points now (endpoints.ts).
        const revocationUrl = boundRevocationUrl(row, provider);
        if (revocationUrl) {
          try {
            await revokeTokens({
              revocationUrl,
              client: clientOf(provider, ctx.envelope),
              accessToken: ctx.envelope.open(row.access_token_sealed),
              refreshToken: row.refresh_token_sealed ? ctx.envelope.open(row.refresh_token_sealed) : undefined,
              timeoutMs: deps.httpTimeoutMs,
            });
          } catch (err) {
            if (!(err instanceof ProviderCallError)) throw err;
            req.log.warn({ ...where, reason: err.message }, 'token revocation failed; token kept');
            throw badGateway(`Revocation at provider '${row.provider_id}' failed: ${err.message}. The token was kept; retry the deletion.`);
          }
          req.log.info(where, 'token revoked at the provider');
        } else {
          req.log.warn(where, 'provider has no revocation endpoint: token deleted without revocation at the provider');
        }
        deleted = await deleteClaimed(ctx.db, row.id, claim.claim);
      } finally {
        if (!deleted) await releaseClaim(ctx.db, row.id, claim.claim).catch(() => undefined);
      }
      req.log.info(where, 'token deleted');
      return reply.status(204).send();
    },
  );
}
