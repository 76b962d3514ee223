/**
 * deny_hosts against the system resolver's own ways of reaching another name than the one the
 * decision was made on: the resolv.conf search list (`secret` -> `secret.corp.internal`) and
 * CNAMEs. The real resolver, a real DNS server: netns-resolver.child.mjs runs them in a private
 * network and mount namespace (`unshare -mn`, root only), so every packet stays on a loopback of
 * its own. Needs `npm run build`. The policy-level parts run everywhere.
 */
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { EgressDenied, etcHostsNames, parseResolvConf, resolveAllowed, searchCandidates } from '../../src/proxy/egress.js';
import { ProxyError } from '../../src/proxy/errors.js';
import { compileEgress, type AccessControl } from '../../src/rules/egress.js';
import { REPO_ROOT } from '../helpers/proxy.js';

function canUnshare(): boolean {
  try {
    execFileSync('unshare', ['-mn', 'true'], { stdio: 'ignore', timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

type Result = Record<string, { status: number; reached: boolean; at?: string }>;
function throughNamespace(config: unknown, names: string[]): Result {
  const out = execFileSync('unshare', ['-mn', process.execPath, path.join(REPO_ROOT, 'test/proxy/netns-resolver.child.mjs'), REPO_ROOT, JSON.stringify(config), ...names], { timeout: 60_000, encoding: 'utf8' });
  return JSON.parse(out.trim().split('\n').pop()!) as Result;
}

describe.skipIf(!canUnshare())('deny_hosts with the real system resolver (private namespace)', () => {
  it('a short name the search list expands to a denied name, or a CNAME to one, is refused; short names otherwise work, as do /etc/hosts names', () => {
    // search corp.internal (ndots 1); A records: secret, svc, deep.sub, hidden.sub (all .corp.internal),
    // open.example.net; alias.example.net CNAME secret.corp.internal; /etc/hosts: hostsonly.example.
    const r = throughNamespace({ access_control: { deny_hosts: ['secret.corp.internal', 'hidden.sub.corp.internal'] } }, [
      'secret.corp.internal',
      'secret',
      'alias.example.net',
      'hidden.sub',
      'svc',
      'deep.sub',
      'open.example.net',
      'hostsonly.example',
      'filesfirst',
      'localhost',
      'nothere',
    ]);
    expect(r['secret.corp.internal']).toMatchObject({ status: 403, reached: false });
    // The search list makes `secret` secret.corp.internal: the proxy knows, and refuses.
    expect(r.secret).toMatchObject({ status: 403, reached: false });
    expect(r['alias.example.net']).toMatchObject({ status: 403, reached: false });
    // A name with a dot is tried as is first (ndots 1), then with the search list: still checked.
    expect(r['hidden.sub']).toMatchObject({ status: 403, reached: false });
    expect(r.svc).toMatchObject({ status: 200, reached: true });
    expect(r['deep.sub']).toMatchObject({ status: 200, reached: true });
    expect(r['open.example.net']).toMatchObject({ status: 200, reached: true });
    expect(r['hostsonly.example']).toMatchObject({ status: 200, reached: true });
    // /etc/hosts answers a name as given before any search domain (filesfirst.corp.internal is 127.0.0.3).
    expect(r.filesfirst).toEqual({ status: 200, reached: true, at: '127.0.0.2' });
    expect(r.localhost).toMatchObject({ status: 200, reached: true });
    expect(r.nothere).toMatchObject({ status: 502, reached: false });
  }, 90_000);

  it('without a name in deny_hosts, aliases and short names reach their addresses (only the addresses are policy then)', () => {
    const r = throughNamespace({ access_control: { deny_hosts: ['10.9.9.9'] } }, ['alias.example.net', 'secret']);
    expect(r['alias.example.net']).toMatchObject({ status: 200, reached: true });
    expect(r.secret).toMatchObject({ status: 200, reached: true });
  }, 90_000);
});

describe('the search list, as the system resolver reads it', () => {
  it('search or domain (the last wins), ndots, LOCALDOMAIN and RES_OPTIONS over the file', () => {
    expect(parseResolvConf('nameserver 1.1.1.1\nsearch a.test B.test.\noptions ndots:2 timeout:1\n', {})).toEqual({ search: ['a.test', 'b.test'], ndots: 2 });
    expect(parseResolvConf('search a.test\ndomain c.test\n', {})).toEqual({ search: ['c.test'], ndots: 1 });
    expect(parseResolvConf('# search x.test\nsearch a.test # b.test\n', {})).toEqual({ search: ['a.test'], ndots: 1 });
    expect(parseResolvConf('search a.test\n', { LOCALDOMAIN: 'l.test  m.test', RES_OPTIONS: 'ndots:5' })).toEqual({ search: ['l.test', 'm.test'], ndots: 5 });
    expect(parseResolvConf('search a.test\n', { LOCALDOMAIN: '' })).toEqual({ search: [], ndots: 1 });
  });

  it('candidates in the order the resolver tries them', () => {
    const conf = { search: ['ns.svc.cluster.local', 'svc.cluster.local'], ndots: 5 };
    expect(searchCandidates('my-svc', conf)).toEqual(['my-svc.ns.svc.cluster.local', 'my-svc.svc.cluster.local', 'my-svc']);
    expect(searchCandidates('a.b.c.d.e.f', conf)[0]).toBe('a.b.c.d.e.f');
    expect(searchCandidates('api.example.com', { search: [], ndots: 1 })).toEqual(['api.example.com']);
    expect(searchCandidates('api.example.com', { search: ['corp'], ndots: 1 })).toEqual(['api.example.com', 'api.example.com.corp']);
  });
});

describe('deny_hosts and aliases, policy level', () => {
  const policy = compileEgress({ deny_hosts: ['secret.corp.internal', '*.vault.internal'], allow_hosts: ['*.example.net'] });
  const lookupAll = async () => ['127.0.0.1'];
  const chain: Record<string, string[]> = { 'a.example.net': ['b.example.net'], 'b.example.net': ['secret.corp.internal.'], 'c.example.net': ['x.vault.internal'], 'loop.example.net': ['loop2.example.net'], 'loop2.example.net': ['loop.example.net'] };
  const cnames = async (n: string) => {
    if (chain[n]) return chain[n];
    throw Object.assign(new Error('no'), { code: n.startsWith('fail') ? 'ETIMEOUT' : 'ENODATA' });
  };

  it('a CNAME chain reaching a denied name is refused (any hop, wildcards too); allow_hosts is not asked of aliases', async () => {
    expect(policy.deniesNames).toBe(true);
    for (const host of ['a.example.net', 'c.example.net']) {
      const err = await resolveAllowed(host, 443, { policy, lookupAll, cnames }).catch((e: unknown) => e);
      expect(err, host).toBeInstanceOf(EgressDenied);
      expect((err as EgressDenied).refusal.kind).toBe('host_denied');
      expect((err as EgressDenied).reason).toMatch(/stands for .* in DNS/);
    }
    expect(await resolveAllowed('plain.example.net', 443, { policy, lookupAll, cnames })).toBe('127.0.0.1');
    expect(policy.checkAlias('plain.example.net', 443, 'cdn.fastly.net')).toBeUndefined();
  });

  it('a looping chain or a failed CNAME query refuses rather than passing the check over', async () => {
    for (const [host, why] of [
      ['loop.example.net', /too long or looping/],
      ['fail.example.net', /cannot check the DNS aliases of fail\.example\.net .*\(ETIMEOUT\)/],
    ] as const) {
      const err = await resolveAllowed(host, 443, { policy, lookupAll, cnames }).catch((e: unknown) => e);
      // A ProxyError, so the sandbox reads this reason (a 502), not "request failed (ETIMEOUT)".
      expect(err, host).toBeInstanceOf(ProxyError);
      expect([(err as ProxyError).status, (err as ProxyError).type]).toEqual([502, 'dns_error']);
      expect((err as ProxyError).reason).toMatch(why);
    }
  });

  it('no CNAME query without a name in deny_hosts, for a pinned target or an address', async () => {
    let asked = 0;
    const counting = async (n: string) => {
      asked++;
      return cnames(n);
    };
    const addrOnly = compileEgress({ deny_hosts: ['10.0.0.1', '[fd00::1]:443', '10.0.0.2:80'] });
    expect(addrOnly.deniesNames).toBe(false);
    expect(await resolveAllowed('a.example.net', 443, { policy: addrOnly, lookupAll, cnames: counting })).toBe('127.0.0.1');
    expect(await resolveAllowed('a.example.net', 443, { policy, lookupAll, cnames: counting, pinned: '127.0.0.2' })).toBe('127.0.0.2');
    // (The address allowed by name too: a dial checks the name and port under the policy first.)
    const withAddress = compileEgress({ deny_hosts: ['secret.corp.internal', '*.vault.internal'], allow_hosts: ['*.example.net', '127.0.0.3'] });
    expect(await resolveAllowed('127.0.0.3', 443, { policy: withAddress, lookupAll, cnames: counting })).toBe('127.0.0.3');
    expect(asked).toBe(0);
  });

  it('a dial checks the name and port under the policy in force first (a request planned under an older one), before any lookup', async () => {
    let looked = 0;
    const counting = async () => {
      looked++;
      return lookupAll();
    };
    const cases: [AccessControl, string, number][] = [
      [{ deny_hosts: ['a.example.net'] }, 'a.example.net', 443],
      [{ allow_hosts: ['b.example.net'] }, 'a.example.net', 443],
      [{ deny_ports: [8443] }, 'a.example.net', 8443],
    ];
    for (const [ac, host, port] of cases) {
      const err = await resolveAllowed(host, port, { policy: compileEgress(ac), lookupAll: counting, pinned: '127.0.0.1' }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(EgressDenied);
      expect((err as EgressDenied).address).toBeUndefined();
    }
    expect(looked).toBe(0);
  });

  it('/etc/hosts names: comments, aliases, case and a trailing dot', () => {
    expect([...etcHostsNames('127.0.0.1 localhost\n# 10.0.0.1 commented\n10.0.0.2  Box.Local. box # comment\n\n::1 ip6-localhost')]).toEqual(['localhost', 'box.local', 'box', 'ip6-localhost']);
  });
});

describe('a --resolve pin that names a host', () => {
  it('is resolved and its addresses checked like any others (never dialled as a name unchecked)', async () => {
    const policy = compileEgress({});
    const lookupAll = async (n: string) => (n === 'meta.pin' ? ['169.254.169.254'] : n === 'ok.pin' ? ['127.0.0.9'] : []);
    const err = await resolveAllowed('api.example.net', 443, { policy, lookupAll, pinned: 'meta.pin' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(EgressDenied);
    expect((err as EgressDenied).address).toBe('169.254.169.254');
    expect(await resolveAllowed('api.example.net', 443, { policy, lookupAll, pinned: 'ok.pin' })).toBe('127.0.0.9');
    expect(await resolveAllowed('api.example.net', 443, { policy, lookupAll, pinned: '127.0.0.8' })).toBe('127.0.0.8');
  });
});
