// Every sandbox proxy listens on the host's loopback. A box must not be able to use its own proxy
// to reach keygate's API or another sandbox's proxy (which would inject that sandbox's secrets).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { connectTunnel } from '../helpers/connect.js';
import { api, cleanTmp, tmp } from './helpers.js';

const KEY = 'isolation-test-key-0123456789';
let dataDir: string;
let server: RunningCli;
const env = { KEYGATE_API_KEY: KEY, DATABASE_URL: '' };

const start = () => startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], { env });
const portOf = (url: string) => Number(new URL(url).port);

async function createBox(name: string): Promise<number> {
  const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes', {
    template_name: 'python-3.12',
    name,
    wait_for_ready: true,
    proxy_config: { rules: [{ name: 'other', match_hosts: ['api.other.test'], headers: [{ name: 'Authorization', type: 'plaintext', value: `Bearer for-${name}` }] }] },
  });
  expect(r.status).toBe(201);
  return portOf(r.body.proxy.url);
}

async function expectRefused(proxyPort: number, authority: string) {
  const c = await connectTunnel(proxyPort, authority);
  c.socket.destroy();
  expect(c.status, `CONNECT ${authority} through :${proxyPort}`).toBe(403);
}

beforeAll(async () => {
  dataDir = tmp();
  server = await start();
});
afterAll(async () => {
  await server?.stop();
  cleanTmp();
});

describe('sandbox proxies are isolated from each other and from the API', () => {
  it('refuses tunnels to another sandbox proxy, in both directions, and to the API server', async () => {
    const a = await createBox('box-a');
    const b = await createBox('box-b');
    const apiPort = portOf(server.url);
    await expectRefused(a, `127.0.0.1:${b}`);
    await expectRefused(b, `127.0.0.1:${a}`);
    await expectRefused(a, `localhost:${b}`);
    await expectRefused(a, `127.0.0.1:${apiPort}`);
    await expectRefused(b, `localhost:${apiPort}`);
  });

  it('keeps refusing after a restart, when the proxies come back before the API listens', async () => {
    await server.stop();
    server = await start();
    const list = await api(server.url, KEY, 'GET', '/api/v2/sandboxes/boxes');
    const ports = Object.fromEntries(list.body.resources.map((s: { name: string; proxy: { url: string } }) => [s.name, portOf(s.proxy.url)]));
    await expectRefused(ports['box-a'], `127.0.0.1:${ports['box-b']}`);
    await expectRefused(ports['box-a'], `127.0.0.1:${portOf(server.url)}`);
  });
});
