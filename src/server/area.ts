import type { FastifyInstance } from 'fastify';
import type { Authenticator } from './auth.js';
import type { ServerContext } from './context.js';

/** What an area gets to hook itself into `keygate serve`. */
export interface AreaHooks {
  /** Adds an authentication scheme, tried after `X-Api-Key`. */
  addAuthenticator(a: Authenticator): void;
}

/**
 * One area of `keygate serve` (sandbox API, control plane, auth service). `register` adds routes
 * (inside an encapsulated fastify plugin), runs its migrations, and restores what it runs (proxies,
 * application processes) once the server listens (fastify `onReady`/`onListen` hooks); its
 * `onClose` hooks stop them. Areas import this module, never src/server/plugins.ts (which imports
 * them): no cycle.
 */
export interface Area {
  name: string;
  register(app: FastifyInstance, ctx: ServerContext, hooks: AreaHooks): Promise<void>;
}
