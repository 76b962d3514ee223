import path from 'node:path';
import { spawn } from 'node:child_process';
import { has } from './setup.mjs';

const BENCH_DIR = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');

/**
 * Runs bench/client.mjs (or another load generator: `script`) on core 1, away from the proxies on
 * core 0, and returns the JSON line it prints last; `{ok: false, error}` when it prints none.
 * `echo` passes its standard error through as it comes (one-phase tools), else it is kept for the error.
 */
export function runClient(spec, { script = path.join(BENCH_DIR, 'client.mjs'), echo = false } = {}) {
  return new Promise((resolve) => {
    const argv = [process.execPath, script, JSON.stringify(spec)];
    const full = has('taskset') ? ['taskset', '-c', '1', ...argv] : argv;
    const child = spawn(full[0], full.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => {
      err += d;
      if (echo) process.stderr.write(d);
    });
    child.on('close', () => {
      try {
        resolve(JSON.parse(out.trim().split('\n').pop()));
      } catch {
        resolve({ ok: false, error: `client crashed: ${err.trim().split('\n').slice(-3).join(' ') || 'no output'}` });
      }
    });
  });
}
