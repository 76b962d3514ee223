/**
 * Restart with many boxes (issue #16, "Restart and scale"): `keygate serve` answers at once while
 * it brings the boxes back in the background; a box reads `provisioning` until its proxy is back,
 * and `ready` only once it is. The store is a real SQLite database under the data directory,
 * filled before the server starts; the server is the built CLI (`npm run build` first). How fast
 * it answers is measured by scripts/sandbox-measure.mjs, not here.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, describe, expect, it } from 'vitest';
import { SandboxStore } from '../../src/sandbox-api/storage.js';
import { DEFAULT_WORKSPACE_ID } from '../../src/server/auth.js';
import { openDb } from '../../src/store/db.js';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { api, cleanTmp, portAccepts, tmp, waitFor } from './helpers.js';

const KEY = 'restore-key-0123456789abcdef';
const BOXES = 200;
/** Every 50th box was stopped: it stays stopped, with no proxy. */
const stoppedAt = (i: number) => i % 50 === 49;
const index = (b: { name: string }) => Number(b.name.slice(1));

let server: RunningCli | undefined;
afterAll(async () => {
  await server?.stop();
  cleanTmp();
});

interface BoxView {
  name: string;
  status: string;
  proxy: { url: string | null };
}

async function allBoxes(url: string): Promise<BoxView[]> {
  const out: BoxView[] = [];
  for (let offset = 0; ; offset += 100) {
    const r = await api(url, KEY, 'GET', `/api/v2/sandboxes/boxes?limit=100&offset=${offset}`);
    expect(r.status).toBe(200);
    out.push(...r.body.resources);
    if (r.body.resources.length < 100) return out;
  }
}

describe('keygate serve restarting with many boxes in its store', () => {
  it('answers at once; boxes read provisioning until restored, then ready with their proxy up; stopped ones stay stopped', async () => {
    const dataDir = tmp();
    const db = await openDb({ dataDir, databaseUrl: '' });
    const store = new SandboxStore(db);
    await store.migrate();
    for (let i = 0; i < BOXES; i++) {
      await store.insert({
        id: randomUUID(),
        workspaceId: DEFAULT_WORKSPACE_ID,
        name: `r${i}`,
        templateName: 'node-22',
        status: stoppedAt(i) ? 'stopped' : 'ready',
        statusReason: null,
        proxyConfig: { rules: [{ name: 'r', match_hosts: [`r${i}.example.test`], headers: [{ name: 'X-Box', type: 'plaintext', value: `r${i}` }] }] },
        proxyPort: null,
        driver: 'none',
        idleTtlSeconds: 0,
        resources: null,
      });
    }
    await db.close();

    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '' } });
    // The first answer, as soon as the server says it listens: the restore is still under way.
    const first = await allBoxes(server.url);
    expect(first).toHaveLength(BOXES);
    const count = (boxes: BoxView[], status: string) => boxes.filter((b) => b.status === status).length;
    expect(count(first, 'provisioning')).toBeGreaterThan(0);
    expect(count(first, 'failed')).toBe(0);
    expect(first.filter((b) => b.status === 'stopped').map((b) => b.name)).toEqual(first.filter((b) => stoppedAt(index(b))).map((b) => b.name));
    // `ready` means restored: the proxy of every box that says so accepts connections.
    for (const b of first.filter((x) => x.status === 'ready')) expect(await portAccepts(Number(new URL(b.proxy.url!).port)), b.name).toBe(true);

    const last = await waitFor(async () => {
      const boxes = await allBoxes(server!.url);
      return count(boxes, 'provisioning') === 0 ? boxes : undefined;
    }, 'every box restored', 180_000);
    const stopped = last.filter((b) => stoppedAt(index(b)));
    const running = last.filter((b) => !stoppedAt(index(b)));
    expect(stopped.every((b) => b.status === 'stopped')).toBe(true);
    expect(running.every((b) => b.status === 'ready')).toBe(true);
    const ports = running.map((b) => Number(new URL(b.proxy.url!).port));
    expect(new Set(ports).size).toBe(running.length);
    for (const p of ports) expect(await portAccepts(p)).toBe(true);
    // The summary line follows the last restore; the logger writes in batches, so it may land
    // just after the API already shows every box ready (seen in CI): wait for it, bounded.
    await waitFor(async () => server!.output().includes('"msg":"sandboxes restored"') || undefined, 'the restore summary line', 10_000);
    expect(server.output()).toContain('"msg":"sandboxes restored"');
  }, 240_000);
});
