/**
 * The files API of a box, done from inside the box (sandbox.md, property 4): the path is resolved by
 * a shell running in the box's own namespaces, so a symlink or `..` planted in the box resolves
 * against the box's root and can never name a host path. Keygate only moves bytes over pipes, counts
 * them, and stops at the bound. Needs `/bin/sh`, `cat`, `stat`, `mv` and `rm` in the box's root.
 */
import { randomBytes } from 'node:crypto';
import { PassThrough, Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { BoxFileError, type ExecOptions, type ExecProcess } from './driver.js';

type Exec = (opts: ExecOptions) => Promise<ExecProcess>;

const NOT_FOUND = 10;
const NOT_A_FILE = 11;
const FAILED = 12;
/** The box itself may not open it (a read-only mount, /proc, a mode that refuses its user). */
const NOT_ALLOWED = 13;
/** Larger than the caller takes: said before any byte is sent, so no reader is left to kill. */
const TOO_LARGE = 14;
const FILE_TIMEOUT_MS = 10 * 60_000;
/** How long a writer whose upload was refused may take to finish before it is killed. */
const WRITER_GRACE_MS = 5_000;
/**
 * Most bytes read of a file that says it is empty: /proc and /sys files announce size 0 and hold
 * content all the same (the box's `cat /proc/version` prints it). Such a file is read whole, up to
 * this, before the answer (its Content-Length is then known); a larger one is refused (413).
 */
export const PSEUDO_FILE_MAX_BYTES = 1024 * 1024;

// $1 path, $2 the most bytes taken. Opens the file once, prints its size on the first line, then
// that many of its bytes: a file still being written (a log) is served as it was when opened, so
// the Content-Length sent from that size stays true.
const READ = `f=$1
[ -e "$f" ] || exit ${NOT_FOUND}
[ -f "$f" ] || exit ${NOT_A_FILE}
[ -r "$f" ] || exit ${NOT_ALLOWED}
exec 3<"$f" || exit ${FAILED}
s=$(stat -L -c %s /dev/fd/3) || exit ${FAILED}
[ "$s" -le "$2" ] || exit ${TOO_LARGE}
echo "$s"
[ "$s" != 0 ] || exec head -c ${PSEUDO_FILE_MAX_BYTES + 1} <&3
exec head -c "$s" <&3`;

// $1 path, $2 temporary name in the same directory. Writes the temporary only: the rename is a
// separate step, taken once keygate has counted the whole upload (stdin ending is no proof of that).
// The temporary is created first in a subshell (a failed redirection of a builtin ends the shell),
// so that a place the box may not write is told apart from a write that failed on the way.
const WRITE = `f=$1
t="\${f%/*}/$2"
[ -d "\${f%/*}/" ] || exit ${NOT_FOUND}
[ ! -d "$f" ] || exit ${NOT_A_FILE}
(: >"$t") 2>/dev/null || exit ${NOT_ALLOWED}
cat >"$t" || { rm -f -- "$t"; exit ${FAILED}; }`;
const COMMIT = `mv -f -- "\${1%/*}/$2" "$1" || { rm -f -- "\${1%/*}/$2"; exit ${FAILED}; }`;

/** An absolute box path with no NUL; anything else is the caller's mistake. */
export function checkBoxPath(p: string): string {
  if (typeof p !== 'string' || !p.startsWith('/') || p.includes('\0') || p.length > 4096 || p.endsWith('/')) {
    throw new BoxFileError('bad_path', 'path must be an absolute file path inside the box');
  }
  return p;
}

/**
 * The path of an upload, checked before anything is done in the box: absolute, no NUL, at most
 * 4096 characters, and naming a file (no trailing `/`, last component not `.` or `..`). Refused
 * here, it changes nothing (the parents of a path refused later were already made).
 */
export function checkUploadPath(p: string): string {
  checkBoxPath(p);
  const last = p.slice(p.lastIndexOf('/') + 1);
  if (last === '.' || last === '..') throw new BoxFileError('bad_path', 'path must name a file, not . or ..');
  return p;
}

// $1 a directory. Makes it and its missing parents (as the box's user, resolved in the box) and
// prints the topmost one it had to make (nothing when none was missing), for removeMadeParents.
const MAKE_PARENTS = `d=$1 top=
while [ -n "$d" ] && [ ! -e "$d" ] && [ ! -L "$d" ]; do top=$d; d=\${d%/*}; done
mkdir -p -- "$1" 2>/dev/null
printf %s "$top"`;

// $1 the directory given to MAKE_PARENTS, $2 what it printed: removes, deepest first, each of
// those directories that is still empty (rmdir never removes anything else).
const REMOVE_MADE = `d=$1 top=$2
while [ -n "$d" ]; do rmdir -- "$d" 2>/dev/null; [ "$d" = "$top" ] && break; d=\${d%/*}; done; exit 0`;

/**
 * Makes the parent directories of an upload's path in the box; returns what undoes it when the
 * upload is then refused (a refused upload leaves the box as it was).
 */
export async function makeParents(exec: Exec, boxPath: string): Promise<() => Promise<void>> {
  checkUploadPath(boxPath);
  const dir = boxPath.slice(0, boxPath.lastIndexOf('/')) || '/';
  // A failure shows in the write's own error (no such directory).
  const { stdout: top } = await runInBox(exec, ['/bin/sh', '-c', MAKE_PARENTS, 'sh', dir]);
  if (!top) return async () => undefined;
  return async () => {
    await runInBox(exec, ['/bin/sh', '-c', REMOVE_MADE, 'sh', dir, top]).catch(() => undefined);
  };
}

/**
 * The box is at its process (or memory) limit: the reader or writer could not even start in it
 * (its fork failed, or the engine could not start the execution). That is the box's state, for its
 * owner to change, not a failure of the server: it was a 500.
 */
const BOX_FULL = /fork failed|can't fork|Cannot fork|fork: retry|Resource temporarily unavailable|Cannot allocate memory/i;
const boxFull = (what: string) =>
  new BoxFileError('box_full', `${what}: the box is at its process or memory limit (resources), so the files API could not start in it; end some of its processes and retry`);

/** Starts the files API's helper in the box; a box too full to start it is `box_full`. */
async function startIn(exec: Exec, opts: ExecOptions, what: string): Promise<ExecProcess> {
  try {
    return await exec(opts);
  } catch (err) {
    if (!(err instanceof BoxFileError) && err instanceof Error && BOX_FULL.test(err.message)) throw boxFull(what);
    throw err;
  }
}

function failure(code: number | null, stderr: string, what: string): BoxFileError | Error {
  if (code === NOT_FOUND) return new BoxFileError('not_found', `${what}: no such file or directory in the box`);
  if (code === NOT_A_FILE) return new BoxFileError('not_a_file', `${what}: not a regular file`);
  // What the box refuses its own user, or has no room for, is the caller's to change (another
  // path, a smaller file), as the docker driver says it too: never a bare server failure.
  if (code === NOT_ALLOWED) return new BoxFileError('bad_path', what === 'read' ? 'read: the file is not readable in the box' : 'write: the path is not writable in the box');
  if (/No space left on device|Disk quota exceeded/.test(stderr)) return new BoxFileError('too_large', `${what}: no space left in the box for the file`);
  // 126 with nothing said: the engine could not start the helper at all (a docker box with not
  // one process left to give: the runtime's own fork failed, and its message is not the box's).
  if (BOX_FULL.test(stderr) || (code === 126 && !stderr.trim())) return boxFull(what);
  // A path the box's own file system refuses for what it is (a name past NAME_MAX, a link loop, a
  // place turned read-only) is the caller's path, not a server failure: it was a 500.
  if (/File name too long/.test(stderr)) return new BoxFileError('bad_path', `${what}: a name in the path is too long for the box's file system`);
  if (/Too many levels of symbolic links/.test(stderr)) return new BoxFileError('bad_path', `${what}: too many levels of symbolic links in the path`);
  if (/Read-only file system|Permission denied|Operation not permitted/.test(stderr)) return new BoxFileError('bad_path', what === 'read' ? 'read: the file is not readable in the box' : 'write: the path is not writable in the box');
  // The message is the box's own shell speaking about a box path; it never names a host path.
  return new Error(`${what} failed in the box (exit ${code})${stderr ? `: ${stderr.trim().slice(0, 300)}` : ''}`);
}

function collect(s: Readable, limit = 2000): () => string {
  let out = '';
  s.on('data', (d: Buffer) => {
    if (out.length < limit) out += d.toString('utf8');
  });
  return () => out;
}

/** Streams a box file of at most `maxBytes`; the stream errors if the file grows past the size it had. */
export async function readBoxFile(exec: Exec, boxPath: string, maxBytes: number): Promise<{ size: number; stream: Readable }> {
  checkBoxPath(boxPath);
  const p = await startIn(exec, { command: ['/bin/sh', '-c', READ, 'sh', boxPath, String(maxBytes)], cwd: '/', timeoutMs: FILE_TIMEOUT_MS }, 'read');
  const stderr = collect(p.stderr);
  let outputEnded = false;
  // Read the size line without consuming more of the body than the chunk it came with.
  const head = await new Promise<{ size: number; rest: Buffer } | null>((resolve) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const nl = buf.indexOf(10);
      if (nl >= 0) {
        p.stdout.off('data', onData).off('end', onEnd);
        p.stdout.pause();
        resolve({ size: Number(buf.subarray(0, nl).toString()), rest: buf.subarray(nl + 1) });
      } else if (buf.length > 32) {
        p.stdout.off('data', onData).off('end', onEnd);
        resolve(null);
      }
    };
    const onEnd = () => {
      outputEnded = true;
      resolve(null);
    };
    p.stdout.on('data', onData).on('end', onEnd);
  });
  // From here on, a refusal drains what is left (the execution ends only once its output is read).
  if (!head || !Number.isSafeInteger(head.size)) {
    p.stdout.resume();
    // A reader that said why and ended (no such file, too large...) is not killed: on the docker
    // driver a kill is one more process started in the box, for nothing.
    if (!outputEnded) p.kill('SIGKILL');
    const r = await p.done;
    if (r.exitCode === TOO_LARGE) throw new BoxFileError('too_large', `file is larger than ${maxBytes} bytes`);
    throw failure(r.exitCode, stderr(), 'read');
  }
  if (head.size === 0) return readPseudoFile(p, head.rest, stderr, maxBytes);
  if (head.size > maxBytes) {
    p.stdout.resume();
    p.kill('SIGKILL');
    await p.done;
    throw new BoxFileError('too_large', `file is larger than ${maxBytes} bytes`);
  }
  // The reader in the box sends exactly the size it announced; anything else (a file truncated
  // while read) must reach the client as a broken response, never as a complete one.
  let sent = 0;
  const cap = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      sent += chunk.length;
      if (sent > head.size) cb(new Error('the box sent more than the file size it announced'));
      else cb(null, chunk);
    },
    flush(cb) {
      cb(sent < head.size ? new Error('the file was truncated while being read') : null);
    },
  });
  const out = new PassThrough();
  cap.pipe(out);
  // Once nobody reads `out`, what is left of the reader's output is drained and dropped: left in
  // the pipe, it never ends, the execution is never collected, and its pipe (a descriptor of this
  // server), its cgroup and its place among the box's executions stay until the box stops (and a
  // server shutting down waited on that pipe until its forced exit).
  const abandon = () => {
    p.kill('SIGKILL');
    p.stdout.unpipe(cap);
    p.stdout.resume();
  };
  cap.on('error', (e) => {
    abandon();
    out.destroy(e);
  });
  if (head.rest.length) cap.write(head.rest);
  p.stdout.pipe(cap);
  p.stdout.resume();
  // The consumer going away early stops the reader in the box.
  out.on('close', () => {
    if (!out.readableEnded) abandon();
  });
  void p.done.then((r) => {
    if (r.exitCode !== 0 && !out.destroyed) out.destroy(failure(r.exitCode, stderr(), 'read'));
  });
  return { size: head.size, stream: out };
}

/** The rest of a file that announced size 0, read whole (at most PSEUDO_FILE_MAX_BYTES) to learn its size. */
async function readPseudoFile(p: ExecProcess, first: Buffer, stderr: () => string, maxBytes: number): Promise<{ size: number; stream: Readable }> {
  const limit = Math.min(maxBytes, PSEUDO_FILE_MAX_BYTES);
  const chunks: Buffer[] = first.length ? [first] : [];
  let n = first.length;
  p.stdout.on('data', (d: Buffer) => {
    n += d.length;
    // Past the bound, the rest is drained and dropped, never held.
    if (n <= limit + 1) chunks.push(d);
  });
  p.stdout.resume();
  const r = await p.done;
  if (r.exitCode !== 0) {
    const e = failure(r.exitCode, stderr(), 'read');
    // A file the box opened and then could not read (EIO from /proc/self/mem) is the caller's path.
    throw e instanceof BoxFileError ? e : new BoxFileError('bad_path', 'read: the file cannot be read in the box');
  }
  if (n > limit) throw new BoxFileError('too_large', `file is larger than ${limit} bytes`);
  const body = Buffer.concat(chunks, n);
  return { size: body.length, stream: Readable.from(body.length ? [body] : []) };
}

/** Streams `body` into a box file; more than `maxBytes` rejects `too_large` and leaves no file behind. */
export async function writeBoxFile(exec: Exec, boxPath: string, body: Readable, maxBytes: number): Promise<{ size: number }> {
  checkBoxPath(boxPath);
  const tmp = `.kg-upload-${randomBytes(8).toString('hex')}`;
  const p = await startIn(exec, { command: ['/bin/sh', '-c', WRITE, 'sh', boxPath, tmp], cwd: '/', stdin: true, timeoutMs: FILE_TIMEOUT_MS }, 'write');
  const stderr = collect(p.stderr);
  p.stdout.resume();
  let size = 0;
  let tooLarge = false;
  const count = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      size += chunk.length;
      if (size > maxBytes) {
        tooLarge = true;
        cb(new BoxFileError('too_large', `upload is larger than ${maxBytes} bytes`));
      } else cb(null, chunk);
    },
  });
  let streamErr: unknown = null;
  try {
    await pipeline(body, count, p.stdin!);
  } catch (e) {
    streamErr = e;
    // Its input ended (the pipeline destroyed it): the writer finishes what it got, into the
    // temporary only, which is removed below. Killed only if it does not end soon: on the docker
    // driver a kill is one more process started in the box.
    p.stdin?.destroy();
    const ended = await Promise.race([p.done.then(() => true), new Promise<boolean>((r) => setTimeout(r, WRITER_GRACE_MS, false).unref())]);
    if (!ended) p.kill('SIGKILL');
  }
  const r = await p.done;
  const committed = !streamErr && r.exitCode === 0 ? await runInBox(exec, ['/bin/sh', '-c', COMMIT, 'sh', boxPath, tmp]) : null;
  if (committed?.exitCode === 0) return { size };
  // Whatever was written stays under the temporary name only; remove it.
  const dir = boxPath.slice(0, boxPath.lastIndexOf('/') + 1);
  await runInBox(exec, ['rm', '-f', '--', `${dir}${tmp}`]).catch(() => null);
  if (tooLarge) throw new BoxFileError('too_large', `upload is larger than ${maxBytes} bytes`);
  if (streamErr && r.exitCode === 0) throw streamErr;
  throw failure(committed ? committed.exitCode : r.exitCode, committed ? committed.stderr : stderr(), 'write');
}

/**
 * Runs a short command in the box (from `/`, 30 s at most): its exit code, its stdout (up to 8 KiB:
 * enough for a path, which is at most 4096 bytes) and the start of its stderr.
 */
export async function runInBox(exec: Exec, command: string[]): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
  const p = await startIn(exec, { command, cwd: '/', timeoutMs: 30_000 }, 'files');
  const stdout = collect(p.stdout, 8192);
  const stderr = collect(p.stderr);
  const r = await p.done;
  return { exitCode: r.exitCode, stdout: stdout(), stderr: stderr() };
}
