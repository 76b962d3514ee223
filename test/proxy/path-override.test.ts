/**
 * proxy.md "Path patterns": the rules match the normalised path and the request goes upstream with
 * exactly that path. Some servers and frameworks route on a field instead of the request line
 * (`X-Original-URL`, `X-Rewrite-URL`: IIS URL Rewrite, Zend/Laminas, Symfony before
 * CVE-2018-14773): a request for `/repos/x` under a rule scoped to `/repos/*` would be served as
 * `/admin` there, with that rule's credentials. Under a rule with match_paths such a request is
 * refused (400), nothing sent; under a rule for every path (nothing to widen) and with no rule, it
 * goes as it came. Real proxy in-process, both HTTP/1.1 paths and h2, a local HTTPS origin.
 */
import { ProxyAgent, request } from 'undici';
import { describe, expect, it } from 'vitest';
import { h2Request, h2Through } from './h2-helpers.js';
import { useProxyPair } from './fixture.js';

const SCOPED = 'scoped.test.local';
const WHOLE = 'whole.test.local';

const pair = useProxyPair({
  names: [SCOPED, WHOLE],
  tmpPrefix: 'kg-override-',
  rules: [
    { name: 'scoped', match_hosts: [SCOPED], match_paths: ['/repos/*'], headers: [{ name: 'X-Key', value: 'kgOVERRIDE-scoped' }] },
    { name: 'whole', match_hosts: [WHOLE], headers: [{ name: 'X-Key', value: 'kgOVERRIDE-whole' }] },
  ],
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
      const agent = new ProxyAgent({ uri: pair.proxies[i].url, requestTls: { ca: pair.ca.certPem } });
      try {
        for (const [field, value] of OVERRIDES) {
          const before = pair.origin.requests;
          const res = await request(`https://${SCOPED}:${pair.origin.port}/repos/x`, { dispatcher: agent, headers: { [field]: value } });
          const body = await res.body.text();
          expect(res.statusCode, `${field}: ${body}`).toBe(400);
          expect(body).toMatch(/path/i);
          expect(pair.origin.requests).toBe(before);
        }
      } finally {
        await agent.close();
      }
    });

    it(`${name}: forwarded as it came under a rule for every path, and where no rule applies`, async () => {
      const agent = new ProxyAgent({ uri: pair.proxies[i].url, requestTls: { ca: pair.ca.certPem } });
      try {
        for (const url of [`https://${WHOLE}:${pair.origin.port}/repos/x`, `https://${SCOPED}:${pair.origin.port}/other`]) {
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
    const s = await h2Through(pair.proxies[0].port, SCOPED, pair.origin.port, pair.ca.certPem);
    try {
      for (const [field, value] of OVERRIDES) {
        const before = pair.origin.requests;
        const r = await h2Request(s, { ':method': 'GET', ':path': '/repos/x', [field.toLowerCase()]: value });
        expect(r.status, field).toBe(400);
        expect(pair.origin.requests).toBe(before);
      }
    } finally {
      s.close();
    }
  });
});
