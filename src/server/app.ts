import { Ajv, type Options as AjvOptions } from 'ajv';
import addFormatsModule from 'ajv-formats';
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../log.js';
import { loadKeyring } from '../secrets/keyring.js';
import { openDb, type Db } from '../store/db.js';
import { ajvToIssues, type ValidationIssue } from '../validation/errors.js';
import { apiKeyAuthenticator, authenticate, bootstrapAuth, type Authenticator } from './auth.js';
import type { ServerContext } from './context.js';
import { HttpError, HttpValidationError } from './errors.js';
import { registerOpenApi } from './openapi.js';
import { loadAreas, type Area } from './plugins.js';

// ajv-formats ships CommonJS with a default export; under NodeNext it arrives wrapped.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (ajv: Ajv) => Ajv;

export interface BuildServerOptions {
  dataDir: string;
  databaseUrl?: string;
  logger: Logger;
  env?: NodeJS.ProcessEnv;
  /** Directory holding templates.json and other operator configuration; default `<package>/config`. */
  configDir?: string;
  /** Areas to register; default: all of them (src/server/plugins.ts). */
  areas?: Area[];
  /** Largest JSON body accepted, bytes. */
  bodyLimit?: number;
}

export interface BuiltServer {
  app: FastifyInstance;
  ctx: ServerContext;
  /** Starts listening; returns the base URL. */
  listen(host: string, port: number): Promise<string>;
  close(): Promise<void>;
  keyFile?: string;
}

export const PACKAGE_CONFIG_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../config');

const PART_TO_LOC: Record<string, string> = { body: 'body', querystring: 'query', params: 'path', headers: 'header' };

/**
 * Bodies are validated strictly (no type coercion: `"true"` is not a boolean); query strings, path
 * and header parameters arrive as text and are coerced to their declared types.
 */
function makeAjv(coerce: boolean): Ajv {
  const opts: AjvOptions = { allErrors: true, strict: false, coerceTypes: coerce ? 'array' : false, useDefaults: true, removeAdditional: false };
  const ajv = new Ajv(opts);
  addFormats(ajv);
  return ajv;
}

export async function buildServer(opts: BuildServerOptions): Promise<BuiltServer> {
  const env = opts.env ?? process.env;
  const db: Db = await openDb({ dataDir: opts.dataDir, databaseUrl: opts.databaseUrl ?? env.DATABASE_URL });
  // Fail at start on a bad KEYGATE_MASTER_KEY; afterwards key material is re-read on every use so
  // that `keygate secrets rotate-key` run by another process takes effect here at once.
  loadKeyring(opts.dataDir, env);
  const { keyFile } = await bootstrapAuth(db, opts.dataDir, env);

  let baseUrl = '';
  const ctx: ServerContext = {
    db,
    dataDir: opts.dataDir,
    get envelope() {
      return loadKeyring(opts.dataDir, env).envelope;
    },
    logger: opts.logger,
    configDir: opts.configDir ?? env.KEYGATE_CONFIG_DIR ?? PACKAGE_CONFIG_DIR,
    env,
    publicUrl: () => baseUrl,
  };

  const app = Fastify({
    loggerInstance: opts.logger as FastifyBaseLogger,
    bodyLimit: opts.bodyLimit ?? 1024 * 1024,
    ajv: undefined,
    // Ids are ours to mint; never trust a client-provided request id.
    genReqId: () => crypto.randomUUID(),
    return503OnClosing: true,
    forceCloseConnections: 'idle',
  });

  const strictAjv = makeAjv(false);
  const coercingAjv = makeAjv(true);
  app.setValidatorCompiler(({ schema, httpPart }) => (httpPart === 'body' ? strictAjv : coercingAjv).compile(schema));

  app.setErrorHandler((err: FastifyError | HttpError | HttpValidationError, req, reply) => {
    if (err instanceof HttpError) return reply.status(err.status).send({ detail: err.detail });
    if (err instanceof HttpValidationError) return reply.status(422).send({ detail: err.issues });
    const fe = err as FastifyError & { validationContext?: string };
    if (fe.validation) {
      const where = PART_TO_LOC[fe.validationContext ?? 'body'] ?? 'body';
      return reply.status(422).send({ detail: ajvToIssues(fe.validation as never, [where]) });
    }
    if (fe.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || fe.code === 'FST_ERR_CTP_EMPTY_JSON_BODY' || (fe.statusCode === 400 && fe instanceof SyntaxError)) {
      const issue: ValidationIssue = { loc: ['body'], msg: 'JSON decode error', type: 'json_invalid' };
      return reply.status(422).send({ detail: [issue] });
    }
    if (fe.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') return reply.status(415).send({ detail: 'Unsupported media type: send Content-Type: application/json.' });
    if (fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return reply.status(413).send({ detail: 'Request body is too large.' });
    const status = fe.statusCode && fe.statusCode >= 400 && fe.statusCode < 500 ? fe.statusCode : 500;
    if (status >= 500) {
      // Log the error class and message only: messages are ours and never carry secret values.
      req.log.error({ err: { type: fe.name, message: fe.message, code: fe.code } }, 'request failed');
      return reply.status(500).send({ detail: 'Internal server error.' });
    }
    return reply.status(status).send({ detail: fe.message });
  });
  app.setNotFoundHandler((req, reply) => reply.status(404).send({ detail: 'Not Found' }));

  const authenticators: Authenticator[] = [apiKeyAuthenticator(db)];
  app.addHook('onRequest', async (req) => {
    if (req.routeOptions.config?.public) return;
    if (!req.routeOptions.url) return; // unknown route: answered 404 by the not-found handler
    req.principal = await authenticate(req, authenticators);
  });

  registerOpenApi(app, {
    title: 'keygate',
    description: 'Sandbox API with auth proxy configuration, deployment control plane and Auth Service (v2).',
  });
  app.get('/healthz', { config: { public: true }, schema: { hide: true } }, async () => ({ ok: true }));
  app.get('/readyz', { config: { public: true }, schema: { hide: true } }, async () => {
    await db.get('SELECT 1 AS one');
    return { ready: true };
  });

  // Set from the bound address as soon as the server listens, before the areas' onListen hooks
  // run (they read ctx.publicUrl()); a wildcard bind is reached on loopback.
  app.addHook('onListen', async () => {
    const addr = app.server.address();
    if (!addr || typeof addr !== 'object') return;
    const host = addr.address === '0.0.0.0' || addr.address === '::' ? '127.0.0.1' : addr.address;
    baseUrl = `http://${host.includes(':') ? `[${host}]` : host}:${addr.port}`;
  });

  const areas = opts.areas ?? (await loadAreas());
  for (const area of areas) {
    await app.register(async (scope) => area.register(scope, ctx, { addAuthenticator: (a) => authenticators.push(a) }), { name: area.name } as never);
  }
  app.addHook('onClose', async () => {
    await db.close();
  });

  return {
    app,
    ctx,
    keyFile,
    async listen(host: string, port: number) {
      await app.listen({ host, port });
      return baseUrl;
    },
    close: () => app.close(),
  };
}
