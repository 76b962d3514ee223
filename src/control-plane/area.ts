import path from 'node:path';
import type { Area } from '../server/area.js';
import { DockerDriver } from './drivers/docker.js';
import { LocalProcessDriver } from './drivers/local.js';
import { LogStore } from './logs.js';
import { ReplicaRecords } from './orphans.js';
import { ControlPlaneManager } from './manager.js';
import { registerRoutes } from './routes.js';
import { ControlPlaneStore, migrateControlPlane } from './store.js';
import { intSetting, switchSetting } from '../settings.js';
import { tarLimitsFromEnv } from './tarball.js';
import { loggableMessage } from '../server/errors.js';
import { streamHeartbeatMs } from '../server/streams.js';

/**
 * The deployment control plane (`/v2/uploads`, `/v2/deployments...`): its tables, routes, and the
 * runtime that builds and runs revisions (restored when the server starts, stopped when it closes).
 */
export const controlPlaneArea: Area = {
  name: 'control-plane',
  async register(app, ctx) {
    await migrateControlPlane(ctx.db);
    const env = ctx.env;
    const tarLimits = tarLimitsFromEnv(env);
    // Timeouts: at least 1 ms, at most a day (a setTimeout past 2^31 ms fires at once).
    const ms = { min: 1, max: 86_400_000, unit: 'milliseconds' };
    const store = new ControlPlaneStore(ctx.db);
    const logs = new LogStore(ctx.db);
    const manager = new ControlPlaneManager(
      ctx,
      store,
      logs,
      {
        local: new LocalProcessDriver({
          dataDir: ctx.dataDir,
          limits: tarLimits,
          buildTimeoutMs: intSetting(env, 'KEYGATE_BUILD_TIMEOUT_MS', 600_000, ms),
          allowInstallScripts: switchSetting(env, 'KEYGATE_BUILD_INSTALL_SCRIPTS') === true,
          records: new ReplicaRecords(path.join(ctx.dataDir, 'run', 'replicas'), (level, msg, fields) => ctx.logger[level]({ ...fields }, msg)),
        }),
        docker: new DockerDriver(env, (level, msg, fields) => ctx.logger[level]({ ...fields }, msg)),
      },
      {
        host: env.KEYGATE_DEPLOYMENT_HOST || '127.0.0.1',
        buildConcurrency: intSetting(env, 'KEYGATE_BUILD_CONCURRENCY', 2, { min: 1, max: 64 }),
        deployTimeoutMs: intSetting(env, 'KEYGATE_DEPLOY_TIMEOUT_MS', 60_000, ms),
        drainTimeoutMs: intSetting(env, 'KEYGATE_DRAIN_TIMEOUT_MS', 30_000, ms),
        stopGraceMs: intSetting(env, 'KEYGATE_STOP_GRACE_MS', 10_000, ms),
      },
    );
    registerRoutes(app, ctx, store, manager, { maxUploadBytes: intSetting(env, 'KEYGATE_MAX_UPLOAD_BYTES', 100 * 1024 * 1024, { min: 1, unit: 'bytes' }), tarLimits, heartbeatMs: streamHeartbeatMs(env) });
    // Restoring starts processes and health-checks them: it runs in the background, so the API
    // answers at once (restored deployments report their revisions as they come back).
    app.addHook('onReady', async () => {
      void manager.restore().catch((err: Error) => ctx.logger.error({ err: { message: loggableMessage(err) } }, 'control plane restore failed'));
    });
    app.addHook('onClose', async () => {
      await manager.close();
    });
  },
};
