/**
 * "Is this address one of this host's?" decides whether the proxy may dial keygate's API (or
 * itself) there. libuv's interface list leaves out interfaces without carrier (docker0 with no
 * container attached), whose addresses the kernel still delivers to locally: a box reached
 * keygate's API through its proxy at 172.17.0.1 (CI, test/sandbox-api/hostile-api.test.ts).
 * Here the same situation is made in a network namespace of the test's own: a veth with an
 * address whose peer stays down, so it is up but without carrier.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { isLocalAddress, parseFibTrieLocal, parseIfInet6 } from '../../src/proxy/local-addresses.js';

const REPO = path.resolve(import.meta.dirname, '../..');

const FIB_TRIE = `Main:
  +-- 0.0.0.0/0 3 0 4
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 172.17.0.0/16 2 0 2
           |-- 172.17.0.0
              /16 link UNICAST
           |-- 172.17.0.1
              /32 host LOCAL
        |-- 172.17.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 4
           |-- 172.17.0.1
              /32 host LOCAL
`;

describe('this host\'s addresses, as the kernel knows them', () => {
  it('parses the routing trie\'s LOCAL entries (not networks, broadcasts or the default route) and if_inet6', () => {
    expect(parseFibTrieLocal(FIB_TRIE).sort()).toEqual(['127.0.0.1', '172.17.0.1']);
    expect(parseIfInet6('fd000000000000000000000000000002 04 40 00 82     eth0\n00000000000000000000000000000001 01 80 10 80       lo\n')).toEqual([
      'fd00:0000:0000:0000:0000:0000:0000:0002',
      '0000:0000:0000:0000:0000:0000:0000:0001',
    ]);
  });

  it('loopback and unspecified spellings are local; names and addresses of other hosts are not', () => {
    for (const a of ['127.0.0.1', '127.9.9.9', '::1', '0.0.0.0', '::', 'localhost']) expect(isLocalAddress(a), a).toBe(true);
    for (const a of ['192.0.2.200', '2001:db8::99', 'example.test']) expect(isLocalAddress(a), a).toBe(false);
  });

  const unshare = spawnSync('unshare', ['-rn', 'ip', 'link', 'add', 'kgv0', 'type', 'veth', 'peer', 'name', 'kgv1'], { encoding: 'utf8' });
  it.runIf(unshare.status === 0)('in a network namespace: an interface without carrier is missing from os.networkInterfaces() but its address is local, and the proxy refuses a denied port there', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-localaddr-'));
    try {
      const script = path.join(dir, 'probe.mjs');
      writeFileSync(
        script,
        `import http from 'node:http';
import os from 'node:os';
import { isLocalAddress } from ${JSON.stringify(path.join(REPO, 'dist/proxy/local-addresses.js'))};
import { startProxy } from ${JSON.stringify(path.join(REPO, 'dist/proxy/server.js'))};
import { ensureCa } from ${JSON.stringify(path.join(REPO, 'dist/certs/index.js'))};
import { compileConfig } from ${JSON.stringify(path.join(REPO, 'dist/rules/index.js'))};
import { createLogger } from ${JSON.stringify(path.join(REPO, 'dist/log.js'))};
const listed = Object.values(os.networkInterfaces()).flat().map((i) => i.address);
const api = http.createServer((q, s) => s.end('the API'));
await new Promise((r) => api.listen(0, '0.0.0.0', r));
const port = api.address().port;
const proxy = await startProxy({ listen: { host: '127.0.0.1', port: 0 }, ca: await ensureCa(${JSON.stringify(path.join(dir, 'certs'))}), config: compileConfig({ rules: [], no_proxy: [] }), logger: createLogger({ level: 'silent' }), denyTargets: ['0.0.0.0:' + port] });
const direct = await new Promise((r) => http.get({ host: '10.99.0.1', port, path: '/' }, (res) => { res.resume(); r(res.statusCode); }).on('error', (e) => r(e.code)));
const viaProxy = await new Promise((r) => http.get({ host: '127.0.0.1', port: proxy.port, path: 'http://10.99.0.1:' + port + '/', headers: { host: '10.99.0.1:' + port } }, (res) => { res.resume(); r(res.statusCode); }).on('error', (e) => r(e.code)));
console.log(JSON.stringify({ listed: listed.includes('10.99.0.1'), local: isLocalAddress('10.99.0.1'), other: isLocalAddress('10.99.0.2'), direct, viaProxy }));
await proxy.close(0);
api.close();
`,
      );
      // A veth whose peer stays down: up, with an address, and no carrier (as docker0 without containers).
      const setup = 'ip link set lo up && ip link add kgv0 type veth peer name kgv1 && ip addr add 10.99.0.1/24 dev kgv0 && ip link set kgv0 up && exec "$0" "$@"';
      const r = spawnSync('unshare', ['-rn', 'sh', '-c', setup, process.execPath, script], { encoding: 'utf8', timeout: 30_000 });
      expect(r.status, r.stderr).toBe(0);
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
      // The situation is real: libuv does not list the address, yet the kernel delivers to it.
      expect(out.listed).toBe(false);
      expect(out.direct).toBe(200);
      expect(out.local).toBe(true);
      expect(out.other).toBe(false);
      expect(out.viaProxy).toBe(403);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
