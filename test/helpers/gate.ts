/**
 * A TCP relay to a local port that can hold new connections: while shut, a connection is
 * accepted and left waiting until the gate opens, so a test can keep an upstream dial in flight
 * across something it does meanwhile (a change of the egress policy). Loopback only.
 */
import net from 'node:net';

export interface Gate {
  /** The relay's port on 127.0.0.1. */
  port: number;
  /** New connections wait from now on. */
  shut(): void;
  /** Waiting connections, and new ones, go through. */
  open(): void;
  close(): void;
}

export async function tcpGate(targetPort: number): Promise<Gate> {
  let wait: Promise<void> = Promise.resolve();
  let release = (): void => undefined;
  const relay = net.createServer((c) => {
    c.on('error', () => undefined);
    void wait.then(() => {
      const u = net.connect(targetPort, '127.0.0.1');
      u.on('error', () => c.destroy());
      c.pipe(u).pipe(c);
    });
  });
  await new Promise<void>((r) => relay.listen(0, '127.0.0.1', () => r()));
  return {
    port: (relay.address() as net.AddressInfo).port,
    shut: () => void (wait = new Promise<void>((r) => (release = r))),
    open: () => release(),
    close: () => void relay.close(),
  };
}
