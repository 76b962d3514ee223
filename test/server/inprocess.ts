// The whole server (every area) built in-process, listening on loopback, with a key of the default
// workspace and one of a second workspace. The sandbox area runs on the driver given (default
// `none`: records and proxies, no boxes).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { areasWith } from '../../src/cli/serve.js';
import { createLogger } from '../../src/log.js';
import { NoneDriver } from '../../src/sandbox/none.js';
import type { SandboxDriver } from '../../src/sandbox/driver.js';
import { createApiKey } from '../../src/server/auth.js';
import { buildServer, type BuiltServer } from '../../src/server/app.js';

export interface InProcessServer {
  built: BuiltServer;
  url: string;
  dataDir: string;
  /** A key of the default workspace (user admin). */
  key: string;
  /** A key of the workspace team-b (user bob). */
  keyB: string;
  /** What the server logged, one JSON line each. */
  lines: string[];
  close(): Promise<void>;
}

export async function startInProcess(opts: { env?: NodeJS.ProcessEnv; driver?: SandboxDriver; configDir?: string } = {}): Promise<InProcessServer> {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'kg-inproc-'));
  const key = 'kg_inprocess_key_' + 'a'.repeat(24);
  const lines: string[] = [];
  const logger = createLogger({ destination: { write: (l: string) => void lines.push(l) } });
  const built = await buildServer({
    dataDir,
    logger,
    configDir: opts.configDir,
    env: { KEYGATE_API_KEY: key, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock', ...opts.env },
    areas: await areasWith({ driver: opts.driver ?? new NoneDriver(), why: 'test' }),
  });
  const url = await built.listen('127.0.0.1', 0);
  const keyB = (await createApiKey(built.ctx.db, { workspace: 'team-b', user: 'bob' })).key;
  return {
    built,
    url,
    dataDir,
    key,
    keyB,
    lines,
    async close() {
      await built.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
