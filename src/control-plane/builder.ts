import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { BuildError } from './drivers/types.js';
import { LineSplitter } from './logs.js';
import { REPLICA_TOKEN_ENV, ReplicaRecords } from './orphans.js';
import { extractTarball, TarballError, type TarLimits } from './tarball.js';
import { parseJsonSafely } from '../validation/json.js';

export interface LocalBuildOptions {
  tarball: string;
  appDir: string;
  limits: TarLimits;
  /** npm's cache, shared by builds. */
  npmCacheDir: string;
  timeoutMs: number;
  /** Run dependencies' install scripts (off by default: see README of the control plane). */
  allowInstallScripts: boolean;
  log(level: 'info' | 'warn' | 'error', line: string): void;
  signal: AbortSignal;
  /** Build commands are recorded like replicas, so a server killed mid-build leaves none running. */
  records?: { store: ReplicaRecords; deploymentId: string; revisionId: string };
}

/** npm as shipped with this node, so builds do not depend on the server's PATH. */
function npmCommand(): { cmd: string; args: string[] } {
  const cli = path.resolve(path.dirname(process.execPath), '../lib/node_modules/npm/bin/npm-cli.js');
  return existsSync(cli) ? { cmd: process.execPath, args: [cli] } : { cmd: 'npm', args: [] };
}

/** A minimal environment: no server secrets, no deployment secrets (builds never need them). */
export function buildEnv(home: string, npmCache: string): NodeJS.ProcessEnv {
  return {
    PATH: [path.dirname(process.execPath), '/usr/local/bin', '/usr/bin', '/bin'].join(path.delimiter),
    HOME: home,
    LANG: 'C.UTF-8',
    npm_config_cache: npmCache,
    npm_config_update_notifier: 'false',
    npm_config_fund: 'false',
    npm_config_audit: 'false',
    CI: 'true',
  };
}

function readJson(file: string, what: string): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = parseJsonSafely(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new BuildError(`${what}: ${(err as Error).message}`);
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new BuildError(`${what}: must be a JSON object`);
  return raw as Record<string, unknown>;
}

/** Runs one build command in its own process group; output goes to the build log line by line. */
function runStep(cmd: string, args: string[], shown: string, cwd: string, env: NodeJS.ProcessEnv, o: LocalBuildOptions): Promise<void> {
  o.log('info', `$ ${shown}`);
  return new Promise((resolve, reject) => {
    const token = ReplicaRecords.newToken();
    const child = spawn(cmd, args, { cwd, env: { ...env, [REPLICA_TOKEN_ENV]: token }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    const rec = o.records;
    if (rec && child.pid) rec.store.add(token, child.pid, { deploymentId: rec.deploymentId, revisionId: rec.revisionId, replica: 0, kind: 'build' });
    child.once('exit', () => rec?.store.remove(token));
    const out = new LineSplitter((l) => o.log('info', l));
    const err = new LineSplitter((l) => o.log('warn', l));
    child.stdout!.on('data', (c: Buffer) => out.write(c));
    child.stderr!.on('data', (c: Buffer) => err.write(c));
    let why: string | null = null;
    const kill = (reason: string) => {
      why ??= reason;
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        /* already gone */
      }
    };
    const timer = setTimeout(() => kill(`timed out after ${Math.round(o.timeoutMs / 1000)} s`), o.timeoutMs);
    const onAbort = () => kill('cancelled');
    o.signal.addEventListener('abort', onAbort, { once: true });
    child.once('error', (e) => {
      clearTimeout(timer);
      o.signal.removeEventListener('abort', onAbort);
      reject(new BuildError(`${shown}: could not start (${e.message})`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      o.signal.removeEventListener('abort', onAbort);
      out.end();
      err.end();
      if (why) return reject(new BuildError(`${shown}: ${why}`));
      if (code === 0) return resolve();
      reject(new BuildError(`${shown} failed (${code !== null ? `exit code ${code}` : `signal ${signal}`})`));
    });
  });
}

/**
 * `"env": ".env"` in keygate.json names a file `keygate deploy` never uploads: its variables arrive
 * as the deployment's secrets instead. Left in, every replica would warn at start that the file is
 * missing; so when the file is not in the source (or would be outside it), the built keygate.json
 * drops the reference and the build log says why.
 */
export function dropMissingEnvFile(configFile: string, config: Record<string, unknown>, appDir: string, log: (level: 'info', line: string) => void): void {
  if (typeof config.env !== 'string') return;
  const target = path.resolve(appDir, config.env);
  const rel = path.relative(appDir, target);
  const inside = rel !== '' && !rel.startsWith('..') && !path.isAbsolute(rel);
  if (inside && existsSync(target)) return;
  const named = config.env;
  delete config.env;
  writeFileSync(configFile, JSON.stringify(config, null, 2) + '\n');
  log('info', `keygate.json: env file ${named} is not in the upload (keygate deploy never packs env files); the app gets the deployment's secrets as its environment instead`);
}

/**
 * The local build: unpack safely, check keygate.json, `npm ci` when there is a lockfile, the app's
 * `build` script when it has one. Throws BuildError with a one-line reason; details are in the log.
 */
export async function buildLocal(o: LocalBuildOptions): Promise<void> {
  rmSync(o.appDir, { recursive: true, force: true });
  mkdirSync(o.appDir, { recursive: true, mode: 0o755 });
  o.log('info', 'unpacking the source archive');
  try {
    const scan = await extractTarball(o.tarball, o.appDir, o.limits);
    o.log('info', `unpacked ${scan.entries} entries (${scan.unpackedBytes} bytes)`);
  } catch (err) {
    if (err instanceof TarballError) throw new BuildError(`refused source archive: ${err.message}`);
    // The message of a system call names the server's own path: the user sees theirs.
    throw new BuildError(`cannot unpack the source archive: ${(err as Error).message.split('\n')[0].split(o.appDir).join('<app>')}`);
  }
  if (o.signal.aborted) throw new BuildError('cancelled');

  const configFile = path.join(o.appDir, 'keygate.json');
  if (!existsSync(configFile)) throw new BuildError('keygate.json not found at the top of the source');
  const config = readJson(configFile, 'keygate.json');
  const assistants = config.assistants;
  if (!assistants || typeof assistants !== 'object' || Array.isArray(assistants) || Object.keys(assistants).length === 0) {
    throw new BuildError('keygate.json: "assistants" must name at least one assistant');
  }
  o.log('info', `keygate.json names ${Object.keys(assistants).length} assistant(s): ${Object.keys(assistants).slice(0, 10).join(', ')}`);
  dropMissingEnvFile(configFile, config, o.appDir, o.log);

  const pkgFile = path.join(o.appDir, 'package.json');
  if (!existsSync(pkgFile)) {
    o.log('info', 'no package.json: nothing to install or build');
    return;
  }
  const pkg = readJson(pkgFile, 'package.json');
  const home = path.join(path.dirname(o.appDir), 'home');
  mkdirSync(home, { recursive: true });
  mkdirSync(o.npmCacheDir, { recursive: true });
  const env = buildEnv(home, o.npmCacheDir);
  const npm = npmCommand();
  const hasDeps = ['dependencies', 'devDependencies', 'optionalDependencies'].some((k) => {
    const v = pkg[k];
    return v && typeof v === 'object' && Object.keys(v).length > 0;
  });
  const lock = ['package-lock.json', 'npm-shrinkwrap.json'].find((f) => existsSync(path.join(o.appDir, f)));
  if (hasDeps && lock) {
    const args = ['ci', '--no-audit', '--no-fund', ...(o.allowInstallScripts ? [] : ['--ignore-scripts'])];
    await runStep(npm.cmd, [...npm.args, ...args], `npm ${args.join(' ')}`, o.appDir, env, o);
  } else if (hasDeps && !existsSync(path.join(o.appDir, 'node_modules'))) {
    throw new BuildError('package.json declares dependencies but the source has no package-lock.json: run npm install and include the lockfile');
  } else if (hasDeps) {
    o.log('info', 'no lockfile: using the node_modules shipped with the source');
  }
  const scripts = pkg.scripts as Record<string, unknown> | undefined;
  if (scripts && typeof scripts === 'object' && typeof scripts.build === 'string') {
    await runStep(npm.cmd, [...npm.args, 'run', 'build'], 'npm run build', o.appDir, env, o);
  }
}
