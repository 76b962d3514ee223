import { spawn } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const LOG_MODULE = path.resolve('dist/log.js');

interface Seen {
  line: Record<string, unknown>;
  /** When it arrived (performance.now() of this process). */
  at: number;
}

/**
 * Runs `body` in a child whose logger writes to a real pipe (its stdout), as a sidecar does,
 * and timestamps every line as it arrives.
 */
function runChild(body: string, env: Record<string, string> = {}): Promise<{ seen: Seen[]; marks: number[]; code: number | null }> {
  const script = `import { createLogger } from ${JSON.stringify(LOG_MODULE)};
const mark = () => process.stderr.write('logged\\n');
${body}`;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const seen: Seen[] = [];
    const marks: number[] = [];
    let buf = '';
    child.stderr.on('data', (d: Buffer) => {
      for (const m of d.toString().match(/logged/g) ?? []) if (m) marks.push(performance.now());
    });
    child.stdout.on('data', (d: Buffer) => {
      const now = performance.now();
      buf += d.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        seen.push({ line: JSON.parse(buf.slice(0, nl)) as Record<string, unknown>, at: now });
        buf = buf.slice(nl + 1);
      }
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ seen, marks, code }));
  });
}

describe('log output batching', () => {
  it('writes every line, in order, when the process exits right after logging', async () => {
    const { seen, code } = await runChild(`const log = createLogger({ name: 't' });
for (let i = 0; i < 2000; i++) log.info({ i }, 'line');
mark();
process.exit(3);`);
    expect(code).toBe(3);
    expect(seen.map((s) => s.line.i)).toEqual(Array.from({ length: 2000 }, (_, i) => i));
  });

  it('holds info lines for the flush interval but writes warnings at once', async () => {
    const { seen, marks } = await runChild(`const log = createLogger({ name: 't', flushMs: 600 });
log.info('held');
mark();
setTimeout(() => { log.warn('urgent'); mark(); }, 100);
setTimeout(() => process.exit(0), 900);`);
    const held = seen.find((s) => s.line.msg === 'held');
    const urgent = seen.find((s) => s.line.msg === 'urgent');
    expect(held, 'the info line arrives').toBeDefined();
    expect(urgent, 'the warning arrives').toBeDefined();
    // The warning flushes the batch it joins: the info line goes out with it, in order.
    expect(seen.indexOf(held!)).toBeLessThan(seen.indexOf(urgent!));
    // The info line was held until the warning, logged 100 ms later (unbatched it would arrive
    // before the first mark), and the warning was written well before the 600 ms interval.
    expect(held!.at - marks[0]).toBeGreaterThan(60);
    expect(urgent!.at - marks[0]).toBeLessThan(400);
  });

  it('writes an info line on its own within the flush interval, with no exit and no warning', async () => {
    const { seen, marks } = await runChild(`const log = createLogger({ name: 't', flushMs: 50 });
log.info('alone');
mark();
setTimeout(() => process.exit(0), 800);`);
    const alone = seen.find((s) => s.line.msg === 'alone');
    expect(alone).toBeDefined();
    expect(alone!.at - marks[0]).toBeLessThan(1000);
  });

  it('KEYGATE_LOG_FLUSH_MS=0 writes each line as it comes', async () => {
    const { seen, marks } = await runChild(
      `const log = createLogger({ name: 't' });
log.info('now');
mark();
setTimeout(() => process.exit(0), 800);`,
      { KEYGATE_LOG_FLUSH_MS: '0' },
    );
    expect(seen.find((s) => s.line.msg === 'now')!.at - marks[0]).toBeLessThan(1000);
  });

  it('still redacts what it batches', async () => {
    const { seen } = await runChild(`const log = createLogger({ name: 't' });
log.info({ headers: { authorization: 'Bearer sk-live-batched' }, token: 'tok-batched' }, 'redacted');
process.exit(0);`);
    const text = JSON.stringify(seen.map((s) => s.line));
    expect(text).toContain('redacted');
    expect(text).not.toContain('sk-live-batched');
    expect(text).not.toContain('tok-batched');
  });
});
