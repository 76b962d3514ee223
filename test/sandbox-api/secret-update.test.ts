// Setting a workspace secret to a value a sandbox's configuration cannot carry (CR/LF, a trailing
// newline from `cat token.txt`) is the caller's mistake: 422 at that value, naming the secret, the
// sandbox and the header, never the value; nothing is stored, and the sandbox keeps injecting the
// value it had. The real `keygate serve` (none driver) on SQLite, a real HTTPS origin, requests
// through the sandbox's own proxy.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { setUpServe } from './box-helpers.js';
import { api, cleanTmp, viaProxy } from './helpers.js';

const KEY = 'sandbox-secret-update-key-0123456789';
const ORIGIN_HOST = 'api.update.test';
const GOOD = 'ghp_good-' + 'g5'.repeat(10);
const OTHER = 'other-' + 'o7'.repeat(10);
const BAD = 'ghp_rotated-' + 'r8'.repeat(10);

let origin: EchoOrigin;
let server: RunningCli;
const A = (method: string, url: string, body?: unknown) => api(server.url, KEY, method, url, body);

beforeAll(async () => {
  let dataDir: string;
  let env: NodeJS.ProcessEnv;
  ({ origin, dataDir, env } = await setUpServe(KEY, ORIGIN_HOST));
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], { env });
});
afterAll(async () => {
  if (server) expect(await server.stop()).toBe(0);
  await origin?.close();
  cleanTmp();
});

describe('a secret update that would break a sandbox', () => {
  it('is refused with 422 naming secret, sandbox and header; nothing changes', async () => {
    expect((await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: GOOD }, { key: 'OTHER', value: OTHER }])).status).toBe(200);
    const created = await A('POST', '/api/v2/sandboxes/boxes', {
      template_name: 'host',
      name: 'keeps-working',
      wait_for_ready: true,
      proxy_config: { rules: [{ name: 'gh', match_hosts: [ORIGIN_HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GH_TOKEN}' }] }] },
    });
    expect(created.status, created.text).toBe(201);
    expect(created.body.status).toBe('ready');
    const box = created.body;
    const seen = async () => (await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, `https://${ORIGIN_HOST}:${origin.port}/x`)).body.headers.authorization;
    expect(await seen()).toBe(`Bearer ${GOOD}`);

    for (const value of [`${BAD}\n`, `${BAD}\r\nX-Injected: 1`]) {
      const r = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'OTHER', value: 'changed-too' }, { key: 'GH_TOKEN', value }]);
      expect(r.text).not.toContain(BAD);
      expect(r.status, r.text).toBe(422);
      expect(r.body.detail).toEqual([{ loc: ['body', 1, 'value'], msg: expect.stringMatching(/GH_TOKEN.*keeps-working.*Authorization|GH_TOKEN.*Authorization.*keeps-working/), type: 'value_error' }]);
    }
    // Nothing stored: the sandbox is ready and injects the value it had; OTHER was not changed either.
    expect((await A('GET', '/api/v2/sandboxes/boxes/keeps-working')).body.status).toBe('ready');
    expect(await seen()).toBe(`Bearer ${GOOD}`);
    const probe = await A('POST', '/api/v2/sandboxes/boxes', {
      template_name: 'host',
      name: 'probe-other',
      wait_for_ready: true,
      proxy_config: { rules: [{ name: 'o', match_hosts: [ORIGIN_HOST], headers: [{ name: 'X-Other', type: 'workspace_secret', value: '{OTHER}' }] }] },
    });
    expect(probe.status).toBe(201);
    expect((await viaProxy(probe.body.proxy.url, probe.body.proxy.ca_cert_pem, `https://${ORIGIN_HOST}:${origin.port}/x`)).body.headers['x-other']).toBe(OTHER);

    // A value the configuration can carry still goes through and reaches the proxy.
    const ok = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: `${GOOD}-2` }]);
    expect(ok.status, ok.text).toBe(200);
    expect(await seen()).toBe(`Bearer ${GOOD}-2`);
    expect(server.output()).not.toContain(BAD);
  });
});
