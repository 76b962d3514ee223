import { Client } from 'undici';
import { describe, expect, it } from 'vitest';
import { DockerDriver, dockerSocketPath } from '../../src/control-plane/drivers/docker.js';
import { BuildError } from '../../src/control-plane/drivers/types.js';

const socket = dockerSocketPath(process.env);
async function engineAnswers(): Promise<string | null> {
  if (!socket) return `DOCKER_HOST=${process.env.DOCKER_HOST} is not a unix socket`;
  try {
    const client = new Client('http://docker', { socketPath: socket, connect: { timeout: 2000 } });
    const res = await client.request({ method: 'GET', path: '/_ping', headersTimeout: 2000 });
    await res.body.dump();
    await client.close();
    return res.statusCode === 200 ? null : `engine answered ${res.statusCode}`;
  } catch (err) {
    return `no engine at unix://${socket} (${(err as { code?: string }).code ?? (err as Error).message})`;
  }
}
const noEngine = await engineAnswers();
if (noEngine) console.warn(`[keygate tests] Docker driver engine tests skipped: ${noEngine}`);

describe('Docker driver without an engine', () => {
  it('explains that no engine answers, naming the socket', async () => {
    const d = new DockerDriver({ DOCKER_HOST: 'unix:///nonexistent/docker.sock' });
    expect(await d.unavailableReason()).toMatch(/no container engine answers at unix:\/\/\/nonexistent\/docker\.sock/);
    expect(await new DockerDriver({ DOCKER_HOST: 'tcp://10.0.0.1:2375' }).unavailableReason()).toMatch(/not a unix socket/);
  });

  it('fails a build with the same reason instead of hanging', async () => {
    const d = new DockerDriver({ DOCKER_HOST: 'unix:///nonexistent/docker.sock' });
    const err = await d
      .build({ deploymentId: 'd', revisionId: 'r', revisionDir: '/nonexistent', source: 'external_docker', config: { image_uri: 'example/app:1' }, log: () => undefined, signal: new AbortController().signal })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BuildError);
    expect((err as Error).message).toMatch(/no container engine answers/);
  });
});

describe.skipIf(Boolean(noEngine))('Docker driver against a real engine', () => {
  it('reports the engine available and refuses an image that does not exist', async () => {
    const d = new DockerDriver(process.env);
    expect(await d.unavailableReason()).toBeNull();
    const lines: string[] = [];
    const err = await d
      .build({ deploymentId: 'd', revisionId: 'r', revisionDir: '/nonexistent', source: 'external_docker', config: { image_uri: 'keygate-test/does-not-exist:never' }, log: (_l, m) => lines.push(m), signal: new AbortController().signal })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BuildError);
    expect((err as Error).message).toContain('cannot pull keygate-test/does-not-exist:never');
  });
});
