import type { FastifyInstance } from 'fastify';
import type { Db } from '../store/db.js';
import { principalOf } from './auth.js';
import { notFound } from './errors.js';

const TAGS = ['API keys'];
const UUID_PATTERN = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
const detail = { type: 'object', required: ['detail'], properties: { detail: { type: 'string' } } } as const;
const keyRecord = {
  type: 'object',
  required: ['id', 'name', 'key_prefix', 'created_at', 'last_used_at', 'current'],
  properties: {
    id: { type: 'string' },
    name: { type: 'string' },
    key_prefix: { type: 'string', description: 'The first characters of the key, to recognise it; never the key.' },
    created_at: { type: 'string' },
    last_used_at: { type: ['string', 'null'] },
    current: { type: 'boolean', description: 'True for the key this request was made with.' },
  },
} as const;

/**
 * The caller's own API keys (`/api/v1/api-key`): listed by id and prefix, never the key; deleted
 * one by one. Only keys of the calling user in the calling workspace are visible or deletable:
 * anyone else's key is answered like one that does not exist (404). A deleted key stops working
 * at once, also for the streams opened with it (they end at their next heartbeat).
 */
export function registerApiKeyRoutes(app: FastifyInstance, db: Db): void {
  app.get('/api/v1/api-key', { schema: { summary: "List the caller's API keys (never the keys themselves)", tags: TAGS, response: { 200: { type: 'array', items: keyRecord } } } }, async (req) => {
    const p = principalOf(req);
    const rows = await db.all<{ id: string; name: string; key_prefix: string; created_at: string; last_used_at: string | null }>(
      'SELECT id, name, key_prefix, created_at, last_used_at FROM api_keys WHERE workspace_id = ? AND user_id = ? ORDER BY created_at, id',
      [p.workspaceId, p.userId],
    );
    return rows.map((r) => ({ ...r, current: r.id === p.keyId }));
  });

  app.delete<{ Params: { api_key_id: string } }>(
    '/api/v1/api-key/:api_key_id',
    {
      schema: {
        summary: 'Delete one of the caller\'s API keys',
        tags: TAGS,
        params: { type: 'object', required: ['api_key_id'], properties: { api_key_id: { type: 'string', pattern: UUID_PATTERN } } },
        response: { 204: { type: 'null' }, 404: detail },
      },
    },
    async (req, reply) => {
      const p = principalOf(req);
      const id = req.params.api_key_id.toLowerCase();
      const gone = await db.run('DELETE FROM api_keys WHERE id = ? AND workspace_id = ? AND user_id = ?', [id, p.workspaceId, p.userId]);
      if (!gone.changes) throw notFound(`API key ${req.params.api_key_id} not found.`);
      req.log.info({ api_key_id: id }, 'API key deleted');
      return reply.status(204).send();
    },
  );
}
