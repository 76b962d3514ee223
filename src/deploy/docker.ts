import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync, type Dirent } from 'node:fs';
import path from 'node:path';
import { CliError } from '../command-error.js';
import { APP_CONFIG_FILE } from './appdir.js';
import { DockerIgnore } from './dockerignore.js';
import { isLocalEnvFile } from './files.js';

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
  const r = spawnSync(docker, ['info', '--format', '{{.ServerVersion}}'], { encoding: 'utf8', timeout: 20_000, env: dockerEnv() });
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
  const r = spawnSync(docker, ['image', 'inspect', '--format', '{{.Os}}/{{.Architecture}}', image], { encoding: 'utf8', timeout: 20_000, env: dockerEnv() });
  if (r.error || r.status !== 0) return undefined;
  return r.stdout.trim() || undefined;
}

/** One line of output from a docker command, as it arrives. */
export type DockerLine = (line: string, stream: 'stdout' | 'stderr') => void;

export interface DockerRunOptions {
  docker?: string;
  /** The environment of the docker process (default: this process's, minus keygate's own settings). */
  env?: NodeJS.ProcessEnv;
  onLine: DockerLine;
}

/** Longer lines are cut: a build printing a minified bundle must not grow memory without bound. */
const MAX_LINE = 16 * 1024;

/** What docker needs of our environment: everything but the variables that configure keygate (the API key). */
export function dockerEnv(env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) if (k !== 'KEYGATE_API_KEY' && k !== 'KEYGATE_URL') out[k] = v;
  return out;
}

/**
 * Runs `docker ARGS...`, handing each output line to `onLine` as it comes (nothing is buffered
 * beyond one line). Resolves with the exit status; a signal counts as a failure.
 */
export function runDocker(args: string[], o: DockerRunOptions): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const docker = o.docker ?? process.env.KEYGATE_DOCKER ?? 'docker';
  return new Promise((resolve, reject) => {
    const child = spawn(docker, args, { stdio: ['ignore', 'pipe', 'pipe'], env: o.env ?? dockerEnv() });
    const splitter = (stream: 'stdout' | 'stderr') => {
      let pending = '';
      let cut = false;
      const emit = (raw: string) => {
        const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
        o.onLine(line.length > MAX_LINE ? `${line.slice(0, MAX_LINE)} [line cut]` : line, stream);
      };
      return {
        write(chunk: Buffer) {
          const parts = (pending + chunk.toString('utf8')).split('\n');
          pending = parts.pop() ?? '';
          for (const p of parts) {
            if (!cut) emit(p);
            cut = false;
          }
          if (pending.length > MAX_LINE) {
            if (!cut) emit(pending);
            cut = true;
            pending = '';
          }
        },
        end() {
          if (pending && !cut) emit(pending);
          pending = '';
        },
      };
    };
    const out = splitter('stdout');
    const err = splitter('stderr');
    child.stdout!.on('data', (c: Buffer) => out.write(c));
    child.stderr!.on('data', (c: Buffer) => err.write(c));
    child.once('error', (e: NodeJS.ErrnoException) => {
      reject(new CliError(e.code === 'ENOENT' ? `no container runtime: '${docker}' was not found` : `cannot run ${docker}: ${e.code ?? e.message}`));
    });
    child.once('close', (code, signal) => {
      out.end();
      err.end();
      resolve({ code, signal });
    });
  });
}

function exitText(r: { code: number | null; signal: NodeJS.Signals | null }): string {
  return r.signal ? `was stopped by ${r.signal}` : `exited with status ${r.code}`;
}

export interface BuildImageOptions extends DockerRunOptions {
  tag: string;
  /** The build context; it holds the Dockerfile. */
  dir: string;
  /** The host's architecture (injectable for tests); ARM hosts cross-build for {@link TARGET_PLATFORM}. */
  arch?: string;
}

/**
 * The exact `docker` arguments of an image build on a host of `arch`. `--force-rm`: the classic
 * builder keeps the container of a failed step (a stopped container per failed deploy, forever).
 */
export function buildArgs(tag: string, dir: string, arch: string = process.arch): string[] {
  return ['build', '--force-rm', ...platformArgs(arch), '-t', tag, dir];
}

/** `docker build [--platform linux/amd64] -t TAG DIR`, streamed. Throws a one-line CliError on failure. */
export async function buildImage(o: BuildImageOptions): Promise<void> {
  const r = await runDocker(buildArgs(o.tag, o.dir, o.arch), o);
  if (r.code !== 0) throw new CliError(`the image build failed: docker build ${exitText(r)} (its output is above)`);
}

/** `docker push TAG`, streamed. Throws a one-line CliError on failure. */
export async function pushImage(o: DockerRunOptions & { tag: string; registry: string }): Promise<void> {
  const r = await runDocker(['push', o.tag], o);
  if (r.code !== 0) throw new CliError(`pushing ${o.tag} failed: docker push ${exitText(r)} (its output is above; are you logged in? docker login ${o.registry})`);
}

/** Directories plain deploy never packs and the walk does not enter (dependencies, version control). */
const NOT_WALKED = new Set(['node_modules', '.git']);

/**
 * The env file keygate.json names, relative to `dir` (slash-separated), when there is one inside
 * it: plain deploy never packs it (its values travel as the deployment's write-only secrets).
 */
function namedEnvFile(dir: string): string | undefined {
  const file = path.join(dir, APP_CONFIG_FILE);
  if (!existsSync(file)) return undefined;
  let cfg: unknown;
  try {
    cfg = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    return undefined; // an image build does not need keygate.json; a broken one names nothing
  }
  const env = (cfg as { env?: unknown } | null)?.env;
  if (typeof env !== 'string' || env === '') return undefined;
  const rel = path.relative(dir, path.resolve(dir, env));
  if (rel === '' || rel.startsWith('..') || path.isAbsolute(rel)) return undefined;
  return rel.split(path.sep).join('/');
}

/**
 * Prerequisites of an image build in `dir`: a Dockerfile, and no local secret file left in the
 * build context: a `.env` or `.env.*` at any depth (it holds the API key and the app's secrets) or
 * the env file keygate.json names, which plain deploy never packs. Files `.dockerignore` excludes
 * (read as docker reads it, see dockerignore.ts) are fine; the check names the others, never
 * their content.
 */
export function checkBuildContext(dir: string): { dockerfile: string } {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new CliError(`build directory ${dir} does not exist or is not a directory`);
  const dockerfile = path.join(dir, 'Dockerfile');
  if (!existsSync(dockerfile) || !statSync(dockerfile).isFile()) throw new CliError(`${dockerfile} not found: --build-image builds the Dockerfile in DIR`);
  const rules = path.join(dir, '.dockerignore');
  const ig = new DockerIgnore(existsSync(rules) ? readFileSync(rules, 'utf8') : '');
  const named = namedEnvFile(dir);
  const exposed: string[] = [];
  const walk = (abs: string, rel: string) => {
    let entries: Dirent[];
    try {
      entries = readdirSync(abs, { withFileTypes: true });
    } catch {
      return; // unreadable: docker would fail on it itself
    }
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) {
        if (NOT_WALKED.has(e.name)) continue;
        // Without a `!` pattern nothing under an excluded directory can be sent.
        if (!ig.hasExclusions && ig.ignores(r)) continue;
        walk(path.join(abs, e.name), r);
      } else if ((isLocalEnvFile(e.name) || r === named) && !ig.ignores(r)) {
        exposed.push(r);
      }
    }
  };
  walk(dir, '');
  if (exposed.length) {
    // What to add: docker's pattern for the env files (root-only when they all are at the root), and the named file as it is.
    const envNamed = exposed.filter((r) => isLocalEnvFile(path.posix.basename(r)));
    const add = [...(envNamed.length ? [envNamed.every((r) => !r.includes('/')) ? "'.env*'" : "'**/.env*'"] : []), ...exposed.filter((r) => !envNamed.includes(r)).map((r) => `'${r}'`)].join(' and ');
    throw new CliError(`refusing to build: ${exposed.join(', ')} would be sent to docker with the build context (and could be copied into the image); add ${add} to ${rules}`);
  }
  return { dockerfile };
}
