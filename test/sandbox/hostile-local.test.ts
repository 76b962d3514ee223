/**
 * Local driver, an attacker inside a real box reading what the box's own /proc shows of the host
 * (sandbox.md, property 3): bwrap's init is pid 1 in the box and its environment and command line
 * are readable there, so they must hold nothing of the server (its working directory included,
 * which is often the data directory or a checkout).
 */
import { chmodSync, copyFileSync, existsSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { cleanupTmp, localProbe, run, RUN_DIR, spec, TMP } from './local-helpers.js';

const probe = await localProbe();

describe.skipIf(!probe.ok)(`local driver: what pid 1 shows a box (${probe.why})`, () => {
  let driver: LocalDriver;
  let box: Box;
  const serverCwd = process.cwd();
  const cwdMarker = path.join(TMP, 'server-cwd-kg-marker');

  beforeAll(async () => {
    // The server runs from a directory whose name a box must never learn.
    mkdirSync(cwdMarker, { recursive: true });
    process.chdir(cwdMarker);
    driver = new LocalDriver({ runDir: RUN_DIR });
    box = await driver.start(spec({ id: 'hostile-pid1' }));
  });

  afterAll(async () => {
    process.chdir(serverCwd);
    await driver?.close();
    cleanupTmp();
  });

  it("no process visible in the box has the server's working directory or any host path in its environment or command line", async () => {
    const r = await run(box, ['sh', '-c', 'for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null | tr "\\0" "\\n"; done']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toContain('bwrap'); // pid 1 was read: the test looks at the real thing
    expect(r.stdout).not.toContain('kg-marker');
    expect(r.stdout).not.toContain(TMP);
    expect(r.stdout).not.toContain(serverCwd);
  });

  // Property 4: /workspace is a host directory on the same file system as /usr and the data
  // directory here; a hard link would let keygate's side see a host file as the box's.
  it('a host file cannot be hard-linked into /workspace or /tmp', async () => {
    const r = await run(box, ['sh', '-c', 'for t in /workspace/l1 /tmp/l2; do ln /usr/bin/env "$t" 2>&1 && echo "LINKED $t"; done; ln /etc/keygate/ca.pem /workspace/l3 2>&1 && echo LINKED ca; true']);
    expect(r.stdout).not.toContain('LINKED');
    expect(r.stdout).toMatch(/Invalid cross-device link|Operation not permitted|Read-only/);
  });

  // Property 1: abstract unix sockets have no path to hide behind a mount; they belong to a network
  // namespace. A keygate-like listener on the host's abstract namespace must be out of reach.
  it.skipIf(!existsSync('/usr/bin/python3'))('no host abstract unix socket, raw or packet socket is reachable from the box', async () => {
    const name = `kg-hostile-${process.pid}`;
    let hits = 0;
    const srv = net.createServer((c) => {
      hits++;
      c.destroy();
    });
    await new Promise<void>((r) => srv.listen(`\0${name}`, r));
    try {
      // The host can reach it (the attack is real) ...
      await new Promise<void>((resolve, reject) => net.connect(`\0${name}`).on('connect', resolve).on('error', reject));
      const py = `
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\0${name}"); print("CONNECTED abstract")
except OSError as e: print("refused abstract", e.errno)
for fam, typ, proto in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), (socket.AF_PACKET, socket.SOCK_RAW, 0), (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)]:
    try:
        socket.socket(fam, typ, proto); print("OPEN raw", fam)
    except OSError as e: print("refused raw", e.errno)
`;
      const r = await run(box, ['python3', '-c', py]);
      expect(r.exitCode, r.stderr).toBe(0);
      expect(r.stdout.trim().split('\n')).toEqual(['refused abstract 111', 'refused raw 1', 'refused raw 1', 'refused raw 1']);
      expect(hits).toBe(1); // only the host's own connection
    } finally {
      await new Promise((r) => srv.close(r));
    }
  });

  // Property 3: a template's root file system is often an unpacked image, whose /etc is full of
  // symlinks (/etc/localtime -> /usr/share/..., /etc/mtab -> ../proc/self/mounts). Resolved on the
  // host they name host files; in the box they must name the box's.
  it.skipIf(!existsSync('/bin/busybox'))("a symlink in a template root's /etc never binds a host file into the box", async () => {
    const secretDir = path.join(TMP, 'host-secrets');
    mkdirSync(secretDir, { recursive: true });
    const secret = path.join(secretDir, 'master.key');
    writeFileSync(secret, 'kg-host-master-key-9f1e\n');
    const root = path.join(TMP, 'hostile-root');
    for (const d of ['bin', 'usr/bin', 'etc', 'workspace']) mkdirSync(path.join(root, d), { recursive: true });
    copyFileSync('/bin/busybox', path.join(root, 'bin/busybox'));
    chmodSync(path.join(root, 'bin/busybox'), 0o755);
    for (const applet of ['sh', 'cat', 'readlink', 'sleep']) symlinkSync('busybox', path.join(root, 'bin', applet));
    symlinkSync('../../bin/busybox', path.join(root, 'usr/bin/env'));
    symlinkSync(secret, path.join(root, 'etc/absolute'));
    symlinkSync(path.relative(path.join(root, 'etc'), secret), path.join(root, 'etc/relative'));
    writeFileSync(path.join(root, 'etc/plain'), 'from the template\n');
    const hostile = await driver.start(spec({ template: { name: 'hostile-root', rootfs: root, environment: {} } }));
    try {
      const r = await run(hostile, ['/bin/sh', '-c', 'for f in absolute relative plain; do echo "$f: $(cat /etc/$f 2>&1) -> $(readlink /etc/$f)"; done']);
      expect(r.stdout).toContain('plain: from the template');
      expect(r.stdout).not.toContain('kg-host-master-key');
      // Still the template's symlinks, as the image made them (resolved inside the box).
      expect(r.stdout).toContain(`absolute: cat: can't open '/etc/absolute': No such file or directory -> ${secret}`);
    } finally {
      await hostile.stop();
    }
  });
});
