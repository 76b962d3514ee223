// Only what `keygate serve` needs before its driver probe starts is imported here; the server
// itself (fastify, the areas, the database driver) is imported once the probe runs (see run()).
import type { createSandboxArea } from '../sandbox-api/area.js';
import { DriverUnusableError, parseDriverName, selectSandboxDriver } from '../sandbox-api/drivers.js';
import type { DriverChoice } from '../sandbox/choose.js';
import type { Area } from '../server/area.js';
import { resolveDataDir } from './data-dir.js';
import { parseCliArgs } from './args.js';
import { CliError } from './errors.js';
import { releaseOptimizer } from './v8-flags.js';
import { serverReady } from '../proxy/idle-gc.js';
import { listenFailure, parseListen } from './listen.js';
import { untilShutdown } from './shutdown.js';
import { loggableMessage } from '../server/errors.js';

const HELP = `usage: keygate serve [--listen HOST:PORT] [--data DIR] [--config-dir DIR] [--sandbox-driver local|docker|none]
       keygate serve keys create [--workspace NAME] [--user NAME] [--name LABEL] [--data DIR]

Runs the sandbox API (/api/...), the control plane (/v2/deployments...) and the Auth Service
(/v2/auth/...) on one address. Storage: SQLite under --data (default ./data or KEYGATE_DATA_DIR), or
PostgreSQL when DATABASE_URL is set. The first API key comes from KEYGATE_API_KEY, else one is
generated into <data>/api-key (mode 0600).

  --listen HOST:PORT   address to listen on (default 127.0.0.1:8080; port 0 picks a free port)
  --data DIR           data directory (database, master key, CA, secrets)
  --config-dir DIR     operator configuration (templates.json, providers); default: the shipped config/
  --sandbox-driver D   what runs the boxes: local (bubblewrap), docker (the engine on its unix socket) or
                       none (records and proxies only, boxes run elsewhere). Default (or
                       KEYGATE_SANDBOX_DRIVER): local if it works here, else docker, else none. A driver
                       asked for that cannot isolate stops the server with the reason.

keys create prints a new API key for a user of a workspace (created if needed). It is shown once.`;

async function keysCreate(argv: string[]): Promise<number> {
  const [{ AUTH_MIGRATIONS, createApiKey, DEFAULT_WORKSPACE_ID }, { migrate, openDb }] = await Promise.all([import('../server/auth.js'), import('../store/db.js')]);
  const { values } = parseCliArgs(
    {
      args: argv,
      options: {
        workspace: { type: 'string', default: DEFAULT_WORKSPACE_ID },
        user: { type: 'string', default: 'admin' },
        name: { type: 'string', default: 'cli' },
        data: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    },
    HELP,
  );
  if (values.help) {
    process.stdout.write(HELP + '\n');
    return 0;
  }
  const dataDir = resolveDataDir(values.data);
  const db = await openDb({ dataDir });
  try {
    await migrate(db, 'auth', AUTH_MIGRATIONS);
    const created = await createApiKey(db, { workspace: values.workspace!, user: values.user!, name: values.name });
    // The one place a key is printed: the operator asked for it, on their terminal.
    process.stdout.write(`${created.key}\n`);
    process.stderr.write(`created API key ${created.id} for user '${values.user}' of workspace '${values.workspace}' (${created.workspaceId})\n`);
  } finally {
    await db.close();
  }
  return 0;
}

/**
 * An operator's configuration that cannot be used (the master key, the providers file, the JWT
 * settings, the templates, the sandbox proxy settings, the CA) is said in one line, as every
 * other expected failure: its message names the setting and never a secret value. Anything else
 * stays an unexpected error. The classes are loaded already: buildServer imported their modules.
 */
export async function asStartupError(err: unknown): Promise<unknown> {
  const [{ EnvelopeError }, { SecretStoreError }, { ProviderConfigError }, { JwtConfigError }, { TemplatesError }, { SandboxConfigError }, { CaError }] = await Promise.all([
    import('../secrets/envelope.js'),
    import('../secrets/types.js'),
    import('../auth/provider-config.js'),
    import('../auth/jwt.js'),
    import('../sandbox-api/templates.js'),
    import('../sandbox-api/area.js'),
    import('../certs/ca.js'),
  ]);
  const expected = [EnvelopeError, SecretStoreError, ProviderConfigError, JwtConfigError, TemplatesError, SandboxConfigError, CaError];
  return expected.some((c) => err instanceof c) ? new CliError((err as Error).message) : err;
}

/** The driver for `--sandbox-driver` (or the best that works); an unusable one is a one-line start-up error. */
export async function chooseSandboxDriver(requested: string | undefined, dataDir: string): Promise<DriverChoice> {
  try {
    return await selectSandboxDriver(parseDriverName(requested), dataDir);
  } catch (err) {
    if (err instanceof DriverUnusableError) throw new CliError(err.message);
    throw err;
  }
}

/** The server's areas with the sandbox area running boxes on `choice`'s driver. */
export async function areasWith(choice: DriverChoice, opts: Parameters<typeof createSandboxArea>[0] = {}): Promise<Area[]> {
  const [{ createSandboxArea }, { loadAreas }] = await Promise.all([import('../sandbox-api/area.js'), import('../server/plugins.js')]);
  const sandboxArea = createSandboxArea({ ...opts, driver: choice.driver });
  return (await loadAreas()).map((a) => (a.name === sandboxArea.name ? sandboxArea : a));
}

export async function run(argv: string[]): Promise<number> {
  if (argv[0] === 'keys') {
    if (argv[1] !== 'create') throw new CliError(`unknown 'serve keys' command; try 'keygate serve keys create'`);
    return keysCreate(argv.slice(2));
  }
  const { values } = parseCliArgs(
    {
      args: argv,
      options: {
        listen: { type: 'string', default: process.env.KEYGATE_LISTEN ?? '127.0.0.1:8080' },
        data: { type: 'string' },
        'config-dir': { type: 'string' },
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
  // The driver's probe (for `local`, a real box started, used and stopped) waits on child
  // processes, not on this one: it runs while the server's modules load. A driver that cannot
  // isolate still stops the server before it listens.
  const choosing = chooseSandboxDriver(values['sandbox-driver'], dataDir);
  choosing.catch(() => undefined); // awaited below
  const [{ createLogger }, { buildServer }] = await Promise.all([import('../log.js'), import('../server/app.js')]);
  const logger = createLogger({ name: 'keygate-serve' });
  const choice = await choosing;
  let server: Awaited<ReturnType<typeof buildServer>>;
  try {
    server = await buildServer({ dataDir, logger, configDir: values['config-dir'], areas: await areasWith(choice) });
  } catch (err) {
    throw await asStartupError(err);
  }
  // Handlers first: a supervisor may send SIGTERM the moment it reads the line below, and until
  // Node has a handler the default action (dying at once, no drain) applies.
  const stopRequested = untilShutdown((sig) => logger.warn({ signal: sig }, 'still shutting down'));
  let url: string;
  try {
    url = await server.listen(host, port);
  } catch (err) {
    // What buildServer started (the areas' restores, the database) stops before the error is said.
    await server.close().catch(() => undefined);
    throw listenFailure(host, port, err);
  }
  const addr = new URL(url);
  releaseOptimizer(); // started: TurboFan for the requests from here on (v8-flags.ts)
  serverReady(); // started: start-up's garbage and bytecode go once it is quiet (idle-gc.ts)
  process.stdout.write(`keygate serve listening on ${addr.host} (data: ${dataDir}${process.env.DATABASE_URL ? ', database: PostgreSQL' : ''})\n`);
  process.stdout.write(`${choice.why}\n`);
  if (server.keyFile) process.stdout.write(`API key file: ${server.keyFile}\n`);

  const signal = await stopRequested;
  logger.info({ signal }, 'shutting down');
  const force = setTimeout(() => process.exit(1), 15_000);
  force.unref();
  try {
    await server.close();
  } catch (err) {
    logger.error({ err: { message: loggableMessage(err) } }, 'error during shutdown');
  }
  return 0;
}
