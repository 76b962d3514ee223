// The deployment router (src/control-plane/router.ts) in front of a real echo application run by a
// real `keygate serve`, driven by curl as a user would (issue #17 items 2 and 4, #18 item 3).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { appRequestHeaders } from '../../src/control-plane/router.js';
import { curl } from '../helpers/curl.js';
import { runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { api, cleanupTmp, deployDir, echoVariant, tmpDir, waitRevision, type Api } from './helpers.js';

const KEY = 'kg_test_router_key_00000000001';
afterAll(cleanupTmp);


const runRequest = (padding: number) =>
  JSON.stringify({ assistant_id: 'agent', input: { messages: [{ role: 'user', content: 'hi' }] }, stream_mode: 'values', config: { configurable: { delay_ms: 0 } } }) + ' '.repeat(padding);

describe('deployment router against a real application', () => {
  let server: RunningCli;
  let a: Api;
  let otherKey: string;
  let url: string;
  let bodyFile: string;

  beforeAll(async () => {
    const dataDir = tmpDir();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], { env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '' } });
    a = api(server.url, KEY);
    const made = runCli(['serve', 'keys', 'create', '--workspace', 'team-b', '--user', 'bob', '--data', dataDir]);
    expect(made.status, made.stderr).toBe(0);
    otherKey = made.stdout.trim();
    const dep = await deployDir(a, 'router-echo', echoVariant());
    expect((await waitRevision(a, dep.id, dep.latest_revision_id)).status).toBe('DEPLOYED');
    url = dep.url;
    bodyFile = `${tmpDir()}/body.json`;
  }, 90_000);
  afterAll(async () => {
    expect(await server.stop()).toBe(0);
  });

  const post = (extra: string[], file: string) =>
    curl(['-X', 'POST', '-H', `x-api-key: ${KEY}`, '-H', 'content-type: application/json', '--data-binary', `@${file}`, ...extra, `${url}/runs/stream`]);

  it('a body over 1 MiB (curl sends Expect: 100-continue on its own) reaches the app', async () => {
    const { writeFileSync } = await import('node:fs');
    writeFileSync(bodyFile, runRequest(1536 * 1024));
    const r = post(['-v'], bodyFile);
    expect(r.stderr).toMatch(/> Expect: 100-continue/i);
    expect(r.status).toBe(200);
    expect(String(r.body)).toContain('event: end');
  });

  it('a caller refused before its body is read (no key, a wrong key) gets the refusal without a 100; an accepted one gets the 100', async () => {
    const { writeFileSync } = await import('node:fs');
    writeFileSync(bodyFile, runRequest(1536 * 1024));
    for (const key of [[], ['-H', 'x-api-key: kg_not_a_key_0000000000']]) {
      const r = curl(['-v', '-X', 'POST', ...key, '-H', 'content-type: application/json', '--data-binary', `@${bodyFile}`, `${url}/runs/stream`]);
      expect(r.stderr).toMatch(/> Expect: 100-continue/i);
      expect(r.status).toBe(401);
      expect(r.stderr).not.toMatch(/< HTTP\/1\.1 100/);
    }
    const ok = post(['-v'], bodyFile);
    expect(ok.stderr).toMatch(/< HTTP\/1\.1 100 Continue/);
    expect(ok.status).toBe(200);
  });

  it('an explicit Expect: 100-continue on a small body reaches the app', async () => {
    const { writeFileSync } = await import('node:fs');
    writeFileSync(bodyFile, runRequest(0));
    const r = post(['-H', 'Expect: 100-continue'], bodyFile);
    expect(r.status).toBe(200);
    expect(String(r.body)).toContain('event: end');
  });

  // The app answers 413 before reading the body; it must not reset the connection while the router
  // is still sending the rest of it (the reset discarded the answer and the router said 502).
  it.each([
    ['with', []],
    ['without', ['-H', 'Expect:']],
  ])("a body over the app's limit gets the app's own 413, not a 502 (%s Expect: 100-continue)", async (_, extra) => {
    const { writeFileSync } = await import('node:fs');
    writeFileSync(bodyFile, runRequest(11 * 1024 * 1024));
    const r = post(['-v', ...extra], bodyFile);
    if (extra.length === 0) expect(r.stderr).toMatch(/> Expect: 100-continue/i);
    else expect(r.stderr).not.toMatch(/> Expect:/i);
    expect(r.status).toBe(413);
    expect(r.body.detail).toMatch(/^Request body too large \(limit \d+ bytes\)\.$/);
  });

  it("the app's own 4xx passes through unchanged", () => {
    const r = curl(['-H', `x-api-key: ${KEY}`, `${url}/assistants/nobody-here`]);
    expect(r.status).toBe(404);
    expect(r.body).toEqual({ detail: "Assistant 'nobody-here' not found." });
  });

  it('GET /ok needs no key (public in app serve); other routes still do', () => {
    expect(curl([`${url}/ok`]).status).toBe(200);
    const r = curl([`${url}/assistants`]);
    expect(r.status).toBe(401);
    expect(typeof r.body.detail).toBe('string');
  });

  it("a valid key of another workspace is 403, an unknown key 401", () => {
    const other = curl(['-H', `x-api-key: ${otherKey}`, `${url}/assistants`]);
    expect(other.status).toBe(403);
    expect(typeof other.body.detail).toBe('string');
    expect(JSON.stringify(other.body)).not.toContain(otherKey);
    expect(curl(['-H', 'x-api-key: kg_not_a_key_at_all_000000000', `${url}/assistants`]).status).toBe(401);
  });

  it('oversized headers get 431 in the wire shape', () => {
    const r = curl(['-H', `x-big: ${'b'.repeat(20_000)}`, '-H', `x-api-key: ${KEY}`, `${url}/assistants`]);
    expect(r.status).toBe(431);
    expect(r.body).toEqual({ detail: 'Request headers are too large.' });
  });
});

describe('appRequestHeaders (what a replica receives)', () => {
  const pairs = (flat: string[]) => Array.from({ length: flat.length / 2 }, (_, i) => [flat[2 * i].toLowerCase(), flat[2 * i + 1]]);

  it('drops hop-by-hop headers, those named in Connection, Expect and Host; replaces the key and framing', () => {
    const out = pairs(
      appRequestHeaders(
        ['Host', 'x', 'Connection', 'keep-alive, X-Session-Secret', 'X-Session-Secret', 's3cret', 'Expect', '100-continue', 'X-Api-Key', 'caller-key', 'Content-Length', '999', 'TE', 'trailers', 'X-Forwarded-For', '6.6.6.6', 'Accept', 'text/event-stream'],
        { apiKey: 'kgi_app', contentLength: 12, remoteAddress: '127.0.0.1' },
      ),
    );
    expect(out).toEqual([
      ['accept', 'text/event-stream'],
      ['x-api-key', 'kgi_app'],
      ['x-forwarded-for', '127.0.0.1'],
      ['x-forwarded-proto', 'http'],
      ['content-length', '12'],
    ]);
  });

  it('sends no Content-Length for a streamed body of unknown length', () => {
    const out = pairs(appRequestHeaders(['Transfer-Encoding', 'chunked'], { apiKey: 'k', remoteAddress: '::1' }));
    expect(out.map(([k]) => k)).toEqual(['x-api-key', 'x-forwarded-for', 'x-forwarded-proto']);
  });
});
