import { statSync } from 'node:fs';
import * as tar from 'tar';
import type { FileSelection } from './files.js';

/**
 * Writes the selected files as a gzip tarball to `outFile`, streaming from disk (nothing is held
 * in memory). Links are stored as links (`follow: false`; selectFiles only lets in-tree relative
 * ones through); `portable` drops owner names and ids that mean nothing on the control plane.
 */
export async function packToFile(sel: FileSelection, outFile: string): Promise<number> {
  await tar.c({ gzip: true, cwd: sel.root, portable: true, follow: false, noDirRecurse: true, file: outFile }, sel.files);
  return statSync(outFile).size;
}
