import { statSync } from 'node:fs';
import * as tar from 'tar';
import type { FileSelection } from './files.js';

/**
 * tar writes the second name of a hard-linked file as a hard-link entry, which the control plane
 * refuses (hard links are never unpacked): a project with two names for one file could never be
 * deployed. A link cache that remembers nothing makes every name a plain file with its content.
 */
class NoHardLinks extends Map<`${number}:${number}`, string> {
  override set(): this {
    return this;
  }
}

/**
 * Writes the selected files as a gzip tarball to `outFile`. Links are stored as links
 * (`follow: false`; selectFiles only lets in-tree relative ones through); `portable` drops owner
 * names and ids that mean nothing on the control plane. Synchronous: tar's asynchronous packer
 * defers a hard-linked file until its first name is cached, and with this cache it would wait
 * forever.
 */
export async function packToFile(sel: FileSelection, outFile: string): Promise<number> {
  tar.c({ sync: true, gzip: true, cwd: sel.root, portable: true, follow: false, noDirRecurse: true, file: outFile, linkCache: new NoHardLinks() }, sel.files);
  return statSync(outFile).size;
}
