import { proxyConfigSchema } from '../config/schema.js';
import { SECRET_KEY_RE } from '../secrets/keys.js';
import { SANDBOX_STATUSES } from './storage.js';
import { SANDBOX_NAME_PATTERN } from './service.js';
import { DRIVER_NAMES } from '../sandbox/driver.js';
import { OUTPUT_CAP_BYTES } from './output.js';
import { resourcesSchema, templateSchema } from './templates.js';
import { MAX_OFFSET } from '../validation/json.js';

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
  'NPM_CONFIG_CAFILE',
  'WSS_PROXY',
  'WS_PROXY',
  'NODE_USE_ENV_PROXY',
] as const;

const idleTtlSchema = {
  type: 'integer',
  minimum: 0,
  maximum: 31_536_000,
  description: 'Stop the box after this many seconds without an execution; 0 = never. Default 600. Files in /workspace survive a stop.',
} as const;

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
    idle_ttl_seconds: idleTtlSchema,
    resources: { ...resourcesSchema, description: "Overrides the template's default resources, each independently." },
  },
} as const;

export const patchBody = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: {
    proxy_config: {
      ...proxyConfigSchema,
      description: 'Replaces the whole configuration (send opaque values again: they are never returned). Pushed to the running proxy before the answer.',
    },
    idle_ttl_seconds: idleTtlSchema,
  },
} as const;

export const listQuery = {
  type: 'object',
  additionalProperties: false,
  properties: {
    limit: { type: 'integer', minimum: 1, maximum: 100, default: 20 },
    offset: { type: 'integer', minimum: 0, maximum: MAX_OFFSET, default: 0 },
  },
} as const;

/** Longest execute timeout. */
export const MAX_EXEC_TIMEOUT_SECONDS = 86_400;

const commandSchema = {
  anyOf: [
    { type: 'string', minLength: 1, maxLength: 131072 },
    { type: 'array', minItems: 1, maxItems: 4096, items: { type: 'string', maxLength: 131072 } },
  ],
  description: 'A shell command line (run by /bin/sh -c inside the box) or an argv (its program name without "=").',
} as const;

export const executeBody = {
  type: 'object',
  additionalProperties: false,
  required: ['command'],
  properties: {
    command: commandSchema,
    timeout_seconds: { type: 'number', exclusiveMinimum: 0, maximum: MAX_EXEC_TIMEOUT_SECONDS, default: 60, description: 'Kill the whole process tree after this long.' },
    env: {
      type: 'object',
      maxProperties: 1000,
      propertyNames: { pattern: '^[A-Za-z_][A-Za-z0-9_]*$', maxLength: 256 },
      additionalProperties: { type: 'string', maxLength: 131072 },
      description: "Added to the box's environment for this execution.",
    },
    // A NUL in the command, an argument, a value or cwd is refused by the service
    // (execInputIssues) with a message that says why, for HTTP and the WebSocket alike.
    cwd: { type: 'string', pattern: '^/', maxLength: 4096, description: 'Working directory inside the box (default /workspace).' },
  },
} as const;

export const executeOut = {
  type: 'object',
  additionalProperties: false,
  required: ['stdout', 'stderr', 'exit_code', 'signal', 'timed_out', 'duration_ms', 'truncated'],
  properties: {
    stdout: { type: 'string', description: `At most ${OUTPUT_CAP_BYTES} bytes (UTF-8).` },
    stderr: { type: 'string', description: `At most ${OUTPUT_CAP_BYTES} bytes (UTF-8).` },
    exit_code: { type: 'integer', description: "The command's exit code; 128+N when killed by signal N (a timeout kills with SIGKILL: 137)." },
    signal: { type: ['string', 'null'], description: 'The signal that ended the command, if one did.' },
    timed_out: { type: 'boolean' },
    duration_ms: { type: 'integer' },
    truncated: { type: 'boolean', description: 'true when stdout or stderr was longer than the cap; the rest was discarded.' },
  },
} as const;

export const fileQuery = {
  type: 'object',
  additionalProperties: false,
  required: ['path'],
  properties: { path: { type: 'string', minLength: 2, maxLength: 4096, pattern: '^/[^\\u0000]*$', description: 'Absolute path as the box sees it, e.g. /workspace/main.py.' } },
} as const;

export const fileWritten = {
  type: 'object',
  additionalProperties: false,
  required: ['path', 'size'],
  properties: { path: { type: 'string' }, size: { type: 'integer' } },
} as const;

export const nameParams = {
  type: 'object',
  required: ['name'],
  properties: { name: { type: 'string', maxLength: 253 } },
} as const;

export const sandboxOut = {
  type: 'object',
  required: ['id', 'name', 'template_name', 'driver', 'status', 'status_reason', 'idle_ttl_seconds', 'resources', 'last_active_at', 'created_at', 'updated_at', 'proxy_config', 'proxy'],
  additionalProperties: false,
  properties: {
    id: { type: 'string', format: 'uuid' },
    name: { type: 'string' },
    template_name: { type: 'string' },
    driver: { type: 'string', enum: DRIVER_NAMES, description: 'What runs the box: local (bubblewrap), docker, or none (a proxy for a box that runs elsewhere; not isolated by keygate).' },
    status: {
      type: 'string',
      enum: SANDBOX_STATUSES,
      description:
        "provisioning: its proxy and box are being started (also after a server restart, until restored). ready: the box runs and its proxy has the current configuration. stopped: no process runs (stop, idle TTL); /workspace is kept; POST .../start brings it back. failed: see status_reason; retried when the sandbox's configuration or secrets change, at start, and at every server start.",
    },
    status_reason: { type: ['string', 'null'], description: 'Why the sandbox is failed or stopped; null otherwise. Names rules, headers and keys, never values.' },
    idle_ttl_seconds: idleTtlSchema,
    resources: { ...resourcesSchema, required: ['memory_mb', 'cpus', 'pids', 'disk_mb'], description: 'As applied to the box.' },
    last_active_at: { type: ['string', 'null'], format: 'date-time', description: 'Start of the last execution or box start.' },
    created_at: { type: 'string', format: 'date-time' },
    updated_at: { type: 'string', format: 'date-time' },
    proxy_config: { anyOf: [proxyConfigOut, { type: 'null' }] },
    proxy: {
      type: 'object',
      required: ['url', 'ca_cert_pem', 'env'],
      additionalProperties: false,
      description:
        "What the box needs to use its proxy. For local and docker boxes, env is the environment inside the box (proxy at http://127.0.0.1:3128 through the box's relay, CA at /etc/keygate/ca.pem, bundle at /etc/keygate/ca-bundle.pem, Java truststore at /etc/keygate/truststore.p12). For none boxes, url is the proxy on the server's host and the env paths are where the server writes the files (<data>/sandboxes/<id>/ca.pem and ca-bundle.pem: system roots plus the CA); a remote box writes ca_cert_pem to the same paths. The CA's private key never leaves the server.",
      properties: {
        url: { type: ['string', 'null'], description: 'http://HOST:PORT of the sandbox\'s own proxy.' },
        ca_cert_pem: { type: 'string', description: 'The proxy CA certificate (PEM) the box must trust.' },
        env: {
          anyOf: [
            {
              type: 'object',
              additionalProperties: false,
              required: [...ENV_NAMES],
              properties: {
                ...Object.fromEntries(ENV_NAMES.map((n) => [n, { type: 'string' }])),
                JAVA_TOOL_OPTIONS: {
                  type: 'string',
                  description: 'Local and docker boxes, when the server has a JDK (keytool): proxy host and port, http.nonProxyHosts and the truststore at /etc/keygate/truststore.p12 (PKCS12, system roots plus the CA, password changeit), for Java, which ignores HTTPS_PROXY and PEM bundles.',
                },
              },
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
  additionalProperties: false,
  required: ['resources', 'offset'],
  properties: { resources: { type: 'array', items: sandboxOut }, offset: { type: 'integer', description: 'The offset of the next page.' } },
} as const;

export const templateList = {
  type: 'object',
  required: ['resources'],
  additionalProperties: false,
  properties: {
    resources: {
      type: 'array',
      items: {
        ...templateSchema,
        required: [...templateSchema.required, 'drivers'],
        properties: { ...templateSchema.properties, drivers: { type: 'array', items: { type: 'string', enum: DRIVER_NAMES }, description: 'Drivers that can build this template.' } },
      },
    },
    driver: { type: 'string', enum: DRIVER_NAMES, description: 'The driver this server runs boxes with.' },
  },
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
