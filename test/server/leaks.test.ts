// `keygate serve`'s request log lines name the method and the path, never the query string: a
// query can carry a code or a token (an OAuth redirect that missed its route, a client that put its
// key in the URL). The real binary, real requests, its real output.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';

const KEY = 'kg_serve_leak_test_key_0123456789';
let server: RunningCli;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-serve-leaks-'));
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dir], { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_LOG_FLUSH_MS: '0' } });
});
afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('request log lines', () => {
  it('keep the path and drop the query string, on known, unknown and refused routes', async () => {
    const secrets = ['qcode-' + 'a1'.repeat(10), 'qtoken-' + 'b2'.repeat(10), 'qkey-' + 'c3'.repeat(10)];
    const answers = [
      await fetch(`${server.url}/v2/deployments?limit=5&access_token=${secrets[0]}`, { headers: { 'x-api-key': KEY } }),
      // The OAuth redirect with a trailing slash: no route, so no route-level log setting applies.
      await fetch(`${server.url}/v2/auth/callback/oidc/?code=${secrets[1]}&state=s`),
      await fetch(`${server.url}/v2/deployments?api_key=${secrets[2]}`),
    ];
    expect(answers.map((r) => r.status)).toEqual([200, 404, 401]);
    await Promise.all(answers.map((r) => r.text()));
    await expect.poll(() => server.output(), { timeout: 5000 }).toContain('"url":"/v2/auth/callback/oidc/"');
    const out = server.output();
    expect(out).toContain('"url":"/v2/deployments"');
    for (const s of secrets) expect(out).not.toContain(s);
  });
});
