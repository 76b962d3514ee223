/**
 * An execution asked for while its box is going (a stop that went first, its container removed
 * behind the driver's back) is refused as BoxNotRunningError, which the API answers 409: never a
 * bare error (a 500). Real boxes, both drivers.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DockerEngine } from '../../src/docker/engine.js';
import { BoxNotRunningError, type SandboxDriver } from '../../src/sandbox/driver.js';
import { DockerBoxDriver } from '../../src/sandbox/docker.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { announceSkip, dockerSocket } from '../helpers/docker-engine.js';
import { bareSpec, bothDrivers } from './both-drivers.js';

const TMP = mkdtempSync(path.join(os.tmpdir(), 'kg-exec-race-'));
const SCOPE = `keygate-test-execrace-${randomBytes(3).toString('hex')}`;

afterAll(() => rmSync(TMP, { recursive: true, force: true }));

describe.each(await bothDrivers())('executions racing a stop (%s driver)', (which, why) => {
  const skip = announceSkip(`exec race tests (${which})`, why);
  describe.skipIf(skip)(which, () => {
    let driver: SandboxDriver;
    let n = 0;
    const spec = () => bareSpec(which, `er${process.pid}-${++n}`, TMP, { disk_mb: 32 });
    afterAll(async () => {
      await driver?.close();
    });

    it('an execution started once a stop has begun is refused as BoxNotRunningError', async () => {
      driver = which === 'local' ? new LocalDriver({ runDir: path.join(TMP, 'run') }) : new DockerBoxDriver({ scope: SCOPE });
      const s = await spec();
      const box = await driver.start(s);
      const stopping = box.stop();
      await expect(box.exec({ command: 'true' })).rejects.toBeInstanceOf(BoxNotRunningError);
      await stopping;
      await expect(box.exec({ command: 'true' })).rejects.toBeInstanceOf(BoxNotRunningError);
      await driver.destroy(s.id, s.stateDir);
    }, 60_000);

    it.skipIf(which !== 'docker')('docker: an execution in a container removed under it is refused as BoxNotRunningError', async () => {
      const s = await spec();
      const box = await driver.start(s);
      const engine = new DockerEngine(dockerSocket()!);
      const list = await engine.json<{ Id: string }[]>('GET', `/containers/json?filters=${encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox=${s.id}`] }))}`);
      expect(list.body).toHaveLength(1);
      // Removed behind the driver's back: the driver learns of it only when the engine says so.
      await engine.json('DELETE', `/containers/${list.body[0].Id}?force=1`);
      await expect(box.exec({ command: 'true' })).rejects.toBeInstanceOf(BoxNotRunningError);
      await engine.close();
      await driver.destroy(s.id, s.stateDir);
    }, 60_000);
  });
});
