import type { FastifyInstance } from 'fastify';
import { principalOf } from '../server/auth.js';
import type { ServerContext } from '../server/context.js';
import { conflict, HttpValidationError, notFound } from '../server/errors.js';
import { secretRebindProblem } from './endpoints.js';
import { normaliseScopes } from './pkce.js';
import { getProvider, insertProvider, listProviders, patchProvider, plainHttpProblems, secretProblem, toRecord, type ProviderInput } from './providers.js';
import { errorResponse, providerCreateBody, providerParams, providerPatchBody, providerRecord } from './schemas.js';
import { lockProvider } from './tokens.js';

const TAGS = ['Auth Service (v2)'];

function providerNotFound(id: string) {
  return notFound(`Provider '${id}' not found.`);
}

function refusePlainHttp(p: Partial<ProviderInput>): void {
  const problems = plainHttpProblems(p);
  if (problems.length) throw new HttpValidationError(problems.map(({ field, msg }) => ({ loc: ['body', field], msg, type: 'url_scheme' })));
}

/** The provider registry, scoped to the caller's workspace. */
export function registerProviderRoutes(app: FastifyInstance, ctx: ServerContext): void {
  app.post<{ Body: ProviderInput }>(
    '/v2/auth/providers',
    { schema: { summary: 'Register an OAuth provider', tags: TAGS, body: providerCreateBody, response: { 201: providerRecord, 409: errorResponse } } },
    async (req, reply) => {
      const { workspaceId } = principalOf(req);
      const body = { ...req.body, scopes: normaliseScopes(req.body.scopes ?? []) };
      const problem = secretProblem(body.token_endpoint_auth_method, Boolean(body.client_secret));
      if (problem) throw new HttpValidationError([{ loc: ['body', 'client_secret'], ...problem }]);
      refusePlainHttp(body);
      if (!(await insertProvider(ctx.db, ctx.envelope, workspaceId, body, 'api'))) throw conflict(`Provider '${body.provider_id}' already exists.`);
      req.log.info({ provider_id: body.provider_id }, 'OAuth provider registered');
      return reply.status(201).send(toRecord((await getProvider(ctx.db, workspaceId, body.provider_id))!));
    },
  );

  app.get('/v2/auth/providers', { schema: { summary: 'List OAuth providers', tags: TAGS, response: { 200: { type: 'array', items: providerRecord } } } }, async (req) => {
    return (await listProviders(ctx.db, principalOf(req).workspaceId)).map(toRecord);
  });

  app.get<{ Params: { provider_id: string } }>(
    '/v2/auth/providers/:provider_id',
    { schema: { summary: 'Get an OAuth provider', tags: TAGS, params: providerParams, response: { 200: providerRecord, 404: errorResponse } } },
    async (req) => {
      const row = await getProvider(ctx.db, principalOf(req).workspaceId, req.params.provider_id);
      if (!row) throw providerNotFound(req.params.provider_id);
      return toRecord(row);
    },
  );

  app.patch<{ Params: { provider_id: string }; Body: Partial<ProviderInput> }>(
    '/v2/auth/providers/:provider_id',
    { schema: { summary: 'Update an OAuth provider', tags: TAGS, params: providerParams, body: providerPatchBody, response: { 200: providerRecord, 404: errorResponse } } },
    async (req) => {
      const { workspaceId } = principalOf(req);
      const id = req.params.provider_id;
      const patch = { ...req.body, ...(req.body.scopes ? { scopes: normaliseScopes(req.body.scopes) } : {}) };
      refusePlainHttp(patch);
      const row = await ctx.db.tx(async (tx) => {
        const current = await getProvider(tx, workspaceId, id);
        if (!current) throw providerNotFound(id);
        const method = patch.token_endpoint_auth_method ?? current.token_endpoint_auth_method;
        const hasSecret = patch.client_secret !== undefined ? patch.client_secret !== null : current.client_secret_sealed !== null;
        const rebind = secretRebindProblem(current, patch);
        const problem = secretProblem(method, hasSecret) ?? (rebind ? { msg: rebind, type: 'missing' as const } : undefined);
        if (problem) throw new HttpValidationError([{ loc: ['body', 'client_secret'], ...problem }]);
        return patchProvider(tx, ctx.envelope, workspaceId, id, patch);
      });
      req.log.info({ provider_id: id, fields: Object.keys(patch), user_id: principalOf(req).userId }, 'OAuth provider updated');
      return toRecord(row!);
    },
  );

  app.delete<{ Params: { provider_id: string } }>(
    '/v2/auth/providers/:provider_id',
    { schema: { summary: 'Delete an OAuth provider', tags: TAGS, params: providerParams, response: { 204: { type: 'null' }, 404: errorResponse, 409: errorResponse } } },
    async (req, reply) => {
      const { workspaceId } = principalOf(req);
      const id = req.params.provider_id;
      await ctx.db.tx(async (tx) => {
        // Locked first: a sign-in storing its token meanwhile either finishes before the count
        // below (409) or finds the provider gone (and revokes what it was issued).
        if (!(await lockProvider(tx, workspaceId, id))) throw providerNotFound(id);
        // Forgetting the provider would strand its tokens unrevocable: they go first, each revoked.
        const n = await tx.get<{ n: number }>('SELECT COUNT(*) AS n FROM oauth_tokens WHERE workspace_id = ? AND provider_id = ?', [workspaceId, id]);
        if (Number(n?.n ?? 0) > 0) throw conflict(`Provider '${id}' still has ${Number(n!.n)} stored token(s); delete them first.`);
        await tx.run('DELETE FROM oauth_auth_flows WHERE workspace_id = ? AND provider_id = ?', [workspaceId, id]);
        await tx.run('DELETE FROM oauth_providers WHERE workspace_id = ? AND provider_id = ?', [workspaceId, id]);
      });
      req.log.info({ provider_id: id }, 'OAuth provider deleted');
      return reply.status(204).send();
    },
  );
}
