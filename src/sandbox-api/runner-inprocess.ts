import type { Ca } from '../certs/ca.js';
import type { Logger } from '../log.js';
import { startProxy, type ProxyHandle } from '../proxy/server.js';
import type { CompiledConfig } from '../rules/compile.js';
import { acceptsConnection, PortInUseError, type ProxyInstance, type ProxyRunner, type ProxyStartOptions } from './runner.js';

export interface InProcessRunnerOptions {
  ca: Ca;
  logger: Logger;
  /** Loopback by default: the proxies are for boxes on this host. */
  host?: string;
  /** `host:port` -> address pins (curl's --resolve), shared by every sandbox's proxy. */
  resolve?: ReadonlyMap<string, string>;
  /** Extra PEM CAs trusted for upstream TLS (an internal API's CA). */
  upstreamCa?: string[];
  /** Targets no sandbox may reach through its proxy (the API server itself). */
  denyTargets?: () => string[];
  /** How long a stopping proxy lets requests in flight finish. */
  stopGraceMs?: number;
}

class InProcessInstance implements ProxyInstance {
  private compiledRef: object;

  constructor(
    readonly sandboxId: string,
    private readonly handle: ProxyHandle,
    private readonly host: string,
    private readonly graceMs: number,
  ) {
    this.compiledRef = handle.getConfig();
  }

  get url(): string {
    return this.handle.url;
  }

  get port(): number {
    return this.handle.port;
  }

  async push(config: CompiledConfig): Promise<void> {
    this.handle.setConfig(config);
    this.compiledRef = config;
  }

  async ready(): Promise<boolean> {
    return this.handle.getConfig() === this.compiledRef && (await acceptsConnection(this.host, this.handle.port));
  }

  deny(authority: string): void {
    this.handle.denyTarget(authority);
  }

  stop(): Promise<void> {
    return this.handle.close(this.graceMs);
  }
}

/**
 * The embedded default: each sandbox's proxy is its own listener, configuration and upstream
 * pool inside the server process (A's startProxy); only the CA is shared. One proxy's rules are
 * unreachable from another's port: isolation is by listener, not by a lookup on each request.
 */
export class InProcessProxyRunner implements ProxyRunner {
  readonly kind = 'in-process';
  private readonly host: string;

  constructor(private readonly opts: InProcessRunnerOptions) {
    this.host = opts.host ?? '127.0.0.1';
  }

  async start(sandboxId: string, config: CompiledConfig, startOpts: ProxyStartOptions = {}): Promise<ProxyInstance> {
    const port = startOpts.port ?? 0;
    let handle: ProxyHandle;
    try {
      handle = await startProxy({
        listen: { host: this.host, port },
        ca: this.opts.ca,
        config,
        logger: this.opts.logger.child({ sandbox_id: sandboxId }),
        resolve: this.opts.resolve,
        upstreamCa: this.opts.upstreamCa,
        denyTargets: this.opts.denyTargets?.(),
      });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE') throw new PortInUseError(port);
      throw err;
    }
    return new InProcessInstance(sandboxId, handle, this.host, this.opts.stopGraceMs ?? 2000);
  }

  async close(): Promise<void> {
    // Each instance is stopped by its owner; nothing shared to release.
  }
}
