// Reloading from disk: SIGHUP and file changes, through the holder (validate, resolve, compile, swap).
import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ConfigHolder } from '../../src/admin/config-holder.js';
import { ProxyMetrics } from '../../src/admin/metrics.js';
import { Reloader } from '../../src/admin/reload.js';
import { createLogger } from '../../src/log.js';
import type { CompiledConfig } from '../../src/rules/compile.js';
import { DirectorySecretStore, JsonFileSecretStore } from '../../src/secrets/store.js';

let dir: string;
let logs: string;
let applied: CompiledConfig[];
let reloader: Reloader | undefined;

const logger = () =>
  createLogger({
    destination: new Writable({
      write(chunk, _e, cb) {
        logs += chunk.toString();
        cb();
      },
    }),
  });

const cfg = (gen: string, key = 'TOKEN') => ({ rules: [{ name: 'r', match_hosts: ['api.test.local'], headers: [{ name: 'Authorization', type: 'workspace_secret', value: `Bearer {${key}}` }, { name: 'X-Gen', type: 'plaintext', value: gen }] }] });

/** What the proxy would inject now: header pairs of the first rule of the last swapped config. */
const injected = () => Object.fromEntries(applied.at(-1)!.rules[0].headers.map(([k, v]) => [k, v]));

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not reached in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-reload-'));
  logs = '';
  applied = [];
});
afterEach(async () => {
  await reloader?.stop();
  reloader = undefined;
  rmSync(dir, { recursive: true, force: true });
});

async function setup(store: JsonFileSecretStore | DirectorySecretStore, watch: string[]) {
  const configFile = path.join(dir, 'proxy.json');
  writeFileSync(configFile, JSON.stringify(cfg('g1')));
  const metrics = new ProxyMetrics();
  const holder = new ConfigHolder({ proxy: { setConfig: (c) => applied.push(c) }, store, metrics, logger: logger() });
  await holder.apply(cfg('g1'), { source: 'startup' });
  reloader = new Reloader({ holder, configFile, watch: [configFile, ...watch], debounceMs: 100, logger: logger() });
  reloader.start();
  return { holder, configFile, metrics };
}

describe('reload', () => {
  it('SIGHUP re-reads the file and the secrets; a bad file is logged and the old config stays', async () => {
    const secrets = path.join(dir, 'secrets.json');
    writeFileSync(secrets, JSON.stringify({ TOKEN: 'tok-1' }));
    const { holder, configFile } = await setup(new JsonFileSecretStore(secrets), []);
    expect(injected()).toEqual({ authorization: 'Bearer tok-1', 'x-gen': 'g1' });

    writeFileSync(secrets, JSON.stringify({ TOKEN: 'tok-2' }));
    process.kill(process.pid, 'SIGHUP');
    await until(() => holder.generation === 2);
    expect(holder.current()!.source).toBe('sighup');
    expect(injected()).toEqual({ authorization: 'Bearer tok-2', 'x-gen': 'g1' });

    // Missing secret: rejected, reason logged (names the key, not any value), old config in force.
    const swaps = applied.length;
    await reloader!.stop(); // no watcher: only the explicit reload below
    reloader = new Reloader({ holder, configFile, logger: logger() });
    writeFileSync(configFile, JSON.stringify(cfg('g3', 'MISSING_KEY')));
    expect(await reloader.reload('sighup')).toBeUndefined();
    expect(applied.length).toBe(swaps);
    expect(holder.generation).toBe(2);
    const line = JSON.parse(logs.trim().split('\n').at(-1)!);
    expect(line.level).toBe(50);
    expect(line.msg).toMatch(/reload rejected/);
    expect(JSON.stringify(line.issues)).toMatch(/MISSING_KEY/);
    // Broken JSON: the parser's message (which quotes the text) is not logged.
    writeFileSync(configFile, '{"rules": "tok-never-logged');
    expect(await reloader.reload('sighup')).toBeUndefined();
    expect(logs).toMatch(/not valid JSON/);
    expect(logs).not.toMatch(/tok-never-logged|tok-1|tok-2/);
    expect(holder.generation).toBe(2);
  });

  it('a change of the config file (replaced by rename, as editors do) is applied after a debounce', async () => {
    const secrets = path.join(dir, 'secrets.json');
    writeFileSync(secrets, JSON.stringify({ TOKEN: 'tok-1' }));
    const { holder, configFile } = await setup(new JsonFileSecretStore(secrets), [secrets]);
    const tmp = `${configFile}.tmp`;
    writeFileSync(tmp, JSON.stringify(cfg('g-file')));
    renameSync(tmp, configFile);
    await until(() => injected()['x-gen'] === 'g-file');
    expect(holder.current()!.source).toBe('file');
    // A second change to the same file is seen too (the watch survived the rename).
    writeFileSync(configFile, JSON.stringify(cfg('g-file-2')));
    await until(() => injected()['x-gen'] === 'g-file-2');
    // A broken save keeps the previous configuration.
    const gen = holder.generation;
    writeFileSync(configFile, '{ broken');
    await until(() => /reload rejected/.test(logs));
    expect(holder.generation).toBe(gen);
    expect(injected()['x-gen']).toBe('g-file-2');
  });

  it('a Kubernetes secret volume update (..data swap) is picked up', async () => {
    const vol = path.join(dir, 'vol');
    mkdirSync(path.join(vol, '..t1'), { recursive: true });
    writeFileSync(path.join(vol, '..t1', 'TOKEN'), 'k8s-1\n');
    symlinkSync('..t1', path.join(vol, '..data'));
    symlinkSync('..data/TOKEN', path.join(vol, 'TOKEN'));
    await setup(new DirectorySecretStore(vol), [vol]);
    expect(injected().authorization).toBe('Bearer k8s-1');
    mkdirSync(path.join(vol, '..t2'));
    writeFileSync(path.join(vol, '..t2', 'TOKEN'), 'k8s-2\n');
    symlinkSync('..t2', path.join(vol, '..data_tmp'));
    renameSync(path.join(vol, '..data_tmp'), path.join(vol, '..data'));
    await until(() => injected().authorization === 'Bearer k8s-2');
  });
});
