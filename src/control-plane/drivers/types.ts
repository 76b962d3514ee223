import { SECRET_NAMES_ENV } from '../../secrets/redact.js';
import type { Source, SourceRevisionConfig } from '../types.js';

/**
 * A runtime driver turns a revision into running replicas. The control plane (manager, supervisor,
 * front router) is the same for every driver: it builds once per revision, starts as many replicas
 * as the deployment type wants, watches them, and stops them.
 */
export interface RuntimeDriver {
  readonly name: string;
  /** null when usable here, else the reason it is not (shown to users verbatim). */
  unavailableReason(): Promise<string | null>;
  /** Prepares the revision (unpack + npm, or pull an image). Throws {@link BuildError}. */
  build(ctx: BuildContext): Promise<BuildOutput>;
  /** Starts one replica and resolves once it answers its health check. Throws {@link DeployError}. */
  start(spec: StartSpec): Promise<Replica>;
  /** Stops a replica: SIGTERM (or the engine's stop), then a kill after `graceMs`. Idempotent. */
  stop(replica: Replica, graceMs: number): Promise<void>;
  /**
   * Stops replicas a previous server process left running (it was killed before it could stop
   * them). Called once at start, before deployments are restored. Optional: drivers whose
   * replicas cannot outlive the server need none.
   */
  reapOrphans?(graceMs: number): Promise<unknown>;
}

export interface BuildContext {
  deploymentId: string;
  revisionId: string;
  /** `<data>/deployments/<id>/revisions/<rev>`: the driver's to use. */
  revisionDir: string;
  source: Source;
  config: SourceRevisionConfig;
  /** One build-log line (already redacted by the caller's sink). */
  log(level: 'info' | 'warn' | 'error', line: string): void;
  signal: AbortSignal;
}

export interface BuildOutput {
  /** What `start` runs: an application directory, or an image reference. */
  artifact: string;
}

export interface StartSpec {
  deploymentId: string;
  revisionId: string;
  /** 1-based replica number (for log lines and container names). */
  replica: number;
  artifact: string;
  /** The replica's whole environment beyond the driver's own minimal base (secrets, API key). */
  env: Record<string, string>;
  /** Key the front router sends as X-Api-Key; the health check sends it too. */
  apiKey: string;
  /** One deploy-log line from the replica (stdout/stderr) or about it (events). */
  log(level: 'info' | 'warn' | 'error', line: string): void;
  startTimeoutMs: number;
  /** Redacts secret values from captured output before it is logged. */
  redact(s: string): string;
}

/**
 * What every driver gives a replica's `keygate app serve` of the spec: its variables, the API key
 * the router sends, and the names (never values) of the variables that are deployment secrets,
 * whose values the runtime redacts from its errors and logs.
 */
export function replicaEnv(spec: StartSpec): Record<string, string> {
  return { ...spec.env, KEYGATE_API_KEY: spec.apiKey, [SECRET_NAMES_ENV]: Object.keys(spec.env).join(',') };
}

export interface ExitInfo {
  code: number | null;
  signal: string | null;
}

export interface Replica {
  id: string;
  host: string;
  port: number;
  /** Local process id (local driver), for operators and tests. */
  pid?: number;
  /** Resolves when the replica stops, for whatever reason. */
  exited: Promise<ExitInfo>;
}

/** A build failed; the message becomes the revision's status_message (never holds secrets). */
export class BuildError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BuildError';
  }
}

/** A replica could not be started or did not become healthy. */
export class DeployError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DeployError';
  }
}

/**
 * A one-line reason for a failed build or deploy, fit for a revision's status_message and the logs:
 * our own errors (BuildError, DeployError) by their message; a system call's failure by its message
 * (an errno code, the call and a path); anything else only by its name and code, because such a
 * message may quote what it was given: Node's invalid-argument errors quote an environment value,
 * that is a deployment secret, escaped and cut to a length no redactor can recognise.
 */
export function failureReason(err: unknown): string {
  if (err instanceof BuildError || err instanceof DeployError) return err.message;
  const e = err as { message?: unknown; name?: unknown; code?: unknown; syscall?: unknown } | null;
  if (e && typeof e.syscall === 'string' && typeof e.message === 'string') return e.message.split('\n')[0];
  const name = e && typeof e.name === 'string' ? e.name : 'Error';
  return `internal error (${name}${e && typeof e.code === 'string' ? ` ${e.code}` : ''})`;
}
