/**
 * disk_mb where /workspace cannot be a file system of its own (a server that is not root; forced
 * here with `workspaceFs: false`): the disk watch measures the workspace and stops a box that
 * holds more, with the reason the service records. Real boxes, both drivers.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { Box, SandboxDriver } from '../../src/sandbox/driver.js';
import { DockerBoxDriver } from '../../src/sandbox/docker.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { announceSkip } from '../helpers/docker-engine.js';
import { bareSpec, bothDrivers } from './both-drivers.js';
import { run } from './local-helpers.js';

const TMP = mkdtempSync(path.join(os.tmpdir(), 'kg-disk-watch-'));
const SCOPE = `keygate-test-diskwatch-${randomBytes(3).toString('hex')}`;

afterAll(() => rmSync(TMP, { recursive: true, force: true }));

async function ended(box: Box, ms: number): Promise<boolean> {
  return Promise.race([box.ended.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);
}

describe.each(await bothDrivers())('disk watch (%s driver, no sized file system)', (which, why) => {
  const skip = announceSkip(`disk watch tests (${which})`, why);
  describe.skipIf(skip)(which, () => {
    let driver: SandboxDriver;
    let n = 0;
    const spec = (diskMb: number) => bareSpec(which, `dw${process.pid}-${++n}`, TMP, { disk_mb: diskMb });

    afterAll(async () => {
      await driver?.close();
    });

    it('a box that writes past disk_mb is stopped, saying so; one that stays under it runs on', async () => {
      driver = which === 'local' ? new LocalDriver({ runDir: path.join(TMP, 'run'), workspaceFs: false }) : new DockerBoxDriver({ scope: SCOPE, workspaceFs: false });
      const small = await spec(16);
      const box = await driver.start(small);
      const calmSpec = await spec(16);
      const calm = await driver.start(calmSpec);
      try {
        expect((await run(box, 'head -c 8388608 /dev/zero >/workspace/a && echo ok')).stdout).toBe('ok\n');
        expect(await ended(box, 5000)).toBe(false);
        await run(box, 'head -c 16777216 /dev/zero >/workspace/b; echo done');
        expect(await ended(box, 15_000)).toBe(true);
        expect(box.endReason).toMatch(/more than disk_mb 16/);
        // The other box, under its size, is left alone.
        expect((await run(calm, 'echo alive')).stdout).toBe('alive\n');
      } finally {
        await driver.destroy(small.id, small.stateDir);
        await driver.destroy(calmSpec.id, calmSpec.stateDir);
      }
    }, 60_000);

    it('a directory the box hides from the watch does not hide its size', async () => {
      const s = await spec(16);
      const box = await driver.start(s);
      try {
        await run(box, 'mkdir /workspace/h && head -c 20971520 /dev/zero >/workspace/h/x; chmod 000 /workspace/h; echo done');
        expect(await ended(box, 15_000)).toBe(true);
        // local: the watch (the box's own user) cannot read it: stopped for that; docker: the watch reads it anyway.
        expect(box.endReason).toMatch(/disk_mb 16/);
      } finally {
        await driver.destroy(s.id, s.stateDir);
      }
    }, 60_000);
  });
});
