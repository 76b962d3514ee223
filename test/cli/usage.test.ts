import { describe, expect, it } from 'vitest';
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
