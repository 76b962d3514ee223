// The official LangGraph JS SDK (@langchain/langgraph-sdk) as the client of an application that
// the control plane deployed: a real `keygate serve`, the local driver, the deployment's router in
// front of a real `keygate app serve` process. Nothing here talks to the app process directly.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Client } from '@langchain/langgraph-sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { api, cleanupTmp, deployDir, ECHO_AGENT, echoVariant, tmpDir, waitRevision, type Api } from '../control-plane/helpers.js';

const KEY = 'kg_test_langgraph_sdk_key_0003';
const serveEnv = { KEYGATE_API_KEY: KEY, DATABASE_URL: '', KEYGATE_DRAIN_TIMEOUT_MS: '3000', KEYGATE_STOP_GRACE_MS: '3000' };

// The echo example plus a second assistant that fails, so the SDK's error path is exercised too.
const FAILING = `export default {
  description: 'Always fails',
  async run(_input, ctx) {
    ctx.update('check', { checked: true });
    const err = new Error('quota exhausted for this run');
    err.name = 'QuotaError';
    throw err;
  },
};
`;
function appWithFailer(): string {
  const cfg = JSON.parse(readFileSync(path.join(ECHO_AGENT, 'keygate.json'), 'utf8'));
  cfg.assistants.failer = './src/failer.js';
  return echoVariant({ 'keygate.json': JSON.stringify(cfg), 'src/failer.js': FAILING });
}

const HELLO = { messages: [{ role: 'user', content: 'hello from the sdk' }] };
const FAST = { configurable: { delay_ms: 0 } };
/** 200 tokens: 20 s at 100 ms each, so a run that is not cancelled is plain to see. */
const LONG = { messages: [{ role: 'user', content: Array.from({ length: 200 }, (_, i) => `w${i}`).join(' ') }] };

let server: RunningCli;
let a: Api;
let dep: { id: string; url: string; latest_revision_id: string };
let client: Client;

beforeAll(async () => {
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', tmpDir()], { env: serveEnv });
  a = api(server.url, KEY);
  dep = await deployDir(a, 'sdk-echo', appWithFailer());
  const rev = await waitRevision(a, dep.id, dep.latest_revision_id);
  expect(rev.status).toBe('DEPLOYED');
  // No retries: a test must see the first answer, not the fourth.
  client = new Client({ apiUrl: dep.url, apiKey: KEY, callerOptions: { maxRetries: 0 } });
}, 90_000);
afterAll(async () => {
  await server?.stop();
  cleanupTmp();
});

/** The app's `run finished` log line that `match` picks, from the deployment's logs (waits up to 10 s). */
async function runLogLine(match: (m: any) => boolean): Promise<any> {
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    const logs = await a.call('GET', `/v2/deployments/${dep.id}/logs?type=deploy&limit=1000`);
    for (const l of logs.body.logs as { message: string }[]) {
      let m: any;
      try {
        m = JSON.parse(l.message);
      } catch {
        continue;
      }
      if (m?.msg === 'run finished' && match(m)) return m;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return undefined;
}

/** Every event of one SDK stream. */
async function collect(stream: AsyncIterable<{ event: string; data: unknown }>) {
  const out: { event: string; data: any }[] = [];
  for await (const e of stream) out.push(e);
  return out;
}

describe('assistants', () => {
  it('search lists the app\'s assistants as Assistant objects; filters and paging work', async () => {
    const all = await client.assistants.search();
    expect(all.map((x) => x.graph_id).sort()).toEqual(['agent', 'failer']);
    const agent = all.find((x) => x.graph_id === 'agent')!;
    expect(agent).toMatchObject({
      assistant_id: expect.stringMatching(/^[0-9a-f-]{36}$/),
      name: 'agent',
      config: {},
      metadata: { created_by: 'system' },
      version: 1,
      description: 'Echoes the last user message back, token by token.',
    });
    expect(Date.parse(agent.created_at)).not.toBeNaN();
    expect(await client.assistants.search({ graphId: 'failer' })).toEqual([expect.objectContaining({ name: 'failer' })]);
    expect(await client.assistants.search({ name: 'nobody' })).toEqual([]);
    const page = await client.assistants.search({ limit: 1, sortBy: 'name', sortOrder: 'asc', includePagination: true });
    expect(page.assistants.map((x) => x.name)).toEqual(['agent']);
    expect(page.next).toBe('1');
  });

  it('get by id and by name; getGraph; 404 for an unknown one', async () => {
    const [agent] = await client.assistants.search({ graphId: 'agent' });
    expect(await client.assistants.get(agent.assistant_id)).toEqual(agent);
    expect(await client.assistants.get('agent')).toEqual(agent);
    const graph = await client.assistants.getGraph(agent.assistant_id);
    expect(graph.nodes.map((n) => n.id)).toEqual(['__start__', 'agent', '__end__']);
    expect(graph.edges).toEqual([expect.objectContaining({ source: '__start__', target: 'agent' }), expect.objectContaining({ source: 'agent', target: '__end__' })]);
    await expect(client.assistants.get('nobody')).rejects.toMatchObject({ status: 404 });
  });
});

describe('runs without a thread', () => {
  it('runs.wait returns the final values and reports the run id', async () => {
    let created: { run_id: string; thread_id?: string } | undefined;
    const final = (await client.runs.wait(null, 'agent', { input: HELLO, config: FAST, onRunCreated: (m) => (created = m) })) as any;
    expect(final.messages.at(-1)).toMatchObject({ type: 'ai', content: 'hello from the sdk' });
    expect(final.echo_of).toBe('hello from the sdk');
    expect(created).toEqual({ run_id: expect.stringMatching(/^[0-9a-f-]{36}$/), thread_id: undefined });
  });

  it('runs.wait raises a failed run as an Error naming it; raiseError: false returns __error__', async () => {
    await expect(client.runs.wait(null, 'failer', { input: {} })).rejects.toThrow('QuotaError: quota exhausted for this run');
    const raw = (await client.runs.wait(null, 'failer', { input: {}, raiseError: false })) as any;
    expect(raw).toEqual({ __error__: { error: 'QuotaError', message: 'quota exhausted for this run' } });
  });

  it('runs.stream, one mode at a time: values, updates, messages, messages-tuple, custom', async () => {
    const run = (streamMode: any) => collect(client.runs.stream(null, 'agent', { input: HELLO, config: FAST, streamMode }));

    const values = await run('values');
    expect(values[0]).toMatchObject({ event: 'metadata', data: { run_id: expect.any(String), attempt: 1 } });
    expect(values.at(-1)!.event).toBe('end');
    const lastValues = values.filter((e) => e.event === 'values').at(-1)!;
    expect(lastValues.data.messages.at(-1).content).toBe('hello from the sdk');

    const updates = await run('updates');
    expect(updates.filter((e) => e.event === 'updates').map((e) => Object.keys(e.data)[0])).toEqual(['prepare', 'agent']);

    const messages = await run('messages');
    const partials = messages.filter((e) => e.event === 'messages/partial');
    expect(partials.length).toBe(4); // one per token: "hello ", "from ", "the ", "sdk"
    expect(partials.at(-1)!.data[0].content).toBe('hello from the sdk');
    expect(messages.filter((e) => e.event === 'messages/complete')[0].data[0]).toMatchObject({ type: 'ai', content: 'hello from the sdk' });

    const tuples = await run('messages-tuple');
    const chunks = tuples.filter((e) => e.event === 'messages');
    expect(chunks.map((e) => e.data[0].content).join('')).toBe('hello from the sdk');
    expect(chunks[0].data[1]).toMatchObject({ langgraph_node: 'agent' });

    const custom = await run('custom');
    expect(custom.filter((e) => e.event === 'custom').map((e) => e.data)).toEqual([1, 2, 3, 4].map((i) => ({ progress: i, of: 4 })));
  });

  it('runs.stream with every mode at once, and a failing run ending in error then end', async () => {
    const all = await collect(client.runs.stream(null, 'agent', { input: HELLO, config: FAST, streamMode: ['values', 'updates', 'messages', 'messages-tuple', 'custom'] }));
    const kinds = new Set(all.map((e) => e.event));
    for (const k of ['metadata', 'values', 'updates', 'messages/metadata', 'messages/partial', 'messages/complete', 'messages', 'custom', 'end']) expect(kinds, k).toContain(k);
    expect(all.at(-1)!.event).toBe('end');

    const failed = await collect(client.runs.stream(null, 'failer', { input: {}, streamMode: 'updates' }));
    expect(failed.map((e) => e.event)).toEqual(['metadata', 'updates', 'error', 'end']);
    expect(failed[2].data).toEqual({ error: 'QuotaError', message: 'quota exhausted for this run' });
  });

  it('a stream the client abandons is cancelled in the app (on_disconnect: cancel)', async () => {
    const controller = new AbortController();
    let runId: string | undefined;
    const seen: string[] = [];
    // On abort the SDK cancels its reader and ends the iteration (or throws AbortError, depending
    // on where the abort lands); either way the connection is closed under the stream.
    try {
      for await (const e of client.runs.stream(null, 'agent', {
        input: LONG,
        config: { configurable: { delay_ms: 100 } },
        streamMode: 'messages-tuple',
        signal: controller.signal,
        onRunCreated: (m) => (runId = m.run_id),
      })) {
        seen.push(e.event);
        if (seen.filter((x) => x === 'messages').length === 2) controller.abort();
      }
    } catch (err) {
      expect(String(err)).toMatch(/abort/i);
    }
    expect(seen).not.toContain('end');
    expect(runId).toBeTruthy();
    // The app logs how each run ended; the run must end cancelled long before its 20 s of tokens.
    const line = await runLogLine((m) => m.run_id === runId);
    expect(line).toMatchObject({ outcome: 'cancelled', client_disconnected: true });
    expect(line.duration_ms).toBeLessThan(10_000);
  });

  it('a runs.wait the client abandons is cancelled in the app too', async () => {
    const controller = new AbortController();
    const started = Date.now();
    const waiting = client.runs.wait(null, 'agent', { input: LONG, config: { configurable: { delay_ms: 100 } }, signal: controller.signal });
    setTimeout(() => controller.abort(), 500);
    await expect(waiting).rejects.toThrow(/abort/i);
    // The SDK reports the run id only with the answer, so the run is found by route and start time.
    const line = await runLogLine((m) => m.route === '/runs/wait' && Date.parse(m.time) >= started);
    expect(line).toMatchObject({ outcome: 'cancelled', client_disconnected: true, assistant: 'agent' });
    expect(line.duration_ms).toBeLessThan(10_000);
  });
});

describe('what the SDK gets for what is out of scope or refused', () => {
  it('unknown assistant 404, unsupported stream mode 422, threads 404, a wrong key 401: each a clean HTTPError', async () => {
    await expect(client.runs.wait(null, 'nobody', { input: HELLO })).rejects.toMatchObject({ status: 404 });
    await expect(collect(client.runs.stream(null, 'agent', { input: HELLO, streamMode: 'events' }))).rejects.toMatchObject({ status: 422 });
    await expect(client.threads.create()).rejects.toMatchObject({ status: 404 });
    const stranger = new Client({ apiUrl: dep.url, apiKey: 'kg_not_a_key_of_this_workspace', callerOptions: { maxRetries: 0 } });
    await expect(stranger.assistants.search()).rejects.toMatchObject({ status: 401 });
  });
});
