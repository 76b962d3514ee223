import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import type { EchoOrigin } from '../../src/sandbox-api/demo-origin.js';
import { DockerEngine } from '../../src/docker/engine.js';
import { ensureBoxImage } from '../helpers/box-image.js';
import { startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { dockerSocket } from '../helpers/docker-engine.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';
import { execIn, driversUnavailable, setUpServe } from './box-helpers.js';
import { api, cleanTmp, tmp } from './helpers.js';

// Attacks from inside a real box (both real drivers) on a `keygate serve` deployed as the shipped
// image runs it: listening on 0.0.0.0 (Dockerfile, docker-compose.yml). The box is the attacker;
// every test says what it tries and fails when the attack gets through.

const UNAVAILABLE = await driversUnavailable('hostile API tests');

const KEY = 'hostile-test-key-0123456789abcdef';
const ORIGIN_HOST = 'api.example.test';

/** Every non-loopback IPv4 address of this host (where a 0.0.0.0 listener answers too). */
const hostAddresses = () =>
  Object.values(os.networkInterfaces())
    .flat()
    .filter((a) => a && a.family === 'IPv4' && !a.internal)
    .map((a) => a!.address);

/** Spellings of "this host" a box may hand its proxy: other loopback addresses, mapped forms, interfaces. */
const hostSpellings = () => ['127.0.0.1', '127.0.0.2', '127.9.9.9', 'localhost', '[::1]', '[::ffff:127.0.0.2]', ...hostAddresses()];

describe.each(['local', 'docker'] as const)('hostile box vs keygate serve on 0.0.0.0 (%s driver)', (which) => {
  describe.skipIf(UNAVAILABLE[which])(which, () => {
    let origin: EchoOrigin;
    let server: RunningCli;
    let apiPort: string;
    const A = (method: string, url: string, body?: unknown) => api(server.url, KEY, method, url, body);
    const run = (box: string, command: string | string[]) => execIn(server.url, KEY, box, command);

    beforeAll(async () => {
      const cfg = tmp();
      const image = which === 'docker' ? await ensureBoxImage(new DockerEngine(dockerSocket()!)) : undefined;
      mkdirSync(cfg, { recursive: true });
      writeFileSync(path.join(cfg, 'templates.json'), JSON.stringify([{ name: 'box', description: 'hostile', ...(image ? { image } : { rootfs: 'host' }), environment: {}, resources: { memory_mb: 512, cpus: 1, pids: 256 } }]));
      let env: NodeJS.ProcessEnv;
      let dataDir: string;
      ({ origin, dataDir, env } = await setUpServe(KEY, ORIGIN_HOST));
      server = await startCli(['serve', '--listen', '0.0.0.0:0', '--data', dataDir, '--sandbox-driver', which, '--config-dir', cfg], { env });
      await waitForLine(server, (l) => l.startsWith(`sandbox driver ${which}`));
      apiPort = new URL(server.url).port;
      for (const name of ['h1', 'h2']) {
        const r = await A('POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name, wait_for_ready: true });
        expect(r.status, r.text).toBe(201);
        expect(r.body.status, r.text).toBe('ready');
      }
    }, 90_000);

    afterAll(async () => {
      if (server) for (const b of (await A('GET', '/api/v2/sandboxes/boxes?limit=100')).body.resources) await A('DELETE', `/api/v2/sandboxes/boxes/${b.name}`);
      if (server) expect(await server.stop(), server.output().slice(-3000)).toBe(0);
      await origin?.close();
      cleanTmp();
    });

    /**
     * What the box's own proxy answers for `host:port`, as a plain GET and as a CONNECT tunnel:
     * one line per host, "<host> <GET status> <CONNECT status>[ <status through the tunnel>]".
     */
    async function throughProxy(box: string, port: string, hosts: string[]): Promise<string[]> {
      const script = `for h in "$@"; do
  g=$(curl -s --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w '%{http_code}' --max-time 5 "http://$h:${port}/healthz")
  c=$(curl -s --noproxy '' -x http://127.0.0.1:3128 -p -o /dev/null -w '%{http_connect} %{http_code}' --max-time 5 "http://$h:${port}/healthz")
  echo "$h $g $c"
done`;
      const r = await run(box, ['sh', '-c', script, 'sh', ...hosts]);
      return r.stdout.trim().split('\n');
    }

    it("property 6: keygate's API is out of reach through the box's proxy at every address of this host", async () => {
      // The API does answer on those addresses (from the host): the attack is real.
      const direct = await fetch(`http://127.0.0.2:${apiPort}/healthz`);
      expect(direct.status).toBe(200);
      // Read once: other tests' containers add and remove this host's addresses meanwhile.
      const hosts = hostSpellings();
      const lines = await throughProxy('h1', apiPort, hosts);
      expect(lines).toHaveLength(hosts.length);
      for (const line of lines) {
        const [, get, connect, tunnelled] = line.split(' ');
        expect(get, line).toBe('403');
        expect(connect, line).toBe('403');
        expect(tunnelled, line).not.toBe('200');
      }
    });

    it("property 1: dialled directly (no proxy), keygate's API answers at no address, IPv4 or IPv6", async () => {
      const script = `for h in "$@"; do echo "$h $(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' --max-time 3 "http://$h:${apiPort}/healthz")"; done`;
      const hosts = [...hostSpellings(), '[::]', '0.0.0.0'];
      const r = await run('h1', ['sh', '-c', script, 'sh', ...hosts]);
      const lines = r.stdout.trim().split('\n');
      expect(lines).toHaveLength(hosts.length);
      for (const line of lines) expect(line.split(' ')[1], line).toBe('000');
    });

    it("property 6: another box's proxy is out of reach at every address of this host", async () => {
      const other = (await A('GET', '/api/v2/sandboxes/boxes/h2')).body.proxy.url as string;
      const port = new URL(other).port;
      for (const line of await throughProxy('h1', port, hostSpellings())) {
        const [, get, connect] = line.split(' ');
        // Refused by h1's proxy (403), or nothing listens there (502): never h2's proxy answering.
        expect(['403', '502'], line).toContain(get);
        expect(['403', '502', '000'], line).toContain(connect);
      }
    });

    it("property 5: stdin sent faster than the command reads is not buffered by the server: backpressure reaches the client, and nothing is lost", async () => {
      const MiB = 1024 * 1024;
      const frame = JSON.stringify({ type: 'stdin', data: 'x'.repeat(MiB / 2) });
      const open = (command: string, timeout: number) => {
        const ws = new WebSocket(`${server.url.replace('http', 'ws')}/api/v2/sandboxes/boxes/h1/execute/ws`, { headers: { 'x-api-key': KEY } });
        const msgs: any[] = [];
        ws.on('message', (m) => msgs.push(JSON.parse(m.toString())));
        const closed = new Promise<void>((r) => ws.on('close', () => r()));
        ws.on('error', () => undefined);
        return new Promise<{ ws: WebSocket; msgs: any[]; closed: Promise<void> }>((resolve) =>
          ws.on('open', () => {
            ws.send(JSON.stringify({ command, stdin: true, timeout_seconds: timeout }));
            resolve({ ws, msgs, closed });
          }),
        );
      };
      // A command that never reads: 16 MiB pushed at once stay on the client's side.
      const stalled = await open('sleep 600', 6);
      for (let i = 0; i < 32; i++) stalled.ws.send(frame);
      await new Promise((r) => setTimeout(r, 3000));
      expect(stalled.ws.bufferedAmount).toBeGreaterThan(8 * MiB);
      // Once the command ends (its timeout), the server reads again and the socket closes.
      await stalled.closed;
      expect(stalled.msgs.at(-1)?.type === 'exit' || stalled.msgs.at(-1)?.type === 'error', JSON.stringify(stalled.msgs.slice(-2))).toBe(true);
      // A command that reads late gets every byte.
      const late = await open('sleep 2; wc -c', 60);
      for (let i = 0; i < 32; i++) late.ws.send(frame);
      late.ws.send(JSON.stringify({ type: 'stdin_close' }));
      await late.closed;
      const out = late.msgs.filter((m) => m.type === 'stdout').map((m) => m.data).join('');
      expect(out.trim()).toBe(String(16 * MiB));
      expect(late.msgs.at(-1)).toMatchObject({ type: 'exit', exit_code: 0 });
    }, 60_000);

    it('property 4: downloading a FIFO, or a symlink to /dev/zero, answers at once and never streams', async () => {
      const r = await run('h1', 'cd /workspace && mkfifo fifo && ln -s /dev/zero zero && ln -s /dev/urandom random && echo ok');
      expect(r.stdout, r.stderr).toBe('ok\n');
      for (const f of ['fifo', 'zero', 'random']) {
        const ctl = new AbortController();
        const timer = setTimeout(() => ctl.abort(), 10_000);
        const res = await fetch(`${server.url}/api/v2/sandboxes/boxes/h1/files?path=/workspace/${f}`, { headers: { 'x-api-key': KEY }, signal: ctl.signal });
        const body = await res.text();
        clearTimeout(timer);
        expect(res.status, `${f}: ${body}`).toBeGreaterThanOrEqual(400);
        expect(res.status, `${f}: ${body}`).toBeLessThan(500);
        expect(JSON.parse(body).detail, f).toBeTruthy();
      }
    });
  });
});

// keygate's own database (DATABASE_URL) is keygate: a box must not talk to it through its proxy.
const PG_DRIVER = !UNAVAILABLE.local ? 'local' : !UNAVAILABLE.docker ? 'docker' : null;
describe.skipIf(!PG_DRIVER || !pgAvailable())(`hostile box vs keygate serve on PostgreSQL (${PG_DRIVER ?? 'no real driver'})`, () => {
  let origin: EchoOrigin;
  let server: RunningCli;
  let db: URL;

  beforeAll(async () => {
    db = new URL(await freshPgDatabase());
    const cfg = tmp();
    const image = PG_DRIVER === 'docker' ? await ensureBoxImage(new DockerEngine(dockerSocket()!)) : undefined;
    writeFileSync(path.join(cfg, 'templates.json'), JSON.stringify([{ name: 'box', description: 'hostile', ...(image ? { image } : { rootfs: 'host' }), environment: {} }]));
    let env: NodeJS.ProcessEnv;
    let dataDir: string;
    ({ origin, dataDir, env } = await setUpServe(KEY, ORIGIN_HOST, { DATABASE_URL: db.toString() }));
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', PG_DRIVER!, '--config-dir', cfg], { env });
    await waitForLine(server, (l) => l.startsWith('sandbox driver'));
    const r = await api(server.url, KEY, 'POST', '/api/v2/sandboxes/boxes', { template_name: 'box', name: 'p1', wait_for_ready: true });
    expect(r.body.status, r.text).toBe('ready');
  }, 90_000);

  afterAll(async () => {
    if (server) await api(server.url, KEY, 'DELETE', '/api/v2/sandboxes/boxes/p1');
    if (server) expect(await server.stop(), server.output().slice(-3000)).toBe(0);
    await origin?.close();
    cleanTmp();
  });

  it("property 3: keygate's PostgreSQL is out of reach through the box's proxy, by its name or any address", async () => {
    const port = db.port || '5432';
    const hosts = [db.hostname, '127.0.0.1', '127.0.0.2', 'localhost', ...hostAddresses()];
    const script = `for h in "$@"; do echo "$h $(curl -s --noproxy '' -x http://127.0.0.1:3128 -p -o /dev/null -w '%{http_connect}' --max-time 5 "telnet://$h:${port}" </dev/null)"; done`;
    const r = await execIn(server.url, KEY, 'p1', ['sh', '-c', script, 'sh', ...hosts]);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(hosts.length);
    // 403 from the proxy; 200 would be a tunnel to the database.
    for (const line of lines) expect(line.split(' ')[1], line).toBe('403');
  });
});
