/**
 * Local driver, files API (sandbox.md property 4): a symlink or `..` planted inside a real box never
 * makes keygate read or write a host path; sizes are bounded; uploads stream and keep nothing when
 * refused.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BoxFileError, type Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { cleanupTmp, localProbe, run, RUN_DIR, spec, TMP } from './local-helpers.js';

const probe = await localProbe();
const HOST_SECRET = 'kg-host-file-secret-0c1d';

async function text(s: Readable): Promise<string> {
  let out = '';
  for await (const c of s) out += (c as Buffer).toString();
  return out;
}

async function fileError(p: Promise<unknown>): Promise<BoxFileError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(BoxFileError);
  return e as BoxFileError;
}

describe.skipIf(!probe.ok)(`local driver: files stay in the box (${probe.why})`, () => {
  let driver: LocalDriver;
  let box: Box;
  const hostDir = path.join(TMP, 'host-only');
  const hostSecret = path.join(hostDir, 'secret.txt');
  const hostTarget = path.join(hostDir, 'target.txt');
  let workspace: string;

  beforeAll(async () => {
    mkdirSync(hostDir, { recursive: true });
    writeFileSync(hostSecret, HOST_SECRET);
    writeFileSync(hostTarget, 'untouched');
    driver = new LocalDriver({ runDir: RUN_DIR });
    const s = spec({ id: 'files' });
    workspace = path.join(s.stateDir, 'workspace');
    box = await driver.start(s);
    // Planted by code in the box: absolute and relative links to host paths, and to the host's view
    // of the box's own workspace.
    const r = await run(box, [
      'sh',
      '-c',
      'ln -s "$1" /workspace/abs && ln -s "../../../../../../../..$1" /workspace/rel && ln -s "$2" /workspace/wabs && ln -s "$3" /workspace/ws && mkdir /workspace/d && ln -s / /workspace/d/root',
      'sh',
      hostSecret,
      hostTarget,
      path.dirname(workspace),
    ]);
    expect(r.exitCode, r.stderr).toBe(0);
  });

  afterAll(async () => {
    await driver?.close();
    cleanupTmp();
  });

  it('writes and reads a file as the box sees it, streaming', async () => {
    const chunks = (function* () {
      for (let i = 0; i < 256; i++) yield Buffer.alloc(64 * 1024, i);
    })();
    const w = await box.writeFile('/workspace/big.bin', Readable.from(chunks), 32 * 1024 * 1024);
    expect(w.size).toBe(16 * 1024 * 1024);
    const inBox = await run(box, 'stat -c %s /workspace/big.bin; od -An -tu1 -j 16777215 -N1 /workspace/big.bin');
    expect(inBox.stdout.split(/\s+/).filter(Boolean)).toEqual(['16777216', '255']);
    const r = await box.readFile('/workspace/big.bin', 32 * 1024 * 1024);
    expect(r.size).toBe(16 * 1024 * 1024);
    let n = 0;
    let last = -1;
    for await (const c of r.stream) {
      n += (c as Buffer).length;
      last = (c as Buffer).at(-1)!;
    }
    expect(n).toBe(16 * 1024 * 1024);
    expect(last).toBe(255);
  });

  it('a symlink planted in the box to a host path reads as the box sees it: not the host file', async () => {
    expect((await fileError(box.readFile('/workspace/abs', 1024))).kind).toBe('not_found');
    expect((await fileError(box.readFile('/workspace/rel', 1024))).kind).toBe('not_found');
    expect((await fileError(box.readFile(`/workspace/ws/files/workspace/abs`, 1024))).kind).toBe('not_found');
    // A link to the box's root reads the box's /etc/passwd, not the host's.
    const passwd = await box.readFile('/workspace/d/root/etc/passwd', 4096);
    const boxPasswd = await text(passwd.stream);
    expect(boxPasswd).toMatch(/^box:x:1000:1000:/m);
    expect(boxPasswd).not.toBe(readFileSync('/etc/passwd', 'utf8'));
  });

  it('`..` climbs to the box root, never to the host', async () => {
    const up = `/workspace/../../../..${hostSecret}`;
    expect((await fileError(box.readFile(up, 1024))).kind).toBe('not_found');
    const e = await box.readFile('/workspace/../../../../etc/hosts', 1024);
    expect(await text(e.stream)).toBe('127.0.0.1\tlocalhost\n::1\tlocalhost\n');
  });

  it('writing through a planted symlink or `..` never writes a host path', async () => {
    const put = (p: string) => box.writeFile(p, Readable.from([Buffer.from('PWNED')]), 1024);
    await put('/workspace/wabs').catch(() => undefined);
    await put(`/workspace/../../..${hostTarget}`).catch(() => undefined);
    await put(`/workspace/ws/files/workspace/planted.txt`).catch(() => undefined);
    await put(`/workspace/../../../..${path.join(hostDir, 'new.txt')}`).catch(() => undefined);
    expect(readFileSync(hostTarget, 'utf8')).toBe('untouched');
    expect(existsSync(path.join(hostDir, 'new.txt'))).toBe(false);
    expect(existsSync(path.join(workspace, 'planted.txt'))).toBe(false);
    // The write through /workspace/wabs went where the box's link points inside the box, or nowhere.
    expect(readFileSync(hostSecret, 'utf8')).toBe(HOST_SECRET);
  });

  it('bounds: a larger file is refused; a larger upload is refused and leaves nothing behind', async () => {
    await run(box, 'head -c 5000 /dev/zero > /workspace/five-k');
    expect((await fileError(box.readFile('/workspace/five-k', 4999))).kind).toBe('too_large');
    const ok = await box.readFile('/workspace/five-k', 5000);
    expect((await text(ok.stream)).length).toBe(5000);

    const big = Readable.from(
      (function* () {
        for (let i = 0; i < 100; i++) yield Buffer.alloc(1024, 1);
      })(),
    );
    expect((await fileError(box.writeFile('/workspace/up.bin', big, 10_000))).kind).toBe('too_large');
    const ls = await run(box, 'ls -A /workspace');
    expect(ls.stdout).not.toMatch(/up\.bin|kg-upload/);
  });

  it('paths: relative, NUL, a directory and a missing directory are refused clearly', async () => {
    expect((await fileError(box.readFile('workspace/x', 10))).kind).toBe('bad_path');
    expect((await fileError(box.readFile('/workspace/x\0y', 10))).kind).toBe('bad_path');
    expect((await fileError(box.readFile('/workspace', 10))).kind).toBe('not_a_file');
    expect((await fileError(box.readFile('/workspace/d', 10))).kind).toBe('not_a_file');
    expect((await fileError(box.writeFile('/nope/x', Readable.from([Buffer.from('x')]), 10))).kind).toBe('not_found');
    const e = await fileError(box.readFile('/workspace/missing', 10));
    expect(e.kind).toBe('not_found');
    expect(e.message).not.toContain(TMP);
  });

  it('a reader that leaves in the middle of a download ends the read in the box: nothing of it is left open', async () => {
    await run(box, 'head -c 8000000 /dev/zero > /workspace/eight-m');
    const fds = () => readdirSync('/proc/self/fd').length;
    const before = fds();
    for (let i = 0; i < 5; i++) {
      const f = await box.readFile('/workspace/eight-m', 10_000_000);
      await new Promise<void>((resolve) => f.stream.once('data', () => resolve()));
      f.stream.destroy();
    }
    // Each read is an execution in the box, with its pipes on this side: all collected again.
    let after = fds();
    for (let i = 0; i < 100 && after > before; i++) {
      await new Promise((r) => setTimeout(r, 50));
      after = fds();
    }
    expect(after).toBeLessThanOrEqual(before);
  });

  it("what the box cannot write or read, or has no room for, is refused as the caller's problem (never a bare failure)", async () => {
    const one = () => Readable.from([Buffer.from('x')]);
    // Read-only mounts, /proc, and a device.
    for (const p of ['/etc/x', '/usr/x', '/proc/x', '/dev/null', '/etc/keygate/ca.pem']) {
      const e = await fileError(box.writeFile(p, one(), 10));
      expect(e.kind, `${p}: ${e.message}`).toBe('bad_path');
      expect(e.message, p).toMatch(/not writable/);
    }
    // A file the box made unreadable to itself.
    await run(box, 'echo secret > /workspace/locked && chmod 000 /workspace/locked');
    const locked = await fileError(box.readFile('/workspace/locked', 100));
    expect(locked.kind, locked.message).toBe('bad_path');
    expect(locked.message).toMatch(/not readable/);
    // No room left: /tmp of this box is 128 MiB (half its memory).
    const big = Readable.from(
      (function* () {
        for (let i = 0; i < 160; i++) yield Buffer.alloc(1024 * 1024, 1);
      })(),
    );
    const full = await fileError(box.writeFile('/tmp/big.bin', big, 1024 * 1024 * 1024));
    expect(full.kind, full.message).toBe('too_large');
    expect(full.message).toMatch(/no space left/);
    expect((await run(box, 'ls -A /tmp')).stdout).not.toMatch(/big\.bin|kg-upload/);
  });
});
