// The `keygate secrets` command, spawned as the real binary (dist/, built before the tests run).
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Envelope } from '../../src/secrets/envelope.js';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { EncryptedFileSecretStore } from '../../src/secrets/store.js';
import { openDb } from '../../src/store/db.js';
import { CLI, runCli } from '../helpers/cli.js';

let dir: string;
// A clean environment: no master key, store or database selection leaks in from the caller.
const env = { KEYGATE_MASTER_KEY: '', KEYGATE_NEW_MASTER_KEY: '', KEYGATE_SECRETS_FILE: '', KEYGATE_SECRETS_DIR: '', DATABASE_URL: '', KEYGATE_DATA_DIR: '' };
const cli = (args: string[], input?: string, extra: NodeJS.ProcessEnv = {}) => runCli(['secrets', ...args, '--data', dir], { input, env: { ...env, ...extra } });
const store = (workspaceId?: string) => new EncryptedFileSecretStore({ file: path.join(dir, 'secrets.json'), workspaceId, keys: () => loadKeyring(dir, {}).envelope });

beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-secrets-cli-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe('keygate secrets', () => {
  it('set (stdin), list (names only, never values), rm', async () => {
    const v1 = `ghp_${randomBytes(12).toString('hex')}`;
    const v2 = `sk-${randomBytes(12).toString('hex')}`;
    const r1 = cli(['set', 'GITHUB_TOKEN'], `${v1}\n`);
    expect(r1.status).toBe(0);
    expect(cli(['set', 'OPENAI_KEY'], v2).status).toBe(0);
    expect(cli(['set', 'OTHER_WS'], 'w', {}).status).toBe(0);
    expect(runCli(['secrets', 'set', 'ONLY_B', '--data', dir, '--workspace', 'team-b'], { input: 'b', env }).status).toBe(0);
    const list = cli(['list']);
    expect(list.status).toBe(0);
    expect(list.stdout).toBe('GITHUB_TOKEN\nOPENAI_KEY\nOTHER_WS\n');
    const listB = runCli(['secrets', 'list', '--data', dir, '--workspace', 'team-b'], { env });
    expect(listB.stdout).toBe('ONLY_B\n');
    for (const r of [r1, list, listB]) expect(r.stdout + r.stderr).not.toMatch(new RegExp(`${v1}|${v2}`));
    // One trailing newline from `echo` is not part of the value; the file holds no plaintext.
    expect(await store().get('GITHUB_TOKEN')).toBe(v1);
    expect(await store().get('OPENAI_KEY')).toBe(v2);
    expect(readFileSync(path.join(dir, 'secrets.json'), 'utf8')).not.toMatch(new RegExp(`${v1}|${v2}`));

    const rm = cli(['rm', 'OPENAI_KEY']);
    expect(rm.status).toBe(0);
    expect(cli(['list']).stdout).toBe('GITHUB_TOKEN\nOTHER_WS\n');
    const again = cli(['rm', 'OPENAI_KEY']);
    expect(again.status).toBe(1);
    expect(again.stderr).toMatch(/no secret OPENAI_KEY/);
  });

  it('set refuses a value on the command line, without echoing it, and stores nothing', () => {
    const value = 'argv-value-must-not-echo';
    for (const args of [['set', 'TOKEN', value], ['set', `TOKEN=${value}`], ['set', 'TOKEN', `--value=${value}`], ['set', 'TOKEN', '--value', value]]) {
      const r = cli(args, 'from-stdin');
      expect(r.status, args.join(' ')).toBe(2);
      expect(r.stderr).toMatch(/never taken from the command line/);
      expect(r.stdout + r.stderr).not.toContain(value);
    }
    expect(existsSync(path.join(dir, 'secrets.json'))).toBe(false);
  });

  it('set refuses stdin that is not UTF-8 instead of storing a different value', async () => {
    // Latin-1 bytes (a header may carry obs-text, so an operator might pipe them): decoded as
    // UTF-8 they became U+FFFD, and a value other than the one given was stored without a word.
    for (const bytes of [Buffer.from('tok\xe9n-latin1', 'latin1'), Buffer.from([0x61, 0xff, 0xfe, 0x62]), Buffer.from([0xe2, 0x82])]) {
      const r = spawnSync(process.execPath, [CLI, 'secrets', 'set', 'LATIN', '--data', dir], { env: { ...process.env, ...env }, input: bytes, encoding: 'utf8' });
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/not valid UTF-8/);
      expect(r.stderr).not.toContain('latin1');
    }
    expect(await store().list()).toEqual([]);
    // Valid UTF-8 with a trailing newline still works.
    expect(cli(['set', 'LATIN'], 'tokén\n').status).toBe(0);
    expect(await store().get('LATIN')).toBe('tokén');
  });

  it('rejects an empty value and a bad name', () => {
    const empty = cli(['set', 'TOKEN'], '\n');
    expect(empty.status).toBe(1);
    expect(empty.stderr).toMatch(/empty input/);
    const bad = cli(['set', 'bad-name'], 'v');
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/invalid secret name/);
    expect(cli(['list']).stderr).toMatch(/no secrets/);
  });

  it('a wrong master key is a clear one-line error, never garbage', () => {
    expect(cli(['set', 'K'], 'value-under-key-1').status).toBe(0);
    const wrong = { KEYGATE_MASTER_KEY: randomBytes(32).toString('base64') };
    const r = cli(['set', 'K2'], 'v', wrong);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^keygate: .*another master key/);
    expect(r.stderr).not.toMatch(/at .*\.js/); // no stack trace
    const bad = cli(['list'], undefined, { KEYGATE_MASTER_KEY: 'c2hvcnQ=' });
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/KEYGATE_MASTER_KEY must be 32 bytes/);
  });

  it('concurrent CLI writers (separate processes) lose no update', async () => {
    const setOne = (key: string, value: string) =>
      new Promise<number | null>((resolve) => {
        const p = spawn(process.execPath, [CLI, 'secrets', 'set', key, '--data', dir], { env: { ...process.env, ...env }, stdio: ['pipe', 'ignore', 'inherit'] });
        p.stdin.end(value);
        p.on('exit', resolve);
      });
    expect(cli(['list']).status).toBe(0); // master key exists before the race
    const worker = async (w: number) => {
      const codes: (number | null)[] = [];
      for (let i = 0; i < 4; i++) codes.push(await setOne(`W${w}_${i}`, `value-${w}-${i}`));
      return codes;
    };
    const codes = (await Promise.all([0, 1, 2, 3].map(worker))).flat();
    expect(codes.every((c) => c === 0)).toBe(true);
    const snap = await store().snapshot();
    expect(snap.size).toBe(16);
    for (let w = 0; w < 4; w++) for (let i = 0; i < 4; i++) expect(snap.get(`W${w}_${i}`)).toBe(`value-${w}-${i}`);
    expect(existsSync(path.join(dir, 'secrets.json.lock'))).toBe(false);
  });

  it('rotate-key re-encrypts the secrets file and the database; values survive', async () => {
    expect(cli(['set', 'GITHUB_TOKEN'], 'rotating-value').status).toBe(0);
    const old = loadKeyring(dir, {}).envelope;
    const db = await openDb({ dataDir: dir, databaseUrl: '' });
    await db.run('CREATE TABLE sandboxes (name TEXT PRIMARY KEY, proxy_config TEXT)');
    await db.run('INSERT INTO sandboxes VALUES (?, ?)', ['b', JSON.stringify({ rules: [{ headers: [{ type: 'opaque', value: old.seal('opaque-in-db') }] }] })]);
    await db.close();
    const r = cli(['rotate-key']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/secrets file: 1 value/);
    expect(r.stdout).toMatch(/sandboxes\.proxy_config: 1/);
    expect(r.stdout + r.stderr).not.toMatch(/rotating-value|opaque-in-db/);
    const fresh = new Envelope(Buffer.from(readFileSync(path.join(dir, 'master.key'), 'utf8').trim(), 'base64'));
    expect(fresh.keyId).not.toBe(old.keyId);
    const db2 = await openDb({ dataDir: dir, databaseUrl: '' });
    const row = await db2.get<{ proxy_config: string }>('SELECT proxy_config FROM sandboxes');
    await db2.close();
    expect(fresh.open(JSON.parse(row!.proxy_config).rules[0].headers[0].value)).toBe('opaque-in-db');
    expect(await store().get('GITHUB_TOKEN')).toBe('rotating-value');
    // With the key in the environment the new one must be supplied.
    const envKey = { KEYGATE_MASTER_KEY: randomBytes(32).toString('base64') };
    const e = runCli(['secrets', 'rotate-key', '--data', mkdtempSync(path.join(dir, 'e-'))], { env: { ...env, ...envKey } });
    expect(e.status).toBe(1);
    expect(e.stderr).toMatch(/KEYGATE_NEW_MASTER_KEY/);
  });

  it('the terminal prompt does not echo the value', async () => {
    // A real pseudo-terminal (Python's pty), so `set` takes its interactive path.
    const value = `typed-${randomBytes(6).toString('hex')}`;
    const script = `
import os, pty, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], sys.argv[2], 'secrets', 'set', 'TYPED', '--data', sys.argv[3]])
out = b''
def read_until(marker, limit=10):
    global out
    end = time.time() + limit
    while marker not in out and time.time() < end:
        try:
            out += os.read(fd, 1024)
        except OSError:
            break
read_until(b'input hidden')
os.write(fd, sys.argv[4].encode() + b'x\\x7f\\r')
read_until(b'stored', 10)
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors='replace'))
sys.exit(os.waitstatus_to_exitcode(status))
`;
    const r = spawnSync('/usr/bin/python3', ['-c', script, process.execPath, CLI, dir, value], { env: { ...process.env, ...env }, encoding: 'utf8', timeout: 30_000 });
    expect(r.status, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/Value for TYPED \(input hidden\)/);
    expect(r.stdout).toMatch(/stored TYPED/);
    expect(r.stdout).not.toContain(value);
    // Backspace removed the extra character.
    expect(await store().get('TYPED')).toBe(value);
  });
});
