// The CLI never prints a value it read from a file that holds secrets, even when the file is broken:
// the real `keygate` binary, real files.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from '../helpers/cli.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kg-cli-leaks-'));
  dirs.push(d);
  return d;
};
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** A port nothing listens on: the commands below must fail before they talk to a server. */
async function closedPort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise((r) => srv.close(r));
  return port;
}

describe('keygate sandbox create --proxy-config with a broken file', () => {
  it('says where the JSON breaks, never the text around it (an opaque value)', async () => {
    const cwd = tmp();
    const opaque = 'Zq9-never-printed-' + 'e5'.repeat(10);
    const file = path.join(cwd, 'proxy.json');
    // The value in single quotes, a common slip: V8's message quotes the text around the error.
    writeFileSync(file, `{"rules":[{"name":"gh","match_hosts":["api.github.com"],"headers":[{"name":"Authorization","type":"opaque","value":'${opaque}'}]}]}`);
    const port = await closedPort();
    const r = runCli(['sandbox', 'create', 'b1', '--template', 'host', '--proxy-config', file], {
      cwd,
      env: { KEYGATE_API_KEY: 'kg_cli_leak_test_key', KEYGATE_URL: `http://127.0.0.1:${port}` },
    });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/proxy\.json is not valid JSON \((line 1, column \d+|syntax error)\)/);
    expect(r.stderr + r.stdout).not.toContain('Zq9');
    expect(r.stderr).not.toContain('cannot reach');
  });
});

describe('keygate sandbox exec --env without a KEY', () => {
  it('refuses it without printing the argument (it may be the value alone, a token)', async () => {
    const port = await closedPort();
    for (const arg of ['=ghp_envvalue_Zq6' + 'm1'.repeat(8), 'ghp_envvalue_Zq6' + 'm1'.repeat(8)]) {
      const r = runCli(['sandbox', 'exec', 'b1', '--env', arg, 'ls'], { cwd: tmp(), env: { KEYGATE_API_KEY: 'kg_cli_leak_test_key', KEYGATE_URL: `http://127.0.0.1:${port}` } });
      expect(r.status).toBe(2);
      expect(r.stderr).toMatch(/--env expects KEY=VALUE/);
      expect(r.stderr + r.stdout).not.toContain('ghp_envvalue');
    }
  });
});

describe('a KEYGATE_URL that does not parse', () => {
  it('is named without the credentials it carries (environment and .env alike)', () => {
    const cwd = tmp();
    const bad = 'http://ci:hunter2-pw-Zq8@cp.example:80x/';
    const fromEnv = runCli(['deploy', 'list'], { cwd, env: { KEYGATE_API_KEY: 'kg_x', KEYGATE_URL: bad } });
    writeFileSync(path.join(cwd, '.env'), `KEYGATE_API_KEY=kg_x\nKEYGATE_URL=${bad}\n`);
    const fromFile = runCli(['sandbox', 'ls'], { cwd, env: { KEYGATE_API_KEY: '', KEYGATE_URL: '' } });
    for (const r of [fromEnv, fromFile]) {
      expect(r.status).not.toBe(0);
      expect(r.stderr).toMatch(/KEYGATE_URL \(from (environment|\.env)\) is not a URL: 'http:\/\/\[credentials\]@cp\.example:80x\/'/);
      expect(r.stderr).not.toContain('hunter2');
    }
  });
});

describe('a DATABASE_URL that cannot be used', () => {
  it('is one line naming the database without its password, for a bad URL and for a database that does not answer', async () => {
    const port = await closedPort();
    for (const url of ['postgres://kg:Sup3rSecretPw-Zq7@127.0.0.1:54x2/db', `postgres://kg:Sup3rSecretPw-Zq7@127.0.0.1:${port}/db`]) {
      const r = runCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'none'], { env: { DATABASE_URL: url, KEYGATE_API_KEY: 'kg_db_test_key_0123456789' }, timeoutMs: 30_000 });
      expect(r.status).toBe(1);
      expect(r.stderr).not.toContain('Sup3rSecretPw');
      expect(r.stderr).not.toMatch(/unexpected error|\n\s+at /);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^keygate: cannot open the database of DATABASE_URL/);
    }
  });
});

describe('keygate serve with a configuration it cannot use', () => {
  it('says what is wrong in one line, not as an unexpected error with a stack', () => {
    const cases: [NodeJS.ProcessEnv, RegExp][] = [
      [{ KEYGATE_MASTER_KEY: Buffer.from('short-master-key-Zq7').toString('base64') }, /KEYGATE_MASTER_KEY must be 32 bytes/],
      [{ KEYGATE_PROVIDERS_FILE: '/nonexistent/providers.json' }, /KEYGATE_PROVIDERS_FILE: .* does not exist/],
      [{ KEYGATE_JWT_ISSUER: 'https://issuer.test' }, /KEYGATE_JWT_AUDIENCE/],
      [{ KEYGATE_SANDBOX_PROXY_RESOLVE: 'nonsense' }, /KEYGATE_SANDBOX_PROXY_RESOLVE: 'nonsense' is not HOST:PORT:ADDR/],
    ];
    for (const [env, expected] of cases) {
      const r = runCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'none'], { env: { DATABASE_URL: '', KEYGATE_API_KEY: 'kg_cfg_test_key_0123456789', ...env }, timeoutMs: 30_000 });
      expect(r.status, r.stderr).toBe(1);
      expect(r.stderr).toMatch(expected);
      expect(r.stderr).not.toMatch(/unexpected error|\n\s+at /);
      expect(r.stderr).not.toContain('short-master-key-Zq7');
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
    }
  });
});
