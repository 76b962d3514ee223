// A secret's only use is a header the proxy injects, and an HTTP field value (RFC 9110 5.5) is
// VCHAR, SP, HTAB and obs-text: a value holding another control character (NUL, CR, LF, ESC, DEL
// ...) is refused when it is written, 422 at the value's loc, the value never echoed. Through the
// API: workspace secrets, and plaintext and opaque header values of a sandbox's proxy_config.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startInProcess, type InProcessServer } from '../server/inprocess.js';

let s: InProcessServer;
beforeAll(async () => {
  s = await startInProcess();
});
afterAll(async () => {
  await s?.close();
});

async function call(method: string, p: string, body: unknown) {
  const res = await fetch(s.url + p, { method, headers: { 'x-api-key': s.key, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, body: JSON.parse(text), text };
}

const MARK = 'sekrit-marker-77';
const BAD = ['\u0000', '\u0001', '\n', '\r', '\u001b', '\u001f', '\u007f'];
const name = (c: string) => `U+${c.charCodeAt(0).toString(16).padStart(4, '0')}`;

describe('workspace secrets', () => {
  it.each(BAD.map((c) => [name(c), c]))('a value with %s is refused at write time, never echoed', async (_n, c) => {
    const r = await call('POST', '/api/v1/workspaces/current/secrets', [{ key: 'CTL_SECRET', value: `${MARK}${c}tail` }]);
    expect(r.status, r.text).toBe(422);
    expect(r.body.detail).toEqual([{ loc: ['body', 0, 'value'], msg: expect.stringContaining('control character'), type: 'value_error' }]);
    expect(r.text).not.toContain(MARK);
    const names = await fetch(s.url + '/api/v1/workspaces/current/secrets', { headers: { 'x-api-key': s.key } }).then((x) => x.json());
    expect(names).not.toContainEqual({ key: 'CTL_SECRET' });
  });

  it('HTAB, SP and obs-text are field content: accepted', async () => {
    const r = await call('POST', '/api/v1/workspaces/current/secrets', [{ key: 'TAB_SECRET', value: 'a\tb c\u00e9' }]);
    expect(r.status, r.text).toBe(200);
  });
});

describe('plaintext and opaque header values', () => {
  const box = (type: string, value: string, n: string) => ({
    template_name: 'host',
    name: n,
    proxy_config: { rules: [{ name: 'r', match_hosts: ['api.example.test'], headers: [{ name: 'X-Token', type, value }] }] },
  });
  for (const type of ['plaintext', 'opaque']) {
    it.each(BAD.map((c) => [name(c), c]))(`${type}: a value with %s is refused on create and on patch, never echoed`, async (_n, c) => {
      const r = await call('POST', '/api/v2/sandboxes/boxes', box(type, `${MARK}${c}x`, 'ctl-box'));
      expect(r.status, r.text).toBe(422);
      expect(r.body.detail).toContainEqual(expect.objectContaining({ loc: ['body', 'proxy_config', 'rules', 0, 'headers', 0, 'value'] }));
      expect(r.text).not.toContain(MARK);
    });
  }
  it('on patch too', async () => {
    const made = await call('POST', '/api/v2/sandboxes/boxes', box('plaintext', 'fine', 'ctl-patch'));
    expect(made.status, made.text).toBe(201);
    for (const type of ['plaintext', 'opaque']) {
      const r = await call('PATCH', '/api/v2/sandboxes/boxes/ctl-patch', { proxy_config: box(type, `${MARK}\u0000`, 'x').proxy_config });
      expect(r.status, r.text).toBe(422);
      expect(r.text).not.toContain(MARK);
    }
  });
});
