import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { buildLocal } from '../builder.js';
import { LineSplitter } from '../logs.js';
import { REPLICA_TOKEN_ENV, ReplicaRecords, type ReapResult } from '../orphans.js';
import type { TarLimits } from '../tarball.js';
import { BuildError, DeployError, replicaEnv, type BuildContext, type BuildOutput, type ExitInfo, type Replica, type RuntimeDriver, type StartSpec } from './types.js';

/** The compiled CLI next to this module (`dist/cli/main.js`), run with this very node. */
export const KEYGATE_CLI = fileURLToPath(new URL('../../cli/main.js', import.meta.url));

const LISTENING = /listening on (127\.0\.0\.1):(\d+)/;

export interface LocalDriverOptions {
  dataDir: string;
  limits: TarLimits;
  buildTimeoutMs: number;
  allowInstallScripts: boolean;
  /** Where running replicas are recorded, so a server killed outright leaves no unknown processes. */
  records?: ReplicaRecords;
}

/** The base environment of an app process: enough for node to run, nothing of the server's. */
export function replicaBaseEnv(appDir: string): Record<string, string> {
  return {
    PATH: [path.dirname(process.execPath), '/usr/local/bin', '/usr/bin', '/bin'].join(path.delimiter),
    HOME: appDir,
    LANG: 'C.UTF-8',
    NODE_ENV: 'production',
  };
}

/**
 * Runs each replica as `node dist/cli/main.js app serve --app DIR --listen 127.0.0.1:0` in its own
 * process group, learns its port from the `listening on` line and waits for `GET /ok`. It is not a
 * sandbox: the app runs as the server's user (use the Docker driver for isolation).
 */
export class LocalProcessDriver implements RuntimeDriver {
  readonly name = 'local';
  private readonly gone = new WeakSet<Replica>();
  constructor(private readonly o: LocalDriverOptions) {}

  async unavailableReason(): Promise<string | null> {
    return existsSync(KEYGATE_CLI) ? null : `the keygate CLI was not found at ${KEYGATE_CLI} (run npm run build)`;
  }

  /** Stops replicas a previous server left running (see {@link ReplicaRecords.reap}); call before restoring. */
  async reapOrphans(graceMs: number): Promise<ReapResult | null> {
    return this.o.records ? this.o.records.reap(graceMs) : null;
  }

  async build(ctx: BuildContext): Promise<BuildOutput> {
    if (ctx.source !== 'internal_source' || !ctx.config.source_tarball_path) throw new BuildError('the local driver builds internal_source revisions only');
    const appDir = path.join(ctx.revisionDir, 'app');
    await buildLocal({
      tarball: path.join(ctx.revisionDir, 'source.tar.gz'),
      appDir,
      limits: this.o.limits,
      npmCacheDir: path.join(this.o.dataDir, 'cache', 'npm'),
      timeoutMs: this.o.buildTimeoutMs,
      allowInstallScripts: this.o.allowInstallScripts,
      log: ctx.log,
      signal: ctx.signal,
      records: this.o.records ? { store: this.o.records, deploymentId: ctx.deploymentId, revisionId: ctx.revisionId } : undefined,
    });
    return { artifact: appDir };
  }

  async start(spec: StartSpec): Promise<Replica> {
    const appDir = spec.artifact;
    const token = ReplicaRecords.newToken();
    let child: ChildProcess;
    try {
      child = spawn(process.execPath, [KEYGATE_CLI, 'app', 'serve', '--app', appDir, '--listen', '127.0.0.1:0'], {
        cwd: appDir,
        env: { ...replicaBaseEnv(appDir), ...replicaEnv(spec), [REPLICA_TOKEN_ENV]: token },
        stdio: ['ignore', 'pipe', 'pipe'],
        // Its own session and process group: a terminal's Ctrl-C does not reach it, and stop() can
        // signal the group to take whatever the app started along.
        detached: true,
      });
    } catch (err) {
      // spawn refuses its arguments synchronously with a message that quotes the offending one:
      // here that is an environment value, a deployment secret. Only the code travels.
      throw new DeployError(`replica ${spec.replica} could not be started (${(err as NodeJS.ErrnoException).code ?? 'spawn failed'})`);
    }
    // Recorded before anything else can fail: from here on a crash of this server leaves a trace.
    if (child.pid) this.o.records?.add(token, child.pid, { deploymentId: spec.deploymentId, revisionId: spec.revisionId, replica: spec.replica });
    const exited = new Promise<ExitInfo>((resolve) => {
      child.once('exit', (code, signal) => resolve({ code, signal }));
      child.once('error', () => resolve({ code: null, signal: null }));
    });
    let port: number | null = null;
    let onPort: ((p: number) => void) | null = null;
    const seen = (line: string) => {
      if (port === null) {
        const m = LISTENING.exec(line);
        if (m) {
          port = Number(m[2]);
          onPort?.(port);
        }
      }
    };
    const out = new LineSplitter((l) => {
      seen(l);
      spec.log('info', l);
    }, spec.redact);
    const err = new LineSplitter((l) => {
      seen(l);
      spec.log('warn', l);
    }, spec.redact);
    child.stdout!.on('data', (c: Buffer) => out.write(c));
    child.stderr!.on('data', (c: Buffer) => err.write(c));
    child.stdout!.once('end', () => out.end());
    child.stderr!.once('end', () => err.end());

    const replica: Replica = { id: `${spec.revisionId}/${spec.replica}/${child.pid ?? 'x'}`, host: '127.0.0.1', port: 0, pid: child.pid, exited };
    void exited.then(() => {
      this.gone.add(replica);
      this.o.records?.remove(token);
    });
    const deadline = Date.now() + spec.startTimeoutMs;
    const fail = async (why: string): Promise<never> => {
      await this.stop(replica, 2000);
      throw new DeployError(why);
    };

    const gotPort = await Promise.race([
      new Promise<number>((resolve) => {
        if (port !== null) resolve(port);
        onPort = resolve;
      }),
      exited.then((e) => ({ exited: e })),
      new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), spec.startTimeoutMs).unref()),
    ]);
    if (gotPort === 'timeout') return fail(`replica ${spec.replica} did not report its address within ${Math.round(spec.startTimeoutMs / 1000)} s`);
    if (typeof gotPort === 'object') return fail(`replica ${spec.replica} exited during start (${describeExit(gotPort.exited)}); see the deploy log`);
    replica.port = gotPort;

    // Listening is not ready: wait for GET /ok.
    let lastProblem = 'no answer';
    while (Date.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) return fail(`replica ${spec.replica} exited during start (${describeExit({ code: child.exitCode, signal: child.signalCode })}); see the deploy log`);
      try {
        const res = await request(`http://127.0.0.1:${gotPort}/ok`, { headers: { 'x-api-key': spec.apiKey }, headersTimeout: 2000, bodyTimeout: 2000 });
        await res.body.dump();
        if (res.statusCode === 200) return replica;
        lastProblem = `status ${res.statusCode}`;
      } catch (e) {
        lastProblem = (e as Error).message;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    return fail(`replica ${spec.replica} did not pass its health check (GET /ok: ${lastProblem})`);
  }

  async stop(replica: Replica, graceMs: number): Promise<void> {
    if (!replica.pid || this.gone.has(replica)) return;
    const pid = replica.pid;
    const signal = (s: NodeJS.Signals, single = true) => {
      try {
        process.kill(-pid, s);
      } catch {
        if (!single) return;
        try {
          process.kill(pid, s);
        } catch {
          /* gone */
        }
      }
    };
    signal('SIGTERM');
    const done = await Promise.race([replica.exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), graceMs).unref())]);
    if (!done) signal('SIGKILL');
    await replica.exited;
    // The group may hold children the app started; they go with it. Never the bare pid here: once
    // the leader has exited, that number may already belong to someone else.
    signal('SIGKILL', false);
  }
}

export function describeExit(e: ExitInfo): string {
  return e.signal ? `signal ${e.signal}` : `exit code ${e.code}`;
}
