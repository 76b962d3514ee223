import type { FastifyInstance } from 'fastify';
import type { ProxyConfig } from '../config/schema.js';
import { assertSecretValue, SecretStoreError } from '../secrets/types.js';
import { principalOf } from '../server/auth.js';
import { conflict, HttpValidationError } from '../server/errors.js';
import type { ValidationIssue } from '../validation/errors.js';
import {
  createBody,
  errorResponse,
  nameParams,
  patchBody,
  sandboxList,
  sandboxOut,
  secretsBody,
  secretsList,
  secretsQuery,
  templateList,
} from './schemas.js';
import type { CreateInput, SandboxService } from './service.js';

const SANDBOX_TAGS = ['Sandboxes'];
const SECRET_TAGS = ['Workspace secrets'];

const authErrors = { 401: errorResponse };

export function registerSandboxRoutes(app: FastifyInstance, service: SandboxService): void {
  app.get(
    '/api/v2/sandboxes/templates',
    { schema: { summary: 'List the templates sandboxes can be built from', tags: SANDBOX_TAGS, response: { 200: templateList, ...authErrors } } },
    async () => ({ resources: service.templates }),
  );

  app.post<{ Body: CreateInput }>(
    '/api/v2/sandboxes/boxes',
    {
      schema: {
        summary: 'Create a sandbox and start its auth proxy',
        description:
          "Validates the body (422 with the exact loc), checks that the template exists (422 on template_name) and that every {KEY} of every workspace_secret header names an existing workspace secret (422 at that header's value, every missing key reported), seals opaque values, then starts the sandbox's own proxy with the resolved configuration. A name already used in the workspace: 409.",
        tags: SANDBOX_TAGS,
        body: createBody,
        response: { 201: sandboxOut, ...authErrors, 409: errorResponse },
      },
    },
    async (req, reply) => {
      const view = await service.create(principalOf(req).workspaceId, req.body);
      return reply.status(201).send(view);
    },
  );

  app.get(
    '/api/v2/sandboxes/boxes',
    { schema: { summary: "List the workspace's sandboxes (oldest first)", tags: SANDBOX_TAGS, response: { 200: sandboxList, ...authErrors } } },
    async (req) => ({ resources: await service.list(principalOf(req).workspaceId) }),
  );

  app.get<{ Params: { name: string } }>(
    '/api/v2/sandboxes/boxes/:name',
    { schema: { summary: 'Get a sandbox', tags: SANDBOX_TAGS, params: nameParams, response: { 200: sandboxOut, ...authErrors, 404: errorResponse } } },
    async (req) => service.get(principalOf(req).workspaceId, req.params.name),
  );

  app.patch<{ Params: { name: string }; Body: { proxy_config: ProxyConfig } }>(
    '/api/v2/sandboxes/boxes/:name',
    {
      schema: {
        summary: "Replace a sandbox's proxy_config (applied live)",
        description: 'Validated like a create. The running proxy switches to the new configuration before the answer: the next request uses it, requests in flight and open tunnels are not interrupted.',
        tags: SANDBOX_TAGS,
        params: nameParams,
        body: patchBody,
        response: { 200: sandboxOut, ...authErrors, 404: errorResponse },
      },
    },
    async (req) => service.patch(principalOf(req).workspaceId, req.params.name, req.body.proxy_config),
  );

  app.delete<{ Params: { name: string } }>(
    '/api/v2/sandboxes/boxes/:name',
    {
      schema: {
        summary: 'Delete a sandbox: stop its proxy, remove its record and files',
        tags: SANDBOX_TAGS,
        params: nameParams,
        response: { 204: { type: 'null', description: 'Deleted' }, ...authErrors, 404: errorResponse },
      },
    },
    async (req, reply) => {
      await service.delete(principalOf(req).workspaceId, req.params.name);
      return reply.status(204).send();
    },
  );
}

export function registerSecretRoutes(app: FastifyInstance, service: SandboxService): void {
  app.get(
    '/api/v1/workspaces/current/secrets',
    { schema: { summary: "List the workspace's secret names (never values)", tags: SECRET_TAGS, response: { 200: secretsList, ...authErrors } } },
    async (req) => {
      const store = await service.secrets(principalOf(req).workspaceId);
      return (await store.list()).map((key) => ({ key }));
    },
  );

  app.post<{ Body: { key: string; value: string | null }[]; Querystring: { force: boolean } }>(
    '/api/v1/workspaces/current/secrets',
    {
      schema: {
        summary: 'Set (upsert) or delete workspace secrets',
        description:
          "Each item sets a secret (value: string) or deletes it (value: null). Deleting a secret that a sandbox's proxy_config references is refused with 409 naming the sandboxes, unless force=true (those sandboxes' proxies then stop, status failed, until the secret exists again). Sandboxes referencing a changed secret get their proxies' configuration re-resolved and pushed before the answer, so the next request uses the new value. Answers 200 with every secret name of the workspace.",
        tags: SECRET_TAGS,
        querystring: secretsQuery,
        body: secretsBody,
        response: { 200: secretsList, ...authErrors, 409: errorResponse },
      },
    },
    async (req) => {
      const workspaceId = principalOf(req).workspaceId;
      const items = req.body;
      const issues: ValidationIssue[] = [];
      const seen = new Map<string, number>();
      items.forEach((item, i) => {
        if (seen.has(item.key)) issues.push({ loc: ['body', i, 'key'], msg: `Secret '${item.key}' is given twice (also item ${seen.get(item.key)})`, type: 'value_error' });
        else seen.set(item.key, i);
        if (item.value !== null) {
          try {
            assertSecretValue(item.key, item.value);
          } catch (err) {
            if (!(err instanceof SecretStoreError)) throw err;
            issues.push({ loc: ['body', i, 'value'], msg: err.message, type: 'value_error' });
          }
        }
      });
      if (issues.length) throw new HttpValidationError(issues);

      return service.withWorkspace(workspaceId, async () => {
        const store = await service.secrets(workspaceId);
        const deletions = items.filter((i) => i.value === null).map((i) => i.key);
        if (deletions.length && !req.query.force) {
          const users = await service.sandboxesUsing(workspaceId, deletions);
          if (users.length) {
            const which = (await Promise.all(deletions.map(async (k) => ((await service.sandboxesUsing(workspaceId, [k])).length ? k : undefined)))).filter(Boolean);
            throw conflict(`Cannot delete secret${which.length > 1 ? 's' : ''} ${which.join(', ')}: used by sandboxes: ${users.join(', ')}. Change their proxy_config first, or delete with ?force=true.`);
          }
        }
        const changed: string[] = [];
        for (const item of items) {
          if (item.value === null) {
            if (await store.delete(item.key)) changed.push(item.key);
          } else {
            await store.set(item.key, item.value);
            changed.push(item.key);
          }
        }
        req.log.info({ workspace_id: workspaceId, keys: changed, force: req.query.force }, 'workspace secrets changed');
        if (changed.length) await service.secretsChanged(workspaceId, changed);
        return (await store.list()).map((key) => ({ key }));
      });
    },
  );
}
