/**
 * Local driver, processes (sandbox.md property 5): stop, destroy, execution timeouts and kill take
 * the whole process tree down (checked in the host's /proc), no privilege inside, output streams
 * raw, and the resource limits apply. Real boxes only.
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { cleanupTmp, eventually, expectOnlyStdio, expectSignalsPassThrough, expectStdinPassThrough, hostProcessesOf, localProbe, pidNamespace, run, RUN_DIR, SCATTER, spec } from './local-helpers.js';

const probe = await localProbe();

/** Forks until refused; prints how many it got and how many processes the box holds; then takes them all down. */
const FORK_BOMB = `
import os, time
n = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n, len([p for p in os.listdir('/proc') if p.isdigit()]), flush=True)
os.killpg(0, 9)
`;

describe.skipIf(!probe.ok)(`local driver: processes stay in the box (${probe.why})`, () => {
  let driver: LocalDriver;

  beforeAll(() => {
    driver = new LocalDriver({ runDir: RUN_DIR });
  });

  afterAll(async () => {
    await driver?.close();
    cleanupTmp();
  });

  it('stop kills every process of the box, however detached; /workspace survives a start again', async () => {
    const s = spec();
    const box = await driver.start(s);
    const ns = await pidNamespace(box);
    await run(box, 'echo kept > /workspace/kept.txt');
    expect((await run(box, SCATTER)).stdout).toBe('started\n');
    const long = await box.exec({ command: 'echo up; exec sleep 1005' });
    let up = '';
    long.stdout.on('data', (d: Buffer) => (up += d));
    long.stderr.resume();
    expect(await eventually(() => up === 'up\n')).toBe(true);
    expect(await eventually(() => hostProcessesOf(ns, s.id).length >= 7)).toBe(true);
    await box.stop();
    expect(hostProcessesOf(ns, s.id)).toEqual([]);
    const longDone = await long.done;
    expect(longDone.signal, JSON.stringify(longDone)).toBe('SIGKILL');
    await expect(box.exec({ command: 'true' })).rejects.toThrow(/not running/);

    const again = await driver.start(s);
    expect((await run(again, 'cat /workspace/kept.txt')).stdout).toBe('kept\n');
    const ns2 = await pidNamespace(again);
    await driver.destroy(s.id, s.stateDir);
    expect(hostProcessesOf(ns2, s.id)).toEqual([]);
    expect(existsSync(s.stateDir)).toBe(false);
  });

  it('an execution timeout and kill() take down that execution tree, not the box', async () => {
    const s = spec();
    const box = await driver.start(s);
    const t0 = Date.now();
    const r = await run(box, `${SCATTER}; sleep 1006`, { timeoutMs: 1500 });
    expect(r.timedOut).toBe(true);
    expect(r.signal).toBe('SIGKILL');
    expect(Date.now() - t0).toBeLessThan(10_000);
    const left = await run(box, 'ps -eo args | grep "^sleep 10" ; true');
    expect(left.stdout).toBe('');

    const p = await box.exec({ command: `${SCATTER}; sleep 1007` });
    p.stdout.resume();
    p.stderr.resume();
    await new Promise((res) => setTimeout(res, 500));
    p.kill();
    const k = await p.done;
    expect(k.timedOut).toBe(false);
    expect(k.signal).toBe('SIGKILL');
    expect((await run(box, 'ps -eo args | grep "^sleep 10" ; true')).stdout).toBe('');
    // The box itself lives on.
    expect((await run(box, 'echo alive')).stdout).toBe('alive\n');
    await box.stop();
  });

  it('output streams raw as it is produced; exit codes and stdin pass through', async () => {
    const box = await driver.start(spec());
    const p = await box.exec({ command: `printf '\\000\\377\\001raw'; sleep 1.5; printf late; echo err >&2; exit 7` });
    const chunks: { at: number; data: Buffer }[] = [];
    const t0 = Date.now();
    p.stdout.on('data', (d: Buffer) => chunks.push({ at: Date.now() - t0, data: d }));
    let err = '';
    p.stderr.on('data', (d: Buffer) => (err += d));
    const r = await p.done;
    const done = Date.now() - t0;
    expect(r.exitCode).toBe(7);
    expect(err).toBe('err\n');
    expect(Buffer.concat(chunks.map((c) => c.data))).toEqual(Buffer.from([0, 255, 1, ...Buffer.from('rawlate')]));
    expect(chunks[0].data.subarray(0, 6)).toEqual(Buffer.from([0, 255, 1, ...Buffer.from('raw')]));
    expect(done - chunks[0].at).toBeGreaterThan(1000);

    await expectStdinPassThrough(box);
    await box.stop();
  });

  it('a signal sent reaches the command, which may handle it: the execution ends when the command does', async () => {
    const box = await driver.start(spec());
    // Before, nsenter (host side) died of the signal too: the execution said SIGTERM while the
    // command trapped it and went on.
    await expectSignalsPassThrough(box);
    await box.stop();
  });

  it("an execution's processes hold no descriptor but their stdio (not the server's handles on the box's namespaces and root)", async () => {
    const box = await driver.start(spec());
    await expectOnlyStdio(box);
    await box.stop();
  });

  it.skipIf(!probe.why.includes('cgroup v'))('an execution that cannot be spawned (a NUL in an argument) rejects and leaves no cgroup behind', async () => {
    const s = spec();
    const box = await driver.start(s);
    const own = readFileSync('/proc/self/cgroup', 'utf8').split('\n').map((l) => l.split(':')).find((l) => l[1]?.split(',').includes('pids'))?.[2];
    const tag = createHash('sha256').update(RUN_DIR).digest('hex').slice(0, 12);
    const dir = path.join('/sys/fs/cgroup/pids', own ?? '/', `keygate-${tag}`, s.id);
    const children = () => readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
    expect(children()).toEqual([]);
    for (let i = 0; i < 3; i++) await expect(box.exec({ command: ['echo', 'a\0b'], timeoutMs: 10_000 })).rejects.toThrow();
    expect(children()).toEqual([]);
    expect((await run(box, ['echo', 'ok'])).stdout).toBe('ok\n');
    expect(children()).toEqual([]);
    await box.stop();
  });

  it('no privilege: unprivileged uid, no capabilities, no_new_privs, nosuid everywhere, no namespaces, no mounts', async () => {
    const box = await driver.start(spec());
    const r = await run(box, `id -u; grep -E '^(CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs)' /proc/self/status`);
    expect(r.stdout.split('\n')[0]).toBe('1000');
    expect(r.stdout).toMatch(/CapInh:\s+0{16}\nCapPrm:\s+0{16}\nCapEff:\s+0{16}\nCapAmb:\s+0{16}\nNoNewPrivs:\s+1/);
    // Every mount is nosuid: a setuid-root program (su, mount) runs as the box's user.
    const mounts = await run(box, `awk '{print $5, $6}' /proc/self/mountinfo`);
    for (const line of mounts.stdout.trim().split('\n')) expect(line, line).toMatch(/\bnosuid\b/);
    const su = await run(box, `ls -l /usr/bin/mount >&2; mount -t tmpfs none /tmp 2>&1; echo "mount=$?"; unshare -U true 2>&1; echo "unshare=$?"; unshare -n true 2>&1; echo "unsharen=$?"`);
    expect(su.stdout).toMatch(/mount=[1-9]/);
    // No nested user namespace either, where the server runs as root (--disable-userns; see bwrapArgs).
    if (process.getuid?.() === 0) expect(su.stdout).toMatch(/unshare=[1-9]/);
    expect(su.stdout).toMatch(/unsharen=[1-9]/);
    await box.stop();
  });

  it("a request's environment reaches the command in the box only, never the host-side helpers", async () => {
    const box = await driver.start(spec({ env: { FROM_SPEC: 'spec' } }));
    // LD_DEBUG makes every dynamically linked program it reaches say so: only `true`, in the box.
    const r = await run(box, ['true'], { env: { LD_DEBUG: 'libs', FROM_EXEC: 'exec' } });
    expect(r.stderr).toMatch(/initialize program: true/);
    expect(r.stderr).not.toMatch(/initialize program: (\S*\/)?(sh|dash|setpriv|nsenter|prlimit|env)\b/);
    const e = await run(box, ['sh', '-c', 'echo "$FROM_SPEC $FROM_EXEC $HOME"'], { env: { FROM_EXEC: 'exec' } });
    expect(e.stdout).toBe('spec exec /workspace\n');
    await box.stop();
  });

  it('resource limits: a fork bomb hits the process limit, a memory hog is killed, CPU is capped', async () => {
    const forks = await driver.start(spec({ resources: { pids: 40 } }));
    const bomb = await run(forks, ['python3', '-c', FORK_BOMB], { timeoutMs: 20_000 });
    const [forked, seen] = bomb.stdout.trim().split(' ').map(Number);
    expect(forked, bomb.stderr).toBeGreaterThan(10);
    expect(forked).toBeLessThan(40);
    expect(seen).toBeLessThanOrEqual(40);
    await forks.stop();

    const box = await driver.start(spec({ resources: { memory_mb: 64, cpus: 0.05 } }));
    const small = await run(box, ['python3', '-c', 'a = bytearray(8 << 20); print("allocated")']);
    expect(small.stdout).toBe('allocated\n');
    const hog = await run(box, ['python3', '-c', 'a = bytearray(256 << 20); print("allocated")']);
    expect(hog.stdout).toBe('');
    expect(hog.exitCode === 0).toBe(false);

    // 3 s of wall time spinning, beside the same spin in a box with two CPUs (the machine is shared,
    // so the unlimited one is the yardstick): at 0.05 CPU, at most ~0.15 s of CPU.
    const free = await driver.start(spec({ resources: { cpus: 2 } }));
    const SPIN = 'import time\nt=time.time()\nwhile time.time()-t<3: pass\nprint(time.process_time())';
    const [capped, uncapped] = await Promise.all([run(box, ['python3', '-c', SPIN]), run(free, ['python3', '-c', SPIN])]);
    await free.stop();
    expect(Number(capped.stdout)).toBeLessThan(0.3);
    expect(Number(capped.stdout)).toBeLessThan(Number(uncapped.stdout) * 0.6);
    await box.stop();
  });
});
