/**
 * proxy.md "Injection": the rule's header replaces every client-sent header of the same name and
 * the client cannot add a second value. CGI, PHP, WSGI servers and most frameworks read a field
 * through a variable in which `_` and `-` are the same (`X_Key` and `X-Key` are both HTTP_X_KEY;
 * plan.ts already reads method-override fields so): a client's `X_Key` beside the injected
 * `X-Key` is a second value there, or the only one the application sees. So a client field whose
 * name is an injected one with `_` for `-` (or the other way round) is dropped like the same name.
 * Real proxy in-process (both HTTP/1.1 paths, h2), a local HTTPS origin echoing what it received.
 */
import { ProxyAgent, request } from 'undici';
import { describe, expect, it } from 'vitest';
import { h2Request, h2Through } from './h2-helpers.js';
import { useProxyPair } from './fixture.js';

const HOST = 'names.test.local';
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

const pair = useProxyPair({ names: [HOST], tmpPrefix: 'kg-names-', rules: [{ name: 'names', match_hosts: [HOST], headers: RULE_HEADERS }] });

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
      const agent = new ProxyAgent({ uri: pair.proxies[i].url, requestTls: { ca: pair.ca.certPem } });
      try {
        const res = await request(`https://${HOST}:${pair.origin.port}/n`, { dispatcher: agent, headers: CLIENT.flat() });
        check(((await res.body.json()) as { headers: [string, string][] }).headers);
      } finally {
        await agent.close();
      }
    });
  }

  it('HTTP/2', async () => {
    const s = await h2Through(pair.proxies[0].port, HOST, pair.origin.port, pair.ca.certPem);
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
