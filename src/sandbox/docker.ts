import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { BOX_TRUSTSTORE_PATH } from '../certs/env.js';
import { demultiplex, dockerSocketPath, DockerEngine, engineMessage } from '../docker/engine.js';
import type { Logger } from '../log.js';
import { BoxFileError, BoxNotRunningError, BoxStartError, type Box, type BoxSpec, type DriverProbe, type ExecOptions, type ExecProcess, type SandboxDriver } from './driver.js';
import { startExec, type ExecContext } from './docker-exec.js';
import { readBoxFile, writeBoxFile } from './box-files.js';
import { readImageFile } from './docker-files.js';
import { defaultRelayLimits, RelayBudget, type RelayLimits } from './relay-budget.js';
import { DiskWatch, mountRunDir, mountWorkspace, unmountRunDir, unmountWorkspace, WORKSPACE_DIR, WORKSPACE_IMAGE, workspaceBoundUnavailable } from './disk.js';
import { BOX_RELAY_DIR, HostRelay, hostRuntime, RELAY_READY, relayCommand, type HostRuntime } from './docker-relay.js';
import { dockerSeccompOpt } from './docker-seccomp.js';

/**
 * The `docker` box driver (sandbox.md, "Drivers"): a container per box from the template's local
 * image, through the Docker Engine API on its unix socket. Every box is created with no network but
 * loopback, every capability dropped, no-new-privileges, a read-only root, a named volume at
 * /workspace (kept across stop/start, removed on destroy), tmpfs /tmp, memory/CPU/PID limits, and
 * labels by which a later run of the server finds what a killed one left behind.
 *
 * Users inside: the container's main process (the relay, see docker-relay.ts) runs as its own
 * uid; executions run as the image's user when it names a non-root one, else as root, which with
 * every capability dropped and no-new-privileges holds no privilege over anything it does not
 * own (it cannot signal or trace the relay, mount, chown, or gain capabilities through setuid
 * files). Root is kept in that case because a fresh /workspace volume belongs to root unless the
 * image ships /workspace owned by its user, and dropping CAP_CHOWN leaves no way to hand it over.
 */

export interface DockerBoxDriverOptions {
  /** Default: DOCKER_HOST (unix://) or /var/run/docker.sock. */
  socketPath?: string;
  logger?: Logger;
  /**
   * Names and labels this driver's containers and volumes; `reapOrphans` touches only its own
   * scope (tests and several servers can share one engine). Default `keygate-box`.
   */
  scope?: string;
  /**
   * `false`: never a sized /workspace file system, even where one can be mounted: an engine volume
   * and the disk watch instead (disk.ts), as on a server that is not root. For testing that fallback.
   */
  workspaceFs?: false;
  /** Bounds of the relays' connections (relay-budget.ts); default from this process's descriptor limit. */
  relayLimits?: RelayLimits;
}

const LABEL_ID = 'keygate.sandbox';
const LABEL_SCOPE = 'keygate.sandbox.scope';
const BOX_WORKSPACE = '/workspace';
const READY_TIMEOUT_MS = 20_000;
/** Headroom given for a moment to kill a tree in a box at its process limit (the killer is node: threads count). */
const SPARE_PIDS = 24;

/** Container and volume names allow [a-zA-Z0-9][a-zA-Z0-9_.-]. */
function nameFor(scope: string, id: string): string {
  const safe = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$/.test(id) ? id : createHash('sha256').update(id).digest('hex').slice(0, 32);
  return `${scope}-${safe}`;
}

interface ContainerSummary {
  Id: string;
  Labels?: Record<string, string>;
}

interface ImageInfo {
  Config?: { User?: string };
}

/** The image's USER, if it names someone other than root. */
function imageUser(info: ImageInfo): string | null {
  const u = (info.Config?.User ?? '').trim();
  if (!u) return null;
  const [user, group] = u.split(':');
  if (user === '0' || user === 'root') return null;
  return group ? `${user}:${group}` : user;
}

function parseIds(user: string, passwd: string): { uid: number; gid: number } | null {
  const [u, g] = user.split(':');
  let uid = /^\d+$/.test(u) ? Number(u) : NaN;
  let gid = g !== undefined && /^\d+$/.test(g) ? Number(g) : NaN;
  if (Number.isNaN(uid) || Number.isNaN(gid)) {
    for (const line of passwd.split('\n')) {
      const f = line.split(':');
      if (f.length < 4) continue;
      if (f[0] === u || f[2] === u) {
        if (Number.isNaN(uid)) uid = Number(f[2]);
        if (Number.isNaN(gid)) gid = Number(f[3]);
        break;
      }
    }
  }
  if (Number.isNaN(uid)) return null;
  return { uid, gid: Number.isNaN(gid) ? uid : gid };
}

/**
 * Removes a container (force, with its anonymous volumes). One already being removed (another
 * stop, the engine's own clean-up, anyone else's `docker rm`: the engine answers 409 "removal ...
 * already in progress") counts once it is gone: waited for, never a failed stop (it failed a
 * DELETE of the sandbox, a 500, when a stop raced it).
 */
async function removeContainer(engine: DockerEngine, containerId: string): Promise<void> {
  const res = await engine.json('DELETE', `/containers/${containerId}?force=1&v=1`);
  if (res.status === 204 || res.status === 404) return;
  if (res.status === 409 && /already in progress/i.test(engineMessage(res.body, res.status))) {
    const until = Date.now() + 20_000;
    while (Date.now() < until) {
      const info = await engine.json('GET', `/containers/${containerId}/json`);
      if (info.status === 404) return;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  throw new Error(`cannot remove a box container: ${engineMessage(res.body, res.status)}`);
}

export class DockerBoxDriver implements SandboxDriver {
  readonly name = 'docker' as const;
  private readonly engine: DockerEngine | null;
  private readonly where: string;
  private readonly logger: Logger | undefined;
  private readonly scope: string;
  private readonly boxes = new Map<string, DockerBox>();
  private readonly starting = new Map<string, Promise<Box>>();
  private readonly workspaceFs: boolean;
  /** Every box's relay draws on it. */
  private readonly relayBudget: RelayBudget;

  constructor(opts: DockerBoxDriverOptions = {}) {
    const socketPath = opts.socketPath ?? dockerSocketPath(process.env);
    this.where = socketPath ? `unix://${socketPath}` : `DOCKER_HOST=${process.env.DOCKER_HOST}`;
    // A connection per request in flight: a file transfer (the engine's archive stream) lasts as
    // long as its client takes to read it, and on one shared connection it held up every other
    // box's executions, timeouts, kills and stops behind it, across workspaces.
    this.engine = socketPath ? new DockerEngine(socketPath, { pool: true }) : null;
    this.logger = opts.logger;
    this.scope = opts.scope ?? 'keygate-box';
    this.workspaceFs = opts.workspaceFs !== false && workspaceBoundUnavailable() === null;
    this.relayBudget = new RelayBudget(opts.relayLimits ?? defaultRelayLimits());
  }

  async probe(): Promise<DriverProbe> {
    const hint = 'start one (dockerd) or choose --sandbox-driver local';
    if (!this.engine) return { ok: false, reason: `${this.where} is not a unix socket; the docker driver needs a local engine`, hint };
    const why = await this.engine.unavailableReason();
    if (why) return { ok: false, reason: why, hint };
    try {
      hostRuntime();
    } catch (err) {
      return { ok: false, reason: (err as Error).message, hint: 'install what is named, or choose --sandbox-driver local' };
    }
    const v = await this.engine.json<{ Version?: string }>('GET', '/version').catch(() => ({ status: 0, body: {} as { Version?: string } }));
    return { ok: true, detail: `Docker engine ${v.body?.Version ?? '(version unknown)'} at ${this.where}` };
  }

  private requireEngine(): DockerEngine {
    if (!this.engine) throw new BoxStartError(`${this.where} is not a unix socket; the docker driver needs a local engine`);
    return this.engine;
  }

  private labelFilter(id?: string): string {
    const labels = [`${LABEL_SCOPE}=${this.scope}`];
    if (id !== undefined) labels.push(`${LABEL_ID}=${id}`);
    return encodeURIComponent(JSON.stringify({ label: labels }));
  }

  private async containersOf(id?: string): Promise<ContainerSummary[]> {
    const res = await this.requireEngine().json<ContainerSummary[]>('GET', `/containers/json?all=1&filters=${this.labelFilter(id)}`);
    if (res.status !== 200 || !Array.isArray(res.body)) throw new Error(`cannot list containers: ${engineMessage(res.body, res.status)}`);
    return res.body;
  }

  private async removeContainer(containerId: string): Promise<void> {
    await removeContainer(this.requireEngine(), containerId);
  }

  private async removeVolume(name: string): Promise<void> {
    const res = await this.requireEngine().json('DELETE', `/volumes/${encodeURIComponent(name)}?force=1`);
    if (res.status !== 204 && res.status !== 404) throw new Error(`cannot remove a box volume: ${engineMessage(res.body, res.status)}`);
  }

  start(spec: BoxSpec): Promise<Box> {
    const pending = this.starting.get(spec.id);
    if (pending) return pending;
    const p = this.startOrReuse(spec).finally(() => this.starting.delete(spec.id));
    this.starting.set(spec.id, p);
    return p;
  }

  /** A box this driver runs is reused while its container still runs (its relay ends it otherwise). */
  private async startOrReuse(spec: BoxSpec): Promise<Box> {
    const running = this.boxes.get(spec.id);
    if (running) {
      if (await running.isRunning()) return running;
      await running.stop().catch(() => undefined);
    }
    return this.startBox(spec);
  }

  private async startBox(spec: BoxSpec): Promise<Box> {
    const engine = this.requireEngine();
    const why = await engine.unavailableReason();
    if (why) throw new BoxStartError(why);
    let runtime: HostRuntime;
    try {
      runtime = hostRuntime();
    } catch (err) {
      throw new BoxStartError((err as Error).message);
    }
    const image = spec.template.image;
    if (!image) throw new BoxStartError(`the template ${spec.template.name} names no image for the docker driver`);
    // Only local images: a container create never pulls, but say clearly what is missing.
    const img = await engine.json<ImageInfo>('GET', `/images/${encodeURIComponent(image)}/json`);
    if (img.status === 404) throw new BoxStartError(`the image ${image} is not on this Docker engine (images are never pulled): load or build it first`);
    if (img.status !== 200) throw new BoxStartError(`cannot inspect the image ${image}: ${engineMessage(img.body, img.status)}`);
    const execUser = imageUser(img.body) ?? '0:0';

    for (const c of await this.containersOf(spec.id)) await this.removeContainer(c.Id);
    const name = nameFor(this.scope, spec.id);
    const volume = `${name}-workspace`;
    const labels = { [LABEL_ID]: spec.id, [LABEL_SCOPE]: this.scope };
    const execIds = parseIds(execUser, '');
    mkdirSync(spec.stateDir, { recursive: true, mode: 0o700 });
    // /workspace: a file system of its own sized disk_mb (disk.ts), mounted on the host and given
    // to the engine as a volume bound to it (so that, like any empty volume, it first gets what the
    // image has at /workspace, owner included), where this server can mount one; otherwise a plain
    // engine volume, with the disk watch.
    let sized: { dir: string; volume: string } | null = null;
    let legacyVolume: string | null = null;
    let workspaceVolume = volume;
    if (this.workspaceFs) {
      // A box made by an earlier version has its files in a plain engine volume: copied in once.
      const old = await engine.json<{ Mountpoint?: string }>('GET', `/volumes/${encodeURIComponent(volume)}`);
      const from = old.status === 200 && old.body?.Mountpoint ? old.body.Mountpoint : undefined;
      let dir: string;
      try {
        dir = await mountWorkspace(spec.stateDir, spec.resources.disk_mb, null, from);
      } catch (e) {
        throw new BoxStartError(`could not make the box's /workspace (disk_mb ${spec.resources.disk_mb}): ${(e as Error).message}`);
      }
      workspaceVolume = `${name}-disk`;
      const vol = await engine.json('POST', '/volumes/create', { Name: workspaceVolume, Labels: labels, Driver: 'local', DriverOpts: { type: 'none', o: 'bind', device: dir } });
      if (vol.status !== 201) {
        await unmountWorkspace(spec.stateDir);
        throw new BoxStartError(`cannot create the /workspace volume: ${engineMessage(vol.body, vol.status)}`);
      }
      sized = { dir, volume: workspaceVolume };
      if (from) legacyVolume = volume;
    } else {
      const vol = await engine.json('POST', '/volumes/create', { Name: volume, Labels: labels });
      if (vol.status !== 201) throw new BoxStartError(`cannot create the /workspace volume: ${engineMessage(vol.body, vol.status)}`);
    }
    const workspace = { Type: 'volume', Source: workspaceVolume, Target: BOX_WORKSPACE };
    let runDir: string;
    try {
      runDir = await mountRunDir(spec.stateDir);
    } catch (e) {
      if (sized) await unmountWorkspace(spec.stateDir);
      throw new BoxStartError((e as Error).message);
    }
    const caDir = path.join(runDir, 'ca');
    mkdirSync(caDir, { recursive: true, mode: 0o755 });
    writeFileSync(path.join(caDir, 'ca.pem'), spec.caPem, { mode: 0o644 });
    writeFileSync(path.join(caDir, 'ca-bundle.pem'), spec.caBundlePem, { mode: 0o644 });
    if (spec.javaTrustStore) writeFileSync(path.join(caDir, path.posix.basename(BOX_TRUSTSTORE_PATH)), spec.javaTrustStore, { mode: 0o644 });
    // The engine would copy the host's resolv.conf in (naming the host's resolver); the box has no
    // DNS at all: the proxy resolves names.
    const resolvConf = path.join(runDir, 'resolv.conf');
    writeFileSync(resolvConf, '# no DNS in a keygate box: names are resolved by the proxy at 127.0.0.1:3128\n', { mode: 0o644 });

    let relay: HostRelay;
    try {
      relay = await HostRelay.listen(path.join(runDir, 'relay'), spec.proxy, this.relayBudget);
    } catch (err) {
      if (sized) await unmountWorkspace(spec.stateDir);
      await unmountRunDir(spec.stateDir);
      throw new BoxStartError(`cannot set up the relay to the proxy: ${(err as Error).message}`);
    }
    let containerId: string | null = null;
    try {
      const relayUid = execIds?.uid === 3128 ? 3129 : 3128;
      const memory = Math.round(spec.resources.memory_mb * 1024 * 1024);
      const created = await engine.json<{ Id?: string; message?: string }>('POST', `/containers/create?name=${encodeURIComponent(name)}`, {
        Image: image,
        User: `${relayUid}:${relayUid}`,
        Entrypoint: relayCommand(runtime),
        Cmd: [],
        // The box's environment goes to each execution, not to the relay (a request cannot reach it).
        Env: [],
        WorkingDir: '/',
        Hostname: 'sandbox',
        Labels: labels,
        NetworkDisabled: true,
        HostConfig: {
          NetworkMode: 'none',
          CapDrop: ['ALL'],
          // The syscall policy (syscall-policy.ts) as a profile of keygate's own, in place of the engine's default.
          SecurityOpt: ['no-new-privileges', dockerSeccompOpt()],
          ReadonlyRootfs: true,
          Init: true,
          IpcMode: 'private',
          Memory: memory,
          MemorySwap: memory,
          NanoCpus: Math.max(1e7, Math.round(spec.resources.cpus * 1e9)),
          PidsLimit: spec.resources.pids,
          RestartPolicy: { Name: 'no' },
          Tmpfs: { '/tmp': `rw,nosuid,nodev,size=${Math.max(16, Math.floor(spec.resources.memory_mb / 2))}m,mode=1777` },
          Mounts: [workspace],
          Binds: [...runtime.binds, `${relay.dir}:${BOX_RELAY_DIR}:ro`, `${caDir}:/etc/keygate:ro`, `${resolvConf}:/etc/resolv.conf:ro`],
        },
      });
      if (created.status !== 201 || !created.body?.Id) throw new BoxStartError(`cannot create the box container: ${engineMessage(created.body, created.status)}`);
      containerId = created.body.Id;
      await this.verifyIsolation(containerId);
      const started = await engine.json('POST', `/containers/${containerId}/start`);
      if (started.status !== 204) throw new BoxStartError(`cannot start the box container: ${engineMessage(started.body, started.status)}`);
      if (sized) await this.verifyWorkspace(containerId, sized.dir);
      await this.waitForRelay(containerId);

      if (!execIds) {
        const passwd = await readImageFile(engine, containerId, '/etc/passwd', 1 << 20).catch(() => null);
        if (!parseIds(execUser, passwd ?? '')) throw new BoxStartError(`the image's user ${execUser} is not in its /etc/passwd`);
      }
      if (legacyVolume) await this.removeVolume(legacyVolume).catch(() => undefined);
      const execs: ExecContext = {
        engine,
        containerId,
        user: execUser,
        env: spec.env,
        runtime,
        withSpareProcesses: async <T>(fn: () => Promise<T>): Promise<T> => {
          const update = (limit: number) => engine.json('POST', `/containers/${containerId}/update`, { PidsLimit: limit });
          const raised = await update(spec.resources.pids + SPARE_PIDS);
          if (raised.status !== 200) throw new Error(`cannot raise the process limit: ${engineMessage(raised.body, raised.status)}`);
          try {
            return await fn();
          } finally {
            await update(spec.resources.pids).catch(() => undefined);
          }
        },
        killBox: async () => {
          await box.stop();
        },
        log: (msg, err) => this.logger?.warn({ sandbox: spec.id, err: err instanceof Error ? err.message : undefined }, msg),
      };
      const box = new DockerBox(spec.id, containerId, relay, engine, spec.stateDir, execs, () => {
        if (this.boxes.get(spec.id) === box) this.boxes.delete(spec.id);
      });
      // An engine volume has no size: its use is measured and the box stopped past disk_mb.
      if (!sized) box.watchDisk(new DiskWatch(() => this.volumeUse(volume), spec.resources.disk_mb, (why) => box.endBecause(`Stopped: ${why}.`)));
      this.boxes.set(spec.id, box);
      this.logger?.info({ sandbox: spec.id, container: containerId.slice(0, 12) }, 'docker box ready');
      return box;
    } catch (err) {
      if (containerId) await this.removeContainer(containerId).catch(() => undefined);
      await relay.close().catch(() => undefined);
      if (sized) await unmountWorkspace(spec.stateDir);
      await unmountRunDir(spec.stateDir);
      if (err instanceof BoxStartError) throw err;
      throw new BoxStartError(`the box could not start: ${(err as Error).message}`);
    }
  }

  /** Fails closed if the engine did not apply what isolates the box (e.g. an engine that ignores a field). */
  private async verifyIsolation(containerId: string): Promise<void> {
    const info = await this.requireEngine().json<{ HostConfig?: { NetworkMode?: string; ReadonlyRootfs?: boolean; CapDrop?: string[]; SecurityOpt?: string[]; Privileged?: boolean } }>(
      'GET',
      `/containers/${containerId}/json`,
    );
    const h = info.body?.HostConfig;
    const ok =
      info.status === 200 &&
      h?.NetworkMode === 'none' &&
      h.ReadonlyRootfs === true &&
      h.Privileged !== true &&
      (h.CapDrop ?? []).some((c) => c.toUpperCase() === 'ALL' || c.toUpperCase() === 'CAP_ALL') &&
      (h.SecurityOpt ?? []).some((o) => o.startsWith('no-new-privileges')) &&
      (h.SecurityOpt ?? []).includes(dockerSeccompOpt());
    if (!ok) throw new BoxStartError("the engine did not apply the box isolation (network none, read-only root, no capabilities, no-new-privileges, keygate's seccomp profile)");
  }

  /**
   * Fails closed unless the container's /workspace is the sized file system mounted at `dir`: an
   * engine in another mount namespace than this server's would bind the empty directory under it,
   * on the data directory's own disk, unbounded. Compared by device number, from the host's view of
   * the container's main process.
   */
  private async verifyWorkspace(containerId: string, dir: string): Promise<void> {
    const info = await this.requireEngine().json<{ State?: { Pid?: number } }>('GET', `/containers/${containerId}/json`);
    const pid = info.body?.State?.Pid;
    let mountinfo = '';
    try {
      if (pid) mountinfo = readFileSync(`/proc/${pid}/mountinfo`, 'utf8');
    } catch {
      /* not in this server's PID namespace */
    }
    const line = mountinfo.split('\n').find((l) => l.split(' ')[4] === BOX_WORKSPACE);
    const dev = statSync(dir, { bigint: true }).dev;
    const major = ((dev >> 8n) & 0xfffn) | ((dev >> 32n) & ~0xfffn);
    const minor = (dev & 0xffn) | ((dev >> 12n) & ~0xffn);
    if (!line || line.split(' ')[2] !== `${major}:${minor}`) {
      throw new BoxStartError("the engine did not mount the box's sized /workspace (it runs in another mount namespace than keygate serve?); the box would write to the host's disk unbounded");
    }
  }

  private volumeSizes: { at: number; settled: boolean; sizes: Promise<Map<string, number>> } | null = null;

  /**
   * Bytes in a box's /workspace volume, as the engine counts them (`/system/df`, walked by the
   * engine as root on the host: nothing the box does can hide a file from it or make it lie). One
   * answer serves every box's watch for a moment: the engine walks every volume each time.
   */
  private async volumeUse(volume: string): Promise<number | null> {
    if (!this.volumeSizes || (this.volumeSizes.settled && Date.now() - this.volumeSizes.at > 1000)) {
      const sizes = this.requireEngine()
        .json<{ Volumes?: { Name: string; UsageData?: { Size?: number } }[] }>('GET', '/system/df')
        .then((r) => new Map((r.body?.Volumes ?? []).map((v) => [v.Name, v.UsageData?.Size ?? -1] as [string, number])));
      const entry = { at: Date.now(), settled: false, sizes };
      this.volumeSizes = entry;
      sizes.then(
        () => Object.assign(entry, { settled: true, at: Date.now() }),
        () => (this.volumeSizes = null),
      );
    }
    const size = (await this.volumeSizes.sizes).get(volume);
    return size === undefined || size < 0 ? null : size;
  }

  /** The relay prints one line once it listens; a relay that cannot start ends the container. */
  private async waitForRelay(containerId: string): Promise<void> {
    const res = await this.requireEngine().request('GET', `/containers/${containerId}/logs?follow=1&stdout=1&stderr=1`, { timeoutMs: READY_TIMEOUT_MS });
    if (res.statusCode !== 200) {
      await res.body.dump();
      throw new BoxStartError(`cannot follow the box's start (${res.statusCode})`);
    }
    const { stdout, stderr, ended } = demultiplex(res.body);
    let out = '';
    let err = '';
    stderr.on('data', (c: Buffer) => (err = (err + c.toString('utf8')).slice(-500)));
    const ready = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), READY_TIMEOUT_MS);
      stdout.on('data', (c: Buffer) => {
        out = (out + c.toString('utf8')).slice(-500);
        if (out.includes(RELAY_READY)) {
          clearTimeout(timer);
          resolve(true);
        }
      });
      void ended.then(() => {
        clearTimeout(timer);
        resolve(out.includes(RELAY_READY));
      });
    });
    res.body.destroy();
    if (!ready) throw new BoxStartError(`the relay to the proxy did not start in the box${err ? `: ${err.trim().slice(0, 200)}` : ''}`);
  }

  async destroy(id: string, stateDir: string): Promise<void> {
    const box = this.boxes.get(id);
    if (box) await box.stop();
    for (const c of await this.containersOf(id)) await this.removeContainer(c.Id);
    await this.removeVolume(`${nameFor(this.scope, id)}-workspace`);
    await this.removeVolume(`${nameFor(this.scope, id)}-disk`);
    await unmountWorkspace(stateDir);
    await unmountRunDir(stateDir);
    rmSync(stateDir, { recursive: true, force: true });
  }

  async reapOrphans(knownIds: ReadonlySet<string>): Promise<void> {
    const engine = this.requireEngine();
    for (const c of await this.containersOf()) {
      const id = c.Labels?.[LABEL_ID];
      if (id !== undefined && this.boxes.has(id)) continue;
      // Known boxes are stopped (their volume kept) so the service starts them again from their records.
      await this.removeContainer(c.Id);
      this.logger?.info({ sandbox: id, known: id !== undefined && knownIds.has(id) }, 'removed a box container left by a previous run');
    }
    const vols = await engine.json<{ Volumes?: { Name: string; Labels?: Record<string, string>; Options?: Record<string, string> | null }[] }>('GET', `/volumes?filters=${this.labelFilter()}`);
    for (const v of vols.body?.Volumes ?? []) {
      const id = v.Labels?.[LABEL_ID];
      if (id === undefined || this.boxes.has(id)) continue;
      // A sized /workspace a killed server left mounted (its volume names the mount point): unmounted,
      // known or not (a start mounts it again). Only a mount point next to its own image is touched.
      const device = v.Options?.device;
      if (device && path.isAbsolute(device) && path.basename(device) === WORKSPACE_DIR && existsSync(path.join(path.dirname(device), WORKSPACE_IMAGE))) {
        await unmountWorkspace(path.dirname(device));
        await unmountRunDir(path.dirname(device));
      }
      if (knownIds.has(id)) continue;
      await this.removeVolume(v.Name);
    }
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.boxes.values()].map((b) => b.stop()));
    await this.engine?.close();
  }
}

class DockerBox implements Box {
  private stopped = false;
  endReason: string | null = null;
  private diskWatch: DiskWatch | null = null;
  private stopping: Promise<void> | null = null;
  private markEnded!: () => void;
  readonly ended = new Promise<void>((resolve) => (this.markEnded = resolve));

  constructor(
    readonly id: string,
    private readonly containerId: string,
    private readonly relay: HostRelay,
    private readonly engine: DockerEngine,
    /** The box's state directory on the host (its sized /workspace and run directory are mounted under it). */
    private readonly stateDir: string,
    private readonly execs: ExecContext,
    private readonly forget: () => void,
  ) {
    // The engine answers this once the container is not running any more (it died: the relay,
    // its main process, was killed, e.g. by the OOM killer): the box is over, stopped here too.
    void engine
      .request('POST', `/containers/${containerId}/wait?condition=not-running`, { timeoutMs: 0 })
      .then((res) => res.body.dump())
      .catch(() => undefined)
      .then(() => (this.stopped ? undefined : this.stop().catch(() => undefined)));
  }

  private running(): void {
    if (this.stopped) throw new BoxFileError('not_running', 'the box is not running');
  }

  watchDisk(watch: DiskWatch): void {
    this.diskWatch = watch;
  }

  /** Stops the box for a limit it broke; the service records `reason`. */
  endBecause(reason: string): void {
    this.endReason ??= reason;
    void this.stop().catch(() => undefined);
  }

  async isRunning(): Promise<boolean> {
    if (this.stopped) return false;
    const info = await this.engine.json<{ State?: { Running?: boolean } }>('GET', `/containers/${this.containerId}/json`).catch(() => null);
    return info?.status === 200 && info.body?.State?.Running === true;
  }

  async exec(opts: ExecOptions): Promise<ExecProcess> {
    if (this.stopped) throw new BoxNotRunningError();
    try {
      return await startExec(this.execs, opts);
    } catch (e) {
      // The engine refusing an execution in a container being removed (a stop racing it) is the box not running.
      if (this.stopped || !(await this.isRunning())) throw new BoxNotRunningError('the box was stopped while the execution was starting');
      throw e;
    }
  }

  /**
   * The files API runs in the box, as on the local driver (box-files.ts): the engine's archive API
   * would read the container's root file system, not the tmpfs /tmp, /proc or /dev the box sees,
   * and would strike `link/..` out by name.
   */
  async readFile(boxPath: string, maxBytes: number): Promise<{ size: number; stream: Readable }> {
    this.running();
    return readBoxFile((o) => this.exec(o), boxPath, maxBytes);
  }

  async writeFile(boxPath: string, body: Readable, maxBytes: number): Promise<{ size: number }> {
    this.running();
    return writeBoxFile((o) => this.exec(o), boxPath, body, maxBytes);
  }

  /** Removing the container kills every process in it; the named /workspace volume stays. */
  /**
   * One stop, however many ask (the service, the container dying, a start of the same box): each
   * waits for it, so a start that follows never races the removal of the old container. The
   * driver forgets the box only once it is removed.
   */
  stop(): Promise<void> {
    this.stopping ??= this.doStop();
    return this.stopping;
  }

  private async doStop(): Promise<void> {
    this.stopped = true;
    this.diskWatch?.stop();
    try {
      const err = await removeContainer(this.engine, this.containerId).then(
        () => null,
        (e: Error) => e,
      );
      await this.relay.close().catch(() => undefined);
      // Its sized /workspace is mounted while it runs only (a start mounts it again).
      await unmountWorkspace(this.stateDir);
      await unmountRunDir(this.stateDir);
      if (err) throw err;
    } finally {
      this.forget();
      this.markEnded();
    }
  }
}
