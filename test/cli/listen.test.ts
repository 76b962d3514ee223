/**
 * One `--listen` syntax for every server command (src/cli/listen.ts): the parser with hostile
 * inputs, then each command refusing one of them as a usage error before it opens anything.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo, type Server } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseListen } from '../../src/cli/listen.js';
import { CliError } from '../../src/cli/errors.js';
import { REPO_ROOT, runCli } from '../helpers/cli.js';

describe('parseListen', () => {
  it.each([
    ['127.0.0.1:8080', '127.0.0.1', 8080],
    ['0.0.0.0:0', '0.0.0.0', 0],
    ['localhost:65535', 'localhost', 65535],
    ['proxy.internal-1.example:3128', 'proxy.internal-1.example', 3128],
    ['[::1]:8080', '::1', 8080],
    ['[::]:1', '::', 1],
    ['[2001:db8::1]:443', '2001:db8::1', 443],
    ['[::ffff:127.0.0.1]:80', '::ffff:127.0.0.1', 80],
    ['127.0.0.1:00080', '127.0.0.1', 80],
  ])('%s', (raw, host, port) => {
    expect(parseListen(raw)).toEqual({ host, port });
  });

  it.each([
    ['', 'no port'],
    ['8080', 'no port'],
    ['127.0.0.1', 'no port'],
    [':8080', 'the host is empty'],
    ['[]:8080', 'an IPv6 address goes in brackets'],
    ['127.0.0.1:', 'the port'],
    ['127.0.0.1:65536', 'the port'],
    ['127.0.0.1:99999', 'the port'],
    ['127.0.0.1:123456', 'the port'],
    ['127.0.0.1:-1', 'the port'],
    ['127.0.0.1:+80', 'the port'],
    ['127.0.0.1:0x50', 'the port'],
    ['127.0.0.1:80 ', 'the port'],
    ['127.0.0.1:８０', 'the port'],
    ['::1:8080', 'an IPv6 address goes in brackets'],
    ['[::1:8080', 'an IPv6 address goes in brackets'],
    ['::1]:8080', 'an IPv6 address goes in brackets'],
    ['[127.0.0.1]:80', 'an IPv6 address goes in brackets'],
    ['[fe80::1%eth0]:80', 'an IPv6 address goes in brackets'],
    ['[::1]]:80', 'an IPv6 address goes in brackets'],
    ['[[::1]]:80', 'an IPv6 address goes in brackets'],
    [' 127.0.0.1:80', 'not an address or host name'],
    ['127.0.0.1 :80', 'not an address or host name'],
    ['host name:80', 'not an address or host name'],
    ['host/x:80', 'not an address or host name'],
    ['user@host:80', 'not an address or host name'],
    ['-host:80', 'not an address or host name'],
    ['a..b:80', 'not an address or host name'],
    ['.:80', 'not an address or host name'],
    ['999.1.1.1:80', 'not an IPv4 address'],
    ['127.0.0:80', 'not an IPv4 address'],
    ['127.0.0.1\n:80', 'not an address or host name'],
    ['hÃ¶st:80', 'not an address or host name'],
    [`${'a'.repeat(300)}:80`, 'not an address or host name'],
  ])('refuses %j (%s)', (raw, why) => {
    let err: unknown;
    try {
      parseListen(raw, '--admin');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CliError);
    expect((err as CliError).exitCode).toBe(2);
    expect((err as CliError).message).toContain(why);
    expect((err as CliError).message).toMatch(/^--admin must be HOST:PORT or \[IPv6\]:PORT/);
  });
});

// Each server command, started as an operator starts it, refuses the same input the same way,
// before it reads a configuration, opens a data directory or listens.
describe('every server command takes the one syntax', () => {
  const commands: [string, string[]][] = [
    ['proxy', ['proxy', '--config', '/nonexistent/config.json']],
    ['serve', ['serve', '--data', '/nonexistent-keygate-data']],
    ['start', ['start', '--data', '/nonexistent-keygate-data']],
    ['app serve', ['app', 'serve', '--app', '/nonexistent-app']],
  ];
  it.each(commands)('%s', (_name, args) => {
    for (const bad of [':8080', '127.0.0.1:65536', '::1:8080']) {
      const r = runCli([...args, '--listen', bad], { env: { KEYGATE_DATA_DIR: '/nonexistent-keygate-data' } });
      expect(r.status, r.stderr).toBe(2);
      expect(r.stderr).toBe(`keygate: --listen must be HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:8080 (${bad === ':8080' ? 'the host is empty' : bad.endsWith('65536') ? 'the port is a number from 0 to 65535' : 'an IPv6 address goes in brackets'}), got '${bad}'\n`);
    }
  });
});

// An address that is already taken is an operator's mistake, not a bug: every server command
// says so in one line (no stack), exits 1, and stops what it had started before the bind failed
// (the control plane's restore, the demo origin) without logging errors about it.
describe('every server command refuses an address in use in one line', () => {
  let taken: Server;
  let port: number;
  let tmp: string;
  beforeAll(async () => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-listen-taken-'));
    writeFileSync(path.join(tmp, 'config.json'), '{"rules":[]}');
    taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    port = (taken.address() as AddressInfo).port;
  });
  afterAll(async () => {
    await new Promise((resolve) => taken.close(resolve));
    rmSync(tmp, { recursive: true, force: true });
  });

  const commands: [string, (dir: string) => string[]][] = [
    ['proxy', (dir) => ['proxy', '--config', path.join(dir, 'config.json'), '--certs', path.join(dir, 'certs'), '--data', path.join(dir, 'proxy-data')]],
    ['serve', (dir) => ['serve', '--data', path.join(dir, 'serve-data'), '--sandbox-driver', 'none']],
    ['start', (dir) => ['start', '--data', path.join(dir, 'start-data'), '--sandbox-driver', 'none']],
    ['app serve', () => ['app', 'serve', '--app', path.join(REPO_ROOT, 'examples/echo-agent')]],
  ];
  it.each(commands)('%s', (_name, args) => {
    const r = runCli([...args(tmp), '--listen', `127.0.0.1:${port}`], { env: { KEYGATE_API_KEY: 'kg-listen-test-key' }, timeoutMs: 30_000 });
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr).toBe(`keygate: cannot listen on 127.0.0.1:${port}: EADDRINUSE\n`);
    expect(r.stdout).not.toMatch(/"level":[5-6]0/); // no error logged on the way out
  });
});
