import { UUID_PATTERN } from './pkce.js';

/** JSON schemas of the Auth Service routes: one source for validation and the OpenAPI document. */

const httpUrl = { type: 'string', format: 'uri', pattern: '^https?://', maxLength: 2048 } as const;
const scopes = { type: 'array', items: { type: 'string', minLength: 1, maxLength: 256, pattern: '^[\\x21\\x23-\\x5b\\x5d-\\x7e]+$' }, maxItems: 100 } as const;

export const AUTH_METHODS = ['client_secret_basic', 'client_secret_post', 'none'] as const;

export const PROVIDER_ID = { type: 'string', pattern: '^[a-z0-9][a-z0-9_.-]{0,62}$', description: 'Lowercase id, unique in the workspace.' } as const;

/** Writable provider fields; `client_secret` is write-only. */
const providerFields = {
  name: { type: 'string', minLength: 1, maxLength: 200 },
  client_id: { type: 'string', minLength: 1, maxLength: 1024 },
  client_secret: { type: ['string', 'null'], minLength: 1, maxLength: 4096, description: 'Write-only; never returned (see has_client_secret). null clears it.' },
  auth_url: httpUrl,
  token_url: httpUrl,
  revocation_url: { ...httpUrl, type: ['string', 'null'], description: 'RFC 7009 endpoint; without one, deleting a token only forgets it.' },
  uses_pkce: { type: 'boolean' },
  token_endpoint_auth_method: { type: 'string', enum: [...AUTH_METHODS] },
  scopes: { ...scopes, description: 'Default scopes when an authenticate call names none.' },
} as const;

export const providerCreateBody = {
  type: 'object',
  additionalProperties: false,
  required: ['provider_id', 'name', 'client_id', 'auth_url', 'token_url'],
  properties: {
    provider_id: PROVIDER_ID,
    ...providerFields,
    uses_pkce: { type: 'boolean', default: true },
    token_endpoint_auth_method: { type: 'string', enum: [...AUTH_METHODS], default: 'client_secret_basic' },
  },
} as const;

export const providerPatchBody = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: providerFields,
} as const;

export const providerRecord = {
  type: 'object',
  required: ['provider_id', 'name', 'client_id', 'has_client_secret', 'auth_url', 'token_url', 'revocation_url', 'uses_pkce', 'token_endpoint_auth_method', 'scopes', 'created_at', 'updated_at'],
  properties: {
    provider_id: { type: 'string' },
    name: { type: 'string' },
    client_id: { type: 'string' },
    has_client_secret: { type: 'boolean' },
    auth_url: { type: 'string' },
    token_url: { type: 'string' },
    revocation_url: { type: ['string', 'null'] },
    uses_pkce: { type: 'boolean' },
    token_endpoint_auth_method: { type: 'string' },
    scopes: { type: 'array', items: { type: 'string' } },
    created_at: { type: 'string' },
    updated_at: { type: 'string' },
  },
} as const;

export const providerParams = {
  type: 'object',
  required: ['provider_id'],
  properties: { provider_id: { type: 'string', minLength: 1, maxLength: 200 } },
} as const;

export const tokenParams = {
  type: 'object',
  required: ['token_id'],
  properties: { token_id: { type: 'string', pattern: UUID_PATTERN, description: 'Token id (a UUID).' } },
} as const;

export const tokenRecord = {
  type: 'object',
  required: ['id', 'provider_id', 'provider_account_label', 'scopes', 'expires_at', 'is_default', 'created_at', 'updated_at'],
  properties: {
    id: { type: 'string' },
    provider_id: { type: 'string' },
    provider_account_label: { type: ['string', 'null'] },
    scopes: { type: 'array', items: { type: 'string' } },
    expires_at: { type: ['string', 'null'] },
    is_default: { type: 'boolean' },
    created_at: { type: 'string' },
    updated_at: { type: 'string' },
  },
} as const;

export const tokenMetadataBody = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: {
    provider_account_label: { type: ['string', 'null'], maxLength: 200 },
    is_default: { type: 'boolean' },
  },
} as const;

export const authenticateBody = {
  type: 'object',
  additionalProperties: false,
  required: ['provider'],
  properties: {
    provider: { type: 'string', minLength: 1, maxLength: 200, description: 'provider_id of a registered provider.' },
    scopes: { ...scopes, default: [] },
  },
} as const;

export const authenticateResponse = {
  type: 'object',
  required: ['status'],
  properties: {
    status: { type: 'string', enum: ['pending', 'completed'] },
    url: { type: 'string' },
    auth_id: { type: 'string' },
    token_id: { type: 'string' },
  },
} as const;

export const waitResponse = {
  type: 'object',
  required: ['status'],
  properties: {
    status: { type: 'string', enum: ['completed', 'pending', 'timeout', 'not_found', 'failed'] },
    token_id: { type: 'string' },
  },
} as const;

export const errorResponse = {
  type: 'object',
  required: ['detail'],
  properties: { detail: { type: 'string' } },
} as const;
