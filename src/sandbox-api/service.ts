import { createHash, randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { compileCandidate, validateCandidate } from '../config/prepare.js';
import { referencedSecretKeys, templateValueProblem } from '../config/resolve.js';
import { TEMPLATE_REF_RE } from '../secrets/keys.js';
import type { ProxyConfig } from '../config/schema.js';
import { BOX_BUNDLE_PATH, BOX_CA_PATH, BOX_PROXY_URL, BOX_TRUSTSTORE_PATH, caBundle, findKeytool, sandboxEnv, writeCaBundle, writeJavaTrustStore } from '../certs/env.js';
import { makeParents } from '../sandbox/box-files.js';
import { BoxNotRunningError, type Box, type BoxResources, type DriverName, type ExecProcess, type ExecResult, type SandboxDriver } from '../sandbox/driver.js';
import type { Logger } from '../log.js';
import { emptyConfig, type CompiledConfig } from '../rules/compile.js';
import { Envelope } from '../secrets/envelope.js';
import { opaqueOpener, redactProxyConfig, sealOpaqueValues } from '../secrets/opaque.js';
import type { SecretStore } from '../secrets/types.js';
import { conflict, forbidden, HttpValidationError, loggableMessage, notFound } from '../server/errors.js';
import { nowIso } from '../store/db.js';
import { ValidationFailure, type ValidationIssue } from '../validation/errors.js';
import { freePort, PortInUseError, type ProxyInstance, type ProxyRunner } from './runner.js';
import { DuplicateNameError, type SandboxRecord, type SandboxStatus, type SandboxStore } from './storage.js';
import { applyResources, driversFor, resourceCapIssues, type Template } from './templates.js';

export const SANDBOX_NAME_PATTERN = '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$';
export const CA_FILE = 'ca.pem';
export const BUNDLE_FILE = 'ca-bundle.pem';

export interface SandboxServiceDeps {
  store: SandboxStore;
  runner: ProxyRunner;
  templates: Map<string, Template>;
  /** Opens the secret store of one workspace (see secrets.ts). */
  openSecrets(workspaceId: string): Promise<SecretStore>;
  /** The current envelope (re-read so key rotation applies at once). */
  envelope(): Envelope;
  dataDir: string;
  /** The shared proxy CA certificate (PEM); its key never leaves the server. */
  caCertPem: string;
  /** Host the proxies listen on and that sandboxes dial. */
  proxyHost: string;
  /** Runs the boxes of this server (`none`: records and proxies only, boxes run elsewhere). */
  driver: SandboxDriver;
  logger: Logger;
  /** Most sandboxes a workspace may hold (KEYGATE_SANDBOX_MAX_PER_WORKSPACE); default DEFAULT_MAX_PER_WORKSPACE. */
  maxPerWorkspace?: number;
}

/**
 * Sandboxes one workspace may hold at once. Each is a proxy (a listening port, its connections), a
 * box (processes, a relay, a /workspace of disk_mb on the host's disk): without a bound one API key
 * could create boxes until the server runs out of descriptors or disk, for every workspace.
 */
export const DEFAULT_MAX_PER_WORKSPACE = 50;

export interface CreateInput {
  template_name: string;
  name: string;
  wait_for_ready?: boolean;
  proxy_config?: ProxyConfig;
  idle_ttl_seconds?: number;
  resources?: Partial<BoxResources>;
}

export interface PatchInput {
  proxy_config?: ProxyConfig;
  idle_ttl_seconds?: number;
}

export const DEFAULT_IDLE_TTL_SECONDS = 600;
/** Boxes brought back at once after a server start. */
const RESTORE_CONCURRENCY = 8;
/** How often idle boxes are looked for. */
export const IDLE_SWEEP_MS = 1000;

const NUL_MSG = 'must not contain a NUL character (no process argument, environment value or path can carry one)';

/**
 * What no process can be started with: a NUL in the command, an argument, an environment name or
 * value, or the working directory. Refused as the caller's mistake (422 at the field) before the
 * driver sees it: spawn would refuse it as an internal error whose message quotes the whole
 * argument, and a command line or an environment value often holds a credential.
 */
export function execInputIssues(opts: { command: string | string[]; env?: Record<string, string>; cwd?: string }): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  const bad = (v: unknown) => typeof v === 'string' && v.includes('\u0000');
  if (typeof opts.command === 'string') {
    if (bad(opts.command)) issues.push({ loc: ['body', 'command'], msg: `The command ${NUL_MSG}`, type: 'value_error' });
  } else {
    opts.command.forEach((a, i) => {
      if (bad(a)) issues.push({ loc: ['body', 'command', i], msg: `An argument ${NUL_MSG}`, type: 'value_error' });
    });
  }
  for (const [k, v] of Object.entries(opts.env ?? {})) {
    if (bad(v)) issues.push({ loc: ['body', 'env', k], msg: `The value of ${k} ${NUL_MSG}`, type: 'value_error' });
  }
  if (bad(opts.cwd)) issues.push({ loc: ['body', 'cwd'], msg: `The working directory ${NUL_MSG}`, type: 'value_error' });
  return issues;
}

/** The sandbox as the API returns it. Built from the stored form only: nothing resolved, nothing opaque. */
export interface SandboxView {
  id: string;
  name: string;
  template_name: string;
  driver: DriverName;
  status: SandboxStatus;
  status_reason: string | null;
  idle_ttl_seconds: number;
  resources: BoxResources;
  last_active_at: string | null;
  created_at: string;
  updated_at: string;
  proxy_config: ProxyConfig | null;
  proxy: { url: string | null; ca_cert_pem: string; env: Record<string, string> | null };
}

const PROXY_CONFIG_LOC = ['body', 'proxy_config'];

/** A running box and what its idle TTL counts. */
interface LiveBox {
  box: Box;
  /** Executions in flight. */
  active: number;
  lastActive: number;
  idleTtlMs: number;
}

/** Serialises async work per key (a sandbox id, a workspace id). */
class KeyedQueue {
  private readonly tails = new Map<string, Promise<unknown>>();
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.then(
      () => undefined,
      () => undefined,
    );
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }
  async drain(): Promise<void> {
    while (this.tails.size) await Promise.all([...this.tails.values()]);
  }
}

/**
 * Sandboxes and the proxies that serve them. Every operation is scoped to a workspace id from the
 * authenticated caller. Work on one sandbox's proxy (start, push, stop) is serialised per sandbox;
 * checks of a configuration against the workspace's secrets are serialised per workspace against
 * secret deletions, so a sandbox can never be created referencing a secret being deleted.
 */
export class SandboxService {
  private readonly proxies = new Map<string, ProxyInstance>();
  private readonly perSandbox = new KeyedQueue();
  private readonly perWorkspace = new KeyedQueue();
  /** Proxy starts, one at a time (see startProxy). */
  private readonly proxyStarts = new KeyedQueue();
  private readonly secretStores = new Map<string, Promise<SecretStore>>();
  /** Destinations no sandbox's proxy may reach (the API server itself), see denyToAll. */
  private readonly deniedToAll = new Set<string>();
  /** Running boxes (not for `none`). */
  private readonly live = new Map<string, LiveBox>();
  private readonly sweeper: NodeJS.Timeout;
  private restoring: Promise<void> | undefined;
  private closing = false;

  /** System roots plus the CA, built once (every box gets it at /etc/keygate/ca-bundle.pem). */
  private readonly bundlePem: string;
  /** keytool of this machine's JDK: without one, boxes get no Java truststore (and no JAVA_TOOL_OPTIONS). */
  private readonly keytool = findKeytool();
  /** The Java truststore of every box (see javaTrustStore); a failure to build it is remembered here. */
  private trustStore: Promise<Uint8Array | undefined> | undefined;
  private trustStoreFailed = false;

  constructor(private readonly deps: SandboxServiceDeps) {
    this.bundlePem = caBundle(deps.caCertPem);
    this.sweeper = setInterval(() => {
      this.sweepIdle().catch((err: Error) => deps.logger.error({ err: { message: loggableMessage(err) } }, 'idle sweep failed'));
    }, IDLE_SWEEP_MS);
    this.sweeper.unref();
  }

  get driverName(): DriverName {
    return this.deps.driver.name;
  }

  get templates(): Template[] {
    return [...this.deps.templates.values()];
  }

  /** The templates as the API lists them: with the drivers that can build each. */
  templateViews(): (Template & { drivers: DriverName[] })[] {
    return this.templates.map((t) => ({ ...t, drivers: driversFor(t) }));
  }

  secrets(workspaceId: string): Promise<SecretStore> {
    let p = this.secretStores.get(workspaceId);
    if (!p) {
      p = this.deps.openSecrets(workspaceId);
      p.catch(() => this.secretStores.delete(workspaceId));
      this.secretStores.set(workspaceId, p);
    }
    return p;
  }

  /** Runs `fn` while no other secret-dependent change of the workspace is under way. */
  withWorkspace<T>(workspaceId: string, fn: () => Promise<T>): Promise<T> {
    return this.perWorkspace.run(workspaceId, fn);
  }

  // ---------------------------------------------------------------------------------------------
  // Validation

  /**
   * Checks a proxy_config from a request and returns its stored form (opaque values sealed) and
   * what its proxy runs, through the one validate-resolve-compile path of every configuration
   * (config/prepare.ts). Every problem is reported with a loc under `body.proxy_config`.
   */
  private async prepareConfig(workspaceId: string, config: ProxyConfig, issues: ValidationIssue[]): Promise<{ stored: ProxyConfig; compiled: CompiledConfig } | undefined> {
    const own: ValidationIssue[] = [];
    try {
      validateCandidate(config, PROXY_CONFIG_LOC);
    } catch (err) {
      if (!(err instanceof ValidationFailure)) throw err;
      own.push(...err.issues);
    }
    // A sealed-looking opaque value from a client would be decrypted by us and sent upstream:
    // whoever holds any sealed blob could have keygate reveal it to a host they control.
    (config.rules ?? []).forEach((rule, i) =>
      (rule.headers ?? []).forEach((h, j) => {
        if (h.type === 'opaque' && Envelope.isSealed(h.value)) {
          own.push({ loc: [...PROXY_CONFIG_LOC, 'rules', i, 'headers', j, 'value'], msg: 'An opaque value must be the plain value to inject, not an encrypted one', type: 'value_error' });
        }
      }),
    );
    if (own.length) {
      issues.push(...own);
      return undefined;
    }
    const stored = sealOpaqueValues(config, this.deps.envelope());
    try {
      return { stored, compiled: await this.compile(workspaceId, stored, PROXY_CONFIG_LOC) };
    } catch (err) {
      if (!(err instanceof ValidationFailure)) throw err;
      issues.push(...err.issues);
      return undefined;
    }
  }

  /**
   * The stored form resolved against the workspace's secrets right now and compiled (issues
   * located under `locPrefix`). Throws ValidationFailure.
   */
  private async compile(workspaceId: string, stored: ProxyConfig | null, locPrefix: (string | number)[] = []): Promise<CompiledConfig> {
    if (!stored) return emptyConfig();
    const needsSecrets = referencedSecretKeys(stored).length > 0;
    const snapshot = needsSecrets ? await (await this.secrets(workspaceId)).snapshot() : new Map<string, string>();
    return compileCandidate(stored, (k) => snapshot.get(k), { openOpaque: opaqueOpener(this.deps.envelope()) }, locPrefix);
  }

  // ---------------------------------------------------------------------------------------------
  // API operations

  async create(workspaceId: string, input: CreateInput): Promise<SandboxView> {
    const driver = this.deps.driver.name;
    const rec = await this.withWorkspace(workspaceId, async () => {
      const issues: ValidationIssue[] = [];
      const template = this.deps.templates.get(input.template_name);
      if (!template) {
        const known = [...this.deps.templates.keys()];
        issues.push({
          loc: ['body', 'template_name'],
          msg: `Unknown template '${input.template_name}'${known.length ? `; available: ${known.join(', ')}` : '; no templates are configured'}`,
          type: 'value_error',
        });
      } else if (!driversFor(template).includes(driver)) {
        const usable = this.templates.filter((t) => driversFor(t).includes(driver)).map((t) => t.name);
        issues.push({
          loc: ['body', 'template_name'],
          msg: `Template '${template.name}' cannot be built by the '${driver}' driver this server runs (it names no ${driver === 'local' ? 'rootfs' : 'image'})${usable.length ? `; usable: ${usable.join(', ')}` : ''}`,
          type: 'value_error',
        });
      }
      if (template) issues.push(...resourceCapIssues(template, input.resources));
      const prepared = input.proxy_config ? await this.prepareConfig(workspaceId, input.proxy_config, issues) : undefined;
      if (issues.length || !template) throw new HttpValidationError(issues);
      const existing = await this.deps.store.getByName(workspaceId, input.name);
      if (existing) throw conflict(`A sandbox named '${input.name}' already exists in this workspace.`);
      // Counted under the workspace's queue: concurrent creates cannot both take the last place.
      const max = this.deps.maxPerWorkspace ?? DEFAULT_MAX_PER_WORKSPACE;
      if ((await this.deps.store.list(workspaceId)).length >= max) {
        throw forbidden(`This workspace has reached its limit of ${max} sandboxes (KEYGATE_SANDBOX_MAX_PER_WORKSPACE); delete one first.`);
      }
      const id = randomUUID();
      this.writeCaFiles(id);
      try {
        const created = await this.deps.store.insert({
          id,
          workspaceId,
          name: input.name,
          templateName: input.template_name,
          status: 'provisioning',
          statusReason: null,
          proxyConfig: prepared?.stored ?? null,
          // Chosen now so the 201 already tells the box where its proxy will be.
          proxyPort: await this.reservePort(),
          driver,
          idleTtlSeconds: input.idle_ttl_seconds ?? DEFAULT_IDLE_TTL_SECONDS,
          resources: applyResources(template, input.resources),
        });
        return { created, compiled: prepared?.compiled ?? emptyConfig() };
      } catch (err) {
        this.removeFiles(id);
        if (err instanceof DuplicateNameError) throw conflict(err.message);
        throw err;
      }
    });
    const started = this.perSandbox.run(rec.created.id, () => this.bringUp(rec.created, rec.compiled));
    if (input.wait_for_ready) {
      await started;
      return this.view((await this.deps.store.getById(rec.created.id)) ?? rec.created);
    }
    started.catch(() => undefined); // the outcome lands in the record's status
    return this.view(rec.created);
  }

  /**
   * A free port that no other sandbox has on record: a sandbox whose proxy is stopped (failed, or
   * the server down) keeps its port for when it comes back.
   */
  private async reservePort(): Promise<number> {
    const taken = new Set((await this.deps.store.listAll()).map((r) => r.proxyPort));
    let port = await freePort(this.deps.proxyHost);
    for (let i = 0; i < 20 && taken.has(port); i++) port = await freePort(this.deps.proxyHost);
    return port;
  }

  async get(workspaceId: string, name: string): Promise<SandboxView> {
    return this.view(await this.mustGet(workspaceId, name));
  }

  async list(workspaceId: string, page: { limit: number; offset: number }): Promise<SandboxView[]> {
    return (await this.deps.store.list(workspaceId, page)).map((r) => this.view(r));
  }

  /** Replaces the proxy_config (pushed to the running proxy before answering) and/or the idle TTL. */
  async patch(workspaceId: string, name: string, input: PatchInput): Promise<SandboxView> {
    const rec = await this.withWorkspace(workspaceId, async () => {
      const current = await this.mustGet(workspaceId, name);
      const issues: ValidationIssue[] = [];
      const prepared = input.proxy_config ? await this.prepareConfig(workspaceId, input.proxy_config, issues) : undefined;
      if (issues.length) throw new HttpValidationError(issues);
      await this.perSandbox.run(current.id, async () => {
        // As it is now, not as it was before the queue: a stop or the idle TTL may have gone first.
        const cur = await this.deps.store.getById(current.id);
        if (!cur) return;
        if (input.idle_ttl_seconds !== undefined) {
          await this.deps.store.setIdleTtl(cur.id, input.idle_ttl_seconds);
          const live = this.live.get(cur.id);
          if (live) live.idleTtlMs = input.idle_ttl_seconds * 1000;
        }
        if (prepared) {
          await this.deps.store.setConfig(cur.id, prepared.stored);
          // A stopped box stays stopped (only start brings it back, and applies the new
          // configuration then): pushing it would start its proxy and box again.
          if (cur.status !== 'stopped') await this.apply({ ...cur, proxyConfig: prepared.stored }, prepared.compiled);
        }
      });
      return current;
    });
    return this.viewById(rec.id, name);
  }

  async delete(workspaceId: string, name: string): Promise<void> {
    const rec = await this.mustGet(workspaceId, name);
    await this.perSandbox.run(rec.id, async () => {
      // A DELETE queued behind another one finds the box gone: 404, as for any unknown box.
      if (!(await this.deps.store.getById(rec.id))) throw notFound(`Sandbox '${name}' not found.`);
      await this.stopBox(rec.id);
      if (rec.driver !== 'none') await this.deps.driver.destroy(rec.id, this.boxStateDir(rec.id));
      await this.stopProxy(rec.id);
      await this.deps.store.delete(rec.id);
      this.removeFiles(rec.id);
    });
    this.deps.logger.info({ sandbox: rec.name, sandbox_id: rec.id, workspace_id: workspaceId }, 'sandbox deleted');
  }

  /** Kills every process of the box and stops its proxy; /workspace is kept for a later start. */
  async stop(workspaceId: string, name: string): Promise<SandboxView> {
    const rec = await this.mustGet(workspaceId, name);
    await this.perSandbox.run(rec.id, async () => {
      // A box already stopped stays as it is: its status_reason (the idle TTL, its disk, its own
      // end) still says why it stopped, and a second stop must not erase it.
      const cur = await this.deps.store.getById(rec.id);
      if (!cur || (cur.status === 'stopped' && !this.isUp(cur))) return;
      await this.stopNow(rec.id, null);
    });
    return this.viewById(rec.id, name);
  }

  /** Starts a stopped (or failed) box again; answers once it is ready or failed. */
  async start(workspaceId: string, name: string): Promise<SandboxView> {
    const rec = await this.mustGet(workspaceId, name);
    await this.perSandbox.run(rec.id, async () => {
      const cur = await this.deps.store.getById(rec.id);
      if (!cur || (cur.status === 'ready' && this.isUp(cur))) return;
      await this.deps.store.setStatus(cur.id, 'provisioning', null);
      await this.reapply(cur.id, true);
    });
    return this.viewById(rec.id, name);
  }

  // ---------------------------------------------------------------------------------------------
  // Executions and files

  /**
   * Starts one execution in a ready box. The box counts as active until it ends (the idle TTL never
   * stops a box in the middle of a command).
   */
  async exec(workspaceId: string, name: string, opts: { command: string | string[]; timeoutMs: number; env?: Record<string, string>; cwd?: string; stdin?: boolean }): Promise<ExecProcess> {
    const issues = execInputIssues(opts);
    if (issues.length) throw new HttpValidationError(issues);
    // A program named NAME=VALUE would be one more variable to the `env` that starts a command in
    // a local box: refused for every driver alike, before anything is started.
    if (Array.isArray(opts.command) && opts.command[0].includes('=')) {
      throw new HttpValidationError([{ loc: ['body', 'command', 0], msg: 'The program name must not contain "="', type: 'value_error' }]);
    }
    const rec = await this.mustGet(workspaceId, name);
    const live = this.runningBox(rec);
    live.active++;
    live.lastActive = Date.now();
    let proc: ExecProcess;
    try {
      proc = await live.box.exec({ command: opts.command, env: opts.env, cwd: opts.cwd, timeoutMs: opts.timeoutMs, stdin: opts.stdin });
    } catch (err) {
      this.execEnded(rec.id, live);
      // A stop (DELETE, idle TTL, the box ending) that went first while the execution was starting: a 409, not a 500.
      if (err instanceof BoxNotRunningError || this.live.get(rec.id) !== live) throw conflict(`Sandbox '${rec.name}' was stopped before the execution could start; start it again.`);
      throw err;
    }
    const done = proc.done.finally(() => this.execEnded(rec.id, live));
    done.catch(() => undefined);
    return { stdout: proc.stdout, stderr: proc.stderr, stdin: proc.stdin, kill: (sig) => proc.kill(sig), done: done as Promise<ExecResult> };
  }

  private execEnded(id: string, live: LiveBox): void {
    live.active--;
    live.lastActive = Date.now();
    this.deps.store.touch(id, nowIso()).catch(() => undefined);
  }

  /**
   * A file transfer counts as activity from its start until its last byte (a download: until its
   * stream closes): the idle TTL never stops a box in the middle of one. A box stopped meanwhile
   * anyway (stop, DELETE) makes the transfer a 409 that says so, not whatever the cut looked like.
   */
  private async transfer<T>(rec: SandboxRecord, live: LiveBox, fn: () => Promise<T>, until: (result: T) => Promise<void> = async () => undefined): Promise<T> {
    live.active++;
    live.lastActive = Date.now();
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      live.active--;
      live.lastActive = Date.now();
    };
    let result: T;
    try {
      result = await fn();
    } catch (err) {
      end();
      if (this.live.get(rec.id) !== live) throw conflict(`Sandbox '${rec.name}' was stopped during the file transfer.`);
      throw err;
    }
    void until(result).finally(end);
    return result;
  }

  async readFile(workspaceId: string, name: string, boxPath: string, maxBytes: number) {
    const rec = await this.mustGet(workspaceId, name);
    const live = this.runningBox(rec);
    return this.transfer(
      rec,
      live,
      () => live.box.readFile(boxPath, maxBytes),
      (file) => new Promise<void>((resolve) => (file.stream.destroyed ? resolve() : file.stream.once('close', () => resolve()))),
    );
  }

  /** Writes a file, creating its parent directories first, inside the box (as the box's user). */
  async writeFile(workspaceId: string, name: string, boxPath: string, body: Readable, maxBytes: number) {
    const rec = await this.mustGet(workspaceId, name);
    const live = this.runningBox(rec);
    // No file larger than the box's /workspace can fit: refused (413) once it passes that, before
    // the docker driver spools it on the host's disk.
    const diskMb = rec.resources?.disk_mb;
    if (diskMb) maxBytes = Math.min(maxBytes, diskMb * 1024 * 1024);
    return this.transfer(rec, live, async () => {
      // The path is checked first and the parents made only then; a write refused after that
      // removes the parents it made, so that a refused upload leaves the box as it was.
      const undo = await makeParents((o) => live.box.exec(o), boxPath);
      try {
        return await live.box.writeFile(boxPath, body, maxBytes);
      } catch (err) {
        await undo();
        throw err;
      }
    });
  }

  /** The running box of a record, or the 409 that says why there is none. */
  private runningBox(rec: SandboxRecord): LiveBox {
    if (rec.driver === 'none') throw conflict(`Sandbox '${rec.name}' uses the 'none' driver: it is a proxy for a box that runs elsewhere, so keygate cannot execute in it or reach its files.`);
    const live = this.live.get(rec.id);
    if (!live || rec.status !== 'ready') {
      throw conflict(`Sandbox '${rec.name}' is ${rec.status}${rec.statusReason ? ` (${rec.statusReason})` : ''}; ${rec.status === 'stopped' ? 'start it first' : 'wait until it is ready'}.`);
    }
    return live;
  }

  /** Names of the workspace's sandboxes whose configuration references any of `keys`. */
  async sandboxesUsing(workspaceId: string, keys: Iterable<string>): Promise<string[]> {
    const wanted = new Set(keys);
    const out: string[] = [];
    for (const rec of await this.deps.store.list(workspaceId)) {
      if (rec.proxyConfig && referencedSecretKeys(rec.proxyConfig).some((r) => wanted.has(r.key))) out.push(rec.name);
    }
    return out;
  }

  /**
   * What would break if these secrets were set: for every sandbox of the workspace whose
   * configuration references one of them, every workspace_secret header that would no longer
   * resolve to a legal HTTP field value (a CR/LF, a trailing newline). Located at the item's
   * value, naming secret, sandbox, rule and header, never a value. Checked before anything is
   * stored, so a refused change changes nothing (a running proxy would otherwise be stopped).
   */
  async secretChangeIssues(workspaceId: string, items: { key: string; value: string | null }[]): Promise<ValidationIssue[]> {
    const setAt = new Map<string, number>();
    items.forEach((item, i) => {
      if (item.value !== null) setAt.set(item.key, i);
    });
    if (setAt.size === 0) return [];
    const recs = (await this.deps.store.list(workspaceId)).filter((r) => r.proxyConfig && referencedSecretKeys(r.proxyConfig).some((k) => setAt.has(k.key)));
    if (recs.length === 0) return [];
    const snapshot = await (await this.secrets(workspaceId)).snapshot();
    const next = (key: string) => (setAt.has(key) ? (items[setAt.get(key)!].value as string) : snapshot.get(key));
    const issues: ValidationIssue[] = [];
    for (const rec of recs) {
      (rec.proxyConfig!.rules ?? []).forEach((rule) =>
        (rule.headers ?? []).forEach((h) => {
          if (h.type !== 'workspace_secret') return;
          const changed = [...new Set([...h.value.matchAll(TEMPLATE_REF_RE)].map((m) => m[1]))].filter((k) => setAt.has(k));
          if (changed.length === 0) return;
          const problem = templateValueProblem(h.value, next);
          if (!problem) return;
          for (const key of changed) {
            issues.push({
              loc: ['body', setAt.get(key)!, 'value'],
              msg: `Secret '${key}' would break sandbox '${rec.name}': header '${h.name}' of rule '${rule.name}' would not be a legal HTTP field value (${problem}); nothing was changed`,
              type: 'value_error',
            });
          }
        }),
      );
    }
    return issues;
  }

  /**
   * After secrets of a workspace changed: re-resolve and push the configuration of every sandbox
   * referencing one of `keys`, so the next request uses the new values. Resolves once pushed.
   */
  async secretsChanged(workspaceId: string, keys: Iterable<string>): Promise<void> {
    const wanted = new Set(keys);
    const affected = (await this.deps.store.list(workspaceId)).filter((r) => r.proxyConfig && referencedSecretKeys(r.proxyConfig).some((k) => wanted.has(k.key)));
    await Promise.all(affected.map((r) => this.perSandbox.run(r.id, () => this.reapply(r.id))));
  }

  /**
   * The secrets changed behind the API's back (the CLI wrote the shared secrets file): re-resolve
   * every sandbox that uses secrets, in every workspace, and push (or stop, failing closed).
   */
  async secretsFileChanged(): Promise<void> {
    if (this.closing) return;
    const affected = (await this.deps.store.listAll()).filter((r) => r.proxyConfig && referencedSecretKeys(r.proxyConfig).length > 0);
    await Promise.all(affected.map((r) => this.perSandbox.run(r.id, () => this.reapply(r.id))));
    if (affected.length) this.deps.logger.info({ sandboxes: affected.length }, 'secrets file changed: sandbox configurations re-applied');
  }

  // ---------------------------------------------------------------------------------------------
  // Proxies

  /**
   * Server start, before listening: whatever a previous run left (after a SIGKILL too) is not
   * running any more as far as the records go; every box not stopped reads `provisioning` until
   * restoreAll has brought it back.
   */
  async prepareRestore(): Promise<void> {
    await this.deps.store.markProvisioning();
  }

  /**
   * Brings back every sandbox (server start, in the background once the API listens): the driver
   * first kills what a previous run left behind, then each box not stopped gets its proxy and box
   * from its stored config and current secrets.
   */
  async restoreAll(): Promise<void> {
    const all = await this.deps.store.listAll();
    await this.deps.driver.reapOrphans(new Set(all.map((r) => r.id)));
    const queue = all.filter((r) => r.status !== 'stopped');
    const worker = async () => {
      for (let rec = queue.shift(); rec; rec = queue.shift()) {
        const id = rec.id;
        await this.perSandbox.run(id, async () => {
          // As it is now: the API answered while the list above was reaped. A box stopped
          // meanwhile stays stopped; one deleted meanwhile gets nothing written again.
          const cur = await this.deps.store.getById(id);
          if (!cur || cur.status === 'stopped') return;
          this.writeCaFiles(id);
          await this.reapply(id, true);
        });
        // The API answers meanwhile: requests waiting in the event loop go before the next box.
        await new Promise((r) => setImmediate(r));
      }
    };
    await Promise.all(Array.from({ length: Math.min(RESTORE_CONCURRENCY, queue.length) }, worker));
    this.deps.logger.info({ sandboxes: all.length, running: this.proxies.size, boxes: this.live.size, runner: this.deps.runner.kind, driver: this.deps.driver.name }, 'sandboxes restored');
  }

  /** Starts restoreAll without waiting for it (the API listens meanwhile); close() waits for it. */
  restoreInBackground(): void {
    // The Java truststore (keytool, once per CA and data directory) is made now, not when the
    // first box asks for it: that box would wait a second or two.
    if (this.deps.driver.name !== 'none') void this.javaTrustStore();
    this.restoring = this.restoreAll().catch((err: Error) => this.deps.logger.error({ err: { message: loggableMessage(err) } }, 'restoring sandboxes failed'));
  }

  /** Stops every box and proxy (server shutdown); records stay so the next start restores them. */
  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.sweeper);
    await this.restoring; // its remaining boxes see `closing` and are skipped
    await this.perSandbox.drain();
    await Promise.all([...this.live.keys()].map((id) => this.stopBox(id)));
    await Promise.all([...this.proxies.keys()].map((id) => this.stopProxy(id)));
    await this.deps.driver.close();
    await this.deps.runner.close();
  }

  /** The proxy of a sandbox, if running (tests, diagnostics). */
  proxyOf(sandboxId: string): ProxyInstance | undefined {
    return this.proxies.get(sandboxId);
  }

  /** Stops boxes without an execution for their idle TTL. */
  private async sweepIdle(): Promise<void> {
    const now = Date.now();
    for (const [id, live] of this.live) {
      if (live.active > 0 || live.idleTtlMs <= 0 || now - live.lastActive < live.idleTtlMs) continue;
      await this.perSandbox.run(id, async () => {
        const cur = this.live.get(id);
        if (cur !== live || live.active > 0 || Date.now() - live.lastActive < live.idleTtlMs) return;
        this.deps.logger.info({ sandbox_id: id, idle_ttl_seconds: live.idleTtlMs / 1000 }, 'sandbox stopped: idle');
        await this.stopNow(id, `Stopped after ${live.idleTtlMs / 1000} s without an execution (idle_ttl_seconds).`);
      });
    }
  }

  private async stopNow(id: string, reason: string | null): Promise<void> {
    await this.stopBox(id);
    await this.stopProxy(id);
    if (await this.deps.store.getById(id)) await this.deps.store.setStatus(id, 'stopped', reason);
  }

  /** A record whose box (or, for `none`, proxy) runs. */
  private isUp(rec: SandboxRecord): boolean {
    return rec.driver === 'none' ? this.proxies.has(rec.id) : this.live.has(rec.id);
  }

  /**
   * Re-resolves and applies a sandbox's configuration. `bringBack`: also start what is not
   * running (server start, `start`); otherwise a stopped box only has its record updated.
   */
  private async reapply(id: string, bringBack = false): Promise<void> {
    if (this.closing) return;
    const rec = await this.deps.store.getById(id);
    if (!rec) return;
    if (rec.status === 'stopped' && !bringBack) return; // applied when it starts again
    let compiled: CompiledConfig;
    try {
      compiled = await this.compile(rec.workspaceId, rec.proxyConfig);
    } catch (err) {
      // Fail closed: a configuration that no longer resolves (a secret deleted with force, a key
      // that cannot open an opaque value) must not keep injecting what it used to.
      const reason = err instanceof ValidationFailure ? err.issues.map((i) => i.msg).join('; ') : `configuration cannot be resolved: ${loggableMessage(err)}`;
      await this.stopBox(id);
      await this.stopProxy(id);
      await this.deps.store.setStatus(id, 'failed', `Proxy stopped: ${reason}`);
      this.deps.logger.warn({ sandbox: rec.name, sandbox_id: id, workspace_id: rec.workspaceId, reason }, 'sandbox proxy stopped: configuration does not resolve');
      return;
    }
    await this.apply(rec, compiled);
  }

  /** Pushes to the running proxy, or brings the sandbox up when it is not running. */
  private async apply(rec: SandboxRecord, compiled: CompiledConfig): Promise<void> {
    const running = this.proxies.get(rec.id);
    if (!running || !this.isUp(rec)) return this.bringUp(rec, compiled);
    await running.push(compiled);
    if (rec.status !== 'ready') await this.deps.store.setStatus(rec.id, 'ready', null);
    this.deps.logger.info({ sandbox: rec.name, sandbox_id: rec.id, rules: compiled.rules.map((r) => r.name) }, 'sandbox proxy configuration pushed');
  }

  /** Starts the proxy, then the box behind it; `ready` only when both run, else `failed` with why. */
  private async bringUp(rec: SandboxRecord, compiled: CompiledConfig): Promise<void> {
    if (this.closing) return;
    const log = { sandbox: rec.name, sandbox_id: rec.id, workspace_id: rec.workspaceId, driver: rec.driver };
    let stage = 'Proxy failed to start';
    try {
      const instance = await this.startProxy(rec, compiled);
      if (!instance) return;
      if (rec.driver !== 'none') {
        stage = 'Box failed to start';
        if (rec.driver !== this.deps.driver.name) {
          throw new Error(`it was created with the '${rec.driver}' driver and this server runs '${this.deps.driver.name}'; restart keygate serve with --sandbox-driver ${rec.driver}, or delete it`);
        }
        await this.startBox(rec, instance);
        if (this.closing || !(await this.deps.store.getById(rec.id))) {
          await this.stopBox(rec.id);
          return;
        }
      }
      await this.deps.store.setStatus(rec.id, 'ready', null, instance.port);
      this.deps.logger.info({ ...log, proxy_url: instance.url, runner: this.deps.runner.kind }, 'sandbox ready');
    } catch (err) {
      await this.stopBox(rec.id);
      await this.stopProxy(rec.id);
      const reason = `${stage}: ${loggableMessage(err)}`;
      this.deps.logger.error({ ...log, err: { message: loggableMessage(err) } }, 'sandbox failed to start');
      if (!this.closing) await this.deps.store.setStatus(rec.id, 'failed', reason).catch(() => undefined);
    }
  }

  private async startProxy(rec: SandboxRecord, compiled: CompiledConfig): Promise<ProxyInstance | undefined> {
    // Building a proxy is tens of milliseconds of CPU in one piece (mostly its upstream trust
    // store). Restoring hundreds with several at once would run several such pieces per
    // event-loop turn, and an API request needs a few turns: one start per turn, after the I/O
    // that arrived meanwhile, keeps the API answering while a restart brings boxes back.
    const start = (port: number) =>
      this.proxyStarts.run('', async () => {
        await new Promise((r) => setImmediate(r));
        return this.deps.runner.start(rec.id, compiled, { port });
      });
    let instance: ProxyInstance;
    try {
      instance = await start(rec.proxyPort ?? 0);
    } catch (err) {
      if (!(err instanceof PortInUseError)) throw err;
      // Someone took the port while we were down: a new one, reported in the record.
      this.deps.logger.warn({ sandbox: rec.name, sandbox_id: rec.id, port: rec.proxyPort }, 'sandbox proxy port taken; picking another');
      instance = await start(0);
    }
    if (this.closing || !(await this.deps.store.getById(rec.id))) {
      // Deleted or shutting down while starting: do not leave an orphan listening.
      await instance.stop();
      return undefined;
    }
    this.isolate(rec.id, instance);
    this.proxies.set(rec.id, instance);
    if (!(await instance.ready())) throw new Error('the proxy does not accept connections');
    return instance;
  }

  /** The box itself, its relay pointed at `proxy`. Its environment holds no secret value. */
  private async startBox(rec: SandboxRecord, proxy: ProxyInstance): Promise<void> {
    const template = this.deps.templates.get(rec.templateName);
    if (!template) throw new Error(`its template '${rec.templateName}' is no longer configured (templates.json)`);
    // A record from before a resource existed (disk_mb) gets the template's default for it.
    const resources = { ...applyResources(template, undefined), ...rec.resources };
    const javaTrustStore = await this.javaTrustStore();
    const box = await this.deps.driver.start({
      id: rec.id,
      template: { name: template.name, rootfs: template.rootfs, image: template.image, environment: template.environment },
      resources,
      env: { ...this.boxEnv(rec), ...template.environment },
      caPem: this.deps.caCertPem,
      caBundlePem: this.bundlePem,
      javaTrustStore,
      proxy: { host: this.deps.proxyHost, port: proxy.port },
      stateDir: this.boxStateDir(rec.id),
    });
    this.live.set(rec.id, { box, active: 0, lastActive: Date.now(), idleTtlMs: rec.idleTtlSeconds * 1000 });
    void box.ended.then(() => this.boxEnded(rec.id, box));
    await this.deps.store.touch(rec.id);
  }

  /**
   * A box that ended without the service stopping it (its init exited: the box's own code can do
   * that; its container died) is stopped on record, with why, and its proxy with it: never a
   * `ready` box whose every execution fails. Only `start` brings it back.
   */
  private boxEnded(id: string, box: Box): void {
    if (this.live.get(id)?.box !== box) return; // stopped by the service (stop, TTL, DELETE, shutdown)
    void this.perSandbox.run(id, async () => {
      if (this.live.get(id)?.box !== box) return;
      this.live.delete(id);
      await this.stopProxy(id);
      if (this.closing || !(await this.deps.store.getById(id))) return;
      await this.deps.store.setStatus(id, 'stopped', box.endReason ?? 'The box ended by itself (its processes are gone); start it again.');
      this.deps.logger.warn({ sandbox_id: id }, 'sandbox stopped: the box ended by itself');
    }).catch((err: Error) => this.deps.logger.error({ sandbox_id: id, err: { message: err.message } }, 'recording an ended box failed'));
  }

  private async stopBox(id: string): Promise<void> {
    const live = this.live.get(id);
    if (!live) return;
    this.live.delete(id);
    await live.box.stop().catch((err: Error) => this.deps.logger.warn({ sandbox_id: id, err: { message: loggableMessage(err) } }, 'error stopping box'));
  }

  /** The proxy environment as seen from inside a box (sandbox.md, property 3), Java's included when it has a truststore. */
  private boxEnv(rec: SandboxRecord): Record<string, string> {
    const javaTrustStorePath = this.keytool && !this.trustStoreFailed ? BOX_TRUSTSTORE_PATH : undefined;
    return sandboxEnv({ proxyUrl: BOX_PROXY_URL, caCertPath: BOX_CA_PATH, bundlePath: BOX_BUNDLE_PATH, noProxy: rec.proxyConfig?.no_proxy, javaTrustStorePath });
  }

  /**
   * Java ignores HTTPS_PROXY and PEM bundles: every box gets a PKCS12 truststore (the JDK's roots
   * plus the CA, as `keygate ca env` writes it) at /etc/keygate/truststore.p12, and
   * JAVA_TOOL_OPTIONS naming it and the proxy. Built with keytool once, in the background (a JVM
   * run takes a second or two), and kept under the data directory for the CA it holds, so later
   * starts reuse it. Undefined when there is no keytool, or building failed (logged): boxes then
   * start without it rather than not at all.
   */
  private javaTrustStore(): Promise<Uint8Array | undefined> {
    this.trustStore ??= (async () => {
      if (!this.keytool) return undefined;
      const ca = createHash('sha256').update(this.deps.caCertPem).digest('hex').slice(0, 16);
      const file = path.join(this.deps.dataDir, 'sandboxes', `java-truststore-${ca}.p12`);
      try {
        if (!existsSync(file)) {
          mkdirSync(path.dirname(file), { recursive: true, mode: 0o755 });
          await writeJavaTrustStore(this.deps.caCertPem, file, this.keytool);
        }
        return readFileSync(file);
      } catch (err) {
        this.trustStoreFailed = true;
        this.deps.logger.warn({ err: { message: loggableMessage(err) } }, 'no Java truststore for boxes: keytool failed; JAVA_TOOL_OPTIONS left out');
        return undefined;
      }
    })();
    return this.trustStore;
  }

  /**
   * Makes `authority` unreachable through every sandbox's proxy, now and for proxies started later.
   * Used for the API server's own address: a box must not reach keygate's API on its loopback.
   */
  denyToAll(authority: string): void {
    this.deniedToAll.add(authority);
    for (const p of this.proxies.values()) p.deny(authority);
  }

  /**
   * Every proxy listens on this host's loopback, so without this a box could CONNECT through its
   * own proxy to another sandbox's proxy port and have that sandbox's credentials injected.
   */
  private isolate(id: string, instance: ProxyInstance): void {
    const host = this.deps.proxyHost;
    for (const a of this.deniedToAll) instance.deny(a);
    for (const [otherId, other] of this.proxies) {
      if (otherId === id) continue;
      other.deny(`${host}:${instance.port}`);
      instance.deny(`${host}:${other.port}`);
    }
  }

  private async stopProxy(id: string): Promise<void> {
    const p = this.proxies.get(id);
    if (!p) return;
    this.proxies.delete(id);
    await p.stop().catch((err: Error) => this.deps.logger.warn({ sandbox_id: id, err: { message: loggableMessage(err) } }, 'error stopping sandbox proxy'));
  }

  // ---------------------------------------------------------------------------------------------
  // Files and views

  private sandboxDir(id: string): string {
    return path.join(this.deps.dataDir, 'sandboxes', id);
  }

  /** The CA certificate and the bundle (system roots + CA) the box points its tools at. */
  private writeCaFiles(id: string): void {
    const dir = this.sandboxDir(id);
    // At a restart they are usually there already: 1,000 boxes would rewrite 200 MB of bundles.
    try {
      if (readFileSync(path.join(dir, CA_FILE), 'utf8') === this.deps.caCertPem && existsSync(path.join(dir, BUNDLE_FILE))) return;
    } catch {
      /* not there yet */
    }
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    writeFileSync(path.join(dir, CA_FILE), this.deps.caCertPem, { mode: 0o644 });
    writeCaBundle(this.deps.caCertPem, path.join(dir, BUNDLE_FILE));
  }

  /** Host-side driver state of a box (never inside the box). */
  private boxStateDir(id: string): string {
    return path.join(this.sandboxDir(id), 'box');
  }

  private removeFiles(id: string): void {
    rmSync(this.sandboxDir(id), { recursive: true, force: true });
  }

  /** The record as it is now; 404 when it was deleted meanwhile (a DELETE that went first). */
  private async viewById(id: string, name: string): Promise<SandboxView> {
    const rec = await this.deps.store.getById(id);
    if (!rec) throw notFound(`Sandbox '${name}' not found.`);
    return this.view(rec);
  }

  private async mustGet(workspaceId: string, name: string): Promise<SandboxRecord> {
    const rec = await this.deps.store.getByName(workspaceId, name);
    if (!rec) throw notFound(`Sandbox '${name}' not found.`);
    return rec;
  }

  view(rec: SandboxRecord): SandboxView {
    const port = this.proxies.get(rec.id)?.port ?? rec.proxyPort;
    const url = port ? `http://${this.deps.proxyHost.includes(':') ? `[${this.deps.proxyHost}]` : this.deps.proxyHost}:${port}` : null;
    const dir = this.sandboxDir(rec.id);
    const template = this.deps.templates.get(rec.templateName);
    // A real box sees its proxy through the relay at 127.0.0.1:3128; a `none` box (elsewhere) dials it directly.
    const env = rec.driver !== 'none'
      ? this.boxEnv(rec)
      : url
        ? sandboxEnv({ proxyUrl: url, caCertPath: path.join(dir, CA_FILE), bundlePath: path.join(dir, BUNDLE_FILE), noProxy: rec.proxyConfig?.no_proxy })
        : null;
    return {
      id: rec.id,
      name: rec.name,
      template_name: rec.templateName,
      driver: rec.driver,
      status: rec.status,
      status_reason: rec.statusReason,
      idle_ttl_seconds: rec.idleTtlSeconds,
      resources: { ...applyResources(template ?? { name: '', description: '', environment: {} }, undefined), ...rec.resources },
      last_active_at: rec.lastActiveAt,
      created_at: rec.createdAt,
      updated_at: rec.updatedAt,
      proxy_config: rec.proxyConfig ? redactProxyConfig(rec.proxyConfig) : null,
      proxy: {
        url,
        ca_cert_pem: this.deps.caCertPem,
        env,
      },
    };
  }
}
