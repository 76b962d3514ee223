// Runs `node dist/cli/main.js deploy ...` asynchronously (spawnSync would freeze the test worker
// while a deploy waits) with an environment that carries only what the test gives it.
import { spawn, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import * as tar from 'tar';
import { CLI, REPO_ROOT } from '../helpers/cli.js';

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** The parent's environment minus every keygate setting, so nothing leaks in from the runner. */
export function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('KEYGATE_') && k !== 'NO_COLOR' && k !== 'CI') env[k] = v;
  return { ...env, ...extra };
}

export function spawnDeploy(args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv }): { proc: ChildProcess; done: Promise<CliResult>; stdout(): string } {
  const proc = spawn(process.execPath, [CLI, 'deploy', ...args], { cwd: opts.cwd, env: cleanEnv(opts.env), stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  proc.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  proc.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  const done = new Promise<CliResult>((resolve) => proc.once('close', (code) => resolve({ code, stdout, stderr })));
  return { proc, done, stdout: () => stdout };
}

export async function runDeploy(args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<CliResult> {
  const { proc, done } = spawnDeploy(args, opts);
  const timer = setTimeout(() => proc.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
  try {
    return await done;
  } finally {
    clearTimeout(timer);
  }
}

/** A copy of examples/echo-agent under `parent/<name>`, so the derived deployment name is known. */
export function copyEcho(parent: string, name: string): string {
  const dir = path.join(parent, name);
  cpSync(path.join(REPO_ROOT, 'examples/echo-agent'), dir, { recursive: true });
  return dir;
}

/** Every file (relative path) under `dir`, for checking what the control plane unpacked. */
export function listTree(dir: string, rel = ''): string[] {
  const out: string[] = [];
  for (const name of readdirSync(path.join(dir, rel))) {
    const r = rel ? `${rel}/${name}` : name;
    if (statSync(path.join(dir, r)).isDirectory()) out.push(...listTree(dir, r));
    else out.push(r);
  }
  return out.sort();
}

/** The directory under `root` that holds a keygate.json whose path mentions `revisionId`. */
export function findUnpacked(root: string, revisionId: string): string | undefined {
  const walk = (d: string, depth: number): string | undefined => {
    if (depth > 8 || !existsSync(d)) return undefined;
    if (d.includes(revisionId) && existsSync(path.join(d, 'keygate.json'))) return d;
    for (const name of readdirSync(d)) {
      const p = path.join(d, name);
      if (name !== 'node_modules' && statSync(p).isDirectory()) {
        const hit = walk(p, depth + 1);
        if (hit) return hit;
      }
    }
    return undefined;
  };
  return walk(root, 0);
}

/**
 * A stand-in `docker` CLI (no engine runs here): it appends each invocation as a JSON line
 * `{args, apiKeyInEnv}` to `<dir>/docker-calls.jsonl`, answers `info` with a version, prints a few
 * lines on both streams for `build` and `push`, and fails the command named in FAKE_DOCKER_FAIL.
 */
export function fakeDocker(dir: string): { bin: string; calls(): { args: string[]; apiKeyInEnv: boolean }[] } {
  const bin = path.join(dir, 'fake-docker');
  const log = path.join(dir, 'docker-calls.jsonl');
  const script = `#!${process.execPath}
const fs = require('fs');
const args = process.argv.slice(2);
fs.appendFileSync(${JSON.stringify(log)}, JSON.stringify({ args, apiKeyInEnv: 'KEYGATE_API_KEY' in process.env }) + '\\n');
const cmd = args[0];
if (cmd === 'info') { console.log('27.0.0-test'); process.exit(0); }
if (cmd === 'build' || cmd === 'push') {
  console.log(cmd + ' step 1/2 for ' + args[args.length - 1]);
  console.error(cmd + ' progress on stderr');
  console.log(cmd + ' step 2/2 done');
  if (process.env.FAKE_DOCKER_FAIL === cmd) { console.error(cmd + ': something broke'); process.exit(3); }
  process.exit(0);
}
process.exit(1);
`;
  writeFileSync(bin, script, { mode: 0o755 });
  return {
    bin,
    calls: () =>
      existsSync(log)
        ? readFileSync(log, 'utf8')
            .split('\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l))
        : [],
  };
}

/** Each entry of a (gzip) tarball by path: its type, link target and content as text. */
export async function tarEntries(file: string): Promise<Map<string, { type: string; linkpath?: string; body: string }>> {
  const out = new Map<string, { type: string; linkpath?: string; body: string }>();
  await tar.t({
    file,
    onReadEntry: (e) => {
      const chunks: Buffer[] = [];
      e.on('data', (c: Buffer) => chunks.push(c));
      e.on('end', () => out.set(e.path, { type: e.type, linkpath: e.linkpath, body: Buffer.concat(chunks).toString('utf8') }));
    },
  });
  return out;
}
