import { Client } from 'undici';

/**
 * The one check every real-engine test uses: does a Docker engine answer on its unix socket?
 * Returns null when it does, else the reason, which the caller prints before skipping, so a skip
 * is never silent. CI starts the engine with scripts/dockerd.sh.
 */
export function dockerSocket(env: NodeJS.ProcessEnv = process.env): string | null {
  const host = env.DOCKER_HOST;
  if (!host) return '/var/run/docker.sock';
  return host.startsWith('unix://') ? host.slice('unix://'.length) : null;
}

export async function engineUnavailableReason(env: NodeJS.ProcessEnv = process.env): Promise<string | null> {
  const socket = dockerSocket(env);
  if (!socket) return `DOCKER_HOST=${env.DOCKER_HOST} is not a unix socket`;
  const client = new Client('http://docker', { socketPath: socket, connect: { timeout: 2000 } });
  try {
    const res = await client.request({ method: 'GET', path: '/_ping', headersTimeout: 2000 });
    await res.body.dump();
    return res.statusCode === 200 ? null : `the engine at unix://${socket} answered ${res.statusCode}`;
  } catch (err) {
    return `no engine at unix://${socket} (${(err as { code?: string }).code ?? (err as Error).message}); start one with scripts/dockerd.sh start`;
  } finally {
    await client.close().catch(() => undefined);
  }
}

/** Prints why `what` is skipped (visible in the test output) and returns whether to skip. */
export function announceSkip(what: string, reason: string | null): boolean {
  if (reason) console.warn(`[keygate tests] ${what} skipped: ${reason}`);
  return Boolean(reason);
}
