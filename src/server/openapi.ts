import type { FastifyInstance, RouteOptions } from 'fastify';
import { version } from '../version.js';
import { frameworkStatuses } from './errors.js';

declare module 'fastify' {
  interface FastifySchema {
    /** Leave the route out of the OpenAPI document. */
    hide?: boolean;
    summary?: string;
    description?: string;
    tags?: string[];
    /** Answers that are not JSON (an HTML page): status -> description, documented as text/html. */
    htmlResponses?: Record<number, string>;
  }
}

interface Collected {
  method: string;
  url: string;
  schema: Record<string, unknown>;
  isPublic: boolean;
}

const PART_TO_IN: Record<string, string> = { params: 'path', querystring: 'query', headers: 'header' };

/** fastify `/v2/x/:id` -> OpenAPI `/v2/x/{id}`. */
function openApiPath(url: string): string {
  return url.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
}

function parameters(schema: Record<string, unknown>): unknown[] {
  const out: unknown[] = [];
  for (const part of ['params', 'querystring', 'headers'] as const) {
    const s = schema[part] as { properties?: Record<string, unknown>; required?: string[] } | undefined;
    for (const [name, prop] of Object.entries(s?.properties ?? {})) {
      out.push({ name, in: PART_TO_IN[part], required: part === 'params' || (s?.required ?? []).includes(name), schema: prop });
    }
  }
  return out;
}

const VALIDATION_ERROR = {
  type: 'object',
  required: ['detail'],
  properties: {
    detail: {
      type: 'array',
      items: {
        type: 'object',
        required: ['loc', 'msg', 'type'],
        properties: {
          loc: { type: 'array', items: { anyOf: [{ type: 'string' }, { type: 'integer' }] } },
          msg: { type: 'string' },
          type: { type: 'string' },
        },
      },
    },
  },
};

const HTTP_ERROR = { type: 'object', required: ['detail'], properties: { detail: { type: 'string' } } };

const FRAMEWORK_DESCRIPTIONS: Record<number, string> = {
  401: 'Missing or invalid credentials',
  403: 'X-Tenant-Id names a workspace the credential does not belong to',
  413: 'Request body too large',
  415: 'Unsupported media type',
};

/**
 * Serves `/openapi.json`, built from the very schemas fastify validates with (collected as routes
 * are added), so the document cannot drift from the behaviour.
 */
export function registerOpenApi(app: FastifyInstance, info: { title: string; description: string }): void {
  const routes: Collected[] = [];
  app.addHook('onRoute', (route: RouteOptions) => {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    const schema = (route.schema ?? {}) as Record<string, unknown>;
    if (schema.hide) return;
    for (const m of methods) {
      if (m === 'HEAD' || m === 'OPTIONS') continue;
      routes.push({ method: m.toLowerCase(), url: route.url, schema, isPublic: Boolean(route.config?.public) });
    }
  });
  let cached: unknown;
  app.get('/openapi.json', { config: { public: true }, schema: { hide: true } }, async () => {
    if (cached) return cached;
    const paths: Record<string, Record<string, unknown>> = {};
    for (const r of routes) {
      const p = (paths[openApiPath(r.url)] ??= {});
      const responses: Record<string, unknown> = {};
      for (const [code, body] of Object.entries((r.schema.response as Record<string, unknown>) ?? {})) {
        responses[code] = { description: code, content: { 'application/json': { schema: body } } };
      }
      const validated = ['body', 'params', 'querystring', 'headers'].some((part) => r.schema[part] !== undefined);
      for (const code of frameworkStatuses({ method: r.method, authenticated: !r.isPublic, validated })) {
        responses[String(code)] ??=
          code === 422
            ? { description: 'Validation Error', content: { 'application/json': { schema: { $ref: '#/components/schemas/HTTPValidationError' } } } }
            : { description: FRAMEWORK_DESCRIPTIONS[code], content: { 'application/json': { schema: { $ref: '#/components/schemas/HTTPError' } } } };
      }
      for (const [code, description] of Object.entries(r.schema.htmlResponses ?? {})) {
        responses[code] = { description, content: { 'text/html': { schema: { type: 'string' } } } };
      }
      // A route that declares no success answer (a stream) still has one.
      if (!Object.keys(responses).some((c) => c.startsWith('2'))) responses['200'] = { description: 'OK' };
      p[r.method] = {
        summary: r.schema.summary,
        description: r.schema.description,
        tags: r.schema.tags,
        parameters: parameters(r.schema),
        ...(r.schema.body ? { requestBody: { required: true, content: { 'application/json': { schema: r.schema.body } } } } : {}),
        responses,
        security: r.isPublic ? [] : [{ 'API Key': [] }, { 'Tenant ID': [] }, { 'Bearer Auth': [] }],
      };
    }
    cached = {
      openapi: '3.1.0',
      info: { title: info.title, description: info.description, version },
      paths,
      components: {
        schemas: { HTTPValidationError: VALIDATION_ERROR, HTTPError: HTTP_ERROR },
        securitySchemes: {
          'API Key': { type: 'apiKey', in: 'header', name: 'X-Api-Key' },
          'Tenant ID': { type: 'apiKey', in: 'header', name: 'X-Tenant-Id' },
          'Bearer Auth': { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' },
        },
      },
    };
    return cached;
  });
}
