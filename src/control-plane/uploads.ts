import { createHash, randomUUID } from 'node:crypto';
import { createWriteStream, mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { HttpError, HttpValidationError } from '../server/errors.js';
import { scanTarball, TarballError, type TarLimits } from './tarball.js';

export const UPLOAD_DIR = 'uploads';
/** `uploads/<uuid>.tar.gz`: the only shape of path a revision may reference. */
export const UPLOAD_PATH_RE = /^uploads\/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.tar\.gz$/;

export interface UploadResult {
  source_tarball_path: string;
  size: number;
  sha256: string;
}

class TooLarge extends Error {}

/**
 * Streams a request body to `<data>/uploads/<uuid>.tar.gz` (never held in memory), counting and
 * hashing on the way, stopping at `maxBytes`; then proves it is a gzip tar whose entries are safe.
 * A refused upload leaves no file behind.
 */
export async function receiveUpload(body: Readable, dataDir: string, maxBytes: number, limits: TarLimits, declaredLength?: number): Promise<UploadResult> {
  if (declaredLength !== undefined && declaredLength > maxBytes) {
    body.resume();
    throw new HttpError(413, `Upload is too large: the limit is ${maxBytes} bytes.`);
  }
  const dir = path.join(dataDir, UPLOAD_DIR);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const rel = `${UPLOAD_DIR}/${randomUUID()}.tar.gz`;
  const file = path.join(dataDir, rel);
  const hash = createHash('sha256');
  let size = 0;
  const meter = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      size += chunk.length;
      // Past the limit the rest is read and dropped, so the client gets a clean 413 instead of a
      // reset connection; a client that keeps going far beyond it is cut off.
      if (size > maxBytes * 2 + 1024 * 1024) return cb(new TooLarge());
      if (size > maxBytes) return cb();
      hash.update(chunk);
      cb(null, chunk);
    },
  });
  try {
    await pipeline(body, meter, createWriteStream(file, { flags: 'wx', mode: 0o600 }));
  } catch (err) {
    rmSync(file, { force: true });
    if (err instanceof TooLarge) throw new HttpError(413, `Upload is too large: the limit is ${maxBytes} bytes.`);
    throw err;
  }
  if (size > maxBytes) {
    rmSync(file, { force: true });
    throw new HttpError(413, `Upload is too large: the limit is ${maxBytes} bytes.`);
  }
  if (size === 0) {
    rmSync(file, { force: true });
    throw new HttpValidationError([{ loc: ['body'], msg: 'Upload is empty: send the application directory as a .tar.gz', type: 'value_error' }]);
  }
  try {
    const scan = await scanTarball(file, limits);
    if (!scan.hasKeygateJson) throw new TarballError('archive has no keygate.json at its top level');
  } catch (err) {
    rmSync(file, { force: true });
    if (err instanceof TarballError) throw new HttpValidationError([{ loc: ['body'], msg: `Refused tarball: ${err.message}`, type: 'value_error' }]);
    throw err;
  }
  return { source_tarball_path: rel, size, sha256: hash.digest('hex') };
}
