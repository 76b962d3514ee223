/**
 * proxy.md "Path patterns": the rules match the normalised path and the request goes upstream with
 * exactly that path. Some servers and frameworks route on a field instead of the request line
 * (`X-Original-URL`, `X-Rewrite-URL`: IIS URL Rewrite, Zend/Laminas, Symfony before
 * CVE-2018-14773): a request for `/repos/x` under a rule scoped to `/repos/*` would be served as
 * `/admin` there, with that rule's credentials. Under a rule with match_paths such a request is
 * refused (400), nothing sent; under a rule for every path (nothing to widen) and with no rule, it
 * goes as it came. Real proxy in-process, both HTTP/1.1 paths and h2, a local HTTPS origin.
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

const SCOPED = 'scoped.test.local';
const WHOLE = 'whole.test.local';
const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-override-'));
let ca: Ca;
let origin: TestOrigin;
const proxies: ProxyHandle[] = [];

beforeAll(async () => {
  const pki = await createTestPki([SCOPED, WHOLE]);
  origin = await startOrigin(pki);
  ca = await ensureCa(path.join(dir, 'certs'));
  for (const fastPath of [true, false]) {
    proxies.push(
      await startProxy({
        listen: { host: '127.0.0.1', port: 0 },
        ca,
        config: compileConfig({
          no_proxy: [],
          rules: [
            { name: 'scoped', match_hosts: [SCOPED], match_paths: ['/repos/*'], headers: [{ name: 'X-Key', value: 'kgOVERRIDE-scoped' }] },
            { name: 'whole', match_hosts: [WHOLE], headers: [{ name: 'X-Key', value: 'kgOVERRIDE-whole' }] },
          ],
        }),
        logger: createLogger({ destination: new Writable({ write: (_c, _e, cb) => cb() }) }),
        fastPath,
        resolve: new Map([
          [`${SCOPED}:${origin.port}`, '127.0.0.1'],
          [`${WHOLE}:${origin.port}`, '127.0.0.1'],
        ]),
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

const OVERRIDES: [string, string][] = [
  ['X-Original-URL', '/admin'],
  ['x-rewrite-url', '/admin'],
  ['X_Original_Url', '/admin'],
  ['X-REWRITE-URL', '/repos/x'],
];

describe('a field naming another path than the request line', () => {
  for (const [name, i] of [
    ['fast path', 0],
    ['Node path', 1],
  ] as const) {
    it(`${name}: refused under a rule with match_paths, nothing sent`, async () => {
      const agent = new ProxyAgent({ uri: proxies[i].url, requestTls: { ca: ca.certPem } });
      try {
        for (const [field, value] of OVERRIDES) {
          const before = origin.requests;
          const res = await request(`https://${SCOPED}:${origin.port}/repos/x`, { dispatcher: agent, headers: { [field]: value } });
          const body = await res.body.text();
          expect(res.statusCode, `${field}: ${body}`).toBe(400);
          expect(body).toMatch(/path/i);
          expect(origin.requests).toBe(before);
        }
      } finally {
        await agent.close();
      }
    });

    it(`${name}: forwarded as it came under a rule for every path, and where no rule applies`, async () => {
      const agent = new ProxyAgent({ uri: proxies[i].url, requestTls: { ca: ca.certPem } });
      try {
        for (const url of [`https://${WHOLE}:${origin.port}/repos/x`, `https://${SCOPED}:${origin.port}/other`]) {
          const res = await request(url, { dispatcher: agent, headers: { 'X-Original-URL': '/admin' } });
          expect(res.statusCode, url).toBe(200);
          const echo = (await res.body.json()) as { headers: [string, string][] };
          expect(echo.headers.filter(([k]) => k.toLowerCase() === 'x-original-url').map(([, v]) => v)).toEqual(['/admin']);
        }
      } finally {
        await agent.close();
      }
    });
  }

  it('HTTP/2: refused under a rule with match_paths, nothing sent', async () => {
    const s = await h2Through(proxies[0].port, SCOPED, origin.port, ca.certPem);
    try {
      for (const [field, value] of OVERRIDES) {
        const before = origin.requests;
        const r = await h2Request(s, { ':method': 'GET', ':path': '/repos/x', [field.toLowerCase()]: value });
        expect(r.status, field).toBe(400);
        expect(origin.requests).toBe(before);
      }
    } finally {
      s.close();
    }
  });
});
