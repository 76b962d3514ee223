import { pipeline } from 'node:stream/promises';
import * as tar from 'tar';
import type { DockerEngine } from '../docker/engine.js';

/**
 * A small file of a docker box's image, read by the engine through its archive API before the box
 * runs anything (its /etc/passwd, to check the user executions run as). The files API itself goes
 * through the box (box-files.ts, as on the local driver): the archive API reads the container's
 * root file system, not what the box sees at tmpfs /tmp, /proc or /dev, and resolves `..` by name.
 * Null when there is no such regular file; an error past `maxBytes`.
 */
export async function readImageFile(engine: DockerEngine, containerId: string, boxPath: string, maxBytes: number): Promise<string | null> {
  const res = await engine.request('GET', `/containers/${containerId}/archive?path=${encodeURIComponent(boxPath)}`);
  if (res.statusCode !== 200) {
    await res.body.dump();
    if (res.statusCode === 404) return null;
    throw new Error(`the engine refused to read ${boxPath} of the image (${res.statusCode})`);
  }
  const parts: Buffer[] = [];
  let size = 0;
  let found = false;
  const parser = new tar.Parser({
    onReadEntry: (entry) => {
      if (found || entry.type !== 'File') {
        entry.resume();
        return;
      }
      found = true;
      entry.on('data', (c: Buffer) => {
        size += c.length;
        if (size > maxBytes) res.body.destroy(new Error(`${boxPath} of the image is larger than ${maxBytes} bytes`));
        else parts.push(c);
      });
    },
  });
  await pipeline(res.body, parser);
  return found ? Buffer.concat(parts).toString('utf8') : null;
}
