// A field the API accepts is a field it uses: source_revision_config fields that the deployment's
// source does not use (image_uri for an uploaded source, source_tarball_path for an image) are a
// 422 at that field, on create and on patch, never stored and ignored.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startInProcess, type InProcessServer } from '../server/inprocess.js';
import { api, cleanupTmp, echoVariant, packDir, type Api } from './helpers.js';

let s: InProcessServer;
let a: Api;
beforeAll(async () => {
  s = await startInProcess();
  a = api(s.url, s.key);
});
afterAll(async () => {
  await s?.close();
  cleanupTmp();
});

const upload = async () => (await a.upload(await packDir(echoVariant({ 'keygate.json': '{ not json' })))).body.source_tarball_path as string;

describe('source_revision_config fields the source does not use', () => {
  it('internal_source with an image_uri: 422 at image_uri, nothing created', async () => {
    const p = await upload();
    const r = await a.call('POST', '/v2/deployments', { name: 'mixed-src', source: 'internal_source', source_revision_config: { source_tarball_path: p, image_uri: 'nginx:1.27' } });
    expect(r.status, r.text).toBe(422);
    expect(r.body.detail).toEqual([{ loc: ['body', 'source_revision_config', 'image_uri'], msg: expect.stringContaining('not used by source internal_source'), type: 'value_error' }]);
    expect((await a.call('GET', '/v2/deployments?name_contains=mixed-src')).body.resources).toEqual([]);
  });

  it('an image source with a source_tarball_path: 422 at source_tarball_path (before the driver is asked)', async () => {
    for (const source of ['internal_docker', 'external_docker']) {
      const r = await a.call('POST', '/v2/deployments', { name: 'mixed-img', source, source_revision_config: { image_uri: 'nginx:1.27', source_tarball_path: 'uploads/x.tar.gz' } });
      expect(r.status, r.text).toBe(422);
      expect(r.body.detail).toEqual([{ loc: ['body', 'source_revision_config', 'source_tarball_path'], msg: expect.stringContaining(`not used by source ${source}`), type: 'value_error' }]);
    }
  });

  it('null stands for "not given": accepted', async () => {
    const r = await a.call('POST', '/v2/deployments', { name: 'null-img', source: 'internal_source', source_revision_config: { source_tarball_path: await upload(), image_uri: null } });
    expect(r.status, r.text).toBe(201);
  });

  it('patch: an image_uri next to a new upload is a 422, no revision made', async () => {
    const made = await a.call('POST', '/v2/deployments', { name: 'patch-mixed', source: 'internal_source', source_revision_config: { source_tarball_path: await upload() } });
    expect(made.status, made.text).toBe(201);
    const r = await a.call('PATCH', `/v2/deployments/${made.body.id}`, { source_revision_config: { source_tarball_path: await upload(), image_uri: 'nginx:1.27' } });
    expect(r.status, r.text).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['body', 'source_revision_config', 'image_uri']);
    expect((await a.call('GET', `/v2/deployments/${made.body.id}/revisions`)).body.resources).toHaveLength(1);
  });
});
