import type { Readable, Writable } from 'node:stream';

/**
 * The box drivers' one interface (../shared/reference/sandbox.md, "Drivers"). The sandbox API
 * (src/sandbox-api) knows boxes only through it, so that a `kubernetes` driver is one more
 * implementation, not a rewrite. Drivers know nothing of proxy configurations or secrets: they get
 * an address to relay to and an environment that never holds a secret value.
 */
export type DriverName = 'local' | 'docker' | 'none';
export const DRIVER_NAMES: readonly DriverName[] = ['local', 'docker', 'none'];

/** Resources as applied to a box (the template's defaults, overridden per box). */
export interface BoxResources {
  /** Memory limit, MiB. */
  memory_mb: number;
  /** CPU time as a number of CPUs (fractions allowed); drivers without a CPU share limit CPU time. */
  cpus: number;
  /** Most processes and threads the box may hold at once. */
  pids: number;
  /** Size of the box's /workspace, MiB: writes past it fail in the box (ENOSPC), never fill the host's disk. */
  disk_mb: number;
}

/** What a box is built from. Exactly one of `rootfs` (local) or `image` (docker) is meaningful per driver. */
export interface BoxTemplate {
  name: string;
  /** local: `host` (the host's /usr, /bin, /lib*, a minimal /etc, read-only) or an absolute root filesystem directory. */
  rootfs?: string;
  /** docker: a local image reference (no registry is ever asked). */
  image?: string;
  /** Environment the template adds inside the box. */
  environment: Record<string, string>;
}

/** Everything a driver needs to start one box. Holds no secret value. */
export interface BoxSpec {
  /** The sandbox id: names the box's container, processes and host-side state. */
  id: string;
  template: BoxTemplate;
  resources: BoxResources;
  /**
   * Environment inside the box: the proxy variables pointing at `http://127.0.0.1:3128`, the CA
   * paths under /etc/keygate, `NODE_USE_ENV_PROXY=1`, then the template's. Never a secret value.
   */
  env: Record<string, string>;
  /** Seen inside the box at /etc/keygate/ca.pem and /etc/keygate/ca-bundle.pem. */
  caPem: string;
  caBundlePem: string;
  /**
   * Seen inside the box at /etc/keygate/truststore.p12 (BOX_TRUSTSTORE_PATH): PKCS12, the JDK's
   * roots plus the CA, public material only, for Java (JAVA_TOOL_OPTIONS in `env` names it).
   * Absent when the server has no keytool.
   */
  javaTrustStore?: Uint8Array;
  /**
   * The box's own proxy on the host. The driver's relay makes it answer at 127.0.0.1:3128 inside the
   * box, and nothing else is reachable from inside (sandbox.md, property 1).
   */
  proxy: { host: string; port: number };
  /** A host directory only this box's driver state lives in (under the data directory; never inside the box). */
  stateDir: string;
}

export interface ExecOptions {
  /** A shell command line (run by /bin/sh -c inside the box) or an argv. */
  command: string | string[];
  /** Added to the box's environment for this execution only. */
  env?: Record<string, string>;
  /** Working directory inside the box; default /workspace. */
  cwd?: string;
  /** Kill the whole process tree after this long. */
  timeoutMs?: number;
  /** Give the process a stdin pipe (otherwise stdin is empty). */
  stdin?: boolean;
}

export interface ExecResult {
  /** null when killed by a signal. */
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
}

/** One running execution. Output streams are raw bytes; the caller caps and counts them. */
export interface ExecProcess {
  readonly stdout: Readable;
  readonly stderr: Readable;
  readonly stdin: Writable | null;
  /** Kills this execution's whole process tree inside the box. */
  kill(signal?: NodeJS.Signals): void;
  /** Settles once the process tree is gone and both output streams have ended. */
  readonly done: Promise<ExecResult>;
}

/** Why a file operation was refused. `path` errors are the caller's (422/404); never a host path in the message. */
export class BoxFileError extends Error {
  constructor(
    readonly kind: 'not_found' | 'not_a_file' | 'too_large' | 'bad_path' | 'not_running' | 'box_full',
    message: string,
  ) {
    super(message);
    this.name = 'BoxFileError';
  }
}

/** A running box. */
export interface Box {
  readonly id: string;
  exec(opts: ExecOptions): Promise<ExecProcess>;
  /**
   * Streams a file as the box sees it: a symlink or `..` inside the box never reaches a host path
   * (sandbox.md, property 4). Rejects with BoxFileError.
   */
  readFile(boxPath: string, maxBytes: number): Promise<{ size: number; stream: Readable }>;
  /** Writes a file as the box sees it, streaming; more than `maxBytes` rejects with `too_large` and keeps nothing. */
  writeFile(boxPath: string, body: Readable, maxBytes: number): Promise<{ size: number }>;
  /** Kills every process of the box; /workspace survives for a later start. */
  stop(): Promise<void>;
  /**
   * Settles once the box has stopped, by stop() or by itself (its init exited: the box's code can
   * end it; its container died), so that the service never reports a box gone as ready.
   */
  readonly ended: Promise<void>;
  /** Why the driver ended the box itself (a limit it enforces by stopping the box), once `ended`; else null. */
  readonly endReason?: string | null;
}

/**
 * Thrown by `exec` when the box is not running, or stopped while the execution was being started
 * (a stop, a DELETE, the idle TTL, the box ending by itself): the caller's 409, never a server error.
 */
export class BoxNotRunningError extends Error {
  constructor(message = 'the box is not running') {
    super(message);
    this.name = 'BoxNotRunningError';
  }
}

/** Whether a driver can isolate on this machine, and if not, what is missing and how to get it. */
export type DriverProbe = { ok: true; detail: string } | { ok: false; reason: string; hint: string };

/** Thrown by `start` when isolation or the relay cannot be set up: the box goes `failed` with this reason. */
export class BoxStartError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BoxStartError';
  }
}

export interface SandboxDriver {
  readonly name: DriverName;
  /** Checked at server start (and cached): an unusable driver never starts a box with open network. */
  probe(): Promise<DriverProbe>;
  /** Starts the box (again, after a stop: /workspace kept). Rejects with BoxStartError; never leaves a half-built box running. */
  start(spec: BoxSpec): Promise<Box>;
  /** Removes every trace of the box: processes, container, volume, state directory. Idempotent. */
  destroy(id: string, stateDir: string): Promise<void>;
  /**
   * Called once at server start with the ids the store knows: kills whatever a previous run of the
   * server left behind (after a SIGKILL) that is not among them, and stops the rest so the service
   * can start them again from their records.
   */
  reapOrphans(knownIds: ReadonlySet<string>): Promise<void>;
  /** Server shutdown: stops every box this driver started. */
  close(): Promise<void>;
}
