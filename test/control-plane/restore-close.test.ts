// A `keygate serve` stopped while it is still restoring deployments (SIGTERM right after it
// listens, the restore running in the background) stops what the restore started, keeps the
// database open until the restore has let go of it, and leaves no application process behind.
// A real serve, real app processes, a real SQLite file.
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { api, appProcessesUnder, cleanupTmp, deployDir, echoVariant, runStream, tmpDir, waitRevision } from './helpers.js';

const KEY = 'kg_test_control_plane_key_restore_close';
const env = { KEYGATE_API_KEY: KEY, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock', KEYGATE_STOP_GRACE_MS: '2000' };
afterAll(cleanupTmp);

describe('a stop during the restore', () => {
  let server: RunningCli | undefined;
  afterAll(async () => {
    await server?.stop();
  });

  it('stops the replicas the restore was starting and logs no error', async () => {
    const dataDir = tmpDir();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env });
    const a = api(server.url, KEY);
    const dep = await deployDir(a, 'restore-close', echoVariant(), { source_config: { deployment_type: 'prod' } });
    expect((await waitRevision(a, dep.id, dep.latest_revision_id)).status).toBe('DEPLOYED');
    expect((await runStream(dep.url, KEY, 'before')).status).toBe(200);
    const depDir = path.join(dataDir, 'deployments', dep.id);
    expect(await server.stop()).toBe(0);
    server = undefined;
    expect(appProcessesUnder(depDir)).toEqual([]);

    for (let i = 0; i < 3; i++) {
      const again = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env });
      // Stopped at once: the restore is reaping, attaching the router or starting replicas.
      await new Promise((r) => setTimeout(r, i * 150));
      expect(await again.stop()).toBe(0);
      const errors = again.output().split('\n').filter((l) => /"level":(50|60)/.test(l));
      expect(errors).toEqual([]);
      // Time for a replica started after the stop to show up, had one been.
      await new Promise((r) => setTimeout(r, 1500));
      expect(appProcessesUnder(depDir)).toEqual([]);
    }
  });
});
