import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli, startCli } from '../helpers/cli.js';

// `keygate serve --sandbox-driver`: says which driver it uses; a driver asked for that cannot
// isolate stops the server with the reason (sandbox.md, property 2: fail closed).

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kg-drv-'));
  dirs.push(d);
  return d;
};
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** A PATH with the tools a server may call but no bubblewrap. */
function pathWithoutBwrap(): string {
  const bin = tmp();
  for (const tool of ['sh', 'nsenter', 'setpriv', 'prlimit', 'keytool']) {
    for (const dir of (process.env.PATH ?? '').split(':')) {
      try {
        symlinkSync(path.join(dir, tool), path.join(bin, tool));
        break;
      } catch {
        /* not there */
      }
    }
  }
  return bin;
}

const base = { DATABASE_URL: '', KEYGATE_API_KEY: 'driver-test-key-0123456789', KEYGATE_SANDBOX_DRIVER: '' };

describe('keygate serve --sandbox-driver', () => {
  it('local asked for without bubblewrap: refuses to start, says what is missing', () => {
    const r = runCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'local'], { env: { ...base, PATH: pathWithoutBwrap() } });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^keygate: sandbox driver "local" cannot isolate boxes here: .*(bwrap|bubblewrap)/m);
    expect(r.stderr).toMatch(/apt-get install bubblewrap/);
  });

  it('docker asked for with no engine: refuses to start', () => {
    const r = runCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'docker'], { env: { ...base, DOCKER_HOST: `unix://${tmp()}/no.sock` } });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/sandbox driver "docker" cannot isolate boxes here/);
  });

  it('an unknown name is refused', () => {
    const r = runCli(['serve', '--data', tmp(), '--sandbox-driver', 'vm'], { env: base });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/unknown sandbox driver 'vm'; use one of local, docker, none/);
  });

  it('not given, with neither bubblewrap nor an engine: none, saying boxes are not isolated and how to get real ones', async () => {
    const s = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp()], {
      env: { ...base, PATH: pathWithoutBwrap(), DOCKER_HOST: `unix://${tmp()}/no.sock` },
      ready: /(sandbox driver none: .*)\n/,
    });
    try {
      expect(s.address).toMatch(/NOT isolated/);
      expect(s.address).toMatch(/apt-get install bubblewrap/);
      expect(s.output()).toMatch(/listening on/);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  });
});
