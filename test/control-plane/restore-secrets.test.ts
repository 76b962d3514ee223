// A restart of `keygate serve` restores each DEPLOYED revision with the secrets it was deployed
// with, or not at all: a revision whose sealed secrets the current master key cannot open is not
// started without them (an app may fall back to defaults it must never run with). A real serve,
// real app processes, the real SQLite file edited while the server is down.
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openSqlite } from '../../src/store/db.js';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { api, appProcessesUnder, cleanupTmp, deployDir, echoVariant, runStream, tmpDir, waitRevision } from './helpers.js';

const KEY = 'kg_test_control_plane_key_restore';
const env = { KEYGATE_API_KEY: KEY, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock', KEYGATE_STOP_GRACE_MS: '2000' };
afterAll(cleanupTmp);

describe('restore after a restart, secrets that cannot be opened', () => {
  let server: RunningCli | undefined;
  afterAll(async () => {
    await server?.stop();
  });

  it('leaves the revision down (503) with the reason in the deploy log, instead of starting it without its secrets', async () => {
    const dataDir = tmpDir();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env });
    let a = api(server.url, KEY);
    const dep = await deployDir(a, 'sealed-restore', echoVariant(), { secrets: [{ name: 'APP_TOKEN', value: 'restore-secret-' + 'k3'.repeat(8) }] });
    expect((await waitRevision(a, dep.id, dep.latest_revision_id)).status).toBe('DEPLOYED');
    expect((await runStream(dep.url, KEY, 'before')).status).toBe(200);
    const depDir = path.join(dataDir, 'deployments', dep.id);
    expect(await server.stop()).toBe(0);
    server = undefined;

    // What a master key that changed under the data looks like to the server: sealed values it cannot open.
    const db = await openSqlite(path.join(dataDir, 'keygate.db'));
    expect((await db.run('UPDATE cp_revisions SET secrets = ? WHERE id = ?', [JSON.stringify({ APP_TOKEN: 'v1.not-a-sealed-value' }), dep.latest_revision_id])).changes).toBe(1);
    await db.close();

    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env });
    a = api(server.url, KEY);
    let logs = '';
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline && !logs.includes('cannot be decrypted')) {
      logs = (await a.call('GET', `/v2/deployments/${dep.id}/logs?type=deploy&limit=1000`)).text;
      await new Promise((r) => setTimeout(r, 200));
    }
    // Time for a replica to have been started, had it been.
    await new Promise((r) => setTimeout(r, 2000));
    expect(appProcessesUnder(depDir)).toEqual([]);
    const run = await runStream(dep.url, KEY, 'after').catch(() => ({ status: 0 }));
    expect(run.status).not.toBe(200);
    expect(logs).toContain(`cannot restore revision ${dep.latest_revision_id}: its secrets cannot be decrypted`);
  });
});
