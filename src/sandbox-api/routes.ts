import type { FastifyInstance, FastifyReply } from 'fastify';
import { BoxFileError } from '../sandbox/driver.js';
import { assertSecretValue, SecretStoreError } from '../secrets/types.js';
import { principalOf } from '../server/auth.js';
import { conflict, HttpError, HttpValidationError } from '../server/errors.js';
import type { ValidationIssue } from '../validation/errors.js';
import { runToCompletion } from './exec.js';
import {
  createBody,
  errorResponse,
  executeBody,
  executeOut,
  fileQuery,
  fileWritten,
  listQuery,
  nameParams,
  patchBody,
  sandboxList,
  sandboxOut,
  secretsBody,
  secretsList,
  secretsQuery,
  templateList,
} from './schemas.js';
import type { CreateInput, PatchInput, SandboxService } from './service.js';

const SANDBOX_TAGS = ['Sandboxes'];
const SECRET_TAGS = ['Workspace secrets'];

const authErrors = { 401: errorResponse };
const boxErrors = { ...authErrors, 404: errorResponse, 409: errorResponse };

/** Largest file the files API moves in one request (KEYGATE_SANDBOX_MAX_FILE_BYTES overrides). */
export const DEFAULT_MAX_FILE_BYTES = 100 * 1024 * 1024;

export interface SandboxRouteOptions {
  maxFileBytes: number;
}

/** A driver's file refusal as the API's answer; the message never names a host path. */
function fileError(err: unknown): never {
  if (!(err instanceof BoxFileError)) throw err;
  switch (err.kind) {
    case 'not_found':
      throw new HttpError(404, err.message);
    case 'too_large':
      throw new HttpError(413, err.message);
    case 'not_running':
    case 'box_full':
      throw conflict(err.message);
    default:
      throw new HttpValidationError([{ loc: ['query', 'path'], msg: err.message, type: 'value_error' }]);
  }
}

type NameReq = { Params: { name: string } };

export function registerSandboxRoutes(app: FastifyInstance, service: SandboxService, opts: SandboxRouteOptions = { maxFileBytes: DEFAULT_MAX_FILE_BYTES }): void {
  app.get(
    '/api/v2/sandboxes/templates',
    { schema: { summary: 'List the templates sandboxes can be built from, and which drivers can build each', tags: SANDBOX_TAGS, response: { 200: templateList, ...authErrors } } },
    async () => ({ resources: service.templateViews(), driver: service.driverName }),
  );

  app.post<{ Body: CreateInput }>(
    '/api/v2/sandboxes/boxes',
    {
      schema: {
        summary: 'Create a sandbox and start its auth proxy',
        description:
          "Validates the body (422 with the exact loc), checks that the template exists (422 on template_name) and that every {KEY} of every workspace_secret header names an existing workspace secret (422 at that header's value, every missing key reported), seals opaque values, then starts the sandbox's own proxy with the resolved configuration. A name already used in the workspace: 409. A workspace holding its limit of sandboxes (KEYGATE_SANDBOX_MAX_PER_WORKSPACE, default 50): 403.",
        tags: SANDBOX_TAGS,
        body: createBody,
        response: { 201: sandboxOut, ...authErrors, 403: errorResponse, 409: errorResponse },
      },
    },
    async (req, reply) => {
      const view = await service.create(principalOf(req).workspaceId, req.body);
      return reply.status(201).send(view);
    },
  );

  app.get<{ Querystring: { limit: number; offset: number } }>(
    '/api/v2/sandboxes/boxes',
    {
      schema: {
        summary: "List the workspace's sandboxes (oldest first), a page at a time",
        description: 'Pages like the deployments list: limit (1..100, default 20) and offset; the answer\'s offset is where the next page starts.',
        tags: SANDBOX_TAGS,
        querystring: listQuery,
        response: { 200: sandboxList, ...authErrors },
      },
    },
    async (req) => {
      const { limit, offset } = req.query;
      const resources = await service.list(principalOf(req).workspaceId, { limit, offset });
      return { resources, offset: offset + resources.length };
    },
  );

  app.get<{ Params: { name: string } }>(
    '/api/v2/sandboxes/boxes/:name',
    { schema: { summary: 'Get a sandbox', tags: SANDBOX_TAGS, params: nameParams, response: { 200: sandboxOut, ...authErrors, 404: errorResponse } } },
    async (req) => service.get(principalOf(req).workspaceId, req.params.name),
  );

  app.patch<{ Params: { name: string }; Body: PatchInput }>(
    '/api/v2/sandboxes/boxes/:name',
    {
      schema: {
        summary: "Replace a sandbox's proxy_config (applied live) and/or its idle_ttl_seconds",
        description: 'Validated like a create. The running proxy switches to the new configuration before the answer: the next request uses it, requests in flight and open tunnels are not interrupted.',
        tags: SANDBOX_TAGS,
        params: nameParams,
        body: patchBody,
        response: { 200: sandboxOut, ...authErrors, 404: errorResponse },
      },
    },
    async (req) => service.patch(principalOf(req).workspaceId, req.params.name, req.body),
  );

  app.post<NameReq>(
    '/api/v2/sandboxes/boxes/:name/stop',
    {
      schema: {
        summary: 'Stop a box: kill every process in it and stop its proxy; /workspace is kept',
        tags: SANDBOX_TAGS,
        params: nameParams,
        response: { 200: sandboxOut, ...authErrors, 404: errorResponse },
      },
    },
    async (req) => service.stop(principalOf(req).workspaceId, req.params.name),
  );

  app.post<NameReq>(
    '/api/v2/sandboxes/boxes/:name/start',
    {
      schema: {
        summary: 'Start a stopped (or failed) box again; answers once it is ready or failed',
        tags: SANDBOX_TAGS,
        params: nameParams,
        response: { 200: sandboxOut, ...authErrors, 404: errorResponse },
      },
    },
    async (req) => service.start(principalOf(req).workspaceId, req.params.name),
  );

  app.post<NameReq & { Body: { command: string | string[]; timeout_seconds: number; env?: Record<string, string>; cwd?: string } }>(
    '/api/v2/sandboxes/boxes/:name/execute',
    {
      schema: {
        summary: 'Run a command in a ready box and return its output and exit code',
        description:
          'The command runs inside the box (its proxy is the only way out). stdout and stderr are each capped at 10 MiB (truncated: true; the rest is discarded, never buffered); at timeout_seconds the whole process tree is killed (timed_out: true). For stdin, a live stream or kill, use the WebSocket at .../execute/ws. 409 when the box is not ready or uses the none driver.',
        tags: SANDBOX_TAGS,
        params: nameParams,
        body: executeBody,
        response: { 200: executeOut, ...boxErrors },
      },
    },
    async (req) => {
      const startedAt = Date.now();
      const { command, timeout_seconds, env, cwd } = req.body;
      const proc = await service.exec(principalOf(req).workspaceId, req.params.name, { command, timeoutMs: timeout_seconds * 1000, env, cwd });
      // A client that goes away takes its execution with it.
      const onGone = () => proc.kill('SIGKILL');
      req.raw.socket.once('close', onGone);
      try {
        return await runToCompletion(proc, startedAt);
      } finally {
        req.raw.socket.off('close', onGone);
      }
    },
  );

  // The files API moves raw bytes in both directions, streaming: no JSON parser in this scope.
  app.register(async (files) => {
    files.removeAllContentTypeParsers();
    files.addContentTypeParser('*', (_req, _payload, done) => done(null));
    // The query parser keeps a value it cannot decode as it came (`%FF`, a bare `%`), so such a
    // path named a file called `%FF` in the box, not what the client meant: refused instead.
    files.addHook('preValidation', async (req) => {
      const query = (req.raw.url ?? '').split('?').slice(1).join('?');
      for (const pair of query.split('&')) {
        const eq = pair.indexOf('=');
        if ((eq < 0 ? pair : pair.slice(0, eq)) !== 'path') continue;
        try {
          decodeURIComponent(pair.slice(eq + 1).replace(/\+/g, ' '));
        } catch {
          throw new HttpValidationError([{ loc: ['query', 'path'], msg: 'path is not percent-encoded UTF-8: encode every byte of it (a % as %25)', type: 'value_error' }]);
        }
      }
    });

    files.get<NameReq & { Querystring: { path: string } }>(
      '/api/v2/sandboxes/boxes/:name/files',
      {
        schema: {
          summary: 'Download a file from the box (raw body, streamed)',
          description: `The path is resolved inside the box: a symlink or .. planted in the box never reaches a host path. Files over the size limit (default ${DEFAULT_MAX_FILE_BYTES} bytes) answer 413.`,
          tags: SANDBOX_TAGS,
          params: nameParams,
          querystring: fileQuery,
          response: { 200: { description: 'The file (application/octet-stream)', type: 'string', format: 'binary' }, ...boxErrors, 413: errorResponse },
        },
      },
      async (req, reply: FastifyReply) => {
        const file = await service.readFile(principalOf(req).workspaceId, req.params.name, req.query.path, opts.maxFileBytes).catch(fileError);
        return reply.header('content-type', 'application/octet-stream').header('content-length', String(file.size)).send(file.stream);
      },
    );

    files.put<NameReq & { Querystring: { path: string } }>(
      '/api/v2/sandboxes/boxes/:name/files',
      {
        bodyLimit: Number.MAX_SAFE_INTEGER, // bounded by maxFileBytes while streaming, below
        schema: {
          summary: 'Upload a file into the box (raw body, streamed); parent directories are created',
          description: `The path is resolved inside the box (see GET). A body over the size limit (default ${DEFAULT_MAX_FILE_BYTES} bytes) answers 413 and leaves nothing behind.`,
          tags: SANDBOX_TAGS,
          params: nameParams,
          querystring: fileQuery,
          response: { 201: fileWritten, ...boxErrors, 413: errorResponse },
        },
      },
      async (req, reply) => {
        const declared = Number(req.headers['content-length']);
        if (Number.isFinite(declared) && declared > opts.maxFileBytes) throw new HttpError(413, `The file is larger than the limit of ${opts.maxFileBytes} bytes.`);
        const written = await service.writeFile(principalOf(req).workspaceId, req.params.name, req.query.path, req.raw, opts.maxFileBytes).catch(fileError);
        return reply.status(201).send({ path: req.query.path, size: written.size });
      },
    );
  });

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
          "Each item sets a secret (value: string) or deletes it (value: null). Deleting a secret that a sandbox's proxy_config references is refused with 409 naming the sandboxes, unless force=true (those sandboxes' proxies then stop, status failed, until the secret exists again). Sandboxes referencing a changed secret get their proxies' configuration re-resolved and pushed before the answer, so the next request uses the new value. A value that would make such a sandbox's header illegal (CR, LF, NUL, leading or trailing whitespace at the edge of the header) is refused with 422 at that value, naming the sandbox and header, and nothing is stored. Answers 200 with every secret name of the workspace.",
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
      if (issues.length) {
        // A value refused for what a header cannot carry, in a secret a sandbox uses: the message
        // that names the sandbox and header it would break says more than the generic one.
        const breaking = await service.secretChangeIssues(workspaceId, items);
        const at = (i: ValidationIssue) => JSON.stringify(i.loc);
        const specific = new Set(breaking.map(at));
        throw new HttpValidationError([...issues.filter((i) => !specific.has(at(i))), ...breaking.filter((b) => issues.some((i) => at(i) === at(b)))]);
      }

      return service.withWorkspace(workspaceId, async () => {
        const store = await service.secrets(workspaceId);
        const breaking = await service.secretChangeIssues(workspaceId, items);
        if (breaking.length) throw new HttpValidationError(breaking);
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
