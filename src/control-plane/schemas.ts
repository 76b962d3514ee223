import { DEPLOYMENT_STATUSES, DEPLOYMENT_TYPES, LOG_TYPES, REVISION_STATUSES, SOURCES } from './types.js';
import { MAX_OFFSET } from '../validation/json.js';

const TAGS = ['Deployments (v2)'];
const nullableString = { type: ['string', 'null'] } as const;
const detail = { type: 'object', properties: { detail: { type: 'string' } } } as const;

const secretsIn = {
  type: 'array',
  maxItems: 100,
  items: {
    type: 'object',
    additionalProperties: false,
    required: ['name', 'value'],
    properties: {
      name: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]{0,127}$' },
      value: { type: 'string', maxLength: 65536 },
    },
  },
} as const;

const sourceRevisionConfigIn = {
  type: 'object',
  additionalProperties: false,
  properties: {
    source_tarball_path: { type: ['string', 'null'], maxLength: 200 },
    image_uri: { type: ['string', 'null'], minLength: 1, maxLength: 512, pattern: '^[A-Za-z0-9][A-Za-z0-9._/:@-]*$' },
  },
} as const;

const sourceConfigIn = {
  type: 'object',
  additionalProperties: false,
  properties: { deployment_type: { type: 'string', enum: DEPLOYMENT_TYPES } },
} as const;

export const NAME_PATTERN = '^[a-z0-9-]{1,63}$';

export const createBody = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'source', 'source_revision_config'],
  properties: {
    name: { type: 'string', pattern: NAME_PATTERN },
    source: { type: 'string', enum: SOURCES },
    source_config: sourceConfigIn,
    source_revision_config: sourceRevisionConfigIn,
    secrets: secretsIn,
  },
} as const;

export const patchBody = {
  type: 'object',
  additionalProperties: false,
  properties: {
    name: { type: 'string', pattern: NAME_PATTERN },
    source: { type: 'string', enum: SOURCES },
    source_config: sourceConfigIn,
    source_revision_config: { anyOf: [sourceRevisionConfigIn, { type: 'null' }] },
    secrets: { anyOf: [secretsIn, { type: 'null' }] },
  },
} as const;

export const deploymentOut = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    name: { type: 'string' },
    source: { type: 'string' },
    source_config: { type: 'object', properties: { deployment_type: { type: 'string' }, custom_url: nullableString } },
    secrets: { type: 'array', items: { type: 'object', properties: { name: { type: 'string' } } } },
    status: { type: 'string', enum: DEPLOYMENT_STATUSES },
    latest_revision_id: nullableString,
    active_revision_id: nullableString,
    url: nullableString,
    created_at: { type: 'string' },
    updated_at: { type: 'string' },
  },
} as const;

export const revisionOut = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    deployment_id: { type: 'string' },
    status: { type: 'string', enum: REVISION_STATUSES },
    status_message: nullableString,
    replaced_by: nullableString,
    serving: { type: 'boolean', description: "True for the deployment's active revision, the one answering requests." },
    source: { type: 'string' },
    source_revision_config: { type: 'object', properties: { source_tarball_path: nullableString, image_uri: nullableString } },
    created_at: { type: 'string' },
    updated_at: { type: 'string' },
  },
} as const;

/** Ids are UUIDs; anything longer than this is a 422 on its `loc`, not a lookup. */
const idParam = { type: 'string', minLength: 1, maxLength: 64 } as const;
const depParams = { type: 'object', required: ['deployment_id'], properties: { deployment_id: idParam } } as const;

export const schemas = {
  upload: {
    summary: 'Upload an application directory as a tar.gz',
    description: 'Raw body (Content-Type application/gzip or application/octet-stream). The returned source_tarball_path is usable by this workspace only.',
    tags: TAGS,
    response: { 201: { type: 'object', properties: { source_tarball_path: { type: 'string' }, size: { type: 'integer' }, sha256: { type: 'string' } } }, 413: detail },
  },
  create: { summary: 'Create Deployment', tags: TAGS, body: createBody, response: { 201: deploymentOut, 409: detail } },
  list: {
    summary: 'List Deployments',
    tags: TAGS,
    querystring: {
      type: 'object',
      properties: {
        limit: { type: 'integer', minimum: 1, maximum: 100, default: 20 },
        offset: { type: 'integer', minimum: 0, maximum: MAX_OFFSET, default: 0 },
        name_contains: { type: 'string', maxLength: 63 },
        status: { type: 'string', enum: DEPLOYMENT_STATUSES },
        deployment_type: { type: 'string', enum: DEPLOYMENT_TYPES },
      },
    },
    response: { 200: { type: 'object', properties: { resources: { type: 'array', items: deploymentOut }, offset: { type: 'integer' } } } },
  },
  get: { summary: 'Get Deployment', tags: TAGS, params: depParams, response: { 200: deploymentOut, 404: detail } },
  patch: { summary: 'Patch Deployment', tags: TAGS, params: depParams, body: patchBody, response: { 200: deploymentOut, 404: detail } },
  delete: { summary: 'Delete Deployment', tags: TAGS, params: depParams, response: { 204: { type: 'null' }, 404: detail } },
  revisions: {
    summary: 'List Revisions',
    tags: TAGS,
    params: depParams,
    querystring: {
      type: 'object',
      properties: { limit: { type: 'integer', minimum: 1, maximum: 100, default: 20 }, offset: { type: 'integer', minimum: 0, maximum: MAX_OFFSET, default: 0 } },
    },
    response: { 200: { type: 'object', properties: { resources: { type: 'array', items: revisionOut }, offset: { type: 'integer' } } }, 404: detail },
  },
  revision: {
    summary: 'Get Revision',
    tags: TAGS,
    params: { type: 'object', required: ['deployment_id', 'revision_id'], properties: { deployment_id: idParam, revision_id: idParam } },
    response: { 200: revisionOut, 404: detail },
  },
  logs: {
    summary: 'Get Deployment Logs',
    description: 'Oldest first. Without since: the newest `limit` lines. next_since continues exactly after the last line returned.',
    tags: TAGS,
    params: depParams,
    querystring: {
      type: 'object',
      properties: {
        type: { type: 'string', enum: LOG_TYPES },
        revision_id: { type: 'string', maxLength: 64 },
        since: { type: 'string', maxLength: 64 },
        limit: { type: 'integer', minimum: 1, maximum: 1000, default: 200 },
      },
    },
    response: {
      200: {
        type: 'object',
        properties: {
          logs: {
            type: 'array',
            items: { type: 'object', properties: { timestamp: { type: 'string' }, type: { type: 'string' }, revision_id: nullableString, level: { type: 'string' }, message: { type: 'string' } } },
          },
          next_since: { type: 'string' },
        },
      },
      404: detail,
    },
  },
  logStream: {
    summary: 'Follow Deployment Logs (text/event-stream)',
    tags: TAGS,
    params: depParams,
    querystring: {
      type: 'object',
      properties: { type: { type: 'string', enum: LOG_TYPES }, revision_id: { type: 'string', maxLength: 64 }, since: { type: 'string', maxLength: 64 } },
    },
    response: { 404: detail },
  },
};
