import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, realpathSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { HALF_OPEN_IDLE_MS, joinHalfOpen } from '../half-open.js';
import type { RelayBudget } from './relay-budget.js';

/**
 * The docker driver's way out of a `--network none` box (sandbox.md, property 1), and the few host
 * programs it lends the box, read-only:
 *
 * - host side, per box: a unix socket under the box's state directory whose every connection is
 *   piped to the box's proxy (a loopback address of the host). The socket's directory is
 *   bind-mounted into the box: unix sockets are reached by path, not through a network namespace.
 * - box side: the relay, the container's main process, listening on 127.0.0.1:3128 in the box's
 *   network namespace and piping every connection to that socket. It is the host's own node binary,
 *   run through the host's dynamic loader with the host's libraries (all mounted read-only under
 *   /.keygate), so it runs whatever libc the image has (or none). It runs as its own uid: the box's
 *   user can neither signal, trace nor read it.
 * - `tini` (static, the engine's own `docker-init`): the wrapper of every execution, a subreaper,
 *   so that the whole tree of an execution stays under it and can be found and killed.
 */

/** Inside the box. */
export const BOX_RUNTIME_DIR = '/.keygate';
export const BOX_NODE = `${BOX_RUNTIME_DIR}/node`;
export const BOX_LIB_DIR = `${BOX_RUNTIME_DIR}/lib`;
export const BOX_LOADER = `${BOX_LIB_DIR}/ld.so`;
export const BOX_TINI = `${BOX_RUNTIME_DIR}/tini`;
export const BOX_RELAY_DIR = `${BOX_RUNTIME_DIR}/relay`;
export const RELAY_SOCKET_NAME = 'proxy.sock';
export const RELAY_PORT = 3128;
export const RELAY_READY = 'keygate-relay ready';

/**
 * The relay program (node -e). Nothing but a pipe: the proxy does every check. Each side's end
 * goes on alone, as the host side's joinHalfOpen (src/half-open.ts) does it: a program that
 * shuts its sending side after its request still gets the answer; a reset goes on as a reset
 * where the socket can send one (passOnFailure); and a pair left half-open with nothing moving
 * is cut after HALF_OPEN_IDLE_MS. (A twin: this program runs in the box and cannot import the
 * module.) The hop between the two relays is a unix socket, which carries no reset: a reset of
 * the proxy's reaches a docker box as an end.
 */
const RELAY_JS = `
const net = require('net');
const target = process.argv[1];
const server = net.createServer({ noDelay: true, allowHalfOpen: true }, (inside) => {
  const out = net.connect({ path: target, allowHalfOpen: true });
  let clock;
  const cut = () => { inside.destroy(); out.destroy(); };
  const halfOpen = () => {
    if (clock) return;
    clock = setTimeout(cut, ${HALF_OPEN_IDLE_MS});
    const moved = () => clock.refresh();
    inside.on('data', moved); out.on('data', moved);
  };
  let closed = 0;
  const wire = (src, dst) => {
    let ended = false;
    src.once('end', () => { ended = true; halfOpen(); });
    src.on('error', (e) => {
      if (e.code === 'ECONNRESET' && typeof dst.resetAndDestroy === 'function') { try { dst.resetAndDestroy(); } catch { dst.destroy(); } } else dst.destroy();
      src.destroy();
    });
    src.once('close', () => { if (!ended) dst.destroy(); if (++closed === 2) clearTimeout(clock); });
    src.pipe(dst);
  };
  wire(inside, out); wire(out, inside);
});
server.on('error', (e) => { process.stderr.write('keygate-relay: ' + e.code + '\\n'); process.exit(1); });
server.listen(${RELAY_PORT}, '127.0.0.1', () => process.stdout.write(${JSON.stringify(RELAY_READY + '\n')}));
`;

/** Node flags that keep an idle relay small: it only pipes bytes. */
const RELAY_NODE_FLAGS = ['--jitless', '--max-old-space-size=32', '--max-semi-space-size=1', '--v8-pool-size=1', '--no-warnings'];

export interface HostRuntime {
  /** Read-only bind mounts, "host:box:ro". */
  binds: string[];
  /** argv that runs node (from the host) inside any image. */
  nodeArgv: string[];
}

let cached: HostRuntime | null = null;

/**
 * The static tini the engine uses as `docker-init`; exec trees need it (see module comment). The
 * local driver lends the same one to its boxes where it has no cgroups (local.ts).
 */
export function findTini(): string | null {
  for (const p of ['/usr/bin/tini-static', '/usr/bin/docker-init', '/usr/sbin/docker-init', '/usr/libexec/docker/docker-init', '/usr/local/bin/docker-init']) {
    if (existsSync(p)) return realpathSync(p);
  }
  return null;
}

/**
 * What the driver lends every box, found once. Throws with what is missing (the probe and start
 * turn it into a refusal: no box without a relay).
 */
export function hostRuntime(): HostRuntime {
  if (cached) return cached;
  const tini = findTini();
  if (!tini) throw new Error('no static tini (docker-init) on this host: apt-get install tini');
  const node = realpathSync(process.execPath);
  let ldd: string;
  try {
    ldd = execFileSync('ldd', [node], { encoding: 'utf8', timeout: 5000 });
  } catch {
    throw new Error('cannot list the libraries of the node binary (ldd): apt-get install libc-bin');
  }
  const binds = [`${node}:${BOX_NODE}:ro`, `${tini}:${BOX_TINI}:ro`];
  let loader: string | null = null;
  for (const line of ldd.split('\n')) {
    const lib = /=>\s+(\/\S+)/.exec(line)?.[1];
    if (lib) binds.push(`${realpathSync(lib)}:${BOX_LIB_DIR}/${path.basename(lib)}:ro`);
    else if (/^\s*(\/\S+ld-linux\S*)\s+\(/.test(line)) loader = /^\s*(\/\S+)/.exec(line)![1];
  }
  if (!loader) throw new Error('the node binary names no dynamic loader (a static node is not supported)');
  binds.push(`${realpathSync(loader)}:${BOX_LOADER}:ro`);
  cached = { binds, nodeArgv: [BOX_LOADER, '--library-path', BOX_LIB_DIR, BOX_NODE] };
  return cached;
}

/** The container's main command: the relay, forwarding 127.0.0.1:3128 to the mounted socket. */
export function relayCommand(rt: HostRuntime): string[] {
  return [...rt.nodeArgv, ...RELAY_NODE_FLAGS, '-e', RELAY_JS, `${BOX_RELAY_DIR}/${RELAY_SOCKET_NAME}`];
}

/** A program run inside the box with the lent node (the exec tree killer). */
export function nodeCommand(rt: HostRuntime, script: string, args: string[]): string[] {
  return [...rt.nodeArgv, ...RELAY_NODE_FLAGS, '-e', script, ...args];
}

/** unix socket paths are limited (sun_path, 108 bytes with the NUL). */
const MAX_SOCKET_PATH = 107;

/** The host side of one box's relay: a unix socket whose connections go to the proxy. */
export class HostRelay {
  private readonly sockets = new Set<net.Socket>();

  private constructor(
    private readonly server: net.Server,
    readonly dir: string,
  ) {}

  /** Listens at `<dir>/proxy.sock` (the directory is created, a stale socket replaced). */
  static async listen(dir: string, proxy: { host: string; port: number }, budget: RelayBudget): Promise<HostRelay> {
    const socketPath = path.join(dir, RELAY_SOCKET_NAME);
    if (Buffer.byteLength(socketPath) > MAX_SOCKET_PATH) {
      throw new Error(`the relay socket path is longer than ${MAX_SOCKET_PATH} bytes; use a shorter data directory`);
    }
    mkdirSync(dir, { recursive: true, mode: 0o711 });
    // The box's relay runs as its own uid: it must be able to reach the socket through the mount.
    chmodSync(dir, 0o711);
    rmSync(socketPath, { force: true });
    const gate = budget.gate();
    const relay = new HostRelay(
      net.createServer({ noDelay: true, allowHalfOpen: true }, (inside) => {
        // Bounded per box and for the server (relay-budget.ts): past either, a 503 that says which.
        const release = gate.admit(inside);
        if (!release) return;
        const out = net.connect({ host: proxy.host, port: proxy.port, noDelay: true, allowHalfOpen: true });
        relay.sockets.add(inside);
        relay.sockets.add(out);
        joinHalfOpen(inside, out, () => {
          relay.sockets.delete(inside);
          relay.sockets.delete(out);
          release();
        });
      }),
      dir,
    );
    await new Promise<void>((resolve, reject) => {
      relay.server.once('error', reject);
      relay.server.listen(socketPath, () => {
        relay.server.off('error', reject);
        resolve();
      });
    });
    chmodSync(socketPath, 0o666);
    return relay;
  }

  /** Stops listening and cuts every relayed connection. */
  async close(): Promise<void> {
    // Each one's 'close' gives its place in the budget back.
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
    rmSync(path.join(this.dir, RELAY_SOCKET_NAME), { force: true });
  }
}
