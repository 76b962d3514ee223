// The streaming execution (WebSocket .../execute/ws) is authorised for as long as it runs: when the
// API key it was opened with is deleted through the API, the execution is killed and the socket
// closed (1008, an error frame) at the next heartbeat, instead of running on until its timeout.
// The real `keygate serve`, a real box (local driver), the ws client.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { localBoxesUnavailable } from './box-helpers.js';
import { api, cleanTmp, tmp } from './helpers.js';

const UNAVAILABLE = localBoxesUnavailable();
const KEY = 'stream-auth-test-key-0123456789abcdef';

describe.skipIf(UNAVAILABLE !== null)(`execute/ws re-checks its caller${UNAVAILABLE ? ` (skipped: ${UNAVAILABLE})` : ''}`, () => {
  let server: RunningCli;
  let dataDir: string;
  const env = { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_STREAM_HEARTBEAT_MS: '300' };

  beforeAll(async () => {
    const cfg = tmp();
    mkdirSync(cfg, { recursive: true });
    writeFileSync(path.join(cfg, 'templates.json'), JSON.stringify([{ name: 'box', description: 'stream auth', rootfs: 'host', environment: {}, resources: { memory_mb: 512, cpus: 1, pids: 256 } }]));
    dataDir = tmp();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'local', '--config-dir', cfg], { env });
    const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'sa1', wait_for_ready: true });
    expect(r.status, r.text).toBe(201);
  }, 90_000);

  afterAll(async () => {
    if (server) await api(server.url, KEY, 'DELETE', '/api/v2/sandboxes/boxes/sa1');
    if (server) expect(await server.stop(), server.output().slice(-3000)).toBe(0);
    cleanTmp();
  });

  it('ends the execution after its API key is deleted through the API', async () => {
    const made = runCli(['serve', 'keys', 'create', '--workspace', 'default', '--user', 'admin', '--name', 'stream', '--data', dataDir], { env });
    expect(made.status, made.stderr).toBe(0);
    const key2 = made.stdout.trim();
    const listed = await api(server.url, key2, 'GET', '/api/v1/api-key');
    const id2 = listed.body.find((k: { current: boolean }) => k.current).id;

    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/sa1/execute/ws`, { headers: { 'x-api-key': key2 } });
    const msgs: any[] = [];
    const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
    const started = new Promise<void>((r) =>
      ws.on('message', (m) => {
        const msg = JSON.parse(m.toString());
        msgs.push(msg);
        if (msg.type === 'started') r();
      }),
    );
    ws.on('error', () => undefined);
    await new Promise<void>((r) => ws.on('open', () => r()));
    ws.send(JSON.stringify({ command: 'sleep 600', timeout_seconds: 600 }));
    await started;

    const del = await api(server.url, KEY, 'DELETE', `/api/v1/api-key/${id2}`);
    expect(del.status, del.text).toBe(204);
    expect(await closed).toBe(1008);
    expect(msgs.at(-1)).toEqual({ type: 'error', detail: expect.stringContaining('no longer valid') });
    // The command went with it: nothing of it is left in the box.
    const ps = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes/sa1/execute', { command: ['sh', '-c', 'ps -eo args | grep -c "^sleep 600" || true'], timeout_seconds: 10 });
    expect(ps.status, ps.text).toBe(200);
    expect(ps.body.stdout.trim()).toBe('0');
  });

  /** A socket to execute/ws with the test's key; resolves once upgraded. */
  async function openExec(opts: WebSocket.ClientOptions = {}) {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/sa1/execute/ws`, { headers: { 'x-api-key': KEY }, ...opts });
    const msgs: any[] = [];
    ws.on('message', (m) => msgs.push(JSON.parse(m.toString())));
    ws.on('error', () => undefined);
    const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
    await new Promise<void>((r) => ws.on('open', () => r()));
    return { ws, msgs, closed };
  }
  /** `p`, or 'still open' once `ms` have passed. */
  const within = <T>(p: Promise<T>, ms: number) => Promise.race([p, new Promise<string>((r) => setTimeout(() => r('still open'), ms))]);

  // An upgraded socket has no HTTP timeout left: one that never sent its request was held for
  // good (its socket, a heartbeat timer, a credential check per beat).
  it('a socket that sends no execute request is ended after three heartbeats, with an error frame', async () => {
    const { msgs, closed } = await openExec();
    expect(await within(closed, 20_000)).toBe(1008);
    expect(msgs).toEqual([{ type: 'error', detail: expect.stringContaining('No execute request arrived within 3 heartbeats') }]);
  });

  // A client gone without a close (a dead network path; here one that never answers a ping) kept
  // its command running until the command's own timeout.
  it('a client that answers no ping for three heartbeats is cut, and its command killed', async () => {
    const marker = `sleep 611`;
    const { ws, msgs, closed } = await openExec({ autoPong: false });
    ws.send(JSON.stringify({ command: marker, timeout_seconds: 600 }));
    expect(await within(closed, 20_000)).toBe(1006);
    expect(msgs).toEqual([{ type: 'started' }]);
    const ps = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes/sa1/execute', { command: ['sh', '-c', `ps -eo args | grep -c "^${marker}" || true`], timeout_seconds: 10 });
    expect(ps.body.stdout.trim()).toBe('0');
  });

  it('a client that answers its pings keeps a quiet command running past three heartbeats', async () => {
    const { ws, msgs, closed } = await openExec();
    ws.send(JSON.stringify({ command: 'sleep 2; echo done', timeout_seconds: 60 }));
    expect(await within(closed, 30_000)).toBe(1000);
    expect(msgs.map((m) => m.type)).toEqual(['started', 'stdout', 'exit']);
    expect(msgs.at(-1)).toMatchObject({ exit_code: 0 });
  });
});
