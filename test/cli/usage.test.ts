import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from '../helpers/cli.js';

// A mistyped flag is an operator error: one line naming it, then the usage; exit status 2; never
// "unexpected error" with a stack trace.
describe('usage errors of the server commands', () => {
  const cases: [string, string[]][] = [
    ['serve', ['serve', '--lisen', '127.0.0.1:0']],
    ['serve keys create', ['serve', 'keys', 'create', '--wrkspace', 'x']],
    ['start', ['start', '--nope']],
    ['proxy', ['proxy', '--config', 'x.json', '--nope']],
    ['ca env', ['ca', 'env', '--nope']],
  ];
  it.each(cases)('%s: unknown flag', (_name, args) => {
    const r = runCli(args, { env: { KEYGATE_DATA_DIR: '/nonexistent-keygate-data' } });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/^keygate: Unknown option '--[a-z]+'/);
    expect(r.stderr).toMatch(/usage: keygate /);
    expect(r.stderr).not.toMatch(/unexpected error|\n\s+at /);
  });
});

// `--help` after any sub-command prints that command's usage and exits 0, before anything is
// required (an API key, a data directory, a server).
describe('--help on every sub-command', () => {
  const cases = [
    'start', 'proxy', 'serve', 'serve keys create', 'ca', 'ca init', 'ca env', 'secrets', 'secrets set', 'secrets list', 'secrets rm', 'secrets rotate-key',
    'app', 'app serve', 'app validate', 'deploy', 'deploy list', 'deploy logs', 'deploy delete',
    'sandbox', 'sandbox create', 'sandbox ls', 'sandbox exec', 'sandbox cp', 'sandbox rm',
  ];
  it.each(cases)('%s --help', (cmd) => {
    const r = runCli([...cmd.split(' '), '--help'], { env: { KEYGATE_API_KEY: '', KEYGATE_DATA_DIR: '/nonexistent-keygate-data', KEYGATE_URL: 'http://127.0.0.1:1' } });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^usage: keygate /);
  });
});

// An operator's mistake in a path is one line naming it, exit 1; never a stack.
describe('paths that cannot be used', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-usage-'));
  const file = path.join(dir, 'a-file');
  writeFileSync(file, 'not a directory');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const dataCases: [string, string[]][] = [
    ['serve', ['serve', '--listen', '127.0.0.1:0', '--sandbox-driver', 'none', '--data', file]],
    ['start', ['start', '--listen', '127.0.0.1:0', '--sandbox-driver', 'none', '--data', file]],
    ['serve keys create', ['serve', 'keys', 'create', '--data', file]],
    ['secrets set', ['secrets', 'set', 'K', '--data', file]],
    ['secrets list', ['secrets', 'list', '--data', file]],
  ];
  it.each(dataCases)('%s: --data names a file', (_name, args) => {
    const r = runCli(args, { input: 'value\n', timeoutMs: 30_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(`keygate: cannot use data directory ${file}: EEXIST\n`);
  });

  it('serve: --config-dir names no directory', () => {
    const missing = path.join(dir, 'no-config');
    const r = runCli(['serve', '--listen', '127.0.0.1:0', '--sandbox-driver', 'none', '--data', path.join(dir, 'data'), '--config-dir', missing], { timeoutMs: 30_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(`keygate: configuration directory ${missing} does not exist (--config-dir or KEYGATE_CONFIG_DIR)\n`);
  });
});
