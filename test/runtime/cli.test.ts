// End to end through the real binary (`node dist/cli/main.js app serve`, built by `npm test`),
// with three independent SSE clients: eventsource-parser, curl -N and Python requests.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, REPO_ROOT, runCli, startCli, type RunningCli } from '../helpers/cli.js';
import { getJson, names, streamRun } from './sse-client.js';

const ECHO_APP = path.join(REPO_ROOT, 'examples/echo-agent');
const FIXTURE_APP = path.join(REPO_ROOT, 'test/runtime/fixtures/app');
const KEY = 'test-key';
const HELLO = { messages: [{ role: 'human', content: 'one two three four' }] };

/** The first interpreter that has `requests` (the brief names /usr/bin/python3; pyenv shims may be first on PATH). */
function findPython(): string | undefined {
  for (const candidate of [process.env.KEYGATE_TEST_PYTHON, '/usr/bin/python3', 'python3', 'python'].filter(Boolean) as string[]) {
    const r = spawnSync(candidate, ['-c', 'import requests'], { stdio: 'ignore' });
    if (r.status === 0) return candidate;
  }
  return undefined;
}
const PYTHON = findPython();

let echo: RunningCli;
let tmp: string;
const started: RunningCli[] = [];

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run 'npm run build' first`);
  tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-app-cli-'));
  echo = await startCli(['app', 'serve', '--app', ECHO_APP, '--listen', '127.0.0.1:0', '--heartbeat-ms', '300'], { env: { KEYGATE_API_KEY: KEY } });
  started.push(echo);
});

afterAll(async () => {
  for (const c of started) await c.stop('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

describe('keygate app serve (real process)', () => {
  it('prints the real port and answers health checks without a key', async () => {
    expect(echo.address).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(echo.address).not.toBe('127.0.0.1:0');
    expect(await getJson(echo.url, '/ok', {})).toMatchObject({ status: 200, body: { ok: true } });
    expect((await getJson(echo.url, '/assistants', {})).status).toBe(401);
    const list = await getJson(echo.url, '/assistants');
    expect(list.body).toEqual([expect.objectContaining({ name: 'agent', description: expect.any(String), id: expect.stringMatching(/^[0-9a-f-]{36}$/) })]);
    // Every stdout line is a JSON log, but for the one plain "listening on" line.
    for (const line of echo.output().trim().split('\n')) {
      if (!line.startsWith('listening on ')) expect(() => JSON.parse(line), line).not.toThrow();
    }
  });

  it('eventsource-parser: messages stream token by token, updates per step', async () => {
    const r = await streamRun(echo.url, {
      assistant_id: 'agent',
      input: HELLO,
      stream_mode: ['updates', 'messages'],
      config: { configurable: { delay_ms: 150 } },
    });
    expect(r.status).toBe(200);
    expect(names(r)).toEqual([
      'metadata',
      'updates',
      'messages/metadata',
      'messages/partial',
      'messages/partial',
      'messages/partial',
      'messages/partial',
      'messages/complete',
      'updates',
      'end',
    ]);
    const partials = r.events.filter((e) => e.event === 'messages/partial');
    expect(partials.map((e) => (e.data as { content: string }[])[0].content)).toEqual(['one ', 'one two ', 'one two three ', 'one two three four']);
    // Arrival times: three pauses of 150 ms (450 ms) separate the first partial from the last; a
    // buffered stream would deliver them together. 300 leaves room for a late first read on a
    // loaded machine, which only shortens the gap.
    expect(partials[3].at - partials[0].at).toBeGreaterThanOrEqual(300);
    expect(r.events.at(-1)!.at - partials[0].at).toBeGreaterThanOrEqual(300);
  });

  it('curl -N sees each event as it is produced', async () => {
    const url = `${echo.url}/runs/stream`;
    const body = JSON.stringify({ assistant_id: 'agent', input: HELLO, stream_mode: 'messages-tuple', config: { configurable: { delay_ms: 150 } } });
    const curl = spawn('curl', ['-sN', '--compressed', '-H', `X-Api-Key: ${KEY}`, '-H', 'Content-Type: application/json', '-d', body, url]);
    const arrivals: { at: number; text: string }[] = [];
    let out = '';
    curl.stdout.setEncoding('utf8');
    curl.stdout.on('data', (chunk: string) => {
      out += chunk;
      arrivals.push({ at: Date.now(), text: out });
    });
    const code = await new Promise<number | null>((resolve) => curl.on('exit', resolve));
    expect(code).toBe(0);
    const events = [...out.matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
    expect(events).toEqual(['metadata', 'messages', 'messages', 'messages', 'messages', 'end']);
    const firstToken = arrivals.find((a) => a.text.includes('event: messages'))!;
    const end = arrivals.find((a) => a.text.includes('event: end'))!;
    expect(firstToken.text).not.toContain('event: end');
    // 450 ms of pauses between them when streamed, ~0 when buffered (see above for the margin).
    expect(end.at - firstToken.at).toBeGreaterThanOrEqual(300);
  });

  it.skipIf(!PYTHON)('Python requests with stream=True reads events as they arrive', async () => {
    const script = `
import json, sys, time, requests
url, key = sys.argv[1], sys.argv[2]
body = {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "one two three four"}]},
        "stream_mode": ["messages-tuple", "updates"], "config": {"configurable": {"delay_ms": 150}}}
t0 = time.monotonic()
seen = []
with requests.post(url, json=body, headers={"x-api-key": key}, stream=True, timeout=30) as r:
    assert r.status_code == 200, r.status_code
    event = None
    for line in r.iter_lines(chunk_size=None, decode_unicode=True):
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            seen.append({"event": event, "data": json.loads(line[6:]), "t": time.monotonic() - t0})
print(json.dumps({"content_type": r.headers["content-type"], "events": seen}))
`;
    const r = spawnSync(PYTHON!, ['-c', script, `${echo.url}/runs/stream`, KEY], { encoding: 'utf8', timeout: 30_000 });
    expect(r.status, r.stderr).toBe(0);
    const result = JSON.parse(r.stdout) as { content_type: string; events: { event: string; data: unknown; t: number }[] };
    expect(result.content_type).toBe('text/event-stream');
    expect(result.events.map((e) => e.event)).toEqual(['metadata', 'updates', 'messages', 'messages', 'messages', 'messages', 'updates', 'end']);
    const tokens = result.events.filter((e) => e.event === 'messages');
    expect(tokens.map((e) => (e.data as [{ content: string }])[0].content).join('')).toBe('one two three four');
    // The tokens are written 150 ms apart (450 ms from the first to the last): read as they
    // arrive, the first is seen well before the end; buffered, all arrive together (gap ~0). A
    // late first read on a loaded machine shortens the gap (0.39 s seen in CI), so half of it
    // is the bound that tells the two apart.
    expect(result.events.at(-1)!.t - tokens[0].t).toBeGreaterThanOrEqual(0.225);
  });

  it('the API key is hidden from the application and enforced', async () => {
    const fixture = await startCli(['app', 'serve', '--app', FIXTURE_APP, '--listen', '127.0.0.1:0'], { env: { KEYGATE_API_KEY: KEY } });
    started.push(fixture);
    const r = await streamRun(fixture.url, { assistant_id: 'envcheck', stream_mode: 'custom' });
    expect(r.events[1].data).toMatchObject({ greeting: 'hello from the env file', api_key_visible: false });
    expect((await streamRun(fixture.url, { assistant_id: 'envcheck' }, { headers: { 'x-api-key': 'nope' } })).status).toBe(401);
    expect(fixture.output()).not.toContain(KEY);
    expect(await fixture.stop()).toBe(0);
  });

  it('SIGTERM lets a run finish inside the grace period and exits 0', async () => {
    const s = await startCli(['app', 'serve', '--app', ECHO_APP, '--listen', '127.0.0.1:0', '--grace-ms', '5000']);
    started.push(s);
    const run = streamRun(
      s.url,
      { assistant_id: 'agent', input: HELLO, stream_mode: 'messages-tuple', config: { configurable: { delay_ms: 100 } } },
      {
        onEvent: (e, all) => {
          if (e.event === 'messages' && all.filter((x) => x.event === 'messages').length === 1) s.proc.kill('SIGTERM');
        },
      },
    );
    const r = await run;
    expect(names(r)).toEqual(['metadata', 'messages', 'messages', 'messages', 'messages', 'end']);
    expect(await s.stop()).toBe(0);
  });

  it('SIGTERM cancels a run that outlasts the grace period, then exits 0', async () => {
    const s = await startCli(['app', 'serve', '--app', ECHO_APP, '--listen', '127.0.0.1:0', '--grace-ms', '200']);
    started.push(s);
    const t0 = Date.now();
    const r = await streamRun(
      s.url,
      { assistant_id: 'agent', input: { messages: [{ role: 'user', content: 'word '.repeat(200) }] }, stream_mode: 'messages-tuple', config: { configurable: { delay_ms: 100 } } },
      {
        onEvent: (e, all) => {
          if (e.event === 'messages' && all.filter((x) => x.event === 'messages').length === 1) s.proc.kill('SIGTERM');
        },
      },
    );
    expect(names(r).slice(-2)).toEqual(['error', 'end']);
    expect(r.events.at(-2)!.data).toEqual({ error: 'CancelledError', message: 'The application is shutting down.' });
    expect(await s.stop()).toBe(0);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });
});

describe('keygate app with an invalid application', () => {
  function appDir(name: string, config: string | null, files: Record<string, string> = {}): string {
    const dir = path.join(tmp, name);
    mkdirSync(path.join(dir, 'src'), { recursive: true });
    if (config !== null) writeFileSync(path.join(dir, 'keygate.json'), config);
    for (const [f, text] of Object.entries(files)) writeFileSync(path.join(dir, f), text);
    return dir;
  }

  const cases: [string, string | null, Record<string, string>, RegExp][] = [
    ['no-config', null, {}, /keygate\.json: file not found/],
    ['bad-json', '{"assistants": ', {}, /keygate\.json: invalid JSON/],
    ['no-assistants', '{"name": "x"}', {}, /keygate\.json: assistants: Field required/],
    ['extra-field', '{"assistants": {"a": "./src/a.js"}, "graphs": {}}', { 'src/a.js': 'export default { run() {} }' }, /keygate\.json: graphs: Extra inputs are not permitted/],
    ['missing-module', '{"assistants": {"agent": "./src/missing.js"}}', {}, /keygate\.json: assistants\.agent: module \.\/src\/missing\.js does not exist/],
    ['no-run', '{"assistants": {"agent": "./src/a.js"}}', { 'src/a.js': 'export default { description: "x" }' }, /keygate\.json: assistants\.agent: .*has no run\(input, ctx\) function/],
    ['syntax-error', '{"assistants": {"agent": "./src/a.js"}}', { 'src/a.js': 'export default {{ nope' }, /keygate\.json: assistants\.agent: cannot load module \.\/src\/a\.js: SyntaxError: /],
    ['bad-type', '{"assistants": {"agent": 5}}', {}, /keygate\.json: assistants\.agent: Must be string/],
  ];

  for (const [name, config, files, expected] of cases) {
    it(`${name}: exits non-zero naming the file and field`, () => {
      const dir = appDir(name, config, files);
      const r = runCli(['app', 'serve', '--app', dir, '--listen', '127.0.0.1:0']);
      expect(r.status).not.toBe(0);
      expect(r.stderr).toContain(path.join(dir, 'keygate.json'));
      expect(r.stderr).toMatch(expected);
      expect(r.stderr).not.toMatch(/\n\s+at /); // one clear message, not a stack trace
      expect(r.stdout).not.toContain('listening on');
    });
  }

  it('validate prints the assistants with their stable ids', () => {
    const r = runCli(['app', 'validate', '--app', ECHO_APP]);
    expect(r.status).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out).toMatchObject({ name: 'echo', assistants: [{ name: 'agent', source: './src/agent.js' }] });
    expect(runCli(['app', 'validate', '--app', ECHO_APP]).stdout).toBe(r.stdout);
  });

  it('bad flags and an empty key are refused', () => {
    expect(runCli(['app', 'serve', '--app', ECHO_APP, '--listen', 'nowhere']).stderr).toMatch(/^keygate: --listen must be HOST:PORT or \[IPv6\]:PORT, e\.g\. 127\.0\.0\.1:8080 \(no port\), got 'nowhere'\n$/);
    const empty = runCli(['app', 'serve', '--app', ECHO_APP, '--listen', '127.0.0.1:0'], { env: { KEYGATE_API_KEY: '' } });
    expect(empty.status).not.toBe(0);
    expect(empty.stderr).toMatch(/KEYGATE_API_KEY is set but empty/);
    expect(runCli(['app', 'serve', '--listen', '127.0.0.1:0']).stderr).toMatch(/--app DIR is required/);
  });
});
