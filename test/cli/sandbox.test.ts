import { spawn } from 'node:child_process';
import net from 'node:net';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startCli, waitForLine, type RunningCli } from '../helpers/cli.js';
import { localBoxesUnavailable } from '../sandbox-api/box-helpers.js';
import { cleanTmp, tmp } from '../sandbox-api/helpers.js';

// The real `keygate sandbox` CLI against a real `keygate serve` running real (local) boxes.

const UNAVAILABLE = localBoxesUnavailable();
if (UNAVAILABLE) console.warn(`SKIPPED keygate sandbox CLI tests: ${UNAVAILABLE}`);

const KEY = 'cli-sandbox-key-0123456789abcdef';
let server: RunningCli;
let cwd: string;
let env: NodeJS.ProcessEnv;

const cli = (args: string[], input?: string, extraEnv: NodeJS.ProcessEnv = {}) => runCli(['sandbox', ...args], { env: { ...env, ...extraEnv }, cwd, input });

describe.skipIf(UNAVAILABLE)('keygate sandbox', () => {
  beforeAll(async () => {
    const dataDir = tmp();
    cwd = tmp();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'local'], { env: { DATABASE_URL: '', KEYGATE_API_KEY: KEY } });
    await waitForLine(server, (l) => l.startsWith('sandbox driver local'));
    // The key and URL come from .env in the current directory, like `keygate deploy` reads them.
    writeFileSync(path.join(cwd, '.env'), `KEYGATE_API_KEY=${KEY}\nKEYGATE_URL=${server.url}\n`);
    env = { KEYGATE_API_KEY: '', KEYGATE_URL: '' };
  }, 60_000);

  afterAll(async () => {
    if (server) expect(await server.stop()).toBe(0);
    cleanTmp();
  });

  it('create waits for a ready box (default template of the driver); ls lists it', () => {
    const c = cli(['create', 'c1', '--idle-ttl', '0', '--json']);
    expect(c.status, c.stderr).toBe(0);
    expect(JSON.parse(c.stdout)).toMatchObject({ name: 'c1', status: 'ready', driver: 'local', template_name: 'host', idle_ttl_seconds: 0 });
    const ls = cli(['ls']);
    expect(ls.status).toBe(0);
    expect(ls.stdout).toMatch(/^NAME\s+STATUS\s+DRIVER/);
    expect(ls.stdout).toMatch(/\nc1\s+ready\s+local\s+host\s+0\s/);
    expect(JSON.parse(cli(['ls', '--json']).stdout).map((b: { name: string }) => b.name)).toEqual(['c1']);
  });

  it('exec streams output and exits with the command exit code', () => {
    const r = cli(['exec', 'c1', '--', 'echo out; echo err >&2; exit 7']);
    expect(r.status).toBe(7);
    expect(r.stdout).toBe('out\n');
    expect(r.stderr).toBe('err\n');
    const argv = cli(['exec', 'c1', '--', 'printf', '%s|', 'a b', 'c']);
    expect(argv.stdout).toBe('a b|c|');
    const json = cli(['exec', 'c1', '--json', '--env', 'X=42', '--', 'echo $X; exit 3']);
    expect(json.status).toBe(3);
    expect(JSON.parse(json.stdout)).toMatchObject({ stdout: '42\n', exit_code: 3, truncated: false });
  });

  it('exec -i forwards stdin', () => {
    const r = cli(['exec', '-i', 'c1', '--', 'tr a-z A-Z'], 'hello box\n');
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toBe('HELLO BOX\n');
  });

  it('cp copies a file into the box and back out', () => {
    const src = path.join(cwd, 'in.txt');
    writeFileSync(src, 'round trip \u00e9\n');
    expect(cli(['cp', src, 'c1:/workspace/sub/in.txt']).status).toBe(0);
    expect(cli(['exec', 'c1', '--', 'cat /workspace/sub/in.txt']).stdout).toBe('round trip \u00e9\n');
    const dst = path.join(cwd, 'out.txt');
    const r = cli(['cp', 'c1:/workspace/sub/in.txt', dst]);
    expect(r.status, r.stderr).toBe(0);
    expect(readFileSync(dst, 'utf8')).toBe('round trip \u00e9\n');
    const missing = cli(['cp', 'c1:/workspace/nope.txt', path.join(cwd, 'nope.txt')]);
    expect(missing.status).toBe(1);
    expect(missing.stderr).toMatch(/no such file.*\(404\)/);
  });

  it('cp of a local file that grows while it is uploaded sends it as it was at the start, and an empty file', () => {
    const src = path.join(cwd, 'growing.log');
    writeFileSync(src, Buffer.alloc(8 * 1024 * 1024, 'g'));
    // Appends all through the upload (its process group killed after it; 20 s at most in any case).
    const writer = spawn('timeout', ['20', '/bin/sh', '-c', `while :; do echo appended-line; done >> ${src}`], { stdio: 'ignore', detached: true });
    try {
      const r = cli(['cp', src, 'c1:/workspace/growing.log']);
      expect(r.status, r.stderr).toBe(0);
      const inBox = cli(['exec', 'c1', '--', 'wc -c < /workspace/growing.log; head -c 8388608 /workspace/growing.log | tr -d g | wc -c']).stdout.split('\n');
      const size = Number(inBox[0]);
      expect(size).toBeGreaterThanOrEqual(8 * 1024 * 1024);
      expect(inBox[1]).toBe('0');
      // Whatever was sent past the first 8 MiB is whole lines appended before the stat.
      const tail = cli(['exec', 'c1', '--', 'tail -c +8388609 /workspace/growing.log | grep -cv "^appended-line$"; true']).stdout.trim();
      expect(tail).toBe('0');
    } finally {
      process.kill(-writer.pid!, 'SIGKILL');
    }
    writeFileSync(path.join(cwd, 'empty.txt'), '');
    expect(cli(['cp', path.join(cwd, 'empty.txt'), 'c1:/workspace/empty.txt']).status).toBe(0);
    expect(cli(['exec', 'c1', '--', 'wc -c < /workspace/empty.txt']).stdout.trim()).toBe('0');
  });

  it('errors are one line; a wrong key is a 401 that never shows the key', () => {
    const r = cli(['exec', 'nope', '--', 'true']);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^keygate: cannot execute: Sandbox 'nope' not found\. \(404\)\n$/);
    const bad = cli(['ls'], undefined, { KEYGATE_API_KEY: 'wrong-key-abcdefghijklmnop' });
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/rejected the API key \(401\)/);
    expect(bad.stderr + bad.stdout).not.toContain('wrong-key-abcdefghijklmnop');
  });

  it('a server that is not there is "cannot reach"; a failure of the request itself says what failed, not that', async () => {
    const closed = await new Promise<number>((resolve) => {
      const srv = net.createServer().listen(0, '127.0.0.1', () => {
        const { port } = srv.address() as net.AddressInfo;
        srv.close(() => resolve(port));
      });
    });
    // Every command that talks to the API says it the same way, the streaming exec (a WebSocket) too.
    for (const args of [['ls'], ['exec', 'c1', '--', 'true'], ['exec', '--json', 'c1', '--', 'true'], ['rm', 'c1']]) {
      const gone = cli(args, undefined, { KEYGATE_URL: `http://127.0.0.1:${closed}` });
      expect(gone.status, args.join(' ')).toBe(1);
      expect(gone.stderr, args.join(' ')).toBe(`keygate: cannot reach the sandbox API at http://127.0.0.1:${closed}: connection refused (ECONNREFUSED); is 'keygate serve' running there? (set KEYGATE_URL)\n`);
    }
    // A directory given as the file to upload: its read fails on this side, the server is fine.
    const dir = cli(['cp', cwd, 'c1:/workspace/dir.bin']);
    expect(dir.status).toBe(1);
    expect(dir.stderr).toMatch(/^keygate: cannot upload: EISDIR\b.*\n$/);
  });

  it('rm deletes the box', () => {
    const r = cli(['rm', 'c1']);
    expect(r.status).toBe(0);
    expect(r.stdout).toBe('deleted c1\n');
    expect(JSON.parse(cli(['ls', '--json']).stdout)).toEqual([]);
  });
});
