import { Ajv, type Options as AjvOptions } from 'ajv';
import addFormatsModule from 'ajv-formats';
import websocket from '@fastify/websocket';
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../log.js';
import { loadKeyring } from '../secrets/keyring.js';
import { openDb, type Db } from '../store/db.js';
import { apiKeyAuthenticator, authenticateRequest, bootstrapAuth, type Authenticator } from './auth.js';
import type { ServerContext } from './context.js';
import { errorResponse, HttpError, HttpValidationError, loggableMessage, unavailable } from './errors.js';
import { lingerIfUnread, onClientError } from './http-errors.js';
import { registerOpenApi } from './openapi.js';
import { registerApiKeyRoutes } from './api-keys.js';
import type { Area } from './area.js';
import { loadAreas } from './plugins.js';
import { followHeadLines } from './head-lines.js';
import { unicodeIssues } from '../validation/json.js';

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

/** One registered route: every route of the server is listed (test/server/authz-matrix.test.ts checks each). */
export interface RouteInfo {
  method: string;
  url: string;
  /** Answers without credentials (`config.public`). */
  public: boolean;
  websocket: boolean;
}

export interface BuiltServer {
  app: FastifyInstance;
  /** Every route registered, in registration order (HEAD routes fastify adds for GET included). */
  routes: readonly RouteInfo[];
  ctx: ServerContext;
  /** Starts listening; returns the base URL. */
  listen(host: string, port: number): Promise<string>;
  close(): Promise<void>;
  keyFile?: string;
}

export const PACKAGE_CONFIG_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../config');

/**
 * Longer than any URL Node's parser lets through (its header limit counts the request line): path
 * parameters are bounded by their schemas instead, so an over-long one is a 422 with its `loc`.
 */
const MAX_PARAM_LENGTH = 64 * 1024;

/** True when the request carries no body at all (no Transfer-Encoding, Content-Length absent or 0). */
function bodyless(headers: Record<string, string | string[] | undefined>): boolean {
  return headers['transfer-encoding'] === undefined && (headers['content-length'] === undefined || headers['content-length'] === '0');
}

/** Node's parser marks a request that asked to switch protocols (not in @types/node). */
function isUpgrade(req: FastifyRequest): boolean {
  return (req.raw as { upgrade?: boolean }).upgrade === true;
}

/**
 * A request Node handed over as an upgrade (`Upgrade:` with `Connection: Upgrade`) has left the
 * HTTP parser: nothing closes its socket after an ordinary answer (a 401, a 404), and an open one
 * would also hold `close()` forever. Once such an answer is written the socket is ended; an
 * accepted WebSocket hijacks the reply and never gets here.
 */
function closeUpgradeAfterAnswer(req: FastifyRequest, reply: FastifyReply): void {
  if (!isUpgrade(req)) return;
  const socket = req.raw.socket;
  reply.raw.once('finish', () => {
    if (!reply.sent || socket.destroyed) return;
    socket.end();
    // A client that does not close its side is not waited for.
    setTimeout(() => socket.destroy(), 1000).unref();
  });
}

/**
 * Bodies are validated strictly (no type coercion: `"true"` is not a boolean); query strings, path
 * and header parameters arrive as text and are coerced to their declared types.
 */
const ROUTE_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;

/** The methods some route answers for this URL's path (none: the path itself is unknown). */
function allowedMethods(app: FastifyInstance, url: string): string[] {
  const q = url.indexOf('?');
  const path = q < 0 ? url : url.slice(0, q);
  return ROUTE_METHODS.filter((method) => app.findRoute({ method, url: path }) !== null);
}

function makeAjv(coerce: boolean): Ajv {
  const opts: AjvOptions = { allErrors: true, strict: false, coerceTypes: coerce ? 'array' : false, useDefaults: true, removeAdditional: false };
  const ajv = new Ajv(opts);
  addFormats(ajv);
  return ajv;
}

/**
 * fastify's request log fields, without the query string: a query can carry an OAuth code or a
 * token (a redirect that missed its route, a client that put its key in the URL), and request
 * lines are written before any route could say otherwise.
 */
function requestForLog(req: { method?: string; url?: string; host?: string; ip?: string; socket?: { remotePort?: number } }) {
  const url = req.url ?? '';
  const q = url.indexOf('?');
  return { method: req.method, url: q < 0 ? url : url.slice(0, q), host: req.host, remoteAddress: req.ip, remotePort: req.socket?.remotePort };
}

export async function buildServer(opts: BuildServerOptions): Promise<BuiltServer> {
  const env = opts.env ?? process.env;
  const db: Db = await openDb({
    dataDir: opts.dataDir,
    databaseUrl: opts.databaseUrl ?? env.DATABASE_URL,
    onConnectionLost: (reason) => opts.logger.warn({ reason }, 'database connection lost; the next query opens a new one'),
  });
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
    loggerInstance: opts.logger.child({}, { serializers: { req: requestForLog } }) as FastifyBaseLogger,
    bodyLimit: opts.bodyLimit ?? 1024 * 1024,
    ajv: undefined,
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // Ids are ours to mint; never trust a client-provided request id.
    genReqId: () => crypto.randomUUID(),
    // fastify's own 503 while closing has its shape, not ours: the onRequest hook below answers it.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    clientErrorHandler: onClientError,
    frameworkErrors: (err, req, reply) => {
      closeUpgradeAfterAnswer(req as unknown as FastifyRequest, reply as unknown as FastifyReply);
      const r = errorResponse(err);
      // Typed for the route that was not found; the answer is the same for any.
      void (reply as unknown as FastifyReply).status(r.status).send(r.body);
    },
  });

  // A head too large is a 414 or a 431 by its bytes, not by how they arrived (onClientError reads the lines).
  followHeadLines(app.server);

  const strictAjv = makeAjv(false);
  const coercingAjv = makeAjv(true);
  app.setValidatorCompiler(({ schema, httpPart }) => {
    if (httpPart !== 'body') return coercingAjv.compile(schema);
    const validate = strictAjv.compile(schema);
    // fastify hands a missing body over as null: a route that takes one says it is missing (as
    // FastAPI does), after path and query (validated first) are found fine.
    const validateBody = (data: unknown) => {
      if (data === null || data === undefined) return { error: new HttpValidationError([{ loc: ['body'], msg: 'Field required', type: 'missing' }]) };
      // A string that is not Unicode text would be stored altered (U+FFFD): refused first.
      const unicode = unicodeIssues(data, ['body']);
      if (unicode.length) return { error: new HttpValidationError(unicode) };
      const ok = validate(data);
      validateBody.errors = validate.errors;
      return ok;
    };
    validateBody.errors = null as typeof validate.errors;
    return validateBody;
  });

  app.setErrorHandler((err: FastifyError, req, reply) => {
    const r = errorResponse(err);
    // Log the error class, code and message only for our own failures (client mistakes are not
    // worth a log line); a message that quotes a value (Node's argument checks) loses the quote.
    if (r.internal) req.log.error({ err: { type: err.name, message: loggableMessage(err), code: err.code ?? r.code } }, 'request failed');
    if (r.headers) void reply.headers(r.headers);
    return reply.status(r.status).send(r.body);
  });
  // A path that exists under other methods is a 405 naming them (as FastAPI answers), not a 404
  // that would tell the client the resource is gone. Checked before authentication, like routing.
  app.setNotFoundHandler((req, reply) => {
    const allowed = allowedMethods(app, req.url);
    if (allowed.length) return reply.status(405).header('allow', allowed.join(', ')).send({ detail: 'Method Not Allowed' });
    return reply.status(404).send({ detail: 'Not Found' });
  });
  // An answer while the client is still sending its body (a 401 or 404 before the body was read,
  // a 413 mid-upload) closes the connection: nobody reads the rest, and Node would otherwise read
  // and drop it, keep-alive, for as long as the client sends (an endless upload to a refusal).
  // Such an answer, and any other that closes the connection (fastify's 413 for a declared length
  // over the limit), lingers: the rest is drained within bounds (lingerIfUnread) before the close,
  // where Node would close at once and the client's next write would meet a reset that can
  // discard the answer.
  app.addHook('onSend', async (req, reply, payload) => {
    if (!req.raw.complete && !req.raw.destroyed) void reply.header('connection', 'close');
    if (/\bclose\b/i.test(String(reply.getHeader('connection') ?? ''))) lingerIfUnread(req.raw);
    return payload;
  });

  let closing = false;
  app.addHook('preClose', async () => {
    closing = true;
  });
  // First hook of every request: a request with no body is never parsed, whatever Content-Type
  // it names (a DELETE sent by a client whose default headers include application/json). An
  // upgrade is answered like any request, then its socket closed (unless a WebSocket route took
  // it); only a WebSocket route takes an upgrade, and only to WebSocket: anything else (h2c, a
  // WebSocket to a plain route) is a 400, like routing checked before the credentials.
  app.addHook('onRequest', async (req, reply) => {
    closeUpgradeAfterAnswer(req, reply);
    if (closing) throw unavailable('The server is shutting down.');
    if (req.headers['content-type'] !== undefined && bodyless(req.headers)) delete req.headers['content-type'];
    if (isUpgrade(req) && req.routeOptions.url) {
      const protocol = String(req.headers.upgrade ?? '').trim().toLowerCase();
      if (protocol !== 'websocket') throw new HttpError(400, 'Protocol upgrade not supported: only WebSocket routes accept an upgrade, and only to websocket.');
      if (!req.routeOptions.config?.websocket) throw new HttpError(400, 'This route does not accept a WebSocket upgrade.');
    }
  });
  // Routes are marked at registration: a WebSocket route by `websocket: true`. Every route is
  // listed, with whether it is public: nothing is reachable that the list does not show.
  const routes: RouteInfo[] = [];
  app.addHook('onRoute', (route) => {
    const ws = Boolean((route as { websocket?: boolean }).websocket);
    if (ws) route.config = { ...(route.config as object), websocket: true } as typeof route.config;
    const isPublic = Boolean((route.config as { public?: boolean } | undefined)?.public);
    for (const method of [route.method].flat()) routes.push({ method: String(method).toUpperCase(), url: route.url, public: isPublic, websocket: ws });
  });
  // The WebSocket plugin sits at the root, under the hooks above and the authentication below:
  // an upgrade to any route passes through them like a request (and is answered like one when
  // refused); the upgrade itself happens only in a WebSocket route's handler.
  await app.register(websocket, { options: { maxPayload: 1024 * 1024 } });

  const authenticators: Authenticator[] = [apiKeyAuthenticator(db)];
  app.addHook('onRequest', async (req) => {
    if (req.routeOptions.config?.public) return;
    if (!req.routeOptions.url) return; // unknown route: answered 404 by the not-found handler
    await authenticateRequest(req, authenticators);
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
  registerApiKeyRoutes(app, db);

  // Set from the bound address as soon as the server listens, before the areas' onListen hooks
  // run (they read ctx.publicUrl()); a wildcard bind is reached on loopback.
  app.addHook('onListen', async () => {
    const addr = app.server.address();
    if (!addr || typeof addr !== 'object') return;
    const host = addr.address === '0.0.0.0' || addr.address === '::' ? '127.0.0.1' : addr.address;
    baseUrl = `http://${host.includes(':') ? `[${host}]` : host}:${addr.port}`;
  });

  // onClose hooks run last-registered first: the database closes after every area has stopped
  // what still uses it (the control plane's restore, the sandboxes' state).
  app.addHook('onClose', async () => {
    await db.close();
  });
  const areas = opts.areas ?? (await loadAreas());
  for (const area of areas) {
    await app.register(async (scope) => area.register(scope, ctx, { addAuthenticator: (a) => authenticators.push(a) }), { name: area.name } as never);
  }

  return {
    app,
    routes,
    ctx,
    keyFile,
    async listen(host: string, port: number) {
      await app.listen({ host, port });
      return baseUrl;
    },
    close: () => app.close(),
  };
}
