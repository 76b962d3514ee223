// Several processes write the one encrypted secrets file at once (as `keygate secrets set` and a
// running `keygate serve` do) while a key rotation runs, and are killed with SIGKILL at arbitrary
// points: no acknowledged write may be lost, the file must stay whole (the old or the new
// document, never a torn one), the store must stay writable after the kills (stale locks broken),
// and re-running the rotation completes it with every value readable.
import { spawn, type ChildProcess } from 'node:child_process';
import fc from 'fast-check';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { rotateMasterKey } from '../../src/secrets/rotate.js';
import { EncryptedFileSecretStore } from '../../src/secrets/store.js';
import { REPO_ROOT } from '../helpers/cli.js';
import { propertyParams } from '../helpers/property.js';

const DIST = path.join(REPO_ROOT, 'dist/secrets');

// A writer: sets its own key to v0, v1, ... and acknowledges each on stdout once set() resolved.
const WRITER = `
const { EncryptedFileSecretStore } = await import(${JSON.stringify(path.join(DIST, 'store.js'))});
const { loadKeyring } = await import(${JSON.stringify(path.join(DIST, 'keyring.js'))});
const [dataDir, key] = process.argv.slice(2);
const store = new EncryptedFileSecretStore({ file: dataDir + '/secrets.json', keys: () => loadKeyring(dataDir, {}).envelope, lock: { timeoutMs: 60000 } });
for (let i = 0; ; i++) {
  await store.set(key, key + '-value-' + i);
  process.stdout.write(i + '\\n');
}
`;
// A rotator: rotates the master key over and over.
const ROTATOR = `
const { rotateMasterKey } = await import(${JSON.stringify(path.join(DIST, 'rotate.js'))});
const [dataDir] = process.argv.slice(2);
for (;;) { await rotateMasterKey({ dataDir, env: {} }); process.stdout.write('r\\n'); await new Promise((r) => setTimeout(r, 20)); }
`;

let root: string;
beforeAll(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'kg-crash-writers-'));
  writeFileSync(path.join(root, 'writer.mjs'), WRITER);
  writeFileSync(path.join(root, 'rotator.mjs'), ROTATOR);
});
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

interface Proc {
  child: ChildProcess;
  acked: () => number;
  exited: Promise<void>;
}

function start(script: string, args: string[]): Proc {
  const child = spawn(process.execPath, [path.join(root, script), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
  const exited = new Promise<void>((resolve) =>
    child.on('exit', (code, signal) => {
      if (signal !== 'SIGKILL') out += `\nEXIT ${code} ${signal} ${err}`;
      resolve();
    }),
  );
  return {
    child,
    exited,
    acked: () => {
      if (/EXIT/.test(out)) throw new Error(`a writer died on its own: ${out}`);
      const lines = out.split('\n').filter((l) => /^\d+$/.test(l));
      return lines.length ? Number(lines[lines.length - 1]) : -1;
    },
  };
}

describe('processes killed while writing the secrets file', () => {
  it('lose no acknowledged write, never tear the file, and leave it writable and rotatable', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: 0, max: 400 }), { minLength: 3, maxLength: 3 }),
        fc.integer({ min: 0, max: 400 }),
        fc.boolean(),
        async (killAfter, rotatorKillAfter, withRotator) => {
          const dataDir = mkdtempSync(path.join(root, 'run-'));
          const procs: Proc[] = [];
          try {
            loadKeyring(dataDir, {});
            const keys = killAfter.map((_, i) => `W${i}`);
            const writers = keys.map((k) => start('writer.mjs', [dataDir, k]));
            const rotator = withRotator ? start('rotator.mjs', [dataDir]) : undefined;
            procs.push(...writers, ...(rotator ? [rotator] : []));
            // Let them all get going (a first acknowledgement each), then kill each at its moment.
            for (const w of writers) {
              for (let t = 0; w.acked() < 0; t++) {
                if (t > 1000) throw new Error('a writer never acknowledged a write');
                await sleep(10);
              }
            }
            await Promise.all([
              ...writers.map(async (w, i) => {
                await sleep(killAfter[i]);
                w.child.kill('SIGKILL');
                await w.exited;
              }),
              (async () => {
                if (!rotator) return;
                await sleep(rotatorKillAfter);
                rotator.child.kill('SIGKILL');
                await rotator.exited;
              })(),
            ]);
            // A lock left behind is whole: a waiter can tell whose it is.
            const lockFile = path.join(dataDir, 'secrets.json.lock');
            if (existsSync(lockFile)) expect(readFileSync(lockFile, 'utf8')).toMatch(/^\S+ \d+ [0-9a-f]+$/);
            // The file is a whole document at every point; it is now too.
            const text = readFileSync(path.join(dataDir, 'secrets.json'), 'utf8');
            expect(() => JSON.parse(text)).not.toThrow();
            // A rotation killed half-way is completed by running it again.
            if (withRotator) await rotateMasterKey({ dataDir, env: {} });
            expect(readdirSync(dataDir).filter((f) => f.startsWith('master.key') && !f.endsWith('.tmp'))).toEqual(['master.key']);
            const store = new EncryptedFileSecretStore({ file: path.join(dataDir, 'secrets.json'), keys: () => loadKeyring(dataDir, {}).envelope });
            const snap = await store.snapshot();
            writers.forEach((w, i) => {
              const n = w.acked();
              // The last acknowledged value, or the one being written when the kill came.
              expect([`${keys[i]}-value-${n}`, `${keys[i]}-value-${n + 1}`], `writer ${keys[i]} acknowledged ${n}`).toContain(snap.get(keys[i]));
            });
            // Still writable: the lock a killed holder left is broken.
            await store.set('AFTER', 'after-the-kills');
            expect(await store.get('AFTER')).toBe('after-the-kills');
            expect(existsSync(lockFile)).toBe(false);
            // What killed writers left half-written (a retired key, values since replaced) is gone.
            expect(readdirSync(dataDir).filter((f) => f.endsWith('.tmp'))).toEqual([]);
          } finally {
            for (const p of procs) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
            await Promise.all(procs.map((p) => p.exited));
            rmSync(dataDir, { recursive: true, force: true });
          }
        },
      ),
      propertyParams(5),
    );
  });
});

describe('what a writer killed mid-write leaves beside the files', () => {
  it('is removed by the next write and by rotate-key, so a retired key or a deleted value does not linger', async () => {
    const dataDir = mkdtempSync(path.join(root, 'leftovers-'));
    const dead = 2147483646; // a pid that cannot be alive here
    const store = new EncryptedFileSecretStore({ file: path.join(dataDir, 'secrets.json'), keys: () => loadKeyring(dataDir, {}).envelope });
    await store.set('A', 'a');
    const oldKey = readFileSync(path.join(dataDir, 'master.key'), 'utf8');
    // As writeFileAtomic names its temp files, killed before the rename.
    writeFileSync(path.join(dataDir, `secrets.json.${dead}.0badc0de.tmp`), readFileSync(path.join(dataDir, 'secrets.json')));
    writeFileSync(path.join(dataDir, `master.key.prev.${dead}.0badc0de.tmp`), oldKey);
    writeFileSync(path.join(dataDir, `master.key.next.${dead}.0badc0de.tmp`), oldKey);
    writeFileSync(path.join(dataDir, `secrets.json.lock.${dead}.0badc0de0bad.tmp`), `host ${dead} 00`);
    await store.delete('A');
    expect(readdirSync(dataDir).filter((f) => f.startsWith('secrets.json.') && f.endsWith('.tmp'))).toEqual([]);
    await store.set('B', 'b');
    await rotateMasterKey({ dataDir, env: {} });
    expect(readdirSync(dataDir).sort()).toEqual(['master.key', 'secrets.json']);
    expect(await store.get('B')).toBe('b');
    rmSync(dataDir, { recursive: true, force: true });
  });
});
