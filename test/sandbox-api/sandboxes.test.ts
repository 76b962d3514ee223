import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { setUpServe } from './box-helpers.js';
import { api, cleanTmp, portAccepts, viaProxy, waitFor } from './helpers.js';

// The real `keygate serve` (spawned from dist/) on SQLite, a real HTTPS origin with its own CA,
// and requests from "inside the sandbox" through the proxy URL the API returned.

const KEY = 'sandbox-test-key-0123456789';
const SECRET_1 = 'ghp_first-secret-VALUE-1111';
const SECRET_2 = 'ghp_rotated-secret-VALUE-2222';
const OPAQUE = 'opaque-write-only-VALUE-3333';
const SECRET_CLI = 'ghp_from-the-cli-VALUE-6666';
const ORIGIN_HOST = 'api.example.test';

let origin: EchoOrigin;
let dataDir: string;
let server: RunningCli;
let keyB: string;
let env: NodeJS.ProcessEnv;
let earlierOutput = '';

const A = (method: string, url: string, body?: unknown) => api(server.url, KEY, method, url, body);
const B = (method: string, url: string, body?: unknown) => api(server.url, keyB, method, url, body);
const originUrl = (p: string) => `https://${ORIGIN_HOST}:${origin.port}${p}`;

function rules(authValue = 'Bearer {GH_TOKEN}') {
  return {
    no_proxy: ['localhost'],
    rules: [
      {
        name: 'example',
        match_hosts: [ORIGIN_HOST],
        match_paths: ['/api/*'],
        headers: [
          { name: 'Authorization', type: 'workspace_secret', value: authValue },
          { name: 'X-Opaque', type: 'opaque', value: OPAQUE },
          { name: 'X-Plain', type: 'plaintext', value: 'plain-1' },
        ],
      },
    ],
  };
}

/** No response may ever carry a secret or an opaque value. */
function expectClean(text: string) {
  expect(text).not.toContain(SECRET_1);
  expect(text).not.toContain(SECRET_2);
  expect(text).not.toContain(OPAQUE);
  expect(text).not.toContain(SECRET_CLI);
}

async function startServer() {
  return startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], { env });
}

beforeAll(async () => {
  ({ origin, dataDir, env, keyB } = await setUpServe(KEY, ORIGIN_HOST));
  server = await startServer();
});

afterAll(async () => {
  if (server) expect(await server.stop()).toBe(0);
  await origin?.close();
  cleanTmp();
});

describe('authentication', () => {
  it('401 without a key and with a wrong key, on every route', async () => {
    const routes: [string, string][] = [
      ['GET', '/api/v2/sandboxes/boxes'],
      ['POST', '/api/v2/sandboxes/boxes'],
      ['GET', '/api/v2/sandboxes/boxes/x'],
      ['PATCH', '/api/v2/sandboxes/boxes/x'],
      ['DELETE', '/api/v2/sandboxes/boxes/x'],
      ['GET', '/api/v2/sandboxes/templates'],
      ['GET', '/api/v1/workspaces/current/secrets'],
      ['POST', '/api/v1/workspaces/current/secrets'],
    ];
    for (const [method, url] of routes) {
      const body = method === 'POST' || method === 'PATCH' ? {} : undefined;
      const missing = await api(server.url, null, method, url, body);
      expect(missing.status, `${method} ${url}`).toBe(401);
      expect(missing.body.detail).toMatch(/X-Api-Key/);
      const wrong = await api(server.url, 'wrong-key-0123456789abcdef', method, url, body);
      expect(wrong.status, `${method} ${url}`).toBe(401);
      expect(wrong.body).toEqual({ detail: 'Invalid API key.' });
    }
  });
});

describe('workspace secrets', () => {
  it('sets secrets and lists names only, sorted', async () => {
    const r = await A('POST', '/api/v1/workspaces/current/secrets', [
      { key: 'GH_TOKEN', value: SECRET_1 },
      { key: 'A_OTHER', value: 'other-value' },
    ]);
    expect(r.status).toBe(200);
    expect(r.body).toEqual([{ key: 'A_OTHER' }, { key: 'GH_TOKEN' }]);
    const list = await A('GET', '/api/v1/workspaces/current/secrets');
    expect(list.body).toEqual([{ key: 'A_OTHER' }, { key: 'GH_TOKEN' }]);
    expectClean(list.text);
    expect(list.text).not.toContain('other-value');
  });

  it('422 with the loc of a bad key, a duplicate, a non-string value', async () => {
    const bad = await A('POST', '/api/v1/workspaces/current/secrets', [
      { key: 'OK', value: 'x' },
      { key: '9bad-key', value: 'x' },
    ]);
    expect(bad.status).toBe(422);
    expect(bad.body.detail).toEqual([expect.objectContaining({ loc: ['body', 1, 'key'], type: 'string_pattern_mismatch' })]);
    const dup = await A('POST', '/api/v1/workspaces/current/secrets', [
      { key: 'DUP', value: 'x' },
      { key: 'DUP', value: 'y' },
    ]);
    expect(dup.status).toBe(422);
    expect(dup.body.detail[0].loc).toEqual(['body', 1, 'key']);
    const num = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'N', value: 5 }]);
    expect(num.status).toBe(422);
    expect(num.body.detail[0].loc).toEqual(['body', 0, 'value']);
    const notArray = await A('POST', '/api/v1/workspaces/current/secrets', { key: 'N', value: 'x' });
    expect(notArray.status).toBe(422);
    expect(notArray.body.detail[0].loc).toEqual(['body']);
    // Nothing of the refused batches was stored.
    expect((await A('GET', '/api/v1/workspaces/current/secrets')).body).toEqual([{ key: 'A_OTHER' }, { key: 'GH_TOKEN' }]);
  });
});

describe('templates', () => {
  it('lists the shipped templates', async () => {
    const r = await A('GET', '/api/v2/sandboxes/templates');
    expect(r.status).toBe(200);
    expect(r.body.resources.map((t: { name: string }) => t.name)).toEqual(['host', 'python-3.12', 'node-22']);
    expect(r.body.resources[0]).toMatchObject({ rootfs: 'host', image: expect.any(String), environment: expect.any(Object), description: expect.any(String), drivers: ['local', 'docker', 'none'] });
    expect(r.body.resources[1].drivers).toEqual(['docker', 'none']);
    expect(r.body.driver).toBe('none');
  });
});

describe('sandboxes', () => {
  let box: any;

  it('201: creates a sandbox whose own proxy injects the secret into a real HTTPS request', async () => {
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'python-3.12', name: 'box-1', wait_for_ready: true, proxy_config: rules() });
    expect(r.status).toBe(201);
    expectClean(r.text);
    box = r.body;
    expect(box).toMatchObject({ name: 'box-1', template_name: 'python-3.12', driver: 'none', status: 'ready', status_reason: null, idle_ttl_seconds: 600 });
    expect(box.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(Date.parse(box.created_at)).not.toBeNaN();
    expect(Date.parse(box.updated_at)).not.toBeNaN();
    // Redacted: template kept, opaque value omitted, plaintext as stored.
    expect(box.proxy_config.rules[0].headers).toEqual([
      { name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GH_TOKEN}' },
      { name: 'X-Opaque', type: 'opaque' },
      { name: 'X-Plain', type: 'plaintext', value: 'plain-1' },
    ]);
    expect(box.proxy.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(box.proxy.ca_cert_pem).toBe(readFileSync(path.join(dataDir, 'ca', 'ca.pem'), 'utf8'));
    expect(box.proxy.ca_cert_pem).not.toContain('PRIVATE KEY');
    const sbxDir = path.join(dataDir, 'sandboxes', box.id);
    expect(box.proxy.env).toEqual({
      HTTPS_PROXY: box.proxy.url,
      HTTP_PROXY: box.proxy.url,
      https_proxy: box.proxy.url,
      http_proxy: box.proxy.url,
      NO_PROXY: 'localhost,127.0.0.1,::1',
      no_proxy: 'localhost,127.0.0.1,::1',
      NODE_EXTRA_CA_CERTS: path.join(sbxDir, 'ca.pem'),
      SSL_CERT_FILE: path.join(sbxDir, 'ca-bundle.pem'),
      REQUESTS_CA_BUNDLE: path.join(sbxDir, 'ca-bundle.pem'),
      CURL_CA_BUNDLE: path.join(sbxDir, 'ca-bundle.pem'),
      GIT_SSL_CAINFO: path.join(sbxDir, 'ca-bundle.pem'),
      NPM_CONFIG_CAFILE: path.join(sbxDir, 'ca-bundle.pem'),
      WSS_PROXY: box.proxy.url,
      WS_PROXY: box.proxy.url,
      NODE_USE_ENV_PROXY: '1',
    });
    expect(readFileSync(path.join(sbxDir, 'ca.pem'), 'utf8')).toBe(box.proxy.ca_cert_pem);
    expect(readFileSync(path.join(sbxDir, 'ca-bundle.pem'), 'utf8')).toContain(box.proxy.ca_cert_pem.trim());

    // The client's own Authorization is replaced, never doubled.
    const res = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user?x=1'), { authorization: 'Bearer client-chosen' });
    expect(res.status).toBe(200);
    expect(res.body.path).toBe('/api/user?x=1');
    expect(res.body.headers.authorization).toBe(`Bearer ${SECRET_1}`);
    expect(res.body.headers['x-opaque']).toBe(OPAQUE);
    expect(res.body.headers['x-plain']).toBe('plain-1');
    // A path outside match_paths gets nothing.
    const other = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/public'));
    expect(other.body.headers.authorization).toBeUndefined();
    expect(other.body.headers['x-opaque']).toBeUndefined();
  });

  it('409 on a name already used in the workspace', async () => {
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'box-1' });
    expect(r.status).toBe(409);
    expect(r.body).toEqual({ detail: "A sandbox named 'box-1' already exists in this workspace." });
  });

  it('422: schema error deep in proxy_config, with the exact loc', async () => {
    const cfg = rules();
    (cfg.rules[0] as any).match_hosts = [ORIGIN_HOST, 42];
    (cfg.rules[0].headers[1] as any).type = 'secret';
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'bad-schema', proxy_config: cfg });
    expect(r.status).toBe(422);
    expectClean(r.text);
    const locs = r.body.detail.map((d: any) => d.loc);
    expect(locs).toContainEqual(['body', 'proxy_config', 'rules', 0, 'match_hosts', 1]);
    expect(locs).toContainEqual(['body', 'proxy_config', 'rules', 0, 'headers', 1, 'type']);
    for (const d of r.body.detail) expect(Object.keys(d).sort()).toEqual(['loc', 'msg', 'type']);
  });

  it('422: semantic errors of proxy_config (bad host pattern, header value with CR LF) point into the body', async () => {
    const cfg = rules();
    cfg.rules[0].match_hosts = ['exa mple.com'];
    cfg.rules[0].headers[2].value = 'a\r\nInjected: yes';
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'bad-semantic', proxy_config: cfg });
    expect(r.status).toBe(422);
    const locs = r.body.detail.map((d: any) => d.loc);
    expect(locs).toContainEqual(['body', 'proxy_config', 'rules', 0, 'match_hosts', 0]);
    expect(locs).toContainEqual(['body', 'proxy_config', 'rules', 0, 'headers', 2, 'value']);
  });

  it('422: every missing secret reported at its header value, naming the key', async () => {
    const cfg = rules('token {NOPE_ONE} {GH_TOKEN} {NOPE_TWO}');
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'missing', proxy_config: cfg });
    expect(r.status).toBe(422);
    expectClean(r.text);
    expect(r.body.detail).toHaveLength(2);
    for (const [i, key] of ['NOPE_ONE', 'NOPE_TWO'].entries()) {
      expect(r.body.detail[i].loc).toEqual(['body', 'proxy_config', 'rules', 0, 'headers', 0, 'value']);
      expect(r.body.detail[i].msg).toContain(`'${key}'`);
    }
    expect((await A('GET', '/api/v2/sandboxes/boxes/missing')).status).toBe(404);
  });

  it('422: unknown template on template_name; bad name on name; wrong types not coerced', async () => {
    const t = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'cobol-85', name: 'ok-name' });
    expect(t.status).toBe(422);
    expect(t.body.detail).toEqual([{ loc: ['body', 'template_name'], msg: expect.stringContaining("Unknown template 'cobol-85'"), type: 'value_error' }]);
    for (const name of ['Upper', '-lead', 'trail-', 'a'.repeat(64), 'under_score', '']) {
      const n = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name });
      expect(n.status, name).toBe(422);
      expect(n.body.detail[0].loc).toEqual(['body', 'name']);
    }
    const w = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'typed', wait_for_ready: 'true' });
    expect(w.status).toBe(422);
    expect(w.body.detail[0].loc).toEqual(['body', 'wait_for_ready']);
    const missing = await A('POST', '/api/v2/sandboxes/boxes', { name: 'typed' });
    expect(missing.body.detail).toEqual([{ loc: ['body', 'template_name'], msg: 'Field required', type: 'missing' }]);
    const extra = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'typed', colour: 'red' });
    expect(extra.body.detail[0].loc).toEqual(['body', 'colour']);
  });

  it('422: an opaque value that looks encrypted is refused (no decrypt-and-send oracle)', async () => {
    const cfg = rules();
    cfg.rules[0].headers[1].value = 'kg1.0123abcd.AAAAAAAAAAAAAAAA.BBBB';
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'sealed', proxy_config: cfg });
    expect(r.status).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['body', 'proxy_config', 'rules', 0, 'headers', 1, 'value']);
  });

  it('GET one and the list: redacted, nothing resolved; 404 for an unknown name', async () => {
    const one = await A('GET', '/api/v2/sandboxes/boxes/box-1');
    expect(one.status).toBe(200);
    expectClean(one.text);
    expect(one.body).toMatchObject({ id: box.id, name: 'box-1', status: 'ready', proxy: { url: box.proxy.url } });
    expect(one.body.proxy_config.rules[0].headers[1]).toEqual({ name: 'X-Opaque', type: 'opaque' });
    const list = await A('GET', '/api/v2/sandboxes/boxes');
    expect(list.status).toBe(200);
    expectClean(list.text);
    expect(list.body.resources.map((b: any) => b.name)).toEqual(['box-1']);
    const missing = await A('GET', '/api/v2/sandboxes/boxes/nothing');
    expect(missing.status).toBe(404);
    expect(missing.body).toEqual({ detail: "Sandbox 'nothing' not found." });
  });

  it('PATCH takes effect live on the running proxy (same port, next request)', async () => {
    const cfg = rules('token {GH_TOKEN}');
    cfg.rules[0].headers[2].value = 'plain-2';
    const r = await A('PATCH', '/api/v2/sandboxes/boxes/box-1', { proxy_config: cfg });
    expect(r.status).toBe(200);
    expectClean(r.text);
    expect(r.body.proxy.url).toBe(box.proxy.url);
    expect(r.body.proxy_config.rules[0].headers[0].value).toBe('token {GH_TOKEN}');
    expect(r.body.proxy_config.rules[0].headers[1]).toEqual({ name: 'X-Opaque', type: 'opaque' });
    const res = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user'));
    expect(res.body.headers.authorization).toBe(`token ${SECRET_1}`);
    expect(res.body.headers['x-plain']).toBe('plain-2');
    expect(res.body.headers['x-opaque']).toBe(OPAQUE);
  });

  it('PATCH validates like a create (422 loc, missing secret) and 404s an unknown sandbox', async () => {
    const bad = await A('PATCH', '/api/v2/sandboxes/boxes/box-1', { proxy_config: rules('Bearer {ABSENT}') });
    expect(bad.status).toBe(422);
    expect(bad.body.detail[0].loc).toEqual(['body', 'proxy_config', 'rules', 0, 'headers', 0, 'value']);
    expect(bad.body.detail[0].msg).toContain("'ABSENT'");
    const schema = await A('PATCH', '/api/v2/sandboxes/boxes/box-1', { proxy_config: { rules: [{ name: 'x' }] } });
    expect(schema.body.detail).toEqual([{ loc: ['body', 'proxy_config', 'rules', 0, 'match_hosts'], msg: 'Field required', type: 'missing' }]);
    const unknown = await A('PATCH', '/api/v2/sandboxes/boxes/ghost', { proxy_config: rules() });
    expect(unknown.status).toBe(404);
    // The refused patches changed nothing.
    const res = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user'));
    expect(res.body.headers.authorization).toBe(`token ${SECRET_1}`);
  });

  it('secret rotation: a new value reaches the running proxy for the next request', async () => {
    const r = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: SECRET_2 }]);
    expect(r.status).toBe(200);
    const res = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user'));
    expect(res.body.headers.authorization).toBe(`token ${SECRET_2}`);
  });

  it('a rotation with `keygate secrets set` (the shared secrets file) reaches the running proxy too', async () => {
    const r = runCli(['secrets', 'set', 'GH_TOKEN', '--data', dataDir], { env, input: SECRET_CLI });
    expect(r.status, r.stderr).toBe(0);
    expectClean(r.stdout + r.stderr);
    await waitFor(async () => (await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user'))).body.headers.authorization === `token ${SECRET_CLI}`, 'the CLI rotation to apply');
  });

  it('deleting a secret in use: 409 naming the sandboxes; with force the proxy stops (fail closed) until it is back', async () => {
    const refused = await A('POST', '/api/v1/workspaces/current/secrets', [
      { key: 'A_OTHER', value: null },
      { key: 'GH_TOKEN', value: null },
    ]);
    expect(refused.status).toBe(409);
    expect(refused.body.detail).toContain('GH_TOKEN');
    expect(refused.body.detail).toContain('used by sandboxes: box-1');
    expect(refused.body.detail).not.toContain('A_OTHER');
    // Nothing of the refused batch was applied.
    expect((await A('GET', '/api/v1/workspaces/current/secrets')).body).toEqual([{ key: 'A_OTHER' }, { key: 'GH_TOKEN' }]);

    const forced = await A('POST', '/api/v1/workspaces/current/secrets?force=true', [{ key: 'GH_TOKEN', value: null }]);
    expect(forced.status).toBe(200);
    expect(forced.body).toEqual([{ key: 'A_OTHER' }]);
    const after = await A('GET', '/api/v2/sandboxes/boxes/box-1');
    expect(after.body.status).toBe('failed');
    expect(after.body.status_reason).toContain("'GH_TOKEN'");
    const port = Number(new URL(box.proxy.url).port);
    expect(await portAccepts(port)).toBe(false);

    const back = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: SECRET_1 }]);
    expect(back.status).toBe(200);
    const ready = await A('GET', '/api/v2/sandboxes/boxes/box-1');
    expect(ready.body).toMatchObject({ status: 'ready', status_reason: null, proxy: { url: box.proxy.url } });
    const res = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user'));
    expect(res.body.headers.authorization).toBe(`token ${SECRET_1}`);
  });

  it('deleting an unused secret is allowed without force', async () => {
    const r = await A('POST', '/api/v1/workspaces/current/secrets', [{ key: 'A_OTHER', value: null }]);
    expect(r.status).toBe(200);
    expect(r.body).toEqual([{ key: 'GH_TOKEN' }]);
  });

  it('wait_for_ready false: 201 at once with status provisioning and the proxy URL, ready soon after', async () => {
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'bg-box', proxy_config: rules() });
    expect(r.status).toBe(201);
    expect(r.body.status).toBe('provisioning');
    expect(r.body.proxy.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const ready = await waitFor(async () => {
      const g = await A('GET', '/api/v2/sandboxes/boxes/bg-box');
      return g.body.status === 'ready' ? g.body : undefined;
    }, 'bg-box ready');
    expect(ready.proxy.url).toBe(r.body.proxy.url);
    expect(ready.proxy.url).not.toBe(box.proxy.url);
    const res = await viaProxy(ready.proxy.url, ready.proxy.ca_cert_pem, originUrl('/api/x'));
    expect(res.body.headers.authorization).toBe(`Bearer ${SECRET_1}`);
  });

  it('a sandbox without proxy_config gets a proxy that injects nothing', async () => {
    const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'plain-box', wait_for_ready: true });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ status: 'ready', proxy_config: null });
    // The origin's CA is not the proxy's, so a blind tunnel needs the origin CA on the client side.
    const res = await viaProxy(r.body.proxy.url, origin.caPem, originUrl('/api/x'));
    expect(res.status).toBe(200);
    expect(res.body.headers.authorization).toBeUndefined();
  });

  it('concurrent creates of one name: exactly one 201, the others 409; each sandbox its own port', async () => {
    const results = await Promise.all(Array.from({ length: 4 }, () => A('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'race', wait_for_ready: true })));
    expect(results.map((r) => r.status).sort()).toEqual([201, 409, 409, 409]);
    const urls = (await A('GET', '/api/v2/sandboxes/boxes')).body.resources.map((b: any) => b.proxy.url);
    expect(new Set(urls).size).toBe(urls.length);
    expect((await A('DELETE', '/api/v2/sandboxes/boxes/race')).status).toBe(204);
  });

  it('opaque and secret values are not readable in the SQLite files or the secrets file', () => {
    const files = readdirSync(dataDir).filter((f) => f.startsWith('keygate.db') || f === 'secrets.json');
    expect(files).toContain('keygate.db');
    expect(files).toContain('secrets.json');
    for (const f of files) {
      const bytes = readFileSync(path.join(dataDir, f));
      for (const v of [OPAQUE, SECRET_1, SECRET_2, SECRET_CLI]) expect(bytes.includes(Buffer.from(v)), `${v} in ${f}`).toBe(false);
    }
    // The sealed opaque value is there, so the check above looked at the right place.
    const db = Buffer.concat(files.filter((f) => f.startsWith('keygate.db')).map((f) => readFileSync(path.join(dataDir, f))));
    expect(db.includes(Buffer.from('"type":"opaque","value":"kg1.'))).toBe(true);
  });

  it('two workspaces are isolated: names, records, secrets, configs', async () => {
    expect((await B('GET', '/api/v2/sandboxes/boxes')).body).toEqual({ resources: [], offset: 0 });
    expect((await B('GET', '/api/v2/sandboxes/boxes/box-1')).status).toBe(404);
    expect((await B('PATCH', '/api/v2/sandboxes/boxes/box-1', { proxy_config: {} })).status).toBe(404);
    expect((await B('DELETE', '/api/v2/sandboxes/boxes/box-1')).status).toBe(404);
    expect((await B('GET', '/api/v1/workspaces/current/secrets')).body).toEqual([]);
    // Workspace A's secret does not exist for B.
    const missing = await B('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'box-1', proxy_config: rules() });
    expect(missing.status).toBe(422);
    expect(missing.body.detail[0].msg).toContain("'GH_TOKEN'");
    // B has its own GH_TOKEN and may reuse the name box-1.
    expect((await B('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: 'team-b-token-value' }])).status).toBe(200);
    const created = await B('POST', '/api/v2/sandboxes/boxes', { template_name: 'node-22', name: 'box-1', wait_for_ready: true, proxy_config: rules() });
    expect(created.status).toBe(201);
    expect(created.body.id).not.toBe(box.id);
    expect(created.body.proxy.url).not.toBe(box.proxy.url);
    const resB = await viaProxy(created.body.proxy.url, created.body.proxy.ca_cert_pem, originUrl('/api/x'));
    expect(resB.body.headers.authorization).toBe('Bearer team-b-token-value');
    const resA = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/x'));
    expect(resA.body.headers.authorization).toBe(`token ${SECRET_1}`);
    // Rotating B's secret leaves A's sandbox alone.
    await B('POST', '/api/v1/workspaces/current/secrets', [{ key: 'GH_TOKEN', value: 'team-b-token-rotated' }]);
    expect((await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/x'))).body.headers.authorization).toBe(`token ${SECRET_1}`);
    expect((await A('GET', '/api/v2/sandboxes/boxes')).body.resources.map((b: any) => b.name)).toEqual(['box-1', 'bg-box', 'plain-box']);
  });

  it('DELETE stops the proxy, removes the record and files: 204, then 404', async () => {
    const r = await A('GET', '/api/v2/sandboxes/boxes/plain-box');
    const port = Number(new URL(r.body.proxy.url).port);
    expect(await portAccepts(port)).toBe(true);
    const del = await A('DELETE', '/api/v2/sandboxes/boxes/plain-box');
    expect(del.status).toBe(204);
    expect(del.text).toBe('');
    expect(await portAccepts(port)).toBe(false);
    expect(existsSync(path.join(dataDir, 'sandboxes', r.body.id))).toBe(false);
    expect((await A('GET', '/api/v2/sandboxes/boxes/plain-box')).status).toBe(404);
    expect((await A('DELETE', '/api/v2/sandboxes/boxes/plain-box')).status).toBe(404);
  });

  it('restart of keygate serve brings back every sandbox and its proxy, same port, nothing lost', async () => {
    const before = (await A('GET', '/api/v2/sandboxes/boxes')).body.resources;
    const beforeB = (await B('GET', '/api/v2/sandboxes/boxes')).body.resources;
    expect(await server.stop()).toBe(0);
    earlierOutput += server.output();
    for (const b of [...before, ...beforeB]) expect(await portAccepts(Number(new URL(b.proxy.url).port))).toBe(false);
    server = await startServer();
    // The API answers at once; each box reads `provisioning` until the background restore brought it back.
    const after = await waitFor(async () => {
      const boxes = (await A('GET', '/api/v2/sandboxes/boxes')).body.resources;
      return boxes.every((b: any) => b.status !== 'provisioning') ? boxes : undefined;
    }, 'every box restored');
    expect(after.map((b: any) => [b.id, b.name, b.proxy.url, b.status, b.created_at])).toEqual(before.map((b: any) => [b.id, b.name, b.proxy.url, 'ready', b.created_at]));
    expect(after.map((b: any) => b.proxy_config)).toEqual(before.map((b: any) => b.proxy_config));
    const res = await viaProxy(box.proxy.url, box.proxy.ca_cert_pem, originUrl('/api/user'));
    expect(res.body.headers.authorization).toBe(`token ${SECRET_1}`);
    expect(res.body.headers['x-opaque']).toBe(OPAQUE);
    const afterB = await waitFor(async () => {
      const boxes = (await B('GET', '/api/v2/sandboxes/boxes')).body.resources;
      return boxes.every((b: any) => b.status === 'ready') ? boxes : undefined;
    }, "workspace B's box restored");
    expect(afterB[0].proxy.url).toBe(beforeB[0].proxy.url);
    const resB = await viaProxy(afterB[0].proxy.url, afterB[0].proxy.ca_cert_pem, originUrl('/api/x'));
    expect(resB.body.headers.authorization).toBe('Bearer team-b-token-rotated');
  });

  it('the routes and their schemas are in /openapi.json', async () => {
    const doc = (await api(server.url, null, 'GET', '/openapi.json')).body;
    const create = doc.paths['/api/v2/sandboxes/boxes'].post;
    expect(create.tags).toEqual(['Sandboxes']);
    expect(create.requestBody.content['application/json'].schema.properties.proxy_config.properties.rules).toBeDefined();
    expect(create.responses['201'].content['application/json'].schema.properties.proxy.properties.env).toBeDefined();
    expect(create.responses['422']).toBeDefined();
    for (const m of ['get', 'patch', 'delete']) expect(doc.paths['/api/v2/sandboxes/boxes/{name}'][m].summary).toEqual(expect.any(String));
    expect(doc.paths['/api/v1/workspaces/current/secrets'].post.parameters).toContainEqual(expect.objectContaining({ name: 'force', in: 'query' }));
    expect(doc.paths['/api/v2/sandboxes/templates'].get).toBeDefined();
  });

  it('logs never carried a secret, an opaque value or the API key', () => {
    const out = earlierOutput + server.output();
    expect(out).toContain('"msg":"sandbox ready"');
    expectClean(out);
    expect(out).not.toContain(KEY);
  });
});
