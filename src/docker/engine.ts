import net from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { PassThrough } from 'node:stream';
import { Client, Pool } from 'undici';

/**
 * A small Docker Engine API client on the engine's unix socket (undici), shared by whatever talks to
 * a local engine. Only local engines: `DOCKER_HOST=unix:///path` or the default socket; any other
 * scheme is refused (a TCP engine would also break the unix-socket relay of the sandbox driver).
 */
export const ENGINE_API = '/v1.41';

/** `DOCKER_HOST=unix:///path` or the default socket; null for other schemes. */
export function dockerSocketPath(env: NodeJS.ProcessEnv = process.env): string | null {
  const h = env.DOCKER_HOST;
  if (!h) return '/var/run/docker.sock';
  if (h.startsWith('unix://')) return h.slice('unix://'.length);
  return null;
}

export type EngineMethod = 'GET' | 'HEAD' | 'POST' | 'PUT' | 'DELETE';

export interface EngineResponse<T> {
  status: number;
  body: T;
}

/** An engine error message, short and without anything but what the engine said. */
export function engineMessage(body: unknown, status: number): string {
  const m = (body as { message?: unknown } | undefined)?.message;
  return typeof m === 'string' && m ? m.slice(0, 300) : `engine answered ${status}`;
}

export class DockerEngine {
  readonly socketPath: string;
  readonly where: string;
  private readonly client: Client | Pool;

  /**
   * `pool`: as many connections as there are requests in flight, for callers that hold requests
   * open for long (container waits, followed logs), which on one connection would hold up every
   * later call. Without it, one connection.
   */
  constructor(socketPath: string, opts: { pool?: boolean } = {}) {
    this.socketPath = socketPath;
    this.where = `unix://${socketPath}`;
    this.client = opts.pool
      ? new Pool('http://docker', { socketPath, connect: { timeout: 2000 } })
      : new Client('http://docker', { socketPath, connect: { timeout: 2000 }, pipelining: 0 });
  }

  /** A raw request; the caller consumes or dumps the body. `timeoutMs` 0 means none (long streams). */
  async request(
    method: EngineMethod,
    path: string,
    opts: { json?: unknown; body?: Readable; headers?: Record<string, string>; timeoutMs?: number } = {},
  ) {
    const timeout = opts.timeoutMs ?? 30_000;
    const headers: Record<string, string> = { ...opts.headers };
    if (opts.json !== undefined) headers['content-type'] = 'application/json';
    return this.client.request({
      method,
      path: `${ENGINE_API}${path}`,
      headers,
      body: opts.json !== undefined ? JSON.stringify(opts.json) : opts.body,
      headersTimeout: timeout,
      bodyTimeout: timeout,
    });
  }

  /** A request whose answer is JSON (or empty); non-JSON answers become `{message}`. */
  async json<T = unknown>(method: EngineMethod, path: string, json?: unknown, timeoutMs?: number): Promise<EngineResponse<T>> {
    const res = await this.request(method, path, { json, timeoutMs });
    const text = await res.body.text();
    let parsed: unknown = undefined;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = { message: text.slice(0, 300) };
    }
    return { status: res.statusCode, body: parsed as T };
  }

  /** The engine's answer to `/_ping`: its status, or why no answer came (the error code or message). */
  async ping(): Promise<{ status: number } | { error: string }> {
    try {
      const res = await this.client.request({ method: 'GET', path: '/_ping', headersTimeout: 2000, bodyTimeout: 2000 });
      await res.body.dump();
      return { status: res.statusCode };
    } catch (err) {
      return { error: (err as { code?: string }).code ?? (err as Error).message };
    }
  }

  /** null when the engine answers `/_ping`, else why not (no secret can be in it: it names the socket). */
  async unavailableReason(): Promise<string | null> {
    const p = await this.ping();
    if ('error' in p) return `no Docker engine answers at ${this.where} (${p.error})`;
    return p.status === 200 ? null : `the engine at ${this.where} answered /_ping with ${p.status}`;
  }

  /**
   * POST with `Upgrade: tcp` (exec start, attach): the engine answers 101 and the connection becomes
   * the raw, multiplexed stream of the process.
   */
  async hijack(path: string, json: unknown, timeoutMs = 30_000): Promise<Duplex> {
    // undici's upgrade() sends no body, and exec start needs one: one raw HTTP/1.1 exchange on its own connection.
    const payload = Buffer.from(JSON.stringify(json));
    const socket = net.connect(this.socketPath);
    socket.setNoDelay(true);
    return new Promise<Duplex>((resolve, reject) => {
      let head = Buffer.alloc(0);
      const timer = setTimeout(() => fail(new Error(`the engine at ${this.where} did not answer ${path}`)), timeoutMs);
      const fail = (err: Error) => {
        clearTimeout(timer);
        socket.destroy();
        reject(err);
      };
      const onData = (chunk: Buffer) => {
        head = Buffer.concat([head, chunk]);
        const end = head.indexOf('\r\n\r\n');
        if (end < 0) {
          if (head.length > 64 * 1024) fail(new Error('the engine sent an oversized response head'));
          return;
        }
        socket.off('data', onData);
        socket.off('error', fail);
        clearTimeout(timer);
        const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head.subarray(0, end).toString('latin1'))?.[1]);
        const rest = head.subarray(end + 4);
        if (status !== 101 && status !== 200) {
          socket.destroy();
          reject(new Error(`the engine refused ${path}: ${status} ${rest.toString('utf8').slice(0, 300).trim()}`));
          return;
        }
        socket.pause();
        if (rest.length > 0) socket.unshift(rest);
        // Readers see a cut connection as the end of the stream; it must never crash the process.
        socket.on('error', () => undefined);
        resolve(socket);
      };
      socket.on('data', onData);
      socket.once('error', fail);
      socket.write(
        `POST ${ENGINE_API}${path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n` +
          `Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: ${payload.length}\r\n\r\n`,
      );
      socket.write(payload);
    });
  }

  async close(): Promise<void> {
    await this.client.close().catch(() => undefined);
  }
}

function drainOrClose(stream: PassThrough): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      stream.off('drain', done);
      stream.off('close', done);
      resolve();
    };
    stream.on('drain', done);
    stream.on('close', done);
  });
}

/**
 * Splits the engine's multiplexed stream (no TTY) into stdout and stderr: each frame is an 8-byte
 * header (stream type, 3 zero bytes, big-endian length) then the payload. Frames are passed on as
 * they come (never gathered), with backpressure from both outputs: the caller reads both.
 */
export function demultiplex(source: Readable): { stdout: PassThrough; stderr: PassThrough; ended: Promise<void> } {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const ended = (async () => {
    let head = Buffer.alloc(0);
    let remaining = 0;
    let target: PassThrough = stdout;
    try {
      for await (const chunk of source as AsyncIterable<Buffer>) {
        let c = chunk;
        while (c.length > 0) {
          if (remaining === 0) {
            const need = 8 - head.length;
            head = Buffer.concat([head, c.subarray(0, need)]);
            c = c.subarray(need);
            if (head.length < 8) break;
            target = head[0] === 2 ? stderr : stdout;
            remaining = head.readUInt32BE(4);
            head = Buffer.alloc(0);
            continue;
          }
          const part = c.subarray(0, remaining);
          c = c.subarray(part.length);
          remaining -= part.length;
          // A reader that gave up (destroyed its stream) gets nothing more; the other one goes on.
          if (target.destroyed) continue;
          if (!target.write(part)) await drainOrClose(target);
        }
      }
    } catch {
      /* the connection was cut (kill, engine gone): end what we have */
    } finally {
      stdout.end();
      stderr.end();
    }
  })();
  return { stdout, stderr, ended };
}
