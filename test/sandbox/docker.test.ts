/**
 * The docker box driver against the real engine (sandbox.md, security properties 1-5), with real
 * containers from a test image imported from host files, a real keygate proxy (child process) and a
 * real HTTPS origin with its own CA. Needs `npm run build` (the proxy is dist/cli/main.js) and
 * `apt-get install busybox-static curl`.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { caBundle, sandboxEnv } from '../../src/certs/env.js';
import { DockerEngine, dockerSocketPath } from '../../src/docker/engine.js';
import { BoxFileError, BoxStartError, type Box, type BoxSpec, type ExecOptions } from '../../src/sandbox/driver.js';
import { DockerBoxDriver } from '../../src/sandbox/docker.js';
import { BOX_UID, boxImageUnavailableReason, ensureBoxImage, ensureRootBoxImage } from '../helpers/box-image.js';
import { announceSkip, engineUnavailableReason } from '../helpers/docker-engine.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { CLI, REPO_ROOT, spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';

const SECRET = 'kgBOXSECRET-4c1d-8e2f-value';
const API_HOST = 'api.test.local';
const SCOPE = `keygate-test-box-${randomBytes(3).toString('hex')}`;
/** The scope of the "server" the reaping test kills: reaping one scope never touches another. */
const REAP_SCOPE = `${SCOPE}-reap`;

const engineReason = await engineUnavailableReason();
const imageReason = engineReason ?? boxImageUnavailableReason() ?? (existsSync(CLI) ? null : `${CLI} is missing: run npm run build`);
const skip = announceSkip('docker box driver tests', imageReason);

interface Ran {
  out: string;
  err: string;
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
}

async function run(box: Box, command: ExecOptions['command'], opts: Omit<ExecOptions, 'command'> = {}): Promise<Ran> {
  const p = await box.exec({ timeoutMs: 30_000, ...opts, command });
  let out = '';
  let err = '';
  p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
  p.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
  const r = await p.done;
  return { out, err, ...r };
}

async function readAll(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of stream) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

async function fileError(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    if (err instanceof BoxFileError) return err.kind;
    throw err;
  }
  return 'no error';
}

describe.skipIf(skip)('docker box driver (real engine)', () => {
  let engine: DockerEngine;
  let image: string;
  let pki: TestPki;
  let origin: TestOrigin;
  let proxy: SpawnedProxy;
  let driver: DockerBoxDriver;
  let box: Box;
  let baseDir: string;
  let suiteStart: number;
  /** A TCP server on the docker bridge's host address: what a box with a network could reach. */
  let bridgeServer: net.Server;
  let bridgeAddr: { host: string; port: number };
  let bridgeConnections = 0;

  const spec = (id: string, over: Partial<BoxSpec> = {}): BoxSpec => ({
    id,
    template: { name: 'test', image, environment: {} },
    resources: { memory_mb: 256, cpus: 1, pids: 128, disk_mb: 64 },
    env: {
      ...sandboxEnv({ proxyUrl: 'http://127.0.0.1:3128', caCertPath: '/etc/keygate/ca.pem', bundlePath: '/etc/keygate/ca-bundle.pem' }),
      NODE_USE_ENV_PROXY: '1',
      BOX_GREETING: 'hello-from-spec',
    },
    caPem: proxy.caPem,
    caBundlePem: caBundle(proxy.caPem),
    proxy: { host: proxy.host, port: proxy.port },
    stateDir: path.join(baseDir, id),
    ...over,
  });

  async function containersOf(id?: string, scope = SCOPE): Promise<{ Id: string; State: string }[]> {
    const labels = [`keygate.sandbox.scope=${scope}`, ...(id ? [`keygate.sandbox=${id}`] : [])];
    const res = await engine.json<{ Id: string; State: string }[]>('GET', `/containers/json?all=1&filters=${encodeURIComponent(JSON.stringify({ label: labels }))}`);
    return res.body;
  }

  async function volumesOf(id: string, scope = SCOPE): Promise<string[]> {
    const f = encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox.scope=${scope}`, `keygate.sandbox=${id}`] }));
    const res = await engine.json<{ Volumes: { Name: string }[] | null }>('GET', `/volumes?filters=${f}`);
    return (res.body.Volumes ?? []).map((v) => v.Name);
  }

  /** Processes in the box other than its init and relay (uid 3128). */
  async function boxProcesses(b: Box): Promise<string[]> {
    const r = await run(b, ['/bin/ps', '-o', 'pid,user,args']);
    return r.out
      .split('\n')
      .slice(1)
      .filter((l) => l.trim() && !/\b3128\b/.test(l.split(/\s+/).slice(0, 3).join(' ')) && !/ps -o pid,user,args/.test(l));
  }

  beforeAll(async () => {
    suiteStart = Math.floor(Date.now() / 1000);
    engine = new DockerEngine(dockerSocketPath()!);
    image = await ensureBoxImage(engine);
    pki = await createTestPki([API_HOST]);
    origin = await startOrigin(pki);
    proxy = await spawnProxy({
      config: { rules: [{ name: 'api', match_hosts: [API_HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }] }] },
      secrets: { API_TOKEN: SECRET },
      resolve: [`${API_HOST}:${origin.port}:127.0.0.1`],
      upstreamCa: [pki.caPem],
    });
    // The host's address on the engine's default bridge (its gateway: the subnet's first address
    // unless named): what any container with a network reaches. Listening there proves it is the host's.
    const bridge = await engine.json<{ IPAM?: { Config?: { Subnet?: string; Gateway?: string }[] } }>('GET', '/networks/bridge');
    const cfg = bridge.body.IPAM?.Config?.find((c) => c.Subnet && !c.Subnet.includes(':'));
    const gateway = cfg?.Gateway ?? cfg?.Subnet?.replace(/\.0\/\d+$/, '.1');
    if (!gateway || !net.isIPv4(gateway)) throw new Error('the engine has no IPv4 default bridge');
    bridgeServer = net.createServer((s) => {
      bridgeConnections++;
      s.end('reached the host\n');
    });
    await new Promise<void>((r) => bridgeServer.listen(0, gateway, r));
    bridgeAddr = { host: gateway, port: (bridgeServer.address() as net.AddressInfo).port };
    baseDir = mkdtempSync(path.join(os.tmpdir(), 'kgbox-'));
    driver = new DockerBoxDriver({ scope: SCOPE });
    box = await driver.start(spec('main'));
  }, 120_000);

  afterAll(async () => {
    if (driver) {
      for (const id of ['main', 'limits', 'oom', 'stop', 'destroy', 'relayfail', 'rootimg', 'relaydies', 'iso-a', 'iso-b']) await driver.destroy(id, path.join(baseDir, id)).catch(() => undefined);
      await driver.close();
    }
    if (engine) {
      // Whatever a failed test left, of this suite's scopes only.
      for (const scope of [SCOPE, REAP_SCOPE]) {
        for (const c of await containersOf(undefined, scope)) await engine.json('DELETE', `/containers/${c.Id}?force=1`);
        const f = encodeURIComponent(JSON.stringify({ label: [`keygate.sandbox.scope=${scope}`] }));
        const vols = await engine.json<{ Volumes: { Name: string }[] | null }>('GET', `/volumes?filters=${f}`);
        for (const v of vols.body.Volumes ?? []) await engine.json('DELETE', `/volumes/${v.Name}?force=1`);
      }
      await engine.close();
    }
    await proxy?.stop();
    await origin?.close();
    if (bridgeServer) await new Promise((r) => bridgeServer.close(r));
    if (baseDir) rmSync(baseDir, { recursive: true, force: true });
  }, 120_000);

  describe('1. the proxy is the only way out', () => {
    it('the box has no interface but loopback', async () => {
      const r = await run(box, 'cat /proc/net/dev');
      const ifaces = r.out
        .split('\n')
        .slice(2)
        .map((l) => l.split(':')[0].trim())
        .filter(Boolean);
      expect(ifaces).toEqual(['lo']);
    });

    it('direct TCP to a host origin gets no connection; through 127.0.0.1:3128 the request reaches the origin with the header injected', async () => {
      const before = origin.requests;
      const viaBridge = await run(box, `curl -sS --noproxy '*' --max-time 5 http://${bridgeAddr.host}:${bridgeAddr.port}/`);
      expect(viaBridge.exitCode).not.toBe(0);
      expect(viaBridge.out).not.toContain('reached the host');
      const viaLoopback = await run(box, `curl -sS --noproxy '*' --max-time 5 -k https://127.0.0.1:${origin.port}/direct`);
      expect(viaLoopback.exitCode).not.toBe(0);
      expect(bridgeConnections).toBe(0);
      expect(origin.requests).toBe(before);

      const proxied = await run(box, `curl -sS --max-time 20 https://${API_HOST}:${origin.port}/repos/x`);
      expect(proxied.err).toBe('');
      expect(proxied.exitCode).toBe(0);
      const echo = JSON.parse(proxied.out) as { headers: [string, string][]; url: string };
      expect(echo.url).toBe('/repos/x');
      expect(echo.headers).toContainEqual(['authorization', `Bearer ${SECRET}`]);
      expect(origin.requests).toBe(before + 1);
    });

    it('the relay carries concurrent tunnels and large bodies both ways', async () => {
      const r = await run(
        box,
        `for i in $(seq 1 16); do curl -s -o /dev/null -w '%{http_code}\\n' https://${API_HOST}:${origin.port}/repos/c$i & done; wait; ` +
          `head -c 20000000 /dev/zero | curl -sS --data-binary @- https://${API_HOST}:${origin.port}/upload`,
        { timeoutMs: 120_000 },
      );
      const lines = r.out.trim().split('\n');
      expect(lines.slice(0, 16)).toEqual(Array(16).fill('200'));
      expect(JSON.parse(lines[16])).toEqual({ bytes: 20_000_000 });
    });

    it('DNS reveals nothing: no resolver is reachable, and the host resolver is not named', async () => {
      const r = await run(box, 'cat /etc/resolv.conf; nslookup example.com; echo "rc=$?"');
      expect(r.out).toMatch(/rc=[1-9]/);
      expect(r.out).not.toMatch(/^nameserver/m);
      expect(r.out + r.err).not.toMatch(/Address(es)?:?\s+\d+\.\d+\.\d+\.\d+(?!.*#53)/);
      const hostResolv = existsSync('/etc/resolv.conf') ? readFileSync('/etc/resolv.conf', 'utf8') : '';
      for (const ns of hostResolv.match(/^nameserver\s+(\S+)/gm) ?? []) expect(r.out).not.toContain(ns.split(/\s+/)[1]);
    });
  });

  describe('6. boxes apart', () => {
    it("each box's 127.0.0.1:3128 reaches its own proxy only, and no box sees another's state", async () => {
      const fakes = await Promise.all(
        ['proxy-of-a', 'proxy-of-b'].map(async (name) => {
          const srv = net.createServer((s) => s.end(`${name}\n`));
          await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
          return { srv, port: (srv.address() as net.AddressInfo).port };
        }),
      );
      try {
        const a = await driver.start(spec('iso-a', { proxy: { host: '127.0.0.1', port: fakes[0].port } }));
        const b = await driver.start(spec('iso-b', { proxy: { host: '127.0.0.1', port: fakes[1].port } }));
        const ask = 'sleep 1 | nc 127.0.0.1 3128; cat /proc/self/mountinfo';
        const [ra, rb] = await Promise.all([run(a, ask), run(b, ask)]);
        expect(ra.out.split('\n')[0]).toBe('proxy-of-a');
        expect(rb.out.split('\n')[0]).toBe('proxy-of-b');
        expect(ra.out).not.toContain(path.join(baseDir, 'iso-b'));
        expect(rb.out).not.toContain(path.join(baseDir, 'iso-a'));
        expect(ra.out).not.toContain(path.join(baseDir, 'main'));
      } finally {
        for (const f of fakes) f.srv.close();
      }
    });
  });

  describe('3. nothing of keygate inside', () => {
    it('no docker socket, no data directory, no CA key, no secret; the environment is the spec', async () => {
      const stateMarker = `kg-state-marker-${randomBytes(6).toString('hex')}`;
      writeFileSync(path.join(baseDir, 'main', 'planted-in-state-dir'), stateMarker);
      const caKey = readFileSync(path.join(proxy.certsDir, 'ca-key.pem'), 'utf8');
      const keyLine = caKey.split('\n').find((l) => l.length > 40)!.slice(0, 40);
      const sock = dockerSocketPath()!;
      const r = await run(box, [
        '/bin/sh',
        '-c',
        'ls -d "$1" /var/run/docker.sock /run/docker.sock 2>&1; echo ---; ' +
          'grep -rlF -e "$2" -e "$3" -e "$4" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=.keygate 2>/dev/null; echo ---; env',
        'sh',
        sock,
        keyLine,
        stateMarker,
        SECRET,
      ]);
      const [ls, found, env] = r.out.split('---\n');
      expect(ls).not.toMatch(/^\/(var\/)?run\/docker\.sock$/m);
      expect(ls).toMatch(/No such file/);
      expect(found.trim()).toBe('');
      expect(env).not.toContain(SECRET);
      expect(env).toContain('HTTPS_PROXY=http://127.0.0.1:3128');
      expect(env).toContain('NODE_USE_ENV_PROXY=1');
      expect(env).toContain('BOX_GREETING=hello-from-spec');
      const ca = await run(box, 'cat /etc/keygate/ca.pem; echo =SEP=; cat /etc/keygate/ca-bundle.pem');
      expect(ca.out.split('=SEP=\n')[0]).toBe(proxy.caPem);
      expect(ca.out.split('=SEP=\n')[1]).toContain(proxy.caPem.trim());
      const mounts = (await run(box, 'cat /proc/self/mountinfo')).out;
      expect(mounts).toContain(' /workspace ');
      expect(mounts).not.toContain('docker.sock');
      expect(mounts).not.toContain(proxy.certsDir);
    });

    it('the relay runs as its own uid: the box user can neither signal nor read it', async () => {
      const r = await run(box, "for p in $(ps -o pid,user | awk '$2==3128{print $1}'); do kill -9 $p 2>&1; cat /proc/$p/environ >/dev/null 2>&1 && echo READ; done; echo done");
      expect(r.out).toMatch(/done/);
      expect(r.out).not.toContain('READ');
      expect(r.out).toMatch(/Operation not permitted|not permitted/);
      const still = await run(box, `curl -sS --max-time 20 https://${API_HOST}:${origin.port}/repos/still`);
      expect(still.exitCode).toBe(0);
    });
  });

  describe('4. files stay in the box', () => {
    let hostFile: string;
    let hostDir: string;
    beforeAll(() => {
      hostDir = mkdtempSync(path.join(os.tmpdir(), 'kg-host-'));
      hostFile = path.join(hostDir, 'host-only.txt');
      writeFileSync(hostFile, 'HOST CONTENT\n');
    });
    afterAll(() => rmSync(hostDir, { recursive: true, force: true }));

    it('a symlink or .. planted in the box reads the box, never the host', async () => {
      const r = await run(box, ['/bin/sh', '-c', 'ln -s "$1" /workspace/to-host && ln -s / /workspace/root && ln -s "$2" /workspace/to-host-dir', 'sh', hostFile, hostDir]);
      expect(r.exitCode).toBe(0);
      expect(await fileError(box.readFile('/workspace/to-host', 1 << 20))).toBe('not_found');
      expect(await fileError(box.readFile(`/workspace/root${hostFile}`, 1 << 20))).toBe('not_found');
      expect(await fileError(box.readFile(`/workspace/../../..${hostFile}`, 1 << 20))).toBe('not_found');
      const inImage = await box.readFile('/workspace/root/etc/in-image.txt', 1 << 20);
      expect((await readAll(inImage.stream)).toString()).toBe('this file is in the image\n');
      const dotdot = await box.readFile('/workspace/../../../etc/in-image.txt', 1 << 20);
      expect((await readAll(dotdot.stream)).toString()).toBe('this file is in the image\n');
    });

    it('writes through a planted symlink or .. never touch the host', async () => {
      // Replaces the link in the box; the host file keeps its content.
      await box.writeFile('/workspace/to-host', Readable.from([Buffer.from('written by the API\n')]), 1024);
      expect(readFileSync(hostFile, 'utf8')).toBe('HOST CONTENT\n');
      expect((await run(box, 'cat /workspace/to-host')).out).toBe('written by the API\n');
      // A directory link to a host path: the box has no such directory.
      expect(await fileError(box.writeFile('/workspace/to-host-dir/new.txt', Readable.from([Buffer.from('x')]), 1024))).toBe('not_found');
      expect(await fileError(box.writeFile(`/workspace/../..${hostDir}/new.txt`, Readable.from([Buffer.from('x')]), 1024))).toBe('not_found');
      expect(readdirSync(hostDir)).toEqual(['host-only.txt']);
      // What the driver lends the box (host files, bind-mounted) cannot be written through the API.
      const caOnHost = readFileSync(path.join(baseDir, 'main', 'run', 'ca', 'ca.pem'), 'utf8');
      expect(await fileError(box.writeFile('/etc/keygate/ca.pem', Readable.from([Buffer.from('x')]), 1024))).toBe('bad_path');
      expect(await fileError(box.writeFile('/.keygate/relay/planted', Readable.from([Buffer.from('x')]), 1024))).toBe('bad_path');
      expect(await fileError(box.writeFile('/.keygate/node', Readable.from([Buffer.from('x')]), 1024))).toBe('bad_path');
      expect(readFileSync(path.join(baseDir, 'main', 'run', 'ca', 'ca.pem'), 'utf8')).toBe(caOnHost);
      expect(existsSync(path.join(baseDir, 'main', 'run', 'relay', 'planted'))).toBe(false);
      // The read-only root stays read-only through the API too.
      expect(await fileError(box.writeFile('/workspace/../etc/planted', Readable.from([Buffer.from('x')]), 1024))).toBe('bad_path');
      expect((await run(box, 'ls /etc/planted')).exitCode).not.toBe(0);
    });

    it('uploads and downloads stream, with bounds, owned by the box user', async () => {
      const big = randomBytes(3 * 1024 * 1024 + 17);
      const put = await box.writeFile('/workspace/big.bin', Readable.from([big.subarray(0, 1 << 20), big.subarray(1 << 20)]), 8 << 20);
      expect(put.size).toBe(big.length);
      const st = await run(box, 'stat -c "%u %s" /workspace/big.bin; sha256sum /workspace/big.bin');
      expect(st.out).toContain(`${BOX_UID} ${big.length}`);
      expect(st.out).toContain(createHash('sha256').update(big).digest('hex'));
      const got = await box.readFile('/workspace/big.bin', 8 << 20);
      expect(got.size).toBe(big.length);
      expect((await readAll(got.stream)).equals(big)).toBe(true);

      expect(await fileError(box.readFile('/workspace/big.bin', 1000))).toBe('too_large');
      expect(await fileError(box.writeFile('/workspace/too-big.bin', Readable.from([randomBytes(2000)]), 1000))).toBe('too_large');
      expect((await run(box, 'ls /workspace/too-big.bin')).exitCode).not.toBe(0);
      expect(readdirSync(path.join(baseDir, 'main')).filter((f) => f.startsWith('upload-'))).toEqual([]);
      expect(await fileError(box.readFile('/workspace', 1000))).toBe('not_a_file');
      expect(await fileError(box.writeFile('/workspace', Readable.from([Buffer.from('x')]), 1000))).toBe('not_a_file');
      expect(await fileError(box.writeFile('/', Readable.from([Buffer.from('x')]), 1000))).toBe('bad_path');
      await run(box, 'mkdir -p /workspace/adir');
      expect(await fileError(box.writeFile('/workspace/adir', Readable.from([Buffer.from('x')]), 1000))).toBe('not_a_file');
      expect(await fileError(box.readFile('relative', 1000))).toBe('bad_path');
    });
  });

  describe('5. processes stay in the box', () => {
    it('an execution timeout kills the whole tree, daemons that double-fork and setsid included', async () => {
      const t0 = Date.now();
      // The daemon double-forks, leaves the session and clears its environment: only the subreaper keeps it in the tree.
      const r = await run(box, "sleep 1001 & (env -i /bin/setsid /bin/sh -c '/bin/sleep 1002 &' &) ; sh -c 'sleep 1003' & sleep 1004", { timeoutMs: 1500 });
      expect(r.timedOut).toBe(true);
      expect(r.signal).toBe('SIGKILL');
      expect(r.exitCode).toBeNull();
      expect(Date.now() - t0).toBeLessThan(15_000);
      expect((await boxProcesses(box)).filter((l) => /sleep 100/.test(l))).toEqual([]);
    });

    it('kill() ends a running execution and its children', async () => {
      const p = await box.exec({ command: 'yes > /dev/null & sleep 1005' });
      await new Promise((r) => setTimeout(r, 300));
      p.kill();
      const r = await p.done;
      expect(r.signal).toBe('SIGKILL');
      expect((await boxProcesses(box)).filter((l) => /yes|sleep 1005/.test(l))).toEqual([]);
    });

    it('output streams as it comes, stderr apart, stdin when asked, exit codes pass through', async () => {
      const p = await box.exec({ command: 'echo first; echo oops >&2; read line; echo "got $line"; exit 7', stdin: true });
      const first = await new Promise<string>((r) => p.stdout.once('data', (c: Buffer) => r(c.toString())));
      expect(first).toBe('first\n');
      let err = '';
      p.stderr.on('data', (c: Buffer) => (err += c));
      let rest = '';
      p.stdout.on('data', (c: Buffer) => (rest += c));
      p.stdin!.end('typed\n');
      const r = await p.done;
      expect(rest).toBe('got typed\n');
      expect(err).toBe('oops\n');
      expect(r).toEqual({ exitCode: 7, signal: null, timedOut: false });
      const noStdin = await run(box, 'cat; echo end');
      expect(noStdin.out).toBe('end\n');
    });

    it('a caller that drops stdout does not hang the execution; stderr still arrives', async () => {
      const p = await box.exec({ command: 'head -c 8000000 /dev/zero; echo after >&2' });
      p.stdout.destroy();
      let err = '';
      p.stderr.on('data', (c: Buffer) => (err += c));
      expect(await p.done).toEqual({ exitCode: 0, signal: null, timedOut: false });
      expect(err).toBe('after\n');
    });

    it('no privilege: every capability dropped, a setuid-root program gives nothing', async () => {
      const r = await run(box, "id -u; /suid/busybox id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; cat /proc/self/status | grep NoNewPrivs");
      const lines = r.out.trim().split('\n');
      expect(lines[0]).toBe(String(BOX_UID));
      expect(lines[1]).toBe(String(BOX_UID));
      expect(r.out).toMatch(/CapEff:\s+0+\n/);
      expect(r.out).toMatch(/CapBnd:\s+0+\n/);
      expect(r.out).toMatch(/NoNewPrivs:\s+1/);
    });

    it('an image without a user runs executions as root holding nothing: no capability, no hold on the relay', async () => {
      const rootImage = await ensureRootBoxImage(engine);
      const b = await driver.start(spec('rootimg', { template: { name: 'root', image: rootImage, environment: {} } }));
      const r = await run(
        b,
        "id -u; grep -E '^CapEff' /proc/self/status; touch /workspace/w 2>&1; echo x > /tmp/w && echo wrote; chown 1000 /tmp/w 2>&1; " +
          "for p in $(ps -o pid,user | awk '$2==3128{print $1}'); do kill -9 $p 2>&1; done; mount -t tmpfs none /mnt 2>&1; echo end",
      );
      const lines = r.out.trim().split('\n');
      expect(lines[0]).toBe('0');
      expect(r.out).toMatch(/CapEff:\s+0+\n/);
      // This image's /workspace belongs to uid 1000: root without CAP_DAC_OVERRIDE cannot write there.
      expect(r.out).toMatch(/touch: .*Permission denied/);
      expect(r.out).toContain('wrote');
      expect(r.out).toMatch(/chown: .*Operation not permitted/);
      expect(r.out).toMatch(/can't kill pid 1: Operation not permitted/);
      expect(r.out.match(/can't kill pid \d+: Operation not permitted/g)?.length).toBe(2);
      expect(r.out).toMatch(/mount: .*(denied|not permitted)/i);
      expect((await run(b, `curl -sS --max-time 20 https://${API_HOST}:${origin.port}/repos/root`)).exitCode).toBe(0);
      // The files API writes as the box's own user, with no more right than it: not to this
      // /workspace (the engine's archive API, used before, wrote there as the engine's root).
      await expect(b.writeFile('/workspace/by-api', Readable.from([Buffer.from('x')]), 10)).rejects.toMatchObject({ kind: 'bad_path' });
      await b.writeFile('/tmp/by-api', Readable.from([Buffer.from('x')]), 10);
      expect((await run(b, 'stat -c %u /tmp/by-api; ls /workspace')).out.trim()).toBe('0');
    });

    it('a box whose relay dies stops (never open network); start() brings up a new one', async () => {
      const s = spec('relaydies');
      const b = await driver.start(s);
      const [c] = await containersOf('relaydies');
      // As the relay's own uid (only the test can: the box user cannot), kill every process but init.
      const ex = await engine.json<{ Id: string }>('POST', `/containers/${c.Id}/exec`, { User: '3128:3128', Cmd: ['/bin/kill', '-9', '-1'] });
      await engine.json('POST', `/exec/${ex.body.Id}/start`, { Detach: true, Tty: false });
      const deadline = Date.now() + 15_000;
      let state = 'running';
      while (Date.now() < deadline && state === 'running') {
        await new Promise((r) => setTimeout(r, 200));
        state = (await containersOf('relaydies'))[0]?.State ?? 'gone';
      }
      expect(state).not.toBe('running');
      await expect(b.exec({ command: 'true' })).rejects.toThrow();
      const again = await driver.start(s);
      expect(again).not.toBe(b);
      expect((await run(again, `curl -sS --max-time 20 https://${API_HOST}:${origin.port}/repos/again`)).exitCode).toBe(0);
    });

    it('stop kills every process and removes the container; /workspace survives a start', async () => {
      const b = await driver.start(spec('stop'));
      await run(b, 'echo kept > /workspace/kept.txt');
      const bg = await b.exec({ command: 'sleep 1006' });
      await b.stop();
      await bg.done;
      expect(await containersOf('stop')).toEqual([]);
      await expect(b.exec({ command: 'true' })).rejects.toThrow(/not running/);
      expect(await fileError(b.readFile('/workspace/kept.txt', 100))).toBe('not_running');
      const again = await driver.start(spec('stop'));
      expect((await run(again, 'cat /workspace/kept.txt')).out).toBe('kept\n');
      expect((await boxProcesses(again)).filter((l) => /sleep/.test(l))).toEqual([]);
      // Still the box user's to write after a start: the second mount gave the file system's root
      // back to root, and no new file could be made at its top.
      expect((await run(again, 'touch /workspace/made 2>&1 && echo made; stat -c %u /workspace')).out).toBe('made\n1000\n');
      await again.writeFile('/workspace/after.txt', Readable.from([Buffer.from('after')]), 10);
      expect((await run(again, 'cat /workspace/after.txt; stat -c %u /workspace /workspace/after.txt')).out).toBe('after1000\n1000\n');
    });

    it('destroy removes container, volume and state directory, and is idempotent', async () => {
      const s = spec('destroy');
      await driver.start(s);
      expect((await containersOf('destroy')).length).toBe(1);
      expect((await volumesOf('destroy')).length).toBe(1);
      await driver.destroy('destroy', s.stateDir);
      expect(await containersOf('destroy')).toEqual([]);
      expect(await volumesOf('destroy')).toEqual([]);
      expect(existsSync(s.stateDir)).toBe(false);
      await driver.destroy('destroy', s.stateDir);
    });
  });

  describe('syscall filter (syscall-policy.ts as a seccomp profile of its own)', () => {
    // perl's syscall() calls the kernel as attacking box code would. The AF_VSOCK socket is only
    // created (never connected): vsock is not network-namespaced and reaches the hypervisor.
    const PERL = [
      'print "io_uring=", (syscall(425, 8, 0) == -1 ? $!+0 : "ok"), "\\n";',
      'print "vsock=", (socket(my $v, 40, 1, 0) ? "ok" : $!+0), "\\n";',
      'print "unshare_user=", (syscall(272, 0x10000000) == -1 ? $!+0 : "ok"), "\\n";',
      'print "keyctl=", (syscall(250, 0, -3, 0) == -1 ? $!+0 : "ok"), "\\n";',
      'print "clone3=", (syscall(435, 0, 0) == -1 ? $!+0 : "ok"), "\\n";',
      'print "personality_exec=", (syscall(135, 0x400000) == -1 ? $!+0 : "ok"), "\\n";',
      'print "inet=", (socket(my $i, 2, 1, 0) ? "ok" : $!+0), "\\n";',
      'print "personality_query=", (syscall(135, 0xffffffff) == -1 ? $!+0 : "ok"), "\\n";',
      'my $p = fork(); if (!$p) { exit 7 } waitpid($p, 0); print "fork=", $? >> 8, "\\n";',
    ].join(' ');

    it.skipIf(process.arch !== 'x64')('io_uring, AF_VSOCK, namespaces and the keyring fail with EPERM (clone3 ENOSYS); sockets, fork, sh and applets work', async () => {
      const r = await run(box, ['/usr/bin/perl', '-e', PERL]);
      expect(r.err).toBe('');
      expect(r.out).toBe('io_uring=1\nvsock=1\nunshare_user=1\nkeyctl=1\nclone3=38\npersonality_exec=1\ninet=ok\npersonality_query=ok\nfork=7\n');
      const sh = await run(box, 'grep ^Seccomp: /proc/self/status; echo a b | wc -w; ls / | grep -c workspace; (sleep 0.1 &) ; date +%Y >/dev/null && echo ok');
      expect(sh.out.replace(/[ \t]+/g, ' ')).toBe('Seccomp: 2\n2\n1\nok\n');
    });

    it("the engine was given keygate's profile (verifyIsolation fails closed without it)", async () => {
      const info = await engine.json<{ Id: string; HostConfig: { SecurityOpt: string[] } }>('GET', `/containers/${(await containersOf('main'))[0].Id}/json`);
      const seccomp = info.body.HostConfig.SecurityOpt.filter((o) => o.startsWith('seccomp='));
      expect(seccomp).toHaveLength(1);
      const profile = JSON.parse(seccomp[0].slice('seccomp='.length)) as { defaultAction: string; syscalls: { names: string[]; action: string }[] };
      expect(profile.defaultAction).toBe('SCMP_ACT_ERRNO');
      const allowed = new Set(profile.syscalls.filter((x) => x.action === 'SCMP_ACT_ALLOW').flatMap((x) => x.names));
      for (const n of ['read', 'write', 'execve', 'openat', 'futex', 'epoll_pwait', 'clone', 'socket']) expect(allowed.has(n), n).toBe(true);
      for (const n of ['io_uring_setup', 'unshare', 'setns', 'keyctl', 'bpf', 'ptrace', 'mount', 'clone3']) expect(allowed.has(n), n).toBe(false);
    });
  });

  describe('limits', () => {
    it('PidsLimit caps the processes a box may hold; a timeout still kills the tree of a box at its limit', async () => {
      const b = await driver.start(spec('limits', { resources: { memory_mb: 256, cpus: 0.5, pids: 40, disk_mb: 64 } }));
      const id = (await containersOf('limits'))[0].Id;
      const inspect = await engine.json<{ HostConfig: { PidsLimit: number; NanoCpus: number; Memory: number } }>('GET', `/containers/${id}/json`);
      expect(inspect.body.HostConfig).toMatchObject({ PidsLimit: 40, NanoCpus: 5e8, Memory: 256 * 1024 * 1024 });
      // The subshell dies at its first failed fork; `exec` then needs no fork, so the tree stays at the limit.
      const p = await b.exec({ command: '(i=0; while [ $i -lt 200 ]; do sleep 1007 & i=$((i+1)); done); echo looped; exec sleep 1008', timeoutMs: 5000 });
      let out = '';
      let err = '';
      p.stdout.on('data', (c: Buffer) => (out += c));
      p.stderr.on('data', (c: Buffer) => (err += c));
      let peak = 0;
      const t0 = Date.now();
      // Sampled only before the timeout: killing the tree raises the limit for a moment.
      const poll = setInterval(() => {
        void engine.json<{ pids_stats?: { current?: number } }>('GET', `/containers/${id}/stats?stream=false&one-shot=true`).then((s) => {
          if (Date.now() - t0 < 4500) peak = Math.max(peak, s.body?.pids_stats?.current ?? 0);
        }, () => undefined);
      }, 400);
      const r = await p.done;
      clearInterval(poll);
      expect(out).toContain('looped');
      expect(err).toMatch(/can't fork|Resource temporarily unavailable/);
      expect(peak).toBeGreaterThan(20);
      expect(peak).toBeLessThanOrEqual(40);
      expect(r.timedOut).toBe(true);
      expect((await boxProcesses(b)).filter((l) => /sleep 100[78]/.test(l))).toEqual([]);
      const after = await engine.json<{ HostConfig: { PidsLimit: number } }>('GET', `/containers/${id}/json`);
      expect(after.body.HostConfig.PidsLimit).toBe(40);
    });

    it('Memory: a process past the limit is killed, the box lives on', async () => {
      const b = await driver.start(spec('oom', { resources: { memory_mb: 96, cpus: 1, pids: 64, disk_mb: 64 } }));
      const limit = await run(b, 'cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes');
      expect(limit.out.trim()).toBe(String(96 * 1024 * 1024));
      const hog = await run(b, `awk 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'`, { timeoutMs: 30_000 });
      expect(hog.timedOut).toBe(false);
      expect(hog.exitCode === 137 || hog.exitCode === 2 || hog.signal !== null).toBe(true);
      expect((await run(b, 'echo alive')).out).toBe('alive\n');
    });
  });

  describe('reaping and failing closed', () => {
    it("reapOrphans removes what a SIGKILLed server left: unknown boxes entirely, known ones stopped with their volume kept", async () => {
      // A real server process starts two boxes, then dies by SIGKILL.
      const script = `
        import { DockerBoxDriver } from ${JSON.stringify(path.join(REPO_ROOT, 'dist/sandbox/docker.js'))};
        import { readFileSync } from 'node:fs';
        const spec = JSON.parse(readFileSync(process.argv[1], 'utf8'));
        const d = new DockerBoxDriver({ scope: ${JSON.stringify(REAP_SCOPE)} });
        for (const id of ['known', 'orphan']) await d.start({ ...spec, id, stateDir: spec.stateDir + '/' + id });
        process.stdout.write('started\\n');
        setInterval(() => {}, 1000);
      `;
      const specFile = path.join(baseDir, 'reap-spec.json');
      writeFileSync(specFile, JSON.stringify({ ...spec('x'), stateDir: baseDir }));
      const child = spawn(process.execPath, ['--input-type=module', '-e', script, specFile], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      child.stdout.on('data', (c) => (out += c));
      child.stderr.on('data', (c) => (out += c));
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`the server child did not start its boxes: ${out}`)), 60_000);
        child.stdout.on('data', () => out.includes('started') && (clearTimeout(timer), resolve()));
        child.on('exit', () => (clearTimeout(timer), reject(new Error(`the server child exited: ${out}`))));
      });
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
      expect((await containersOf('known', REAP_SCOPE)).length).toBe(1);
      expect((await containersOf('orphan', REAP_SCOPE)).length).toBe(1);

      const next = new DockerBoxDriver({ scope: REAP_SCOPE });
      await next.reapOrphans(new Set(['known']));
      expect(await containersOf('orphan', REAP_SCOPE)).toEqual([]);
      expect(await volumesOf('orphan', REAP_SCOPE)).toEqual([]);
      expect(await containersOf('known', REAP_SCOPE)).toEqual([]);
      expect((await volumesOf('known', REAP_SCOPE)).length).toBe(1);
      // Another scope's boxes (this suite's own, running) are not touched.
      expect((await containersOf('main')).length).toBe(1);
      await next.destroy('known', path.join(baseDir, 'known'));
      expect(await volumesOf('known', REAP_SCOPE)).toEqual([]);
      await next.close();
    }, 120_000);

    it('a missing image fails with a clear BoxStartError and is never pulled', async () => {
      await expect(driver.start(spec('absent', { template: { name: 't', image: 'keygate-test-box-absent:never', environment: {} } }))).rejects.toThrow(
        /keygate-test-box-absent:never is not on this Docker engine \(images are never pulled\)/,
      );
      expect(await containersOf('absent')).toEqual([]);
    });

    it('a relay that cannot be set up fails the start and leaves no container', async () => {
      const long = path.join(baseDir, 'relayfail', 'x'.repeat(120));
      mkdirSync(long, { recursive: true });
      await expect(driver.start(spec('relayfail', { stateDir: long }))).rejects.toBeInstanceOf(BoxStartError);
      expect(await containersOf('relayfail')).toEqual([]);
    });

    it('probe and start fail closed without an engine, saying where and what to do', async () => {
      const none = new DockerBoxDriver({ socketPath: path.join(baseDir, 'no-engine.sock') });
      const p = await none.probe();
      expect(p.ok).toBe(false);
      if (!p.ok) {
        expect(p.reason).toContain(`no Docker engine answers at unix://${path.join(baseDir, 'no-engine.sock')}`);
        expect(p.hint).toBe('start one (dockerd) or choose --sandbox-driver local');
      }
      await expect(none.start(spec('nothing'))).rejects.toBeInstanceOf(BoxStartError);
      await none.close();
      expect(await driver.probe()).toMatchObject({ ok: true });
    });

    it('no image pull was attempted during the whole suite', async () => {
      const f = encodeURIComponent(JSON.stringify({ type: ['image'], event: ['pull'] }));
      const res = await engine.request('GET', `/events?since=${suiteStart}&until=${Math.ceil(Date.now() / 1000)}&filters=${f}`);
      const text = await res.body.text();
      expect(res.statusCode).toBe(200);
      expect(text.trim()).toBe('');
    });
  });
});
