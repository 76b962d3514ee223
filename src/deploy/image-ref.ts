// Docker image references as the docker CLI reads them (distribution/reference grammar), for the
// one decision the CLI makes from a tag: whether it names a registry to push to.

export interface ImageRef {
  /** The registry host (`registry.example.com`, `localhost:5000`), or null when none is written. */
  registry: string | null;
  /** The repository path under the registry (`team/app`). */
  repository: string;
  tag: string | null;
}

const DOMAIN_COMPONENT = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const DOMAIN = new RegExp(`^${DOMAIN_COMPONENT}(?:\\.${DOMAIN_COMPONENT})*(?::[0-9]+)?$`);
const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[\w][\w.-]{0,127}$/;
const MAX_NAME = 255;

/**
 * Parses a tag given to `docker build -t`. Returns the reference, or a sentence saying what is
 * wrong (the CLI shows it as a usage error). Digests are refused: a build produces the digest.
 * Like docker, the first path component is a registry only when it contains `.` or `:`, is
 * `localhost`, or has upper-case letters; `team/app` is Docker Hub's implicit `docker.io`, which
 * counts as no registry written (write `docker.io/team/app` to push there).
 */
export function parseImageTag(raw: string): ImageRef | string {
  if (raw.length === 0) return 'the image tag is empty';
  if (raw.startsWith('-')) return `'${raw}' is not an image tag (it starts with '-')`;
  if (/\s/.test(raw)) return `'${raw}' is not an image tag (it contains white space)`;
  if (raw.includes('@')) return `'${raw}': give a tag, not a digest (the build produces the digest)`;
  let name = raw;
  let tag: string | null = null;
  const colon = raw.lastIndexOf(':');
  if (colon > raw.lastIndexOf('/')) {
    tag = raw.slice(colon + 1);
    name = raw.slice(0, colon);
    if (!TAG.test(tag)) return `'${raw}': the tag '${tag}' must be letters, digits, '_', '.' or '-' (up to 128, not starting with '.' or '-')`;
  }
  if (name.length > MAX_NAME) return `'${raw}': the image name is longer than ${MAX_NAME} characters`;
  let registry: string | null = null;
  let repository = name;
  const slash = name.indexOf('/');
  if (slash >= 0) {
    const first = name.slice(0, slash);
    if (first.includes('.') || first.includes(':') || first === 'localhost' || first !== first.toLowerCase()) {
      if (!DOMAIN.test(first)) return `'${raw}': '${first}' is not a registry host`;
      registry = first;
      repository = name.slice(slash + 1);
    }
  }
  if (!repository) return `'${raw}': the repository name is missing`;
  for (const part of repository.split('/')) {
    if (!PATH_COMPONENT.test(part)) {
      return `'${raw}': '${part}' is not a valid repository name component (lower-case letters, digits, and '.', '_', '__' or '-' between them)`;
    }
  }
  return { registry, repository, tag };
}
