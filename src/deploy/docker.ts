import { spawnSync } from 'node:child_process';
import { CliError } from '../cli/errors.js';

/** The platform images must be built for: the control plane's hosts are x86-64. */
export const TARGET_PLATFORM = 'linux/amd64';

/** Extra `docker build` arguments for this host: on ARM (e.g. Apple silicon) cross-build for amd64. */
export function platformArgs(arch: string = process.arch): string[] {
  return arch === 'arm64' || arch === 'arm' ? ['--platform', TARGET_PLATFORM] : [];
}

/** The command a user on this host should build an image with. */
export function suggestedBuildCommand(tag: string, arch: string = process.arch): string {
  return ['docker', 'build', ...platformArgs(arch), '-t', tag, '.'].join(' ');
}

/**
 * Prerequisite for image deployments: a container runtime that answers (`docker info`). The
 * message says which of "not installed" and "not running" it is.
 */
export function checkContainerRuntime(docker = process.env.KEYGATE_DOCKER ?? 'docker'): string {
  const r = spawnSync(docker, ['info', '--format', '{{.ServerVersion}}'], { encoding: 'utf8', timeout: 20_000 });
  if (r.error) {
    const code = (r.error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new CliError(`no container runtime: '${docker}' was not found; install Docker (or set KEYGATE_DOCKER) to deploy images`);
    throw new CliError(`the container runtime did not answer: ${docker} info: ${code ?? r.error.message}`);
  }
  if (r.status !== 0) {
    const first = (r.stderr || r.stdout || '').split('\n').find((l) => l.trim()) ?? `exit status ${r.status}`;
    throw new CliError(`the container runtime is not running: ${docker} info: ${first.trim()}`);
  }
  return r.stdout.trim();
}

/** `os/arch` of a locally available image, or undefined when it is not local (e.g. only in a registry). */
export function localImagePlatform(image: string, docker = process.env.KEYGATE_DOCKER ?? 'docker'): string | undefined {
  const r = spawnSync(docker, ['image', 'inspect', '--format', '{{.Os}}/{{.Architecture}}', image], { encoding: 'utf8', timeout: 20_000 });
  if (r.error || r.status !== 0) return undefined;
  return r.stdout.trim() || undefined;
}
