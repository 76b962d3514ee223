/**
 * Egress policy (issue #9 part 2): `access_control` validation with exact locs, and refusals
 * after DNS resolution (names pinned with --resolve) for tunnels, intercepts, plain HTTP and
 * WebSocket, with connection counters proving a refused destination is never dialled.
 */
import { Ajv } from 'ajv';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ProxyAgent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureCa } from '../../src/certs/index.js';
import { resolveProxyConfig } from '../../src/config/resolve.js';
import { validateProxyConfig, type ProxyConfig } from '../../src/config/schema.js';
import { createLogger } from '../../src/log.js';
import { startProxy } from '../../src/proxy/server.js';
import { compileConfig, compileEgress } from '../../src/rules/index.js';
import { mayBeAddress, unwrapAddress } from '../../src/rules/egress.js';
import { proxyConfigOut } from '../../src/sandbox-api/schemas.js';
import { redactProxyConfig } from '../../src/secrets/opaque.js';
import { connectTunnel, tlsOverTunnel } from '../helpers/connect.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { readUntilClose, rawPlain, startRecordingOrigin } from './hardening-helpers.js';

describe('access_control validation', () => {
  it('accepts a full policy; the redacted form and the sandbox API schema keep it; resolve and compile carry it', () => {
    const config: ProxyConfig = {
      rules: [{ name: 'r', match_hosts: ['api.example.com'], headers: [{ name: 'X-Key', type: 'opaque', value: 'kgOPAQUE' }] }],
      access_control: { allow_hosts: ['*.example.com', 'example.com:443'], deny_hosts: ['bad.example.com', '10.1.2.3'], allow_ports: [443, '8000-8999'], deny_ports: [25], deny_addresses: ['10.0.0.0/8', 'fd00::/8', '192.0.2.1'] },
    };
    expect(validateProxyConfig(config)).toEqual([]);
    const redacted = redactProxyConfig(config);
    expect(redacted.access_control).toEqual(config.access_control);
    expect(JSON.stringify(redacted)).not.toContain('kgOPAQUE');
    const ajv = new Ajv({ allErrors: true, strict: false });
    expect(ajv.validate(proxyConfigOut, JSON.parse(JSON.stringify(redacted)))).toBe(true);
    const resolved = resolveProxyConfig(config, () => undefined);
    expect(resolved.access_control).toEqual(config.access_control);
    const compiled = compileConfig(resolved);
    expect(compiled.egress.checkName('api.example.com', 443)).toBeUndefined();
    expect(compiled.egress.checkName('api.example.com', 80)?.kind).toBe('port_not_allowed');
    expect(compiled.egress.checkName('other.org', 443)?.kind).toBe('host_not_allowed');
    expect(compiled.egress.checkName('bad.example.com', 443)?.kind).toBe('host_denied');
    expect(compiled.egress.checkAddress('x.example.com', 443, '10.9.9.9')?.kind).toBe('address_denied');
    expect(compiled.egress.checkAddress('x.example.com', 443, '93.184.216.34')).toBeUndefined();
  });

  it('reports each bad entry at its exact loc', () => {
    const issues = validateProxyConfig({
      access_control: { deny_hosts: ['ok.example', 'bad host'], allow_hosts: ['*'], allow_ports: [443, '9-3'], deny_ports: ['0-10'], deny_addresses: ['10.0.0.0/8', '10.0.0.0/33', 'nope'] },
    });
    expect(issues.map((i) => [i.loc, i.type])).toEqual([
      [['access_control', 'deny_hosts', 1], 'value_error'],
      [['access_control', 'allow_ports', 1], 'value_error'],
      [['access_control', 'deny_ports', 0], 'value_error'],
      [['access_control', 'deny_addresses', 1], 'value_error'],
      [['access_control', 'deny_addresses', 2], 'value_error'],
    ]);
    expect(issues[1].msg).toMatch(/low end above high end/);
    const schema = validateProxyConfig({ access_control: { deny_port: [1], allow_ports: [70000] } });
    expect(schema.map((i) => i.loc)).toEqual(expect.arrayContaining([['access_control', 'deny_port'], ['access_control', 'allow_ports', 0]]));
    expect(schema.find((i) => i.loc.length === 2)?.type).toBe('extra_forbidden');
  });

  it('built-in denies: link-local, metadata (also IPv4-mapped and NAT64 forms), unspecified; not overridable by allow_hosts', () => {
    const p = compileEgress({ allow_hosts: ['*'] });
    for (const a of ['169.254.169.254', '169.254.0.1', 'fd00:ec2::254', 'fe80::1', '::ffff:169.254.169.254', '::ffff:a9fe:a9fe', '64:ff9b::169.254.169.254', '0.0.0.0', '::', '100.100.100.200']) {
      expect(p.checkAddress('x.test', 80, a)?.kind, a).toBe('address_builtin');
    }
    expect(p.checkName('169.254.169.254', 80)?.type).toBe('destination_ip_prohibited');
    expect(p.checkAddress('x.test', 80, '127.0.0.1')).toBeUndefined();
    expect(p.checkAddress('x.test', 80, '2606:4700::1')).toBeUndefined();
  });

  it('checkName skips the address checks only for names that cannot be an address literal (hostile spellings included)', () => {
    // mayBeAddress is a shortcut: whatever it turns away must be something isIPv4, isIPv6 and
    // unwrapAddress would not have taken for an address either, or a literal would escape the
    // built-in and listed address denies.
    const alphabet = '0123456789abcdefx.:%[]-_ ZAF\u0000\u00a0\uff0e';
    let seed = 20261126;
    const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % n);
    const samples = ['169.254.169.254', '::ffff:169.254.169.254', '64:ff9b::a9fe:a9fe', 'fe80::1%eth0', '127.1', '0x7f.0.0.1', '2130706433', '[::1]', 'api.test', '1.2.3.4.nip.io', '01.02.03.04'];
    for (let i = 0; i < 20_000; i++) samples.push(Array.from({ length: 1 + rnd(40) }, () => alphabet[rnd(alphabet.length)]).join(''));
    for (const h of samples) {
      if (mayBeAddress(h)) continue;
      expect(net.isIP(h), h).toBe(0);
      expect(unwrapAddress(h), h).toBe(h.toLowerCase());
    }
    const p = compileEgress({ deny_addresses: ['10.0.0.0/8', 'fd00::/8'] });
    for (const h of ['10.1.2.3', 'fd00::1', '::ffff:10.1.2.3', '169.254.169.254']) expect(p.checkName(h, 443)?.type, h).toBe('destination_ip_prohibited');
    expect(p.checkName('ten.example', 443)).toBeUndefined();
  });
});

const NAMES = ['api.test.local', 'other.test.local', 'meta.test.local', 'metarule.test.local'];
let pki: TestPki;
let origin: TestOrigin;
/** Counts every TCP connection that reaches it: a refused destination must leave it at 0. */
let trap: net.Server;
let trapPort = 0;
let trapConnections = 0;
let denyList: SpawnedProxy;
let allowList: SpawnedProxy;

beforeAll(async () => {
  pki = await createTestPki(NAMES);
  origin = await startOrigin(pki);
  trap = net.createServer((s) => {
    trapConnections++;
    s.destroy();
  });
  await new Promise<void>((r) => trap.listen(0, '127.0.0.1', r));
  trapPort = (trap.address() as net.AddressInfo).port;
  const rules = [{ name: 'api', match_hosts: ['api.test.local', 'metarule.test.local'], headers: [{ name: 'X-Key', type: 'plaintext', value: 'v' }] }];
  const resolve = [
    `api.test.local:${origin.port}:127.0.0.1`,
    `other.test.local:${origin.port}:127.0.0.1`,
    `trap.test.local:${trapPort}:127.0.0.1`,
    'meta.test.local:80:169.254.169.254',
    'meta.test.local:443:169.254.169.254',
    'metarule.test.local:443:169.254.169.254',
    'v6meta.test.local:80:[fd00:ec2::254]',
    'mapped.test.local:443:[::ffff:169.254.169.254]',
  ];
  [denyList, allowList] = await Promise.all([
    spawnProxy({ config: { rules, access_control: { deny_hosts: ['127.0.0.1'], deny_ports: [25] } }, resolve, upstreamCa: [pki.caPem] }),
    spawnProxy({ config: { rules, access_control: { allow_hosts: ['api.test.local', 'trap.test.local', 'meta.test.local'] } }, resolve, upstreamCa: [pki.caPem] }),
  ]);
});

afterAll(async () => {
  await denyList?.stop();
  await allowList?.stop();
  await origin?.close();
  await new Promise((r) => trap?.close(r));
});

function expectEgressRefusal(status: number, head: string, body: string, why: RegExp) {
  expect(status).toBe(403);
  expect(head).toMatch(/\r\nProxy-Status: keygate; error=(destination_ip_prohibited|http_request_denied); details="egress refused/i);
  expect(body).toMatch(why);
  expect(body).toMatch(/retrying will not help/);
}

describe('names resolving to denied addresses (--resolve), refused before any connection', () => {
  it('CONNECT to a name pinned to 169.254.169.254: 403 at CONNECT, telling why', async () => {
    const c = await connectTunnel(denyList.port, 'meta.test.local:443');
    expectEgressRefusal(c.status, c.head + '\r\n', c.body, /meta\.test\.local:443 \(meta\.test\.local resolves to 169\.254\.169\.254\) is a link-local address \(cloud metadata/);
  });

  it('an IPv4-mapped spelling of the metadata address is refused too', async () => {
    const c = await connectTunnel(denyList.port, 'mapped.test.local:443');
    expect(c.status).toBe(403);
    expect(c.body).toMatch(/resolves to 169\.254\.169\.254/);
  });

  it('plain HTTP to names pinned to 169.254.169.254 and fd00:ec2::254: 403', async () => {
    const r = await rawPlain(denyList.port, 'GET http://meta.test.local/latest/meta-data/ HTTP/1.1\r\nHost: meta.test.local\r\nConnection: close\r\n\r\n');
    expectEgressRefusal(r.status, r.text, r.text, /link-local/);
    const r6 = await rawPlain(denyList.port, 'GET http://v6meta.test.local/ HTTP/1.1\r\nHost: v6meta.test.local\r\nConnection: close\r\n\r\n');
    expectEgressRefusal(r6.status, r6.text, r6.text, /cloud metadata service address/);
  });

  it('an intercepted rule host pinned to 169.254.169.254: the request inside TLS gets 403, no credential leaves', async () => {
    const c = await connectTunnel(denyList.port, 'metarule.test.local:443');
    expect(c.status).toBe(200);
    const t = await tlsOverTunnel(c.socket, 'metarule.test.local', denyList.caPem);
    const r = await readUntilClose(t, 'GET /x HTTP/1.1\r\nHost: metarule.test.local\r\nConnection: close\r\n\r\n');
    expectEgressRefusal(r.status, r.text, r.text, /169\.254\.169\.254/);
  });

  it('CONNECT straight to the metadata address literal: 403', async () => {
    const c = await connectTunnel(denyList.port, '169.254.169.254:80');
    expect(c.status).toBe(403);
    expect(c.head).toMatch(/error=destination_ip_prohibited/);
  });
});

describe('deny-list: a name resolving to 127.0.0.1 is refused when 127.0.0.1 is denied', () => {
  it('tunnel, intercept and plain HTTP all refused; the trap never sees a connection', async () => {
    const before = trapConnections;
    const originBefore = origin.requests;
    const tunnel = await connectTunnel(denyList.port, `trap.test.local:${trapPort}`);
    expectEgressRefusal(tunnel.status, tunnel.head + '\r\n', tunnel.body, /trap\.test\.local resolves to 127\.0\.0\.1\) matches access_control\.deny_hosts entry '127\.0\.0\.1'/);
    const plain = await rawPlain(denyList.port, `GET http://trap.test.local:${trapPort}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    expect(plain.status).toBe(403);
    const literal = await connectTunnel(denyList.port, `127.0.0.1:${trapPort}`);
    expect(literal.status).toBe(403);
    const c = await connectTunnel(denyList.port, `api.test.local:${origin.port}`);
    const t = await tlsOverTunnel(c.socket, 'api.test.local', denyList.caPem);
    const r = await readUntilClose(t, `GET /x HTTP/1.1\r\nHost: api.test.local:${origin.port}\r\nConnection: close\r\n\r\n`);
    expect(r.status).toBe(403);
    expect(trapConnections).toBe(before);
    expect(origin.requests).toBe(originBefore);
  });

  it('deny_ports: refused by port, before anything', async () => {
    const c = await connectTunnel(denyList.port, 'mail.test.local:25');
    expectEgressRefusal(c.status, c.head + '\r\n', c.body, /port 25 is in access_control\.deny_ports/);
  });

  it('refusals are logged and never retried silently', async () => {
    const lines = denyList.logs().filter((l) => l.type === 'egress_denied');
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.some((l) => l.kind === 'address_builtin' && l.address === '169.254.169.254')).toBe(true);
  });
});

describe('allow-list', () => {
  it('a listed name resolving to 127.0.0.1 is reached; an unlisted one resolving to the same address is refused', async () => {
    const agent = new ProxyAgent({ uri: allowList.url, requestTls: { ca: allowList.caPem } });
    try {
      const ok = await request(`https://api.test.local:${origin.port}/x`, { dispatcher: agent });
      expect(ok.statusCode).toBe(200);
      await ok.body.dump();
    } finally {
      await agent.close();
    }
    const c = await connectTunnel(allowList.port, `other.test.local:${origin.port}`);
    expectEgressRefusal(c.status, c.head + '\r\n', c.body, /other\.test\.local:\d+ is not in access_control\.allow_hosts/);
    const literal = await rawPlain(allowList.port, `GET http://127.0.0.1:${origin.port}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    expect(literal.status).toBe(403);
  });

  it('an allow-listed name pinned to a metadata address is still refused (built-in denies win)', async () => {
    const c = await connectTunnel(allowList.port, 'meta.test.local:443');
    expectEgressRefusal(c.status, c.head + '\r\n', c.body, /resolves to 169\.254\.169\.254\) is a link-local address/);
  });
});

describe('in-process: admin listener by name, DNS failure, policy swap', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-egress-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('a name resolving to a deny target (the admin listener) is refused without a connection; a policy swap applies to the next connection', async () => {
    const ca = await ensureCa(path.join(dir, 'certs'));
    const p = await startProxy({
      listen: { host: '127.0.0.1', port: 0 },
      ca,
      config: compileConfig({ rules: [], no_proxy: [] }),
      logger: createLogger({ level: 'silent' }),
      resolve: new Map([
        [`admin.test.local:${trapPort}`, '127.0.0.1'],
        [`trap.test.local:${trapPort}`, '127.0.0.1'],
      ]),
      denyTargets: [`127.0.0.1:${trapPort}`],
    });
    const denied: unknown[] = [];
    p.events.on('egress_denied', (e) => denied.push(e));
    try {
      const before = trapConnections;
      const c = await connectTunnel(p.port, `admin.test.local:${trapPort}`);
      expect(c.status).toBe(403);
      expect(c.body).toMatch(/own listeners/);
      expect(trapConnections).toBe(before);
      // The proxy's own port by a name pinned to loopback.
      const self = await rawPlain(p.port, `GET http://127.0.0.1:${p.port}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
      expect(self.status).toBe(403);

      // DNS failure: 502 with the reason.
      const dns = await rawPlain(p.port, 'GET http://nxdomain.invalid/ HTTP/1.1\r\nHost: nxdomain.invalid\r\nConnection: close\r\n\r\n');
      expect(dns.status).toBe(502);
      expect(dns.text).toMatch(/cannot resolve nxdomain\.invalid \((ENOTFOUND|EAI_AGAIN|EAI_FAIL)\)/);
      expect(dns.text).toMatch(/error=dns_error/);

      // Swap in a policy denying loopback: the next request is refused, nothing reaches the origin.
      const plain = await startRecordingOrigin();
      try {
        const ok = await rawPlain(p.port, `GET http://127.0.0.1:${plain.port}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
        expect(ok.status).toBe(200);
        const seen = plain.connections;
        p.setConfig(compileConfig({ rules: [], no_proxy: [], access_control: { deny_addresses: ['127.0.0.0/8'] } }));
        const after = await rawPlain(p.port, `GET http://127.0.0.1:${plain.port}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
        expect(after.status).toBe(403);
        expect(after.text).toMatch(/access_control\.deny_addresses/);
        expect(plain.connections).toBe(seen);
      } finally {
        await plain.close();
      }
      expect(denied.length).toBeGreaterThan(0);
    } finally {
      await p.close(200);
    }
  });
});
