// Deployment secrets never come back out: not in an API answer, a revision record, a build or
// deploy log line, nor the server's own output, whatever their shape (a value an environment cannot
// carry, a multi-line value such as a PEM key, a value the app prints as JSON). A real `keygate
// serve` running real app processes on a real SQLite file.
import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { api, cleanupTmp, echoVariant, packDir, runStream, tmpDir, waitRevision, type Api } from './helpers.js';

const KEY = 'kg_test_control_plane_key_leaks';
afterAll(cleanupTmp);

/** Every text the server lets out about deployment `id`: its record, revisions, both logs, the list. */
async function everythingAbout(a: Api, id: string): Promise<string> {
  const paths = [`/v2/deployments/${id}`, '/v2/deployments?limit=100', `/v2/deployments/${id}/revisions`, `/v2/deployments/${id}/logs?limit=1000`];
  const out: string[] = [];
  for (const p of paths) out.push((await a.call('GET', p)).text);
  return out.join('\n');
}

/** Uploads `dir` as deployment `name` with `secrets` and waits until its first revision is DEPLOYED. */
async function deployDir(a: Api, dir: string, name: string, secrets?: { name: string; value: string }[]): Promise<{ id: string; latest_revision_id: string }> {
  const up = await a.upload(await packDir(dir));
  const created = await a.call('POST', '/v2/deployments', {
    name,
    source: 'internal_source',
    source_revision_config: { source_tarball_path: up.body.source_tarball_path },
    ...(secrets ? { secrets } : {}),
  });
  expect(created.status, created.text).toBe(201);
  expect((await waitRevision(a, created.body.id, created.body.latest_revision_id)).status).toBe('DEPLOYED');
  return created.body;
}

describe('deployment secrets never leak (SQLite, local driver)', () => {
  let server: RunningCli;
  let a: Api;
  let dataDir: string;
  beforeAll(async () => {
    dataDir = tmpDir();
    server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], {
      env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock', KEYGATE_STOP_GRACE_MS: '2000' },
    });
    a = api(server.url, KEY);
  });
  afterAll(async () => {
    await server.stop();
  });

  it('refuses a secret value no environment can carry (NUL) with a 422 at its loc, on create and on patch, without echoing it', async () => {
    const headA = 'nulhead-' + 'k3'.repeat(8);
    const tailA = 'nultail-' + 'p5'.repeat(8);
    const value = `${headA}\u0000${tailA}`;
    const up = await a.upload(await packDir(echoVariant()));
    expect(up.status).toBe(201);
    const body = { name: 'nul-secret', source: 'internal_source', source_revision_config: { source_tarball_path: up.body.source_tarball_path }, secrets: [{ name: 'OK_ONE', value: 'fine' }, { name: 'BAD_ONE', value }] };
    const created = await a.call('POST', '/v2/deployments', body);
    let seen = created.text;
    if (created.status === 201) {
      // The old behaviour: accepted, then the replica's spawn fails with a message quoting the value.
      await waitRevision(a, created.body.id, created.body.latest_revision_id);
      seen += await everythingAbout(a, created.body.id);
    }
    seen += server.output();
    expect(seen).not.toContain(headA);
    expect(seen).not.toContain(tailA);
    expect(created.status, created.text).toBe(422);
    expect(created.body.detail).toEqual([{ loc: ['body', 'secrets', 1, 'value'], msg: expect.stringMatching(/NUL/), type: 'value_error' }]);
    expect((await a.call('GET', '/v2/deployments?name_contains=nul-secret')).body.resources).toEqual([]);

    // The same on PATCH, and a refused PATCH changes nothing: the stored secrets and revisions stay.
    const ok = await a.call('POST', '/v2/deployments', { ...body, name: 'nul-patch', secrets: [{ name: 'KEEP_ME', value: 'kept-value' }] });
    expect(ok.status, ok.text).toBe(201);
    await waitRevision(a, ok.body.id, ok.body.latest_revision_id);
    const before = await a.call('GET', `/v2/deployments/${ok.body.id}/revisions`);
    const up2 = await a.upload(await packDir(echoVariant()));
    const patched = await a.call('PATCH', `/v2/deployments/${ok.body.id}`, { secrets: [{ name: 'BAD_ONE', value }], source_revision_config: { source_tarball_path: up2.body.source_tarball_path } });
    expect(patched.status, patched.text).toBe(422);
    expect(patched.body.detail[0].loc).toEqual(['body', 'secrets', 0, 'value']);
    expect(patched.text).not.toContain(headA);
    const after = await a.call('GET', `/v2/deployments/${ok.body.id}`);
    expect(after.body.secrets).toEqual([{ name: 'KEEP_ME' }]);
    expect(after.body.latest_revision_id).toBe(ok.body.latest_revision_id);
    expect((await a.call('GET', `/v2/deployments/${ok.body.id}/revisions`)).body.resources).toHaveLength(before.body.resources.length);
    expect((await a.call('DELETE', `/v2/deployments/${ok.body.id}`)).status).toBe(204);
  });

  it('redacts a multi-line secret (a PEM key) and its JSON-escaped form when the app prints them', async () => {
    const lines = ['-----BEGIN TEST KEY-----', 'MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7' + 'x'.repeat(12), 'bG9uZ2VyIGxpbmUgb2Ygc2VjcmV0IGJhc2U2NCBjb250ZW50Cg' + 'y'.repeat(12), '-----END TEST KEY-----'];
    const pem = lines.join('\n') + '\n';
    const quoted = 'q-"json"-\\-' + 'w8'.repeat(10);
    const agent = readFileSync(path.join(echoVariant(), 'src/agent.js'), 'utf8');
    const leaky = echoVariant({
      'src/agent.js': `console.log('key follows:\\n' + process.env.PEM_KEY);\nconsole.log(JSON.stringify({ env: { PEM_KEY: process.env.PEM_KEY, QUOTED: process.env.QUOTED } }));\n${agent}`,
    });
    const deployed = await deployDir(a, leaky, 'pem-secret', [
      { name: 'PEM_KEY', value: pem },
      { name: 'QUOTED', value: quoted },
    ]);
    let text = '';
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      text = await everythingAbout(a, deployed.id);
      if (text.includes("key follows:") && text.includes(String.raw`\"env\"`)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(text).toContain('key follows:');
    expect(text).toContain(String.raw`\"env\"`);
    const all = text + server.output();
    // Each line of the key is secret material (the armour lines too: they say what the secret is).
    for (const l of lines.slice(1, 3)) expect(all).not.toContain(l);
    expect(all).not.toContain(JSON.stringify(pem).slice(1, -1));
    expect(all).not.toContain(JSON.stringify(quoted).slice(1, -1));
    expect(all).not.toContain('w8'.repeat(10));
    expect((await a.call('DELETE', `/v2/deployments/${deployed.id}`)).status).toBe(204);
  });

  it("keeps the replica's own API key (the router's credential to it) out of the deploy log, even when the app prints its whole environment", async () => {
    const agent = readFileSync(path.join(echoVariant(), 'src/agent.js'), 'utf8');
    // The runtime deletes KEYGATE_API_KEY from process.env before the app loads; /proc still has it.
    const nosy = echoVariant({ 'src/agent.js': `import { readFileSync } from 'node:fs';\nconsole.log('environ: ' + readFileSync('/proc/self/environ', 'latin1').split('\\0').join(' '));\n${agent}` });
    const deployed = await deployDir(a, nosy, 'nosy');
    let text = '';
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline && !text.includes('environ: ')) {
      text = await everythingAbout(a, deployed.id);
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(text).toContain('KEYGATE_API_KEY=');
    expect(text).not.toMatch(/kgi_[A-Za-z0-9_-]{16}/);
    expect(server.output()).not.toMatch(/kgi_[A-Za-z0-9_-]{16}/);
    expect((await a.call('DELETE', `/v2/deployments/${deployed.id}`)).status).toBe(204);
  });

  it("keeps secret values and the replica's API key out of a failed run's error event (stream and wait) and the logs", async () => {
    const plain = 'thrown-secret-' + 'h7'.repeat(10);
    const pemLines = ['-----BEGIN RUN KEY-----', 'runkeyline1' + 'Z9'.repeat(12), 'runkeyline2' + 'Q4'.repeat(12), '-----END RUN KEY-----'];
    const pem = pemLines.join('\n') + '\n';
    // The app quotes the secrets in its exception (a common mistake: an upstream's error that
    // echoes the request's key), a multi-line one JSON-escaped, and the replica's own key read
    // from /proc (process.env no longer has it), also in the error's cause.
    const thrower = echoVariant({
      'src/agent.js': `import { readFileSync } from 'node:fs';
const replicaKey = readFileSync('/proc/self/environ', 'latin1').split('\\0').find((v) => v.startsWith('KEYGATE_API_KEY=')).slice('KEYGATE_API_KEY='.length);
export default {
  async run(input, ctx) {
    ctx.log.error({ detail: 'upstream said ' + ctx.env.PLAIN_SECRET }, 'calling with ' + replicaKey);
    throw new Error('upstream refused key ' + ctx.env.PLAIN_SECRET + ' pem ' + JSON.stringify(ctx.env.PEM_SECRET) + ' raw ' + ctx.env.PEM_SECRET, { cause: new Error('replica key ' + replicaKey) });
  },
};
`,
    });
    const deployed = await deployDir(a, thrower, 'thrower', [
      { name: 'PLAIN_SECRET', value: plain },
      { name: 'PEM_SECRET', value: pem },
    ]);
    const url = (await a.call('GET', `/v2/deployments/${deployed.id}`)).body.url;
    const streamed = await runStream(url, KEY, 'hi');
    expect(streamed.status).toBe(200);
    const error = streamed.events.find((e) => e.event === 'error');
    expect(error, streamed.text).toBeDefined();
    const payload = JSON.parse(error!.data);
    // The sentence stays useful: only the secret parts are gone.
    expect(payload.error).toBe('Error');
    expect(payload.message).toContain('upstream refused key [redacted]');
    expect(payload.message).toContain('replica key [redacted]');
    const waited = await fetch(`${url}/runs/wait`, { method: 'POST', headers: { 'x-api-key': KEY, 'content-type': 'application/json' }, body: JSON.stringify({ assistant_id: 'agent', input: {} }) });
    const waitText = await waited.text();
    expect(waitText).toContain('__error__');
    let logs = '';
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && !logs.includes('run failed')) {
      logs = await everythingAbout(a, deployed.id);
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(logs).toContain('run failed');
    for (const seen of [streamed.text, waitText, logs, server.output()]) {
      expect(seen).not.toContain(plain);
      for (const l of pemLines.slice(1, 3)) expect(seen).not.toContain(l);
      expect(seen).not.toMatch(/kgi_[A-Za-z0-9_-]{16}/);
    }
    expect((await a.call('DELETE', `/v2/deployments/${deployed.id}`)).status).toBe(204);
  });

  it('a PATCH that fails while staging its source changes nothing: secrets and latest revision stay', async () => {
    const created = await a.call('POST', '/v2/deployments', {
      name: 'half',
      source: 'internal_source',
      source_revision_config: { source_tarball_path: (await a.upload(await packDir(echoVariant()))).body.source_tarball_path },
      secrets: [{ name: 'KEPT', value: 'kept-value' }],
    });
    expect(created.status, created.text).toBe(201);
    await waitRevision(a, created.body.id, created.body.latest_revision_id);
    const up = await a.upload(await packDir(echoVariant()));
    // A real fault of the file system: the revisions directory is not a directory any more.
    const revs = path.join(dataDir, 'deployments', created.body.id, 'revisions');
    renameSync(revs, `${revs}.moved`);
    writeFileSync(revs, 'not a directory');
    try {
      const patched = await a.call('PATCH', `/v2/deployments/${created.body.id}`, { secrets: [{ name: 'REPLACED', value: 'new-value' }], source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
      expect(patched.status).toBe(500);
      expect(patched.body).toEqual({ detail: 'Internal server error.' });
    } finally {
      rmSync(revs);
      renameSync(`${revs}.moved`, revs);
    }
    const after = await a.call('GET', `/v2/deployments/${created.body.id}`);
    expect(after.body.secrets).toEqual([{ name: 'KEPT' }]);
    expect(after.body.latest_revision_id).toBe(created.body.latest_revision_id);
    // And the same PATCH once the file system is back goes through whole.
    const again = await a.call('PATCH', `/v2/deployments/${created.body.id}`, { secrets: [{ name: 'REPLACED', value: 'new-value' }], source_revision_config: { source_tarball_path: up.body.source_tarball_path } });
    expect(again.status, again.text).toBe(200);
    expect(again.body.secrets).toEqual([{ name: 'REPLACED' }]);
    expect(again.body.latest_revision_id).not.toBe(created.body.latest_revision_id);
    await waitRevision(a, created.body.id, again.body.latest_revision_id);
    expect((await a.call('DELETE', `/v2/deployments/${created.body.id}`)).status).toBe(204);
  });

  it('stores no secret in clear in the database file', async () => {
    await new Promise((r) => setTimeout(r, 300));
    for (const f of ['keygate.db', 'keygate.db-wal']) {
      const file = path.join(dataDir, f);
      if (existsSync(file)) {
        const raw = readFileSync(file);
        for (const v of ['kept-value', 'MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7']) expect(raw.includes(Buffer.from(v))).toBe(false);
      }
    }
  });
});

describe('a replica that cannot be spawned', () => {
  it('fails with the error code only, never the environment value spawn quotes', async () => {
    const { LocalProcessDriver } = await import('../../src/control-plane/drivers/local.js');
    const { failureReason } = await import('../../src/control-plane/drivers/types.js');
    const driver = new LocalProcessDriver({ dataDir: tmpDir(), limits: {} as never, buildTimeoutMs: 1000, allowInstallScripts: false });
    const secret = 'spawnleak-' + 'r4'.repeat(8);
    const failed = await driver
      .start({ deploymentId: 'd', revisionId: 'r', replica: 1, artifact: tmpDir(), env: { S: `${secret}\u0000tail` }, apiKey: 'kgi_x', log: () => undefined, startTimeoutMs: 1000, redact: (s) => s })
      .then(
        () => null,
        (e: Error) => e,
      );
    expect(failed).toBeInstanceOf(Error);
    expect(failed!.name).toBe('DeployError');
    expect(failureReason(failed)).toMatch(/could not be started \(ERR_INVALID_ARG_VALUE\)/);
    expect(failureReason(failed)).not.toContain(secret);
    // An error of someone else's making is named, not quoted; a system call's failure keeps its path.
    const quoting = Object.assign(new TypeError(`bad value '${secret}'`), { code: 'ERR_INVALID_ARG_VALUE' });
    expect(failureReason(quoting)).toBe('internal error (TypeError ERR_INVALID_ARG_VALUE)');
    const sys = Object.assign(new Error("ENOENT: no such file or directory, open '/x/y'"), { code: 'ENOENT', syscall: 'open' });
    expect(failureReason(sys)).toBe("ENOENT: no such file or directory, open '/x/y'");
  });
});
