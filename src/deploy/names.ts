import path from 'node:path';

/** Deployment names the control plane accepts: lowercase `[a-z0-9-]`, 1-63 characters. */
export const DEPLOYMENT_NAME_RE = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
export const MAX_NAME_LENGTH = 63;

/**
 * Turns a directory name into a deployment name: lower-case, every other character becomes `-`,
 * runs of `-` collapse, leading and trailing `-` go, at most 63 characters. Returns '' when nothing
 * usable is left (the caller turns that into an error asking for `--name`).
 */
export function normaliseName(raw: string): string {
  let s = raw
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '') // "café" -> "cafe" rather than "caf-"
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '');
  if (s.length > MAX_NAME_LENGTH) s = s.slice(0, MAX_NAME_LENGTH).replace(/-+$/, '');
  return s;
}

/** The default deployment name for an application directory (its base name, normalised). */
export function nameForDirectory(dir: string): string {
  return normaliseName(path.basename(path.resolve(dir)));
}

/** Why `name` is not an acceptable deployment name, or null when it is. */
export function nameProblem(name: string): string | null {
  if (name.length === 0) return 'the deployment name is empty';
  if (name.length > MAX_NAME_LENGTH) return `the deployment name is longer than ${MAX_NAME_LENGTH} characters`;
  if (!DEPLOYMENT_NAME_RE.test(name)) return `invalid deployment name '${name}': use lowercase letters, digits and '-' (not at either end)`;
  return null;
}
