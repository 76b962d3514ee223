// The deployment log stream (text/event-stream, follows until the client leaves) is authorised for
// as long as it runs: when the API key it was opened with is deleted, or the deployment is, it ends
// at its next heartbeat with an error event, instead of following on forever. In-process server,
// real HTTP client, the key deleted through the API.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey } from '../../src/server/auth.js';
import { startInProcess, type InProcessServer } from '../server/inprocess.js';
import { api, cleanupTmp, echoVariant, packDir, type Api } from './helpers.js';

let s: InProcessServer;
let a: Api;
beforeAll(async () => {
  s = await startInProcess({ env: { KEYGATE_STREAM_HEARTBEAT_MS: '200' } });
  a = api(s.url, s.key);
});
afterAll(async () => {
  await s?.close();
  cleanupTmp();
});

/** A deployment whose build fails at once: nothing runs, its log exists. */
async function brokenDeployment(name: string): Promise<string> {
  const up = await a.upload(await packDir(echoVariant({ 'keygate.json': '{ not json' })));
  expect(up.status, up.text).toBe(201);
  const res = await a.call('POST', '/v2/deployments', { name, source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
  expect(res.status, res.text).toBe(201);
  return res.body.id;
}

/** Opens the stream and collects its text until the server ends it. */
async function follow(depId: string, key: string): Promise<{ opened: Promise<number>; ended: Promise<string> }> {
  const res = await fetch(`${s.url}/v2/deployments/${depId}/logs/stream`, { headers: { 'x-api-key': key } });
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = '';
  const ended = (async () => {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return text;
      text += dec.decode(value, { stream: true });
    }
  })();
  return { opened: Promise.resolve(res.status), ended };
}

function lastEvent(text: string): { event: string; data: any } {
  const blocks = text.split('\n\n').filter((b) => b.startsWith('event: '));
  const last = blocks.at(-1)!;
  return { event: /^event: (.*)$/m.exec(last)![1], data: JSON.parse(/^data: (.*)$/m.exec(last)![1]) };
}

describe('the log stream re-checks its caller', () => {
  it('ends after the API key it was opened with is deleted through the API', async () => {
    const dep = await brokenDeployment('stream-key');
    const second = await createApiKey(s.built.ctx.db, { workspace: 'default', user: 'admin', name: 'stream' });
    const stream = await follow(dep, second.key);
    expect(await stream.opened).toBe(200);
    const del = await a.call('DELETE', `/api/v1/api-key/${second.id}`);
    expect(del.status, del.text).toBe(204);
    const text = await stream.ended;
    expect(lastEvent(text)).toEqual({ event: 'error', data: { detail: expect.stringContaining('no longer valid') } });
    // And the key no longer opens anything.
    expect((await fetch(`${s.url}/v2/deployments/${dep}/logs/stream`, { headers: { 'x-api-key': second.key } })).status).toBe(401);
  });

  it('ends after the deployment it follows is deleted', async () => {
    const dep = await brokenDeployment('stream-dep');
    const stream = await follow(dep, s.key);
    expect(await stream.opened).toBe(200);
    expect((await a.call('DELETE', `/v2/deployments/${dep}`)).status).toBe(204);
    const text = await stream.ended;
    expect(lastEvent(text)).toEqual({ event: 'error', data: { detail: `Deployment ID ${dep} not found.` } });
  });
});

describe('the log stream and shutdown', () => {
  it('an open log stream is ended when the server closes, and does not hold close() open', async () => {
    const own = await startInProcess({ env: { KEYGATE_STREAM_HEARTBEAT_MS: '60000' } });
    const mine = api(own.url, own.key);
    const up = await mine.upload(await packDir(echoVariant({ 'keygate.json': '{ not json' })));
    const dep = (await mine.call('POST', '/v2/deployments', { name: 'closing', source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path } })).body.id;
    const res = await fetch(`${own.url}/v2/deployments/${dep}/logs/stream`, { headers: { 'x-api-key': own.key } });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const ended = (async () => {
      for (;;) if ((await reader.read()).done) return true;
    })();
    await own.close();
    expect(await ended).toBe(true);
  });
});
