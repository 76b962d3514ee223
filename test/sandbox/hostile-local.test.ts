/**
 * Local driver, an attacker inside a real box reading what the box's own /proc shows of the host
 * (sandbox.md, property 3): bwrap's init is pid 1 in the box and its environment and command line
 * are readable there, so they must hold nothing of the server (its working directory included,
 * which is often the data directory or a checkout).
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { cleanupTmp, localProbe, run, RUN_DIR, spec, TMP } from './local-helpers.js';

const probe = await localProbe();

describe.skipIf(!probe.ok)(`local driver: what pid 1 shows a box (${probe.why})`, () => {
  let driver: LocalDriver;
  let box: Box;
  const serverCwd = process.cwd();
  const cwdMarker = path.join(TMP, 'server-cwd-kg-marker');

  beforeAll(async () => {
    // The server runs from a directory whose name a box must never learn.
    mkdirSync(cwdMarker, { recursive: true });
    process.chdir(cwdMarker);
    driver = new LocalDriver({ runDir: RUN_DIR });
    box = await driver.start(spec({ id: 'hostile-pid1' }));
  });

  afterAll(async () => {
    process.chdir(serverCwd);
    await driver?.close();
    cleanupTmp();
  });

  it("no process visible in the box has the server's working directory or any host path in its environment or command line", async () => {
    const r = await run(box, ['sh', '-c', 'for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null | tr "\\0" "\\n"; done']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toContain('bwrap'); // pid 1 was read: the test looks at the real thing
    expect(r.stdout).not.toContain('kg-marker');
    expect(r.stdout).not.toContain(TMP);
    expect(r.stdout).not.toContain(serverCwd);
  });
});
