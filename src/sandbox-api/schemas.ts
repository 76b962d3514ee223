import { proxyConfigSchema } from '../config/schema.js';
import { SECRET_KEY_RE } from '../secrets/keys.js';
import { SANDBOX_STATUSES } from './storage.js';
import { SANDBOX_NAME_PATTERN } from './service.js';
import { templateSchema } from './templates.js';

// Request and response schemas of the sandbox API: fastify validates with them and /openapi.json
// is built from them, so the document is the behaviour.

export const errorResponse = {
  type: 'object',
  required: ['detail'],
  properties: { detail: { type: 'string' } },
} as const;

/**
 * The proxy_config as returned: the request schema with `value` optional, because `opaque`
 * headers come back without one. Serialising through this schema also drops any property it does
 * not name, a second line of defence behind redactProxyConfig.
 */
function redactedProxyConfigSchema(): Record<string, unknown> {
  const copy = structuredClone(proxyConfigSchema) as unknown as {
    properties: { rules: { items: { properties: { headers: { items: { required: string[]; description?: string } } } } } };
  };
  const header = copy.properties.rules.items.properties.headers.items;
  header.required = ['name', 'type'];
  header.description = 'workspace_secret values are returned as their {KEY} template, plaintext values as stored; opaque values are never returned.';
  return copy as unknown as Record<string, unknown>;
}

export const proxyConfigOut = redactedProxyConfigSchema();

const ENV_NAMES = [
  'HTTPS_PROXY',
  'HTTP_PROXY',
  'https_proxy',
  'http_proxy',
  'NO_PROXY',
  'no_proxy',
  'NODE_EXTRA_CA_CERTS',
  'SSL_CERT_FILE',
  'REQUESTS_CA_BUNDLE',
  'CURL_CA_BUNDLE',
  'GIT_SSL_CAINFO',
] as const;

export const sandboxNameSchema = {
  type: 'string',
  pattern: SANDBOX_NAME_PATTERN,
  description: 'Lower-case letters, digits and -, 1 to 63 characters, starting and ending with a letter or digit; unique in the workspace.',
} as const;

export const createBody = {
  type: 'object',
  additionalProperties: false,
  required: ['template_name', 'name'],
  properties: {
    template_name: { type: 'string', minLength: 1, maxLength: 128, description: 'A template of GET /api/v2/sandboxes/templates.' },
    name: sandboxNameSchema,
    wait_for_ready: {
      type: 'boolean',
      default: false,
      description: "true: answer once the sandbox's proxy accepts connections with its configuration applied (status ready or failed). false: answer at once with status starting.",
    },
    proxy_config: {
      ...proxyConfigSchema,
      description:
        'Auth proxy configuration. Every {KEY} of a workspace_secret header must name an existing workspace secret; opaque values are encrypted at rest and never returned.',
    },
  },
} as const;

export const patchBody = {
  type: 'object',
  additionalProperties: false,
  required: ['proxy_config'],
  properties: {
    proxy_config: {
      ...proxyConfigSchema,
      description: 'Replaces the whole configuration (send opaque values again: they are never returned). Pushed to the running proxy before the answer.',
    },
  },
} as const;

export const nameParams = {
  type: 'object',
  required: ['name'],
  properties: { name: { type: 'string', maxLength: 253 } },
} as const;

export const sandboxOut = {
  type: 'object',
  required: ['id', 'name', 'template_name', 'status', 'status_reason', 'created_at', 'updated_at', 'proxy_config', 'proxy'],
  additionalProperties: false,
  properties: {
    id: { type: 'string', format: 'uuid' },
    name: { type: 'string' },
    template_name: { type: 'string' },
    status: {
      type: 'string',
      enum: SANDBOX_STATUSES,
      description: "starting: its proxy is being started. ready: the proxy runs with the current configuration. failed: the proxy is not running (see status_reason); it is retried when the sandbox's configuration or secrets change and at every server start.",
    },
    status_reason: { type: ['string', 'null'], description: 'Why the sandbox is failed; null otherwise. Names rules, headers and keys, never values.' },
    created_at: { type: 'string', format: 'date-time' },
    updated_at: { type: 'string', format: 'date-time' },
    proxy_config: { anyOf: [proxyConfigOut, { type: 'null' }] },
    proxy: {
      type: 'object',
      required: ['url', 'ca_cert_pem', 'env'],
      additionalProperties: false,
      description:
        "What the box needs to use its proxy. The env paths are where the embedded default writes the files (<data>/sandboxes/<id>/ca.pem and ca-bundle.pem: system roots plus the CA); a remote box writes ca_cert_pem to the same paths. The CA's private key never leaves the server.",
      properties: {
        url: { type: ['string', 'null'], description: 'http://HOST:PORT of the sandbox\'s own proxy.' },
        ca_cert_pem: { type: 'string', description: 'The proxy CA certificate (PEM) the box must trust.' },
        env: {
          anyOf: [
            {
              type: 'object',
              additionalProperties: false,
              required: [...ENV_NAMES],
              properties: Object.fromEntries(ENV_NAMES.map((n) => [n, { type: 'string' }])),
            },
            { type: 'null' },
          ],
        },
      },
    },
  },
} as const;

export const sandboxList = {
  type: 'object',
  required: ['resources'],
  additionalProperties: false,
  properties: { resources: { type: 'array', items: sandboxOut } },
} as const;

export const templateList = {
  type: 'object',
  required: ['resources'],
  additionalProperties: false,
  properties: { resources: { type: 'array', items: templateSchema } },
} as const;

export const secretKeySchema = { type: 'string', pattern: SECRET_KEY_RE.source, description: 'Letters, digits and _, not starting with a digit, at most 128 characters.' } as const;

export const secretsBody = {
  type: 'array',
  maxItems: 1000,
  items: {
    type: 'object',
    additionalProperties: false,
    required: ['key', 'value'],
    properties: {
      key: secretKeySchema,
      value: { type: ['string', 'null'], minLength: 1, maxLength: 65536, description: 'The new value (upsert), or null to delete the secret. Never returned.' },
    },
  },
} as const;

export const secretsList = {
  type: 'array',
  items: { type: 'object', required: ['key'], additionalProperties: false, properties: { key: { type: 'string' } } },
} as const;

export const secretsQuery = {
  type: 'object',
  properties: {
    force: { type: 'boolean', default: false, description: 'Delete secrets even when sandboxes use them; their proxies stop (status failed) until the secret exists again.' },
  },
} as const;
