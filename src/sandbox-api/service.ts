import { randomUUID } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { referencedSecretKeys, resolveProxyConfig } from '../config/resolve.js';
import { validateProxyConfig, type ProxyConfig } from '../config/schema.js';
import { sandboxEnv, writeCaBundle } from '../certs/env.js';
import type { Logger } from '../log.js';
import type { ResolvedProxyConfig } from '../rules/compile.js';
import { Envelope } from '../secrets/envelope.js';
import { opaqueOpener, redactProxyConfig, sealOpaqueValues } from '../secrets/opaque.js';
import type { SecretStore } from '../secrets/types.js';
import { conflict, HttpValidationError, notFound } from '../server/errors.js';
import { ValidationFailure, type ValidationIssue } from '../validation/errors.js';
import { freePort, PortInUseError, type ProxyInstance, type ProxyRunner } from './runner.js';
import { DuplicateNameError, type SandboxRecord, type SandboxStatus, type SandboxStore } from './storage.js';
import type { Template } from './templates.js';

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
  logger: Logger;
}

export interface CreateInput {
  template_name: string;
  name: string;
  wait_for_ready?: boolean;
  proxy_config?: ProxyConfig;
}

/** The sandbox as the API returns it. Built from the stored form only: nothing resolved, nothing opaque. */
export interface SandboxView {
  id: string;
  name: string;
  template_name: string;
  status: SandboxStatus;
  status_reason: string | null;
  created_at: string;
  updated_at: string;
  proxy_config: ProxyConfig | null;
  proxy: { url: string | null; ca_cert_pem: string; env: Record<string, string> | null };
}

const PROXY_CONFIG_LOC = ['body', 'proxy_config'];

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
  private readonly secretStores = new Map<string, Promise<SecretStore>>();
  /** Destinations no sandbox's proxy may reach (the API server itself), see denyToAll. */
  private readonly deniedToAll = new Set<string>();
  private closing = false;

  constructor(private readonly deps: SandboxServiceDeps) {}

  get templates(): Template[] {
    return [...this.deps.templates.values()];
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
   * its resolution. Every problem is reported with a loc under `body.proxy_config`.
   */
  private async prepareConfig(workspaceId: string, config: ProxyConfig, issues: ValidationIssue[]): Promise<{ stored: ProxyConfig; resolved: ResolvedProxyConfig } | undefined> {
    const own = validateProxyConfig(config).map((i) => ({ ...i, loc: [...PROXY_CONFIG_LOC, ...i.loc] }));
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
      return { stored, resolved: await this.resolve(workspaceId, stored) };
    } catch (err) {
      if (!(err instanceof ValidationFailure)) throw err;
      issues.push(...err.issues.map((i) => ({ ...i, loc: [...PROXY_CONFIG_LOC, ...i.loc] })));
      return undefined;
    }
  }

  /** The stored form resolved against the workspace's secrets right now. Throws ValidationFailure. */
  private async resolve(workspaceId: string, stored: ProxyConfig | null): Promise<ResolvedProxyConfig> {
    if (!stored) return { rules: [], no_proxy: [] };
    const needsSecrets = referencedSecretKeys(stored).length > 0;
    const snapshot = needsSecrets ? await (await this.secrets(workspaceId)).snapshot() : new Map<string, string>();
    return resolveProxyConfig(stored, (k) => snapshot.get(k), { openOpaque: opaqueOpener(this.deps.envelope()) });
  }

  // ---------------------------------------------------------------------------------------------
  // API operations

  async create(workspaceId: string, input: CreateInput): Promise<SandboxView> {
    const rec = await this.withWorkspace(workspaceId, async () => {
      const issues: ValidationIssue[] = [];
      if (!this.deps.templates.has(input.template_name)) {
        const known = [...this.deps.templates.keys()];
        issues.push({
          loc: ['body', 'template_name'],
          msg: `Unknown template '${input.template_name}'${known.length ? `; available: ${known.join(', ')}` : '; no templates are configured'}`,
          type: 'value_error',
        });
      }
      const prepared = input.proxy_config ? await this.prepareConfig(workspaceId, input.proxy_config, issues) : undefined;
      if (issues.length) throw new HttpValidationError(issues);
      const existing = await this.deps.store.getByName(workspaceId, input.name);
      if (existing) throw conflict(`A sandbox named '${input.name}' already exists in this workspace.`);
      const id = randomUUID();
      this.writeCaFiles(id);
      try {
        const created = await this.deps.store.insert({
          id,
          workspaceId,
          name: input.name,
          templateName: input.template_name,
          status: 'starting',
          statusReason: null,
          proxyConfig: prepared?.stored ?? null,
          // Chosen now so the 201 already tells the box where its proxy will be.
          proxyPort: await this.reservePort(),
        });
        return { created, resolved: prepared?.resolved ?? { rules: [], no_proxy: [] } };
      } catch (err) {
        this.removeFiles(id);
        if (err instanceof DuplicateNameError) throw conflict(err.message);
        throw err;
      }
    });
    const started = this.perSandbox.run(rec.created.id, () => this.startProxy(rec.created, rec.resolved));
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

  async list(workspaceId: string): Promise<SandboxView[]> {
    return (await this.deps.store.list(workspaceId)).map((r) => this.view(r));
  }

  /** Replaces the proxy_config and pushes it to the running proxy before answering. */
  async patch(workspaceId: string, name: string, config: ProxyConfig): Promise<SandboxView> {
    const rec = await this.withWorkspace(workspaceId, async () => {
      const current = await this.mustGet(workspaceId, name);
      const issues: ValidationIssue[] = [];
      const prepared = await this.prepareConfig(workspaceId, config, issues);
      if (!prepared) throw new HttpValidationError(issues);
      await this.perSandbox.run(current.id, async () => {
        await this.deps.store.setConfig(current.id, prepared.stored);
        await this.apply({ ...current, proxyConfig: prepared.stored }, prepared.resolved);
      });
      return current;
    });
    return this.view((await this.deps.store.getById(rec.id))!);
  }

  async delete(workspaceId: string, name: string): Promise<void> {
    const rec = await this.mustGet(workspaceId, name);
    await this.perSandbox.run(rec.id, async () => {
      await this.stopProxy(rec.id);
      await this.deps.store.delete(rec.id);
      this.removeFiles(rec.id);
    });
    this.deps.logger.info({ sandbox: rec.name, sandbox_id: rec.id, workspace_id: workspaceId }, 'sandbox deleted');
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

  /** Brings back every sandbox's proxy (server start), each from its stored config and current secrets. */
  async restoreAll(): Promise<void> {
    const all = await this.deps.store.listAll();
    const queue = [...all];
    const worker = async () => {
      for (let rec = queue.shift(); rec; rec = queue.shift()) {
        const id = rec.id;
        this.writeCaFiles(id);
        await this.perSandbox.run(id, () => this.reapply(id));
      }
    };
    await Promise.all(Array.from({ length: Math.min(4, all.length) }, worker));
    this.deps.logger.info({ sandboxes: all.length, running: this.proxies.size, runner: this.deps.runner.kind }, 'sandbox proxies restored');
  }

  /** Stops every proxy (server shutdown); records stay so the next start restores them. */
  async close(): Promise<void> {
    this.closing = true;
    await this.perSandbox.drain();
    await Promise.all([...this.proxies.keys()].map((id) => this.stopProxy(id)));
    await this.deps.runner.close();
  }

  /** The proxy of a sandbox, if running (tests, diagnostics). */
  proxyOf(sandboxId: string): ProxyInstance | undefined {
    return this.proxies.get(sandboxId);
  }

  private async reapply(id: string): Promise<void> {
    if (this.closing) return;
    const rec = await this.deps.store.getById(id);
    if (!rec) return;
    let resolved: ResolvedProxyConfig;
    try {
      resolved = await this.resolve(rec.workspaceId, rec.proxyConfig);
    } catch (err) {
      // Fail closed: a configuration that no longer resolves (a secret deleted with force, a key
      // that cannot open an opaque value) must not keep injecting what it used to.
      const reason = err instanceof ValidationFailure ? err.issues.map((i) => i.msg).join('; ') : `configuration cannot be resolved: ${(err as Error).message}`;
      await this.stopProxy(id);
      await this.deps.store.setStatus(id, 'failed', `Proxy stopped: ${reason}`);
      this.deps.logger.warn({ sandbox: rec.name, sandbox_id: id, workspace_id: rec.workspaceId, reason }, 'sandbox proxy stopped: configuration does not resolve');
      return;
    }
    await this.apply(rec, resolved);
  }

  /** Pushes to the running proxy, or starts one when there is none. */
  private async apply(rec: SandboxRecord, resolved: ResolvedProxyConfig): Promise<void> {
    const running = this.proxies.get(rec.id);
    if (!running) return this.startProxy(rec, resolved);
    await running.push(resolved);
    if (rec.status !== 'ready') await this.deps.store.setStatus(rec.id, 'ready', null);
    this.deps.logger.info({ sandbox: rec.name, sandbox_id: rec.id, rules: resolved.rules.map((r) => r.name) }, 'sandbox proxy configuration pushed');
  }

  private async startProxy(rec: SandboxRecord, resolved: ResolvedProxyConfig): Promise<void> {
    if (this.closing) return;
    const log = { sandbox: rec.name, sandbox_id: rec.id, workspace_id: rec.workspaceId };
    try {
      let instance: ProxyInstance;
      try {
        instance = await this.deps.runner.start(rec.id, resolved, { port: rec.proxyPort ?? 0 });
      } catch (err) {
        if (!(err instanceof PortInUseError)) throw err;
        // Someone took the port while we were down: a new one, reported in the record.
        this.deps.logger.warn({ ...log, port: rec.proxyPort }, 'sandbox proxy port taken; picking another');
        instance = await this.deps.runner.start(rec.id, resolved, { port: 0 });
      }
      if (this.closing || !(await this.deps.store.getById(rec.id))) {
        // Deleted or shutting down while starting: do not leave an orphan listening.
        await instance.stop();
        return;
      }
      this.isolate(rec.id, instance);
      this.proxies.set(rec.id, instance);
      if (!(await instance.ready())) throw new Error('the proxy does not accept connections');
      await this.deps.store.setStatus(rec.id, 'ready', null, instance.port);
      this.deps.logger.info({ ...log, proxy_url: instance.url, runner: this.deps.runner.kind }, 'sandbox proxy ready');
    } catch (err) {
      await this.stopProxy(rec.id);
      const reason = `Proxy failed to start: ${(err as Error).message}`;
      this.deps.logger.error({ ...log, err: { message: (err as Error).message } }, 'sandbox proxy failed to start');
      if (!this.closing) await this.deps.store.setStatus(rec.id, 'failed', reason).catch(() => undefined);
    }
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
    await p.stop().catch((err: Error) => this.deps.logger.warn({ sandbox_id: id, err: { message: err.message } }, 'error stopping sandbox proxy'));
  }

  // ---------------------------------------------------------------------------------------------
  // Files and views

  private sandboxDir(id: string): string {
    return path.join(this.deps.dataDir, 'sandboxes', id);
  }

  /** The CA certificate and the bundle (system roots + CA) the box points its tools at. */
  private writeCaFiles(id: string): void {
    const dir = this.sandboxDir(id);
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    writeFileSync(path.join(dir, CA_FILE), this.deps.caCertPem, { mode: 0o644 });
    writeCaBundle(this.deps.caCertPem, path.join(dir, BUNDLE_FILE));
  }

  private removeFiles(id: string): void {
    rmSync(this.sandboxDir(id), { recursive: true, force: true });
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
    return {
      id: rec.id,
      name: rec.name,
      template_name: rec.templateName,
      status: rec.status,
      status_reason: rec.statusReason,
      created_at: rec.createdAt,
      updated_at: rec.updatedAt,
      proxy_config: rec.proxyConfig ? redactProxyConfig(rec.proxyConfig) : null,
      proxy: {
        url,
        ca_cert_pem: this.deps.caCertPem,
        env: url
          ? sandboxEnv({ proxyUrl: url, caCertPath: path.join(dir, CA_FILE), bundlePath: path.join(dir, BUNDLE_FILE), noProxy: rec.proxyConfig?.no_proxy })
          : null,
      },
    };
  }
}
