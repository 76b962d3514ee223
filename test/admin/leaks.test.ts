// A configuration push that cannot be applied says where and why, and never what: no secret value,
// opaque value or pushed secret in the 422 body or in a log line. Real admin listener, real proxy,
// real mounted secret store, undici client.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigHolder } from '../../src/admin/config-holder.js';
import { ProxyMetrics } from '../../src/admin/metrics.js';
import { startAdmin, type AdminHandle } from '../../src/admin/server.js';
import { ensureCa } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { DirectorySecretStore } from '../../src/secrets/store.js';

const ADMIN_TOKEN = 'admin-token-for-leak-tests-0123456789';
const auth = { authorization: `Bearer ${ADMIN_TOKEN}` };
/** Every value pushed or stored here: none may come back in an answer or a log line. */
const VALUES: string[] = [];
const val = (s: string) => {
  VALUES.push(s);
  return s;
};
/** Halves of the values with control characters: an escaped echo ('a\r\nb') still shows them. */
const HEAD = val('leakhead-' + 'h7'.repeat(8));
const TAIL = val('leaktail-' + 't3'.repeat(8));

let dir: string;
let proxy: ProxyHandle;
let admin: AdminHandle;
let holder: ConfigHolder;
let store: DirectorySecretStore;
let logs = '';

async function push(body: unknown) {
  const r = await request(`${admin.url}/config`, { method: 'PUT', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.body.text();
  return { status: r.statusCode, text, json: () => JSON.parse(text) };
}

const rule = (headers: object[]) => ({ rules: [{ name: 'api', match_hosts: ['api.leak.test'], headers }] });

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-admin-leaks-'));
  // Kubernetes-style mounted secrets, written by another tool: the writable stores refuse a value
  // with control characters when it is set (test/secrets/control-chars.test.ts), a mounted one
  // can still hold one, and the proxy must then refuse it at use without echoing it.
  const mounted = path.join(dir, 'secrets');
  mkdirSync(mounted);
  writeFileSync(path.join(mounted, 'GOOD'), val('good-' + 'g1'.repeat(10)));
  writeFileSync(path.join(mounted, 'CRLF_IN_STORE'), `${HEAD}\r\nX-Injected: ${TAIL}`);
  store = new DirectorySecretStore(mounted);
  const logger = createLogger({
    level: 'debug',
    destination: new Writable({
      write(chunk, _enc, cb) {
        logs += chunk.toString();
        cb();
      },
    }),
  });
  const metrics = new ProxyMetrics();
  let proxyRef: ProxyHandle | undefined;
  holder = new ConfigHolder({ proxy: { setConfig: (c) => proxyRef!.setConfig(c) }, store, envelope: () => loadKeyring(dir, {}).envelope, metrics, logger });
  const initial = await holder.prepare(rule([{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {GOOD}' }]), { source: 'startup' });
  proxy = await startProxy({ listen: { host: '127.0.0.1', port: 0 }, ca: await ensureCa(path.join(dir, 'certs')), config: initial.compiled, logger });
  proxyRef = proxy;
  holder.markApplied(initial.config, initial.compiled, { source: 'startup' });
  admin = await startAdmin({ listen: { host: '127.0.0.1', port: 0 }, token: ADMIN_TOKEN, holder, metrics, proxy, logger });
});

afterAll(async () => {
  await admin?.close();
  await proxy?.close(1000);
  rmSync(dir, { recursive: true, force: true });
});

describe('a rejected push names the place and the key, never the value', () => {
  it('a pushed secret with CR/LF makes the resolved header illegal: 422 naming the header and the secret key', async () => {
    const gen = holder.generation;
    const r = await push({
      proxy_config: rule([{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {OK_KEY}-{BAD_KEY}' }]),
      secrets: { OK_KEY: val('okvalue-' + 'o2'.repeat(8)), BAD_KEY: `${HEAD}\r\nX-Injected: ${TAIL}` },
    });
    expect(r.status).toBe(422);
    const [issue, ...rest] = r.json().detail;
    expect(rest).toEqual([]);
    expect(issue.loc).toEqual(['body', 'proxy_config', 'rules', 0, 'headers', 0, 'value']);
    expect(issue.msg).toContain("'Authorization'");
    expect(issue.msg).toContain('BAD_KEY');
    expect(issue.msg).not.toContain('OK_KEY');
    expect(holder.generation).toBe(gen);
  });

  it('a stored secret with CR/LF: the same, through the store', async () => {
    const r = await push(rule([{ name: 'X-Api-Key', type: 'workspace_secret', value: '{CRLF_IN_STORE}' }]));
    expect(r.status).toBe(422);
    expect(r.json().detail).toEqual([{ loc: ['body', 'rules', 0, 'headers', 0, 'value'], msg: expect.stringMatching(/'X-Api-Key'.*CRLF_IN_STORE|CRLF_IN_STORE.*'X-Api-Key'/), type: 'value_error' }]);
  });

  it('an opaque value that is not a legal field value, and one that cannot be decrypted', async () => {
    const r = await push(rule([{ name: 'X-Opaque', type: 'opaque', value: `${HEAD}\n${TAIL}` }]));
    expect(r.status).toBe(422);
    expect(r.json().detail[0].loc).toEqual(['body', 'rules', 0, 'headers', 0, 'value']);
    const sealed = await push(rule([{ name: 'X-Opaque', type: 'opaque', value: `kg1.${HEAD}.${TAIL}` }]));
    expect(sealed.status).toBe(422);
    expect(sealed.json().detail[0].loc).toEqual(['body', 'rules', 0, 'headers', 0, 'value']);
  });

  it('schema errors on a value (too long, wrong type) and on a pushed secret (not a string)', async () => {
    const long = await push(rule([{ name: 'X-Long', type: 'plaintext', value: HEAD + 'x'.repeat(20_000) }]));
    expect(long.status).toBe(422);
    expect(long.json().detail[0].loc).toEqual(['body', 'rules', 0, 'headers', 0, 'value']);
    const typed = await push(rule([{ name: 'X-Typed', type: 'opaque', value: { nested: HEAD } }]));
    expect(typed.status).toBe(422);
    const notString = await push({ proxy_config: rule([]), secrets: { K: { v: HEAD }, L: [TAIL] } });
    expect(notString.status).toBe(422);
    expect(notString.json().detail.map((d: { loc: unknown[] }) => d.loc)).toEqual([
      ['body', 'secrets', 'K'],
      ['body', 'secrets', 'L'],
    ]);
  });

  it('none of the values reached an answer above or a log line', async () => {
    // Every answer of this file was checked by the tests above through their bodies; the logs here.
    expect(logs).toContain('configuration rejected');
    for (const v of VALUES) expect(logs).not.toContain(v);
  });
});

describe('answers', () => {
  it('never echo a value', async () => {
    const bodies = [
      await push({ proxy_config: rule([{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {BAD_KEY}' }]), secrets: { BAD_KEY: `${HEAD}\u0000${TAIL}` } }),
      await push(rule([{ name: 'X-Opaque', type: 'opaque', value: `${HEAD}\r${TAIL}` }])),
      await push(rule([{ name: 'X-Long', type: 'opaque', value: HEAD + 'y'.repeat(20_000) }])),
      await push({ proxy_config: rule([]), secrets: { K: [HEAD] } }),
    ];
    for (const b of bodies) {
      expect(b.status).toBe(422);
      for (const v of VALUES) expect(b.text).not.toContain(v);
    }
  });
});
