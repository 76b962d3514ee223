import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { createLogger } from '../log.js';
import { logLevelSetting } from '../settings.js';
import { startEchoOrigin, type EchoOrigin } from '../sandbox-api/demo-origin.js';
import { driversFor, loadTemplates } from '../sandbox-api/templates.js';
import type { DriverName } from '../sandbox/driver.js';
import { openWorkspaceSecrets } from '../sandbox-api/secrets.js';
import { buildServer, type BuiltServer } from '../server/app.js';
import { DEFAULT_WORKSPACE_ID } from '../server/auth.js';
import { resolveDataDir } from './data-dir.js';
import { parseCliArgs } from './args.js';
import { listenFailure, parseListen } from './listen.js';
import { areasWith, asStartupError, chooseSandboxDriver } from './serve.js';
import { untilShutdown } from './shutdown.js';
import { releaseOptimizer } from './v8-flags.js';
import { serverReady } from '../proxy/idle-gc.js';

const HELP = `usage: keygate start [--data DIR] [--listen HOST:PORT] [--sandbox-driver local|docker|none]

Quick start: runs 'keygate serve' on embedded defaults (SQLite, encrypted secrets file and CA under
--data, default ./data), makes sure the default workspace has a DEMO_TOKEN secret (random, created
once), starts a local HTTPS demo API 'demo-api.keygate.test' that echoes the headers it receives
(reachable only through sandbox proxies), creates the sandbox 'demo' (unless it exists) whose proxy
injects 'Authorization: Bearer {DEMO_TOKEN}', and prints commands to paste: one that runs curl
inside it through its proxy (the header injected), one that shows a direct connection failing.
Ctrl-C stops everything.

  --data DIR           data directory (default ./data or KEYGATE_DATA_DIR)
  --listen HOST:PORT   API address (default 127.0.0.1:8080; port 0 picks a free port)
  --sandbox-driver D   what runs the boxes (see 'keygate serve --help'); default: the best that works here`;

export const DEMO_HOST = 'demo-api.keygate.test';
export const DEMO_SECRET = 'DEMO_TOKEN';
export const DEMO_SANDBOX = 'demo';

/** Quotes for a POSIX shell only when needed, so the common case stays readable. */
function sh(value: string): string {
  return /^[A-Za-z0-9_\-./:=@%+,]+$/.test(value) ? value : `'${value.replace(/'/g, `'\\''`)}'`;
}

export function demoProxyConfig() {
  return {
    rules: [
      {
        name: 'demo-api',
        match_hosts: [DEMO_HOST],
        headers: [{ name: 'Authorization', type: 'workspace_secret', value: `Bearer {${DEMO_SECRET}}` }],
      },
    ],
  };
}

interface InstructionOptions {
  apiUrl: string;
  keyHeader: string;
  keySource: string;
  dataDir: string;
  caPem: string;
  demoUrl: string;
  /** The demo API's real address, for the direct connection that must fail from inside a box. */
  demoDirect: string;
  driver: DriverName;
  template: string;
  /** How to run this keygate binary (it may not be on PATH). */
  keygateCmd: string;
  /** What became of the demo box at start: created, already there, or why not. */
  demoBox: DemoBox;
}

type DemoBox = { state: 'created' | 'exists'; status: string } | { state: 'failed'; reason: string };

/** Step 1: the curl that creates the demo box (identical for every driver). */
function createStep(o: InstructionOptions, key: string): string {
  const body = JSON.stringify({ template_name: o.template, name: DEMO_SANDBOX, wait_for_ready: true, proxy_config: demoProxyConfig() });
  return `curl -s -X POST ${o.apiUrl}/api/v2/sandboxes/boxes \\
  ${key} \\
  -H 'Content-Type: application/json' \\
  -d '${body}'`;
}

/** A real box: run curl inside it through the execute API, once through its proxy and once directly. */
function boxSteps(o: InstructionOptions, key: string): string {
  const exec = (command: string) =>
    `curl -s -X POST ${o.apiUrl}/api/v2/sandboxes/boxes/${DEMO_SANDBOX}/execute \\
  ${key} \\
  -H 'Content-Type: application/json' \\
  -d '${JSON.stringify({ command, timeout_seconds: 20 })}'`;
  return `Step 1: inside the box, call the demo API with no credential: the box's proxy (its only way out) injects it

${exec(`curl -sS ${o.demoUrl}/hello`)}

The answer's stdout is what the demo API received: "authorization": "Bearer ..." is the header the
proxy injected (the demo token's value, shown by the demo server, not by keygate).
The same with the CLI, streaming (exits with the command's exit code):

KEYGATE_URL=${o.apiUrl} KEYGATE_API_KEY=${o.keyHeader} ${o.keygateCmd} sandbox exec ${DEMO_SANDBOX} -- curl -sS ${o.demoUrl}/hello

Step 2: a direct connection from inside the box, bypassing the proxy, gets nowhere

${exec(`curl -sS --noproxy "*" --max-time 5 -k https://${o.demoDirect}/hello`)}

(exit_code is not 0: the box's network has nothing but its proxy.)`;
}

/** A `none` box runs elsewhere: the request goes through its proxy from this shell. */
function proxySteps(o: InstructionOptions, key: string): string {
  const readUrl = `node -pe 'JSON.parse(require("fs").readFileSync(0, "utf8")).proxy.url'`;
  return `Step 1: call the demo API as the box would (driver none: it runs elsewhere), through its proxy, with no credential of your own

PROXY_URL=$(curl -s ${o.apiUrl}/api/v2/sandboxes/boxes/${DEMO_SANDBOX} ${key} | ${readUrl})
curl -s -x "$PROXY_URL" --cacert ${sh(o.caPem)} ${o.demoUrl}/hello

The demo API answers with the request it received: "authorization": "Bearer ..." is the header
the proxy injected (the demo token's value, shown by the demo server, not by keygate).`;
}

function demoBoxLine(b: DemoBox): string {
  if (b.state === 'failed') return `not created: ${b.reason}`;
  return `'${DEMO_SANDBOX}' ${b.state === 'created' ? 'created' : 'already there'} (status ${b.status}); its proxy injects "Authorization: Bearer {${DEMO_SECRET}}" for ${DEMO_HOST}`;
}

/**
 * Creates the demo box through the API itself (the same route, validation and authentication a
 * user's request meets), waiting until it is ready; a box of that name already there is kept.
 */
async function createDemoBox(server: BuiltServer, apiKey: string | undefined, template: string): Promise<DemoBox> {
  if (!apiKey) return { state: 'failed', reason: 'no API key to create it with' };
  const headers = { 'x-api-key': apiKey, 'content-type': 'application/json' };
  const res = await server.app.inject({
    method: 'POST',
    url: '/api/v2/sandboxes/boxes',
    headers,
    payload: JSON.stringify({ template_name: template, name: DEMO_SANDBOX, wait_for_ready: true, proxy_config: demoProxyConfig() }),
  });
  if (res.statusCode === 409) {
    const got = await server.app.inject({ method: 'GET', url: `/api/v2/sandboxes/boxes/${DEMO_SANDBOX}`, headers });
    return { state: 'exists', status: got.statusCode === 200 ? String(got.json().status) : 'unknown' };
  }
  const body = res.json() as { status?: string; status_reason?: string | null; detail?: unknown };
  if (res.statusCode !== 201 && res.statusCode !== 200) return { state: 'failed', reason: `the API answered ${res.statusCode}: ${JSON.stringify(body.detail)}` };
  if (body.status !== 'ready') return { state: 'failed', reason: `it is ${body.status}${body.status_reason ? `: ${body.status_reason}` : ''}` };
  return { state: 'created', status: body.status };
}

function instructions(o: InstructionOptions): string {
  const key = `-H "x-api-key: ${o.keyHeader}"`;
  return `
keygate is running (quick start)

  API             ${o.apiUrl}   (OpenAPI document: ${o.apiUrl}/openapi.json)
  API key         ${o.keySource}
  Data directory  ${o.dataDir}
  Sandbox driver  ${o.driver}${o.driver === 'none' ? ' (boxes are NOT isolated here: records and proxies only)' : ''}
  Proxy CA        ${o.caPem}
  Demo API        ${o.demoUrl}  (a local echo server, reached through sandbox proxies)
  Demo secret     ${DEMO_SECRET} in workspace '${DEFAULT_WORKSPACE_ID}' (its value is never printed by keygate)
  Demo box        ${demoBoxLine(o.demoBox)}

${o.demoBox.state === 'failed' ? `Step 0: create the demo box\n\n${createStep(o, key)}\n\n` : ''}${o.driver === 'none' ? proxySteps(o, key) : boxSteps(o, key)}

What to do next
  - Look at the box: curl -s ${o.apiUrl}/api/v2/sandboxes/boxes/${DEMO_SANDBOX} ${key}
    (proxy.env is the environment inside the box: HTTPS_PROXY, NODE_EXTRA_CA_CERTS, SSL_CERT_FILE ...).
  - Rotate the secret and repeat step 1 (the running proxy picks it up):
    curl -s -X POST ${o.apiUrl}/api/v1/workspaces/current/secrets ${key} -H 'Content-Type: application/json' -d '[{"key":"${DEMO_SECRET}","value":"rotated-demo-value"}]'
  - Store your own secret (e.g. GITHUB_TOKEN) the same way, then PATCH the box's proxy_config
    with a rule for api.github.com. Workspace secrets are also managed by 'keygate secrets --data ${sh(o.dataDir)}'.
  - The box '${DEMO_SANDBOX}' survives restarts; remove it with
    curl -s -X DELETE ${o.apiUrl}/api/v2/sandboxes/boxes/${DEMO_SANDBOX} ${key}
    and create it again (or another, with your own proxy_config) with
${createStep(o, key).replace(/^/gm, '    ')}
  - Run 'keygate serve' for the API alone; 'keygate sandbox --help' for the box CLI; 'keygate --help' for everything else.

Press Ctrl-C to stop.
`;
}

export async function run(argv: string[]): Promise<number> {
  const { values } = parseCliArgs(
    {
      args: argv,
      options: {
        data: { type: 'string' },
        listen: { type: 'string', default: process.env.KEYGATE_LISTEN ?? '127.0.0.1:8080' },
        'sandbox-driver': { type: 'string', default: process.env.KEYGATE_SANDBOX_DRIVER },
        help: { type: 'boolean', short: 'h' },
      },
    },
    HELP,
  );
  if (values.help) {
    process.stdout.write(HELP + '\n');
    return 0;
  }
  const { host, port } = parseListen(values.listen!);
  const dataDir = resolveDataDir(values.data);
  // Request logs would bury the instructions; KEYGATE_LOG_LEVEL=info brings them back.
  const logger = createLogger({ name: 'keygate-start', level: logLevelSetting(process.env, 'warn') });

  let origin: EchoOrigin | undefined;
  let server: BuiltServer | undefined;
  const cleanup = async () => {
    await server?.close().catch(() => undefined);
    await origin?.close().catch(() => undefined);
  };
  // Handlers before anything is announced: a SIGTERM right after the first line must drain.
  const stopRequested = untilShutdown();
  try {
    origin = await startEchoOrigin({ caDir: path.join(dataDir, 'demo-origin-ca'), hosts: [DEMO_HOST] });
    const choice = await chooseSandboxDriver(values['sandbox-driver'], dataDir);
    const areas = await areasWith(choice, {
      resolve: new Map([[`${DEMO_HOST}:${origin.port}`, origin.host]]),
      upstreamCa: [origin.caPem],
    });
    server = await buildServer({ dataDir, logger, areas }).catch(async (err: unknown) => {
      throw await asStartupError(err);
    });
    process.stdout.write(`${choice.why}\n`);

    const secrets = await openWorkspaceSecrets({ dataDir, db: server.ctx.db, env: process.env }, DEFAULT_WORKSPACE_ID);
    if ((await secrets.get(DEMO_SECRET)) === undefined) await secrets.set(DEMO_SECRET, `demo_${randomBytes(16).toString('hex')}`);

    const apiUrl = await server.listen(host, port).catch((err: unknown) => {
      throw listenFailure(host, port, err);
    });
    const envKey = process.env.KEYGATE_API_KEY?.trim() || undefined;
    const keyHeader = envKey ? '$KEYGATE_API_KEY' : server.keyFile ? `$(cat ${sh(server.keyFile)})` : '<your API key>';
    const keySource = envKey ? 'from KEYGATE_API_KEY' : server.keyFile ? `${server.keyFile} (mode 0600; never printed)` : "none on file: create one with 'keygate serve keys create'";
    releaseOptimizer(); // started: TurboFan for the requests from here on (v8-flags.ts)
    serverReady(); // started: start-up's garbage and bytecode go once it is quiet (idle-gc.ts)
    process.stdout.write(`keygate start: API listening on ${new URL(apiUrl).host}\n`);
    // The demo box is built from the first template this server's driver can build.
    const template = [...loadTemplates(server.ctx.configDir).values()].find((t) => driversFor(t).includes(choice.driver.name))?.name ?? 'host';
    const apiKey = envKey ?? (server.keyFile ? readFileSync(server.keyFile, 'utf8').trim() : undefined);
    const demoBox = await createDemoBox(server, apiKey, template);
    process.stdout.write(
      instructions({
        apiUrl,
        keyHeader,
        keySource,
        dataDir,
        caPem: path.join(dataDir, 'ca', 'ca.pem'),
        demoUrl: `https://${DEMO_HOST}:${origin.port}`,
        demoDirect: `${origin.host}:${origin.port}`,
        driver: choice.driver.name,
        template,
        keygateCmd: `node ${sh(process.argv[1])}`,
        demoBox,
      }),
    );
  } catch (err) {
    await cleanup();
    throw err;
  }

  await stopRequested;
  process.stdout.write('\nstopping keygate ...\n');
  const force = setTimeout(() => process.exit(1), 15_000);
  force.unref();
  await cleanup();
  process.stdout.write('stopped.\n');
  return 0;
}
