/**
 * The relay (sandbox.md, property 1): `127.0.0.1:3128` inside a box answers and forwards to the
 * box's own proxy on the host, and to nothing else.
 *
 * How: a short-lived helper enters only the box's user and network namespaces (`nsenter --user --net`),
 * opens a listening socket on 127.0.0.1:3128 there, hands the listening socket to this server over
 * the Node IPC channel, and exits. A socket stays in the namespace it was created in, so this server
 * then accepts the box's connections itself and pipes each one to `proxy.host:port` from the host's
 * namespace. Unlike a unix socket bind-mounted into the box (anthropic's sandbox-runtime), nothing of
 * keygate is mounted in and no relay process runs in the box; the box sees a loopback port only.
 * When this server dies, the socket closes with it: a box is never left with a path out.
 */
import { spawn } from 'node:child_process';
import net from 'node:net';
import { joinHalfOpen } from '../half-open.js';
import type { RelayBudget } from './relay-budget.js';

export const RELAY_PORT = 3128;

// Runs in the box's network namespace (and the host's mount namespace, so it needs nothing of the
// box's root filesystem). Prints nothing: the parent learns failure from the exit code.
const HELPER = `
const s = require('net').createServer();
s.on('error', () => process.exit(3));
s.listen({ port: ${RELAY_PORT}, host: '127.0.0.1', backlog: 128 }, () => process.send('relay', s, () => process.exit(0)));
setTimeout(() => process.exit(4), 10000).unref();
`;

export interface Relay {
  close(): void;
}

/**
 * Opens the box's relay. `enterNet` is the command line that enters the box's user and network
 * namespaces (given as `nsFds`, seen by it from fd 4 on) and runs what follows it. Rejects with the reason when the socket cannot be opened.
 */
export async function openRelay(enterNet: string[], nsFds: number[], proxy: { host: string; port: number }, budget: RelayBudget): Promise<Relay> {
  const listener = await new Promise<net.Server>((resolve, reject) => {
    const child = spawn(enterNet[0], [...enterNet.slice(1), process.execPath, '--max-old-space-size=16', '-e', HELPER], {
      // No environment of this server reaches the helper (it runs in the box's user namespace: as
      // the box's user for an unprivileged server; for a root server, as this server's uid, which
      // that namespace does not map and which holds no capability there).
      env: {},
      // fd 3 is the IPC channel; the namespace descriptors follow it (as `enterNet` names them).
      stdio: ['ignore', 'ignore', 'pipe', 'ipc', ...nsFds],
    });
    let err = '';
    child.stderr!.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-500)));
    let got: net.Server | null = null;
    child.on('message', (msg, handle) => {
      if (msg === 'relay' && handle instanceof net.Server) got = handle;
    });
    child.on('error', (e) => reject(new Error(`relay helper: ${e.message}`)));
    // 'close', not 'exit': the helper sends the socket and exits at once, and its exit can be
    // reported before the message carrying the socket is (seen under load: `exit 0` with no
    // socket). 'close' comes only once the IPC channel has been read to its end.
    child.on('close', (code) => {
      if (got) resolve(got);
      else reject(new Error(`relay could not listen in the box (exit ${code})${err ? `: ${err.trim()}` : ''}`));
    });
  });
  // The server Node made from the helper's socket is a plain net.Server, and its connections
  // must allow half-open like the proxy's own (join.ts). The option is read from this property
  // at each connection (not typed; relay-half-close.test.ts fails if it stops working).
  (listener as net.Server & { allowHalfOpen: boolean }).allowHalfOpen = true;
  const open = new Set<net.Socket>();
  const gate = budget.gate();
  listener.on('connection', (inBox: net.Socket) => {
    // Bounded per box and for the server (relay-budget.ts): past either, a 503 that says which.
    const release = gate.admit(inBox);
    if (!release) return;
    const out = net.connect({ host: proxy.host, port: proxy.port, allowHalfOpen: true });
    open.add(inBox);
    open.add(out);
    joinHalfOpen(inBox, out, () => {
      open.delete(inBox);
      open.delete(out);
      release();
    });
  });
  listener.on('error', () => listener.close());
  return {
    close() {
      listener.close();
      // Each one's 'close' gives its place in the budget back.
      for (const s of open) s.destroy();
    },
  };
}
