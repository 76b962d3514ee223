/**
 * proxy.md "Injection": the rule's header replaces every client-sent header of the same name and
 * the client cannot add a second value. CGI, PHP, WSGI servers and most frameworks read a field
 * through a variable in which `_` and `-` are the same (`X_Key` and `X-Key` are both HTTP_X_KEY;
 * plan.ts already reads method-override fields so): a client's `X_Key` beside the injected
 * `X-Key` is a second value there, or the only one the application sees. So a client field whose
 * name is an injected one with `_` for `-` (or the other way round) is dropped like the same name.
 * Real proxy in-process (both HTTP/1.1 paths, h2), a local HTTPS origin echoing what it received.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa, type Ca } from '../../src/certs/index.js';
import { createLogger } from '../../src/log.js';
import { startProxy, type ProxyHandle } from '../../src/proxy/server.js';
import { compileConfig } from '../../src/rules/index.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki } from '../helpers/pki.js';
import { h2Request, h2Through } from './h2-helpers.js';

const HOST = 'names.test.local';
const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-names-'));
let ca: Ca;
let origin: TestOrigin;
const proxies: ProxyHandle[] = [];
const RULE_HEADERS = [
  { name: 'X-Key', value: 'kgNAMES-dash' },
  { name: 'X_Api_Token', value: 'kgNAMES-underscore' },
];
/** Client fields that a CGI-style reader takes for one of the injected ones. */
const CLIENT: [string, string][] = [
  ['X_Key', 'client-1'],
  ['x_KEY', 'client-2'],
  ['X-Api-Token', 'client-3'],
  ['x-api_token', 'client-4'],
  // Not the same name under any reading: kept.
  ['X-Keys', 'kept-1'],
  ['X__Key', 'kept-2'],
];
const cgi = (n: string) => n.toLowerCase().replace(/_/g, '-');

beforeAll(async () => {
  const pki = await createTestPki([HOST]);
  origin = await startOrigin(pki);
  ca = await ensureCa(path.join(dir, 'certs'));
  for (const fastPath of [true, false]) {
    proxies.push(
      await startProxy({
        listen: { host: '127.0.0.1', port: 0 },
        ca,
        config: compileConfig({ no_proxy: [], rules: [{ name: 'names', match_hosts: [HOST], headers: RULE_HEADERS }] }),
        logger: createLogger({ destination: new Writable({ write: (_c, _e, cb) => cb() }) }),
        fastPath,
        resolve: new Map([[`${HOST}:${origin.port}`, '127.0.0.1']]),
        upstreamCa: [pki.caPem],
      }),
    );
  }
});
afterAll(async () => {
  for (const p of proxies) await p.close(200);
  await origin?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Every field the origin received whose CGI variable is an injected header's, and the kept ones. */
function check(headers: [string, string][]): void {
  const byVar = (n: string) => headers.filter(([k]) => cgi(k) === cgi(n)).map(([k, v]) => `${k}: ${v}`);
  expect(byVar('X-Key')).toEqual(['x-key: kgNAMES-dash']);
  expect(byVar('X_Api_Token')).toEqual(['x_api_token: kgNAMES-underscore']);
  expect(headers.filter(([, v]) => v.startsWith('kept-')).map(([, v]) => v)).toEqual(['kept-1', 'kept-2']);
}

describe('a client field named like an injected one with _ for - never reaches the origin', () => {
  for (const [name, i] of [
    ['fast path', 0],
    ['Node path', 1],
  ] as const) {
    it(name, async () => {
      const agent = new ProxyAgent({ uri: proxies[i].url, requestTls: { ca: ca.certPem } });
      try {
        const res = await request(`https://${HOST}:${origin.port}/n`, { dispatcher: agent, headers: CLIENT.flat() });
        check(((await res.body.json()) as { headers: [string, string][] }).headers);
      } finally {
        await agent.close();
      }
    });
  }

  it('HTTP/2', async () => {
    const s = await h2Through(proxies[0].port, HOST, origin.port, ca.certPem);
    try {
      const fields: Record<string, string> = { ':method': 'GET', ':path': '/n' };
      for (const [k, v] of CLIENT) fields[k.toLowerCase()] = v;
      const r = await h2Request(s, fields);
      check((JSON.parse(r.body) as { headers: [string, string][] }).headers);
    } finally {
      s.close();
    }
  });
});
