import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, rmSync } from 'node:fs';
import { open } from 'node:fs/promises';
import path from 'node:path';
import { PassThrough, Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import * as tar from 'tar';
import type { DockerEngine } from '../docker/engine.js';
import { checkBoxPath } from './box-files.js';
import { BoxFileError } from './driver.js';

/**
 * Files of a docker box through the engine's archive API (`HEAD/GET/PUT /containers/{id}/archive`).
 * The engine resolves every path inside the container's own root (symlinks and `..` included), so
 * nothing planted in the box can make keygate read or write a host path (sandbox.md, property 4).
 * Reads stream the one entry of the engine's tar; writes spool the body (bounded) to the box's
 * state directory, because a tar header needs the size first, then stream one tar entry.
 * The engine cannot see tmpfs mounts: /tmp of a box is not reachable through this API.
 */

/** Go's os.FileMode bits, as the engine reports them in X-Docker-Container-Path-Stat. */
const MODE_DIR = 2 ** 31;
const MODE_SYMLINK = 2 ** 27;
const MODE_TYPE = MODE_DIR | 2 ** 30 | 2 ** 29 | MODE_SYMLINK | 2 ** 26 | 2 ** 25 | 2 ** 24 | 2 ** 23 | 2 ** 21 | 2 ** 19;

interface PathStat {
  name: string;
  size: number;
  mode: number;
  linkTarget: string;
}

export interface FilesContext {
  engine: DockerEngine;
  containerId: string;
  /** Host directory for upload spools (the box's state directory, never inside the box). */
  spoolDir: string;
  /** Numeric owner given to written files (the box's user). */
  uid: number;
  gid: number;
}

/**
 * The local driver's check (absolute, no NUL, no trailing `/`, at most 4096), so that both drivers
 * refuse the same paths the same way: a trailing slash reached the engine, which answered 500.
 */
function checkPath(boxPath: string): string {
  checkBoxPath(boxPath);
  if (Buffer.byteLength(boxPath) > 4096) throw new BoxFileError('bad_path', 'path must be an absolute file path inside the box');
  return path.posix.normalize(boxPath);
}

/**
 * `/bin/sh` in the box: prints the physical directory `$1` names (symlinks resolved as the box
 * resolves them). The engine strikes out `..` lexically (`a/link/..` is `a`), where the box goes
 * to the link target's parent.
 */
export const PHYSICAL_DIR = 'cd -P -- "$1" 2>/dev/null && pwd -P';

/** Whether a path holds a `..` component, the only case where lexical and physical resolution differ. */
export function hasDotDot(boxPath: string): boolean {
  return boxPath.split('/').includes('..');
}

async function stat(ctx: FilesContext, boxPath: string): Promise<PathStat | null> {
  const res = await ctx.engine.request('HEAD', `/containers/${ctx.containerId}/archive?path=${encodeURIComponent(boxPath)}`);
  await res.body.dump();
  if (res.statusCode === 404) return null;
  if (res.statusCode === 400) throw new BoxFileError('bad_path', 'the path is not valid in the box');
  const header = res.headers['x-docker-container-path-stat'];
  if (res.statusCode !== 200 || typeof header !== 'string') throw new Error(`the engine answered ${res.statusCode} to a file stat`);
  const s = JSON.parse(Buffer.from(header, 'base64').toString('utf8')) as Partial<PathStat>;
  return { name: String(s.name ?? ''), size: Number(s.size ?? 0), mode: Number(s.mode ?? 0), linkTarget: String(s.linkTarget ?? '') };
}

/** Follows symlinks the way the box sees them (the engine resolves link targets in the box's root). */
async function statFollow(ctx: FilesContext, boxPath: string): Promise<{ path: string; stat: PathStat } | null> {
  let p = boxPath;
  for (let hops = 0; hops < 16; hops++) {
    const s = await stat(ctx, p);
    if (!s) return null;
    if ((s.mode & MODE_SYMLINK) === 0) return { path: p, stat: s };
    p = path.posix.resolve(path.posix.dirname(p), s.linkTarget);
  }
  throw new BoxFileError('bad_path', 'too many symbolic links');
}

const isRegular = (s: PathStat) => (s.mode & MODE_TYPE) === 0;

export async function readBoxFile(ctx: FilesContext, boxPath: string, maxBytes: number): Promise<{ size: number; stream: Readable }> {
  const found = await statFollow(ctx, checkPath(boxPath));
  if (!found) throw new BoxFileError('not_found', 'no such file in the box');
  if (!isRegular(found.stat)) throw new BoxFileError('not_a_file', 'not a regular file');
  if (found.stat.size > maxBytes) throw new BoxFileError('too_large', `the file is larger than ${maxBytes} bytes`);
  const res = await ctx.engine.request('GET', `/containers/${ctx.containerId}/archive?path=${encodeURIComponent(found.path)}`, { timeoutMs: 0 });
  if (res.statusCode !== 200) {
    await res.body.dump();
    if (res.statusCode === 404) throw new BoxFileError('not_found', 'no such file in the box');
    throw new Error(`the engine refused a file read (${res.statusCode})`);
  }
  // The file is served as it was at the stat, whose size is the Content-Length: a file still being
  // written (a log) has grown by the time the engine archives it, and what it gained is left out.
  // One that shrank must reach the client as a broken response, never as a complete one.
  const size = found.stat.size;
  const out = new PassThrough();
  let sent = 0;
  let seen = false;
  const parser = new tar.Parser({
    onReadEntry: (entry) => {
      if (seen || entry.type !== 'File') {
        entry.resume();
        return;
      }
      seen = true;
      entry.on('data', (c: Buffer) => {
        const part = c.length > size - sent ? c.subarray(0, size - sent) : c;
        if (part.length === 0) return;
        sent += part.length;
        if (!out.write(part)) {
          entry.pause();
          out.once('drain', () => entry.resume());
        }
      });
    },
  });
  // A consumer that goes away early (the client left) ends the engine's archive stream too. Left
  // unread, the engine's archiver (docker-tar) blocks on it for good and holds the container:
  // every later operation on it, `docker rm -f` included, hangs.
  out.on('close', () => {
    if (!out.writableFinished) res.body.destroy();
  });
  void pipeline(res.body, parser)
    .then(() => (sent === size ? out.end() : out.destroy(new Error('the file was truncated while being read'))))
    .catch((err: Error) => out.destroy(err instanceof BoxFileError ? err : new Error('the file read was cut')));
  return { size, stream: out };
}

/** Counts bytes and fails past the bound, so an upload never spools more than allowed. */
function bounded(maxBytes: number, counter: { n: number }): Transform {
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      counter.n += chunk.length;
      if (counter.n > maxBytes) cb(new BoxFileError('too_large', `the body is larger than ${maxBytes} bytes`));
      else cb(null, chunk);
    },
  });
}

/** One tar entry streamed from a file, then the tar end. */
async function* tarOf(name: string, file: string, size: number, uid: number, gid: number): AsyncGenerator<Buffer> {
  const header = Buffer.alloc(512);
  const mtime = new Date();
  // A name past the ustar header's 100 bytes (a box allows 255) goes in a PAX extended header
  // before the entry, which the engine's archive reader takes over the truncated ustar name.
  const needPax = new tar.Header({ path: name, mode: 0o644, uid, gid, size, mtime, type: 'File' }).encode(header, 0);
  if (needPax) yield new tar.Pax({ path: name, mtime }).encode();
  yield header;
  for await (const c of createReadStream(file)) yield c as Buffer;
  const pad = (512 - (size % 512)) % 512;
  yield Buffer.alloc(pad + 1024);
}

export async function writeBoxFile(ctx: FilesContext, boxPath: string, body: Readable, maxBytes: number): Promise<{ size: number }> {
  const p = checkPath(boxPath);
  const dir = path.posix.dirname(p);
  const name = path.posix.basename(p);
  if (!name || name === '..' || name === '.' || p === '/') throw new BoxFileError('bad_path', 'not a file path');
  if (Buffer.byteLength(name) > 255) throw new BoxFileError('bad_path', "write: a name in the path is too long for the box's file system");
  const parent = await statFollow(ctx, dir);
  if (!parent) throw new BoxFileError('not_found', 'the directory does not exist in the box');
  if ((parent.stat.mode & MODE_DIR) === 0) throw new BoxFileError('bad_path', 'the parent is not a directory');
  const existing = await stat(ctx, path.posix.join(parent.path, name));
  if (existing && (existing.mode & MODE_DIR) !== 0) throw new BoxFileError('not_a_file', 'a directory is at that path');

  const spool = path.join(ctx.spoolDir, `upload-${randomBytes(8).toString('hex')}`);
  const counter = { n: 0 };
  // The spool file is created here, before the copy: a write stream that opens it by itself can
  // still be opening (and then create it) after a refused body has already been cleaned up below,
  // which left `upload-*` files behind on the host.
  const spoolFile = await open(spool, 'wx', 0o600);
  try {
    try {
      await pipeline(body, bounded(maxBytes, counter), createWriteStream('', { fd: spoolFile }));
    } catch (err) {
      if (err instanceof BoxFileError) throw err;
      throw new Error('the upload was cut');
    }
    const q = `path=${encodeURIComponent(parent.path)}&noOverwriteDirNonDir=1`;
    const res = await ctx.engine.request('PUT', `/containers/${ctx.containerId}/archive?${q}`, {
      body: Readable.from(tarOf(name, spool, counter.n, ctx.uid, ctx.gid)),
      headers: { 'content-type': 'application/x-tar' },
      timeoutMs: 0,
    });
    const said = (await res.body.text()).slice(0, 1000);
    if (res.statusCode === 200) return { size: counter.n };
    if (res.statusCode === 404) throw new BoxFileError('not_found', 'the directory does not exist in the box');
    // The box's /workspace is sized (disk_mb): a file that does not fit is the caller's to make smaller.
    if (/no space left on device|disk quota exceeded/i.test(said)) throw new BoxFileError('too_large', 'write: no space left in the box for the file (disk_mb)');
    // Engines answer 403 or 500 ("rootfs is marked read-only") for a path outside the volume.
    if (res.statusCode === 403 || res.statusCode === 400 || /read-only/i.test(said)) {
      throw new BoxFileError('bad_path', 'the path is not writable in the box (only /workspace is)');
    }
    throw new Error(`the engine refused a file write (${res.statusCode})`);
  } finally {
    rmSync(spool, { force: true });
    await spoolFile.close().catch(() => undefined);
  }
}
