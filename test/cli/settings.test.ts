/**
 * An operator's setting in the environment that keygate cannot use stops the command at start
 * with one line naming the variable and what it takes (exit 1): never a stack trace, never a
 * silent fall-back to the default (a typo in a timeout would otherwise go unnoticed), and never
 * the value of a secret setting.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { intSetting, logLevelSetting, SettingError, switchSetting } from '../../src/settings.js';
import { REPO_ROOT, runCli, startCli } from '../helpers/cli.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'keygate-settings-'));
writeFileSync(path.join(dir, 'config.json'), '{"rules":[]}');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const KEY = 'kg-settings-test-key-0123456789';
const serve = (driver = 'none') => ['serve', '--listen', '127.0.0.1:0', '--data', path.join(dir, `data-${driver}`), '--sandbox-driver', driver];
const proxy = ['proxy', '--config', path.join(dir, 'config.json'), '--listen', '127.0.0.1:0', '--certs', path.join(dir, 'certs'), '--data', path.join(dir, 'proxy-data')];
const app = ['app', 'serve', '--app', path.join(REPO_ROOT, 'examples/echo-agent'), '--listen', '127.0.0.1:0'];

const cases: [string, string, string[], RegExp][] = [
  ['KEYGATE_API_KEY', 'short-key', serve(), /^keygate: KEYGATE_API_KEY must be at least 16 characters\n$/],
  ['KEYGATE_SANDBOX_MAX_FILE_BYTES', 'ten', serve(), /^keygate: KEYGATE_SANDBOX_MAX_FILE_BYTES must be an integer from 1 .*, got 'ten'\n$/],
  ['KEYGATE_SANDBOX_MAX_PER_WORKSPACE', '0', serve(), /^keygate: KEYGATE_SANDBOX_MAX_PER_WORKSPACE must be an integer from 1 .*, got '0'\n$/],
  ['KEYGATE_SANDBOX_RELAY_CONNECTIONS', 'many', serve('local'), /^keygate: KEYGATE_SANDBOX_RELAY_CONNECTIONS must be an integer from 1 .*, got 'many'\n$/],
  ['KEYGATE_OAUTH_HTTP_TIMEOUT_MS', '5', serve(), /^keygate: KEYGATE_OAUTH_HTTP_TIMEOUT_MS must be an integer from 100 to 120000 \(milliseconds\), got '5'\n$/],
  ['KEYGATE_BUILD_CONCURRENCY', 'two', serve(), /^keygate: KEYGATE_BUILD_CONCURRENCY must be an integer from 1 .*, got 'two'\n$/],
  ['KEYGATE_BUILD_TIMEOUT_MS', '10m', serve(), /^keygate: KEYGATE_BUILD_TIMEOUT_MS must be an integer from 1 .*\(milliseconds\), got '10m'\n$/],
  ['KEYGATE_DEPLOY_TIMEOUT_MS', '60s', serve(), /^keygate: KEYGATE_DEPLOY_TIMEOUT_MS must be an integer from 1 .*\(milliseconds\), got '60s'\n$/],
  ['KEYGATE_DRAIN_TIMEOUT_MS', '-1', serve(), /^keygate: KEYGATE_DRAIN_TIMEOUT_MS must be an integer from 1 .*, got '-1'\n$/],
  ['KEYGATE_STOP_GRACE_MS', '1.5', serve(), /^keygate: KEYGATE_STOP_GRACE_MS must be an integer from 1 .*, got '1.5'\n$/],
  ['KEYGATE_MAX_UPLOAD_BYTES', '1e999', serve(), /^keygate: KEYGATE_MAX_UPLOAD_BYTES must be an integer from 1 .*, got '1e999'\n$/],
  ['KEYGATE_MAX_TAR_ENTRIES', 'lots', serve(), /^keygate: KEYGATE_MAX_TAR_ENTRIES must be an integer from 1 .*, got 'lots'\n$/],
  ['KEYGATE_MAX_UNPACKED_BYTES', '1GB', serve(), /^keygate: KEYGATE_MAX_UNPACKED_BYTES must be an integer from 1 .*, got '1GB'\n$/],
  ['KEYGATE_LOG_LEVEL (serve)', 'verbose', serve(), /^keygate: KEYGATE_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'verbose'\n$/],
  ['KEYGATE_LOG_LEVEL (proxy)', 'verbose', proxy, /^keygate: KEYGATE_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'verbose'\n$/],
  ['KEYGATE_LOG_LEVEL (app serve)', 'verbose', app, /^keygate: KEYGATE_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'verbose'\n$/],
  ['KEYGATE_STREAM_HEARTBEAT_MS', '10s', serve(), /^keygate: KEYGATE_STREAM_HEARTBEAT_MS must be an integer from 100 to 600000 \(milliseconds\), got '10s'\n$/],
  ['KEYGATE_BUILD_INSTALL_SCRIPTS', 'true', serve(), /^keygate: KEYGATE_BUILD_INSTALL_SCRIPTS must be 0 or 1, got 'true'\n$/],
  ['KEYGATE_NODE_FLAGS', 'off', proxy, /^keygate: KEYGATE_NODE_FLAGS must be 0 or 1, got 'off'\n$/],
  ['KEYGATE_FAST_PATH', 'no', proxy, /^keygate: KEYGATE_FAST_PATH must be 0 or 1, got 'no'\n$/],
  ['KEYGATE_RELAY_GC', 'false', proxy, /^keygate: KEYGATE_RELAY_GC must be 0 or 1, got 'false'\n$/],
  ['KEYGATE_IDLE_GC', 'disabled', serve(), /^keygate: KEYGATE_IDLE_GC must be 0 or 1, got 'disabled'\n$/],
  ['KEYGATE_LOG_FLUSH_MS', 'soon', proxy, /^keygate: KEYGATE_LOG_FLUSH_MS must be an integer from 0 to 10000 \(milliseconds\), got 'soon'\n$/],
];

describe('settings in the environment that cannot be used', () => {
  it.each(cases)('%s=%s', (name, value, args, expected) => {
    const variable = name.split(' ')[0];
    const r = runCli(args, { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', [variable]: value }, timeoutMs: 30_000 });
    expect(r.stderr).toMatch(expected);
    expect(r.status).toBe(1);
    if (variable === 'KEYGATE_API_KEY') expect(r.stderr + r.stdout).not.toContain(value);
  });

  it('an empty value is the default, as if unset: serve starts and answers', async () => {
    const empties = Object.fromEntries(cases.map(([name]) => [name.split(' ')[0], '']));
    const cli = await startCli(serve(), { env: { ...empties, KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_LOG_LEVEL: '' } });
    try {
      const res = await fetch(`${cli.url}/api/v2/sandboxes/boxes`, { headers: { 'x-api-key': KEY } });
      expect(res.status).toBe(200);
    } finally {
      expect(await cli.stop()).toBe(0);
    }
  });
});

describe('intSetting and logLevelSetting (src/settings.ts)', () => {
  const range = { min: 1, max: 100, unit: 'milliseconds' };
  it('reads plain decimal integers within the range, and unset or blank as the default', () => {
    expect(intSetting({}, 'X', 7, range)).toBe(7);
    expect(intSetting({ X: '  ' }, 'X', 7, range)).toBe(7);
    expect(intSetting({ X: ' 42 ' }, 'X', 7, range)).toBe(42);
    expect(intSetting({ X: '1' }, 'X', 7, range)).toBe(1);
    expect(intSetting({ X: '100' }, 'X', 7, range)).toBe(100);
  });
  it.each(['0', '101', '1e2', '0x10', '10ms', '1.0', '', '+5', '99999999999999999999'].filter(Boolean))('refuses %j with the variable, the range and the value', (v) => {
    expect(() => intSetting({ X: v }, 'X', 7, range)).toThrow(SettingError);
    expect(() => intSetting({ X: v }, 'X', 7, range)).toThrow(`X must be an integer from 1 to 100 (milliseconds), got '${v}'`);
  });
  it('quotes a hostile value bounded and printable', () => {
    const err = (() => {
      try {
        intSetting({ X: `\x1b[2J${'a'.repeat(500)}` }, 'X', 7, { min: 0 });
      } catch (e) {
        return e as Error;
      }
    })();
    expect(err).toBeInstanceOf(SettingError);
    expect(err!.message).toBe(`X must be an integer from 0 up, got '?[2J${'a'.repeat(36)}...'`);
  });
  it('switches are 0 or 1, blank is the caller\'s default', () => {
    expect(switchSetting({}, 'S')).toBeUndefined();
    expect(switchSetting({ S: '' }, 'S')).toBeUndefined();
    expect(switchSetting({ S: '0' }, 'S')).toBe(false);
    expect(switchSetting({ S: ' 1 ' }, 'S')).toBe(true);
    for (const v of ['true', 'yes', 'on', '2', '01']) expect(() => switchSetting({ S: v }, 'S')).toThrow(`S must be 0 or 1, got '${v}'`);
  });
  it('log levels are pino\'s, blank is the default', () => {
    expect(logLevelSetting({}, 'warn')).toBe('warn');
    expect(logLevelSetting({ KEYGATE_LOG_LEVEL: ' ' }, 'warn')).toBe('warn');
    expect(logLevelSetting({ KEYGATE_LOG_LEVEL: 'debug' }, 'warn')).toBe('debug');
    expect(() => logLevelSetting({ KEYGATE_LOG_LEVEL: 'DEBUG' }, 'warn')).toThrow(SettingError);
  });
});
