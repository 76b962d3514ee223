import { randomBytes } from 'node:crypto';
import { readlinkSync } from 'node:fs';
import { request } from 'undici';
import { DockerEngine, dockerSocketPath, type EngineMethod } from '../../docker/engine.js';
import { LineSplitter } from '../logs.js';
import { bootId, isSameProcess, readProcStat } from '../../proc.js';
import { BuildError, DeployError, replicaEnv, type BuildContext, type BuildOutput, type ExitInfo, type Replica, type RuntimeDriver, type StartSpec } from './types.js';

/** The port the image's `keygate app serve` listens on inside the container (`PORT` is set to it). */
export const CONTAINER_PORT = 8000;

/** `DOCKER_HOST=unix:///path` or the default socket; other schemes are not supported (local only). */
export { dockerSocketPath };

interface DockerReplica extends Replica {
  containerId: string;
}

/** Labels on every replica container: whose it is, so that a later server can tell orphans apart. */
export const LABELS = {
  deployment: 'keygate.deployment',
  revision: 'keygate.revision',
  /**
   * `<boot id>/<pid namespace>/<pid>/<start time>` of the `keygate serve` that started it (see
   * proc.ts). The namespace matters: a server in a container sees other pids than one on the host.
   */
  owner: 'keygate.owner',
} as const;

function pidNamespace(): string | null {
  try {
    return /\[(\d+)\]/.exec(readlinkSync('/proc/self/ns/pid'))?.[1] ?? null;
  } catch {
    return null;
  }
}

/** The identity of this process, as recorded in {@link LABELS.owner}; null where /proc cannot give one. */
export function ownerIdentity(): string | null {
  const me = readProcStat('self');
  const boot = bootId();
  const ns = pidNamespace();
  return me && boot && ns ? `${boot}/${ns}/${me.pid}/${me.startTime}` : null;
}

/**
 * Whether the container's server is provably gone: another boot, or no process with its pid and
 * start time in our pid namespace. A server in another namespace (or an unreadable label) cannot be
 * judged from here, so its containers are left alone: never stop what might be live.
 */
export function ownerGone(owner: string | undefined, here: { boot: string | null; ns: string | null } = { boot: bootId(), ns: pidNamespace() }): boolean {
  const m = /^([0-9a-f-]+)\/(\d+)\/(\d+)\/(\d+)$/.exec(owner ?? '');
  if (!m || !here.boot) return false;
  if (m[1] !== here.boot) return true; // a reboot ended its server
  if (m[2] !== here.ns) return false;
  return !isSameProcess(Number(m[3]), m[4]);
}

/**
 * Runs `external_docker` / `internal_docker` images through the Docker Engine API on a unix socket:
 * pull (build step), create + start with the secrets as environment and a loopback port binding,
 * logs followed into the deploy log, wait for exit, stop + remove.
 */
export class DockerDriver implements RuntimeDriver {
  readonly name = 'docker';
  /**
   * A pooled engine client, not a single connection: each replica holds two requests open for its
   * whole life (the wait and the followed logs), and on one connection every later call would
   * queue behind them. null when DOCKER_HOST is not a unix socket.
   */
  private readonly engine: DockerEngine | null;
  private readonly where: string;
  private readonly owner = ownerIdentity() ?? 'unknown';

  constructor(
    env: NodeJS.ProcessEnv,
    private readonly log: (level: 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void = () => undefined,
  ) {
    const socketPath = dockerSocketPath(env);
    this.where = socketPath ? `unix://${socketPath}` : String(env.DOCKER_HOST);
    this.engine = socketPath ? new DockerEngine(socketPath, { pool: true }) : null;
  }

  private requireEngine(): DockerEngine {
    if (!this.engine) throw new DeployError(`DOCKER_HOST ${this.where} is not a unix socket; only local engines are supported`);
    return this.engine;
  }

  private async call(method: EngineMethod, path: string, body?: unknown, timeoutMs = 30_000) {
    return this.requireEngine().request(method, path, { json: body, timeoutMs });
  }

  private async json<T>(method: EngineMethod, path: string, body?: unknown, timeoutMs?: number): Promise<{ status: number; body: T }> {
    return this.requireEngine().json<T>(method, path, body, timeoutMs);
  }

  async unavailableReason(): Promise<string | null> {
    if (!this.engine) return `DOCKER_HOST ${this.where} is not a unix socket; the Docker driver needs a local engine`;
    const p = await this.engine.ping();
    if ('error' in p) return `no container engine answers at ${this.where} (${p.error}); docker sources need one`;
    return p.status === 200 ? null : `the container engine at ${this.where} answered /_ping with ${p.status}`;
  }

  async build(ctx: BuildContext): Promise<BuildOutput> {
    const image = ctx.config.image_uri;
    if (!image) throw new BuildError('image_uri is required for docker sources');
    const why = await this.unavailableReason();
    if (why) throw new BuildError(why);
    const have = await this.json('GET', `/images/${encodeURIComponent(image)}/json`);
    if (have.status === 200) {
      ctx.log('info', `image ${image} is present`);
      return { artifact: image };
    }
    ctx.log('info', `pulling ${image}`);
    const res = await this.call('POST', `/images/create?fromImage=${encodeURIComponent(image)}`, undefined, 600_000);
    let error: string | null = null;
    const lines = new LineSplitter((l) => {
      try {
        const m = JSON.parse(l) as { status?: string; error?: string; progress?: string };
        if (m.error) error = m.error;
        else if (m.status && !m.progress) ctx.log('info', m.status);
      } catch {
        /* not JSON: ignore */
      }
    });
    for await (const c of res.body) lines.write(c as Buffer);
    lines.end();
    if (res.statusCode !== 200 || error) throw new BuildError(`cannot pull ${image}: ${error ?? `engine answered ${res.statusCode}`}`);
    return { artifact: image };
  }

  async start(spec: StartSpec): Promise<Replica> {
    const why = await this.unavailableReason();
    if (why) throw new DeployError(why);
    const name = `keygate-${spec.deploymentId.slice(0, 8)}-${spec.revisionId.slice(0, 8)}-${spec.replica}-${randomBytes(3).toString('hex')}`;
    const env = Object.entries({ ...replicaEnv(spec), PORT: String(CONTAINER_PORT) }).map(([k, v]) => `${k}=${v}`);
    const created = await this.json<{ Id?: string; message?: string }>('POST', `/containers/create?name=${name}`, {
      Image: spec.artifact,
      Env: env,
      ExposedPorts: { [`${CONTAINER_PORT}/tcp`]: {} },
      Labels: { [LABELS.deployment]: spec.deploymentId, [LABELS.revision]: spec.revisionId, [LABELS.owner]: this.owner },
      HostConfig: { PortBindings: { [`${CONTAINER_PORT}/tcp`]: [{ HostIp: '127.0.0.1', HostPort: '' }] }, RestartPolicy: { Name: 'no' } },
    });
    if (created.status !== 201 || !created.body.Id) throw new DeployError(`cannot create a container from ${spec.artifact}: ${created.body?.message ?? created.status}`);
    const id = created.body.Id;
    const started = await this.json<{ message?: string }>('POST', `/containers/${id}/start`);
    if (started.status !== 204 && started.status !== 304) {
      await this.json('DELETE', `/containers/${id}?force=1&v=1`).catch(() => undefined);
      throw new DeployError(`cannot start container: ${started.body?.message ?? started.status}`);
    }
    const info = await this.json<{ NetworkSettings?: { Ports?: Record<string, { HostPort: string }[] | null> } }>('GET', `/containers/${id}/json`);
    const port = Number(info.body.NetworkSettings?.Ports?.[`${CONTAINER_PORT}/tcp`]?.[0]?.HostPort);
    const exited: Promise<ExitInfo> = this.json<{ StatusCode?: number }>('POST', `/containers/${id}/wait`, undefined, 0)
      .then((r) => ({ code: r.body?.StatusCode ?? null, signal: null }))
      .catch(() => ({ code: null, signal: null }));
    void this.follow(id, spec);
    const replica: DockerReplica = { id: name, containerId: id, host: '127.0.0.1', port, exited };
    if (!port) {
      await this.stop(replica, 1000);
      throw new DeployError('the container has no published port');
    }
    const deadline = Date.now() + spec.startTimeoutMs;
    while (Date.now() < deadline) {
      try {
        const res = await request(`http://127.0.0.1:${port}/ok`, { headers: { 'x-api-key': spec.apiKey }, headersTimeout: 2000, bodyTimeout: 2000 });
        await res.body.dump();
        if (res.statusCode === 200) return replica;
      } catch {
        /* not yet */
      }
      await new Promise((r) => setTimeout(r, 300));
    }
    await this.stop(replica, 1000);
    throw new DeployError(`container did not pass its health check (GET /ok) within ${Math.round(spec.startTimeoutMs / 1000)} s`);
  }

  /** Follows the container's output; the stream is multiplexed (8-byte frame headers) without a TTY. */
  private async follow(id: string, spec: StartSpec): Promise<void> {
    try {
      const res = await this.call('GET', `/containers/${id}/logs?follow=1&stdout=1&stderr=1`, undefined, 0);
      const out = new LineSplitter((l) => spec.log('info', l), spec.redact);
      const err = new LineSplitter((l) => spec.log('warn', l), spec.redact);
      let buf = Buffer.alloc(0);
      for await (const c of res.body) {
        buf = Buffer.concat([buf, c as Buffer]);
        while (buf.length >= 8) {
          const len = buf.readUInt32BE(4);
          if (buf.length < 8 + len) break;
          (buf[0] === 2 ? err : out).write(buf.subarray(8, 8 + len));
          buf = buf.subarray(8 + len);
        }
      }
      out.end();
      err.end();
    } catch {
      /* the container is gone */
    }
  }

  async stop(replica: Replica, graceMs: number): Promise<void> {
    await this.remove((replica as DockerReplica).containerId, graceMs);
  }

  private async remove(id: string, graceMs: number): Promise<void> {
    await this.json('POST', `/containers/${id}/stop?t=${Math.ceil(graceMs / 1000)}`, undefined, graceMs + 10_000).catch(() => undefined);
    await this.json('DELETE', `/containers/${id}?force=1&v=1`).catch(() => undefined);
  }

  /**
   * Removes the replica containers of servers that no longer run (killed before they could stop
   * them: SIGKILL, the OOM killer, a crash), running or not. A container is ours when it carries the
   * deployment label; its server is gone when the owner label names no live process. Containers of
   * a live server (another `keygate serve` on this engine) are left alone. No engine: nothing to do.
   */
  async reapOrphans(graceMs: number): Promise<{ removed: string[] }> {
    const removed: string[] = [];
    if (!this.engine || (await this.unavailableReason())) return { removed };
    const filters = encodeURIComponent(JSON.stringify({ label: [LABELS.deployment] }));
    const list = await this.json<{ Id: string; Names?: string[]; Labels?: Record<string, string> }[]>('GET', `/containers/json?all=1&filters=${filters}`);
    if (list.status !== 200 || !Array.isArray(list.body)) throw new DeployError(`cannot list containers: engine answered ${list.status}`);
    const here = { boot: bootId(), ns: pidNamespace() };
    const orphans = list.body.filter((c) => ownerGone(c.Labels?.[LABELS.owner], here));
    if (orphans.length) this.log('warn', `removing ${orphans.length} replica container(s) left by a previous server`, { containers: orphans.map((c) => c.Id.slice(0, 12)) });
    await Promise.all(orphans.map((c) => this.remove(c.Id, graceMs)));
    for (const c of orphans) removed.push((c.Names?.[0] ?? c.Id).replace(/^\//, ''));
    return { removed };
  }
}
