/**
 * A small local image for the docker box driver's tests, built WITHOUT any registry: a root
 * filesystem made from host files (Debian's busybox-static, curl with the shared libraries `ldd`
 * names), imported with the engine's `POST /images/create?fromSrc=-` (what `docker import` does).
 * Cached by tag: the tag is a hash of what goes in, so a second run reuses the image. Older tags are
 * left alone (another checkout's tests may be using one): remove `keygate-test-box:*` by hand.
 *
 * Inside: /bin/busybox and its applets, /usr/bin/curl, /usr/bin/perl (no modules), an unprivileged user 1000 (the image's USER)
 * owning /workspace, and /suid/busybox (a setuid-root copy of busybox, to show no-new-privileges).
 * Needs `apt-get install busybox-static curl` on the host.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import * as tar from 'tar';
import { DockerEngine } from '../../src/docker/engine.js';

export const TEST_IMAGE_REPO = 'keygate-test-box';
export const BOX_UID = 1000;
const BUSYBOX = '/bin/busybox';
const CURL = '/usr/bin/curl';
/** The host's perl (binary and libraries, no modules): box code calling the kernel directly (syscall, socket). */
const PERL = '/usr/bin/perl';
const LAYOUT_VERSION = '5';

/** Why the test image cannot be built here (a missing host package), or null. */
export function boxImageUnavailableReason(): string | null {
  if (!existsSync(BUSYBOX)) return `${BUSYBOX} is missing: apt-get install busybox-static`;
  if (!existsSync(CURL)) return `${CURL} is missing: apt-get install curl`;
  if (!existsSync(PERL)) return `${PERL} is missing: apt-get install perl-base`;
  return null;
}

/** The shared libraries (and the loader) a dynamic executable needs, as ldd names them. */
export function sharedLibraries(binary: string): string[] {
  let out: string;
  try {
    out = execFileSync('ldd', [binary], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  } catch {
    return []; // "not a dynamic executable": a static binary (busybox-static) needs nothing
  }
  const libs: string[] = [];
  for (const line of out.split('\n')) {
    const m = /=>\s+(\/\S+)/.exec(line) ?? /^\s*(\/\S+)\s+\(/.exec(line);
    if (m) libs.push(m[1]);
  }
  return libs;
}

function fingerprint(files: string[]): string {
  const h = createHash('sha256').update(LAYOUT_VERSION);
  for (const f of files) {
    const s = statSync(f);
    h.update(`${f}:${s.size}:${s.mtimeMs}\n`);
  }
  return h.digest('hex').slice(0, 16);
}

function put(root: string, hostPath: string): void {
  const dest = path.join(root, hostPath);
  mkdirSync(path.dirname(dest), { recursive: true });
  copyFileSync(realpathSync(hostPath), dest);
  chmodSync(dest, statSync(realpathSync(hostPath)).mode & 0o777);
}

function buildRootfs(root: string, libs: string[]): void {
  for (const d of ['bin', 'usr/bin', 'etc', 'tmp', 'root', 'workspace', 'proc', 'sys', 'dev']) mkdirSync(path.join(root, d), { recursive: true });
  chmodSync(path.join(root, 'tmp'), 0o1777);
  put(root, BUSYBOX);
  const applets = execFileSync(BUSYBOX, ['--list'], { encoding: 'utf8' }).split('\n').filter((a) => a && a !== 'busybox');
  for (const a of applets) symlinkSync('busybox', path.join(root, 'bin', a));
  put(root, CURL);
  put(root, PERL);
  for (const lib of libs) put(root, lib);
  // A setuid-root program: with no-new-privileges the box user stays itself when running it.
  // (busybox picks its applet from argv[0], hence the name: `/suid/busybox id -u`.)
  mkdirSync(path.join(root, 'suid'));
  copyFileSync(BUSYBOX, path.join(root, 'suid/busybox'));
  chmodSync(path.join(root, 'suid/busybox'), 0o4755);
  writeFileSync(path.join(root, 'etc/passwd'), `root:x:0:0:root:/root:/bin/sh\nbox:x:${BOX_UID}:${BOX_UID}:box:/workspace:/bin/sh\n`);
  writeFileSync(path.join(root, 'etc/group'), `root:x:0:\nbox:x:${BOX_UID}:\n`);
  writeFileSync(path.join(root, 'etc/in-image.txt'), 'this file is in the image\n');
  chownSync(path.join(root, 'workspace'), BOX_UID, BOX_UID);
}

/** Returns the image reference, importing the image first if this engine does not have it yet. */
export async function ensureBoxImage(engine: DockerEngine): Promise<string> {
  // busybox-static needs no library; Debian's dynamic busybox would need its own.
  const libs = [...new Set([...sharedLibraries(CURL), ...sharedLibraries(BUSYBOX), ...sharedLibraries(PERL)])];
  const tag = fingerprint([BUSYBOX, CURL, PERL, ...libs]);
  const ref = `${TEST_IMAGE_REPO}:${tag}`;
  const have = await engine.json('GET', `/images/${encodeURIComponent(ref)}/json`);
  if (have.status === 200) return ref;

  const root = mkdtempSync(path.join(os.tmpdir(), 'kg-box-rootfs-'));
  try {
    buildRootfs(root, libs);
    const stream = tar.c({ cwd: root, portable: false, preservePaths: false }, ['.']) as unknown as NodeJS.ReadableStream;
    const changes = ['USER 1000:1000', 'WORKDIR /workspace', 'ENV PATH=/bin:/usr/bin', `LABEL ${TEST_IMAGE_REPO}=1`];
    const q = new URLSearchParams({ fromSrc: '-', repo: TEST_IMAGE_REPO, tag });
    for (const c of changes) q.append('changes', c);
    const res = await engine.request('POST', `/images/create?${q}`, {
      body: Readable.from(stream as AsyncIterable<Buffer>),
      headers: { 'content-type': 'application/x-tar' },
      timeoutMs: 120_000,
    });
    const text = await res.body.text();
    if (res.statusCode !== 200 || /"error"/.test(text)) throw new Error(`importing the test image failed: ${res.statusCode} ${text.slice(0, 500)}`);
    return ref;
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

/**
 * The same image with no USER (its processes run as root), for the driver's root case: made with
 * the engine's commit of a never-started container (no registry, no new content).
 */
export async function ensureRootBoxImage(engine: DockerEngine): Promise<string> {
  const base = await ensureBoxImage(engine);
  const tag = `${base.split(':')[1]}-root`;
  const ref = `${TEST_IMAGE_REPO}:${tag}`;
  if ((await engine.json('GET', `/images/${encodeURIComponent(ref)}/json`)).status === 200) return ref;
  const created = await engine.json<{ Id: string }>('POST', '/containers/create', { Image: base, Cmd: ['true'], Labels: { [TEST_IMAGE_REPO]: '1' } });
  if (created.status !== 201) throw new Error(`cannot create a container to commit: ${created.status}`);
  try {
    const q = new URLSearchParams({ container: created.body.Id, repo: TEST_IMAGE_REPO, tag, changes: 'USER 0:0' });
    const res = await engine.json('POST', `/commit?${q}`);
    if (res.status !== 201) throw new Error(`committing the root variant failed: ${res.status}`);
  } finally {
    await engine.json('DELETE', `/containers/${created.body.Id}?force=1`);
  }
  return ref;
}
