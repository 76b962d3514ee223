// A test server taken off the network and put back on the same port: for origins and providers
// whose address is part of what the code under test stored (an issuer URL, a gate's port), so that
// "nothing listens" is a real connection refused and the return a real listener again.
import type http from 'node:http';

/** Stops listening and cuts the open connections; the server keeps its state. */
export async function takeOffline(server: http.Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
}

/** Listens again on loopback `port` (a no-op when it already listens). */
export async function listenAgain(server: http.Server, port: number): Promise<void> {
  if (server.listening) return;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
}
