// An execute request no process can carry (a NUL in its command, an argument, an environment value
// or its working directory) is the caller's mistake: 422 at the field, over HTTP and over the
// WebSocket, and what it held (a command line often holds a credential) is neither answered nor
// logged. The real `keygate serve` on SQLite with real local boxes.
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { localBoxesUnavailable } from './box-helpers.js';
import { api, cleanTmp, tmp } from './helpers.js';

const UNAVAILABLE = localBoxesUnavailable();
if (UNAVAILABLE) console.warn(`SKIPPED sandbox execute input tests: ${UNAVAILABLE}`);

const KEY = 'sbx-leak-key-0123456789abcdef';
const HEAD = 'nulhead-' + 'c4'.repeat(8);
const TAIL = 'nultail-' + 'f6'.repeat(8);
const NUL = `${HEAD}\u0000${TAIL}`;

describe.skipIf(UNAVAILABLE)('execute input with a NUL', () => {
  let server: RunningCli;
  beforeAll(async () => {
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp(), '--sandbox-driver', 'local'], { env: { DATABASE_URL: '', KEYGATE_API_KEY: KEY } });
    await waitForLine(server, (l) => l.startsWith('sandbox driver local'));
    const made = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'host', name: 'nul', wait_for_ready: true });
    expect(made.status, made.text).toBe(201);
    expect(made.body.status).toBe('ready');
  }, 60_000);
  afterAll(async () => {
    if (server) {
      await api(server.url, KEY, 'DELETE', '/api/v2/sandboxes/boxes/nul');
      expect(await server.stop()).toBe(0);
    }
    cleanTmp();
  });

  const cases: [string, Record<string, unknown>, (string | number)[]][] = [
    ['an environment value', { command: 'true', env: { OK: 'fine', TOKEN: NUL } }, ['body', 'env', 'TOKEN']],
    ['a shell command line', { command: `curl -H 'Authorization: Bearer ${NUL}' https://example.com` }, ['body', 'command']],
    ['an argument', { command: ['echo', 'ok', NUL] }, ['body', 'command', 2]],
    ['the working directory', { command: 'true', cwd: `/workspace/${NUL}` }, ['body', 'cwd']],
  ];

  it.each(cases)('%s: 422 at its loc over HTTP, nothing of it echoed', async (_what, body, loc) => {
    const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes/nul/execute', body);
    expect(r.text).not.toContain(HEAD);
    expect(r.text).not.toContain(TAIL);
    expect(r.status, r.text).toBe(422);
    expect(r.body.detail).toEqual([{ loc, msg: expect.stringMatching(/NUL/), type: 'value_error' }]);
  });

  it('the same over the WebSocket', async () => {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/nul/execute/ws`, { headers: { 'x-api-key': KEY } });
    const frames: string[] = [];
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => ws.send(JSON.stringify({ command: 'true', env: { TOKEN: NUL } })));
      ws.on('message', (d) => frames.push(d.toString()));
      ws.once('close', () => resolve());
      ws.once('error', reject);
    });
    expect(frames).toHaveLength(1);
    expect(JSON.parse(frames[0])).toEqual({ type: 'error', detail: [{ loc: ['body', 'env', 'TOKEN'], msg: expect.stringMatching(/NUL/), type: 'value_error' }] });
  });

  it('the box still works and the server logged nothing of those values', async () => {
    const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes/nul/execute', { command: 'echo still here' });
    expect(r.status).toBe(200);
    expect(r.body.stdout).toBe('still here\n');
    expect(server.output()).not.toContain(HEAD);
    expect(server.output()).not.toContain(TAIL);
  });
});
