import net from 'node:net';
import type { CompiledConfig } from '../rules/compile.js';

/**
 * One running proxy for one sandbox. Its configuration is replaced as a whole (`push`): requests
 * already in flight keep the snapshot they started with, open tunnels are untouched.
 */
export interface ProxyInstance {
  readonly sandboxId: string;
  /** `http://127.0.0.1:PORT`: what the sandbox puts in HTTPS_PROXY. */
  readonly url: string;
  readonly port: number;
  /** Applies a new configuration; resolves once the proxy uses it. */
  push(config: CompiledConfig): Promise<void>;
  /** True once the port accepts a connection and the last pushed configuration is applied. */
  ready(): Promise<boolean>;
  /** Refuses `host:port` as a destination from now on (also by any name resolving to it). */
  deny(authority: string): void;
  stop(): Promise<void>;
}

export interface ProxyStartOptions {
  /** Port to listen on; 0 or absent picks a free one. */
  port?: number;
}

/**
 * Runs the sidecar proxies of `keygate serve`: one per sandbox, each on its own loopback port
 * with its own configuration, so one sandbox's rules (and secrets) can never answer for another's.
 * Implementations: in-process (src/sandbox-api/runner-inprocess.ts, the default).
 */
export interface ProxyRunner {
  readonly kind: string;
  /**
   * Starts a proxy already holding `config` (resolved and compiled by config/prepare.ts). Rejects
   * with `PortInUseError` when `port` is taken.
   */
  start(sandboxId: string, config: CompiledConfig, opts?: ProxyStartOptions): Promise<ProxyInstance>;
  /** Stops what is still running (server shutdown). */
  close(): Promise<void>;
}

export class PortInUseError extends Error {
  constructor(readonly port: number) {
    super(`port ${port} is already in use`);
    this.name = 'PortInUseError';
  }
}

/** Asks the kernel for a free loopback port (bind 0, read it, release it). */
export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.once('error', reject);
    srv.listen({ host, port: 0, exclusive: true }, () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** True when something accepts a TCP connection on host:port within `timeoutMs`. */
export function acceptsConnection(host: string, port: number, timeoutMs = 2000): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = net.connect({ host, port });
    const done = (ok: boolean) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}
