// A public OAuth client (token_endpoint_auth_method none) never sends a client secret: a secret given
// for one would be stored and never used, so it is a 422 at client_secret (on create, and on a patch
// that would leave one on a public client), the secret never echoed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startInProcess, type InProcessServer } from '../server/inprocess.js';

let s: InProcessServer;
beforeAll(async () => {
  s = await startInProcess();
});
afterAll(async () => {
  await s?.close();
});

async function call(method: string, p: string, body?: unknown) {
  const res = await fetch(s.url + p, { method, headers: { 'x-api-key': s.key, ...(body ? { 'content-type': 'application/json' } : {}) }, body: body ? JSON.stringify(body) : undefined });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined, text };
}

const SECRET = 'client-secret-marker-5150';
const provider = (id: string, extra: Record<string, unknown>) => ({ provider_id: id, name: id, client_id: 'cid', auth_url: 'https://idp.example.test/authorize', token_url: 'https://idp.example.test/token', ...extra });

describe('client_secret on a public client', () => {
  it('create: 422 at client_secret, nothing stored', async () => {
    const r = await call('POST', '/v2/auth/providers', provider('pub1', { token_endpoint_auth_method: 'none', client_secret: SECRET }));
    expect(r.status, r.text).toBe(422);
    expect(r.body.detail).toEqual([{ loc: ['body', 'client_secret'], msg: expect.stringContaining('public client'), type: 'value_error' }]);
    expect(r.text).not.toContain(SECRET);
    expect((await call('GET', '/v2/auth/providers/pub1')).status).toBe(404);
  });

  it('patch: a secret for a public client, or a switch to public keeping the stored secret: 422; clearing it with the switch: 200', async () => {
    expect((await call('POST', '/v2/auth/providers', provider('pub2', { token_endpoint_auth_method: 'none' }))).status).toBe(201);
    const add = await call('PATCH', '/v2/auth/providers/pub2', { client_secret: SECRET });
    expect(add.status, add.text).toBe(422);
    expect(add.body.detail[0].loc).toEqual(['body', 'client_secret']);
    expect(add.text).not.toContain(SECRET);
    expect((await call('GET', '/v2/auth/providers/pub2')).body.has_client_secret).toBe(false);

    expect((await call('POST', '/v2/auth/providers', provider('conf1', { client_secret: SECRET }))).status).toBe(201);
    const toPublic = await call('PATCH', '/v2/auth/providers/conf1', { token_endpoint_auth_method: 'none' });
    expect(toPublic.status, toPublic.text).toBe(422);
    expect(toPublic.body.detail[0].loc).toEqual(['body', 'client_secret']);
    expect((await call('GET', '/v2/auth/providers/conf1')).body).toMatchObject({ token_endpoint_auth_method: 'client_secret_basic', has_client_secret: true });
    const cleared = await call('PATCH', '/v2/auth/providers/conf1', { token_endpoint_auth_method: 'none', client_secret: null });
    expect(cleared.status, cleared.text).toBe(200);
    expect(cleared.body).toMatchObject({ token_endpoint_auth_method: 'none', has_client_secret: false });
  });
});
