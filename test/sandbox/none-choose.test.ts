/**
 * The `none` driver (a record plus a proxy: code runs elsewhere, and it says so) and the choice of
 * driver (sandbox.md, "Choosing"), with real drivers: a LocalDriver that works here, one pointed at a
 * bubblewrap that is not installed, and the NoneDriver. The docker slot is filled by another real
 * driver (this branch does not import the docker one); the choice only sees probes.
 */
import { mkdirSync, existsSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import { chooseDriver, DriverUnusableError } from '../../src/sandbox/choose.js';
import { BoxFileError } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { NoneDriver } from '../../src/sandbox/none.js';
import { cleanupTmp, localProbe, spec, TMP } from './local-helpers.js';

const local = await localProbe();
afterAll(() => cleanupTmp());

const working = () => new LocalDriver({ runDir: path.join(TMP, 'run-ok') });
const missing = () => new LocalDriver({ runDir: path.join(TMP, 'run-missing'), bwrap: path.join(TMP, 'no-bwrap') });
const none = () => new NoneDriver();

describe('none driver', () => {
  it('starts a record-only box whose executions and files say it runs elsewhere; destroy removes its state', async () => {
    const d = new NoneDriver();
    expect(await d.probe()).toMatchObject({ ok: true });
    const s = spec();
    mkdirSync(s.stateDir, { recursive: true });
    const box = await d.start(s);
    expect(box.id).toBe(s.id);
    await expect(box.exec({ command: 'true' })).rejects.toThrow(/runs elsewhere \(driver "none"\)/);
    const r = await box.readFile('/workspace/x', 10).catch((e: unknown) => e);
    expect(r).toBeInstanceOf(BoxFileError);
    expect((r as BoxFileError).kind).toBe('not_running');
    await expect(box.writeFile('/workspace/x', Readable.from([]), 10)).rejects.toThrow(/runs elsewhere/);
    await box.stop();
    await d.destroy(s.id, s.stateDir);
    expect(existsSync(s.stateDir)).toBe(false);
  });
});

describe('chooseDriver', () => {
  it('asked for and unusable: refuses with the reason and the fix', async () => {
    const e = await chooseDriver('local', { local: missing, docker: missing, none }).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(DriverUnusableError);
    expect((e as Error).message).toBe('sandbox driver "local" cannot isolate boxes here: bubblewrap (bwrap) is not installed (install bubblewrap (apt-get install bubblewrap))');
    await expect(chooseDriver('docker', { local: working, none })).rejects.toThrow(/"docker" is not available/);
  });

  it('asked for none: none, saying so', async () => {
    const c = await chooseDriver('none', { local: working, docker: missing, none });
    expect(c.driver.name).toBe('none');
    expect(c.why).toMatch(/^sandbox driver none \(asked for\): no isolation/);
  });

  it.skipIf(!local.ok)('not asked: local when it works here', async () => {
    const c = await chooseDriver(undefined, { local: working, docker: missing, none });
    expect(c.driver.name).toBe('local');
    expect(c.why).toMatch(/^sandbox driver local: bubblewrap/);
    await c.driver.close();
  });

  it.skipIf(!local.ok)('not asked, local unusable: the docker slot when it answers', async () => {
    const c = await chooseDriver(undefined, { local: missing, docker: working, none });
    expect(c.driver).toBeInstanceOf(LocalDriver);
    expect(c.why).toMatch(/^sandbox driver docker: /);
    await c.driver.close();
  });

  it('neither: none, saying boxes are not isolated, why, and how to get a real one', async () => {
    const c = await chooseDriver(undefined, { local: missing, docker: missing, none });
    expect(c.driver.name).toBe('none');
    expect(c.why).toMatch(/boxes are NOT isolated/);
    expect(c.why).toMatch(/local: bubblewrap \(bwrap\) is not installed \(install bubblewrap \(apt-get install bubblewrap\)\)/);
    expect(c.why).toMatch(/docker: /);
  });
});
