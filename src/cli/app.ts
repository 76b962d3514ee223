import { parseArgs } from 'node:util';
import { createLogger } from '../log.js';
import { makeRedactor, SECRET_NAMES_ENV } from '../secrets/redact.js';
import { AppConfigError, loadApp } from '../runtime/app.js';
import { startAppServer } from '../runtime/server.js';
import { CliError } from './errors.js';
import { listenFailure, parseListen } from './listen.js';
import { untilShutdown } from './shutdown.js';

const USAGE = `usage: keygate app serve --app DIR [--listen HOST:PORT] [--api-key KEY] [--heartbeat-ms N] [--grace-ms N]
       keygate app validate --app DIR

serve     load the application in DIR (its keygate.json) and serve the stateless LangGraph API: POST /runs/stream,
          POST /runs/wait, GET /assistants, POST /assistants/search, GET /assistants/{id}[/graph], and GET /ok.
          Prints "listening on HOST:PORT" (the real port when 0 is asked) once ready.
          --listen        address to listen on (default 127.0.0.1:8123; port 0 picks a free port)
          --api-key       require this X-Api-Key on every route but GET /ok (prefer KEYGATE_API_KEY:
                          command lines are visible to other users of the machine)
          --heartbeat-ms  silence before a ": heartbeat" comment on a stream (default 4000)
          --grace-ms      on SIGTERM/SIGINT, how long running runs may finish before they are cancelled (default 10000)
validate  load the application and print its assistants (name, id) as JSON; exit 1 if keygate.json is invalid.`;

function positiveInt(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new CliError(`--${name}: expected a positive integer, got '${value}'`, 2);
  return Number(value);
}

async function load(dir: string) {
  try {
    return await loadApp(dir);
  } catch (err) {
    if (err instanceof AppConfigError) throw new CliError(`invalid application:\n${err.message}`);
    throw err;
  }
}

async function serve(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      app: { type: 'string' },
      listen: { type: 'string', default: '127.0.0.1:8123' },
      'api-key': { type: 'string' },
      'heartbeat-ms': { type: 'string' },
      'grace-ms': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  if (!values.app) throw new CliError('--app DIR is required', 2);
  const listen = parseListen(values.listen!);
  const heartbeatMs = positiveInt('heartbeat-ms', values['heartbeat-ms'], 4000);
  const graceMs = positiveInt('grace-ms', values['grace-ms'], 10_000);

  // Read the key before the app's env file is applied (a project .env may hold a different
  // KEYGATE_API_KEY, the one its deploy tool uses), then hide it from the app's code.
  const envKey = process.env.KEYGATE_API_KEY;
  delete process.env.KEYGATE_API_KEY;
  const apiKey = values['api-key'] ?? envKey;
  if (apiKey !== undefined && apiKey.length === 0) {
    // Fail closed: an empty key is a mistake (an unset variable), not a wish for an open server.
    throw new CliError(values['api-key'] !== undefined ? '--api-key must not be empty' : 'KEYGATE_API_KEY is set but empty');
  }

  // The control plane names the variables that hold deployment secrets; their values and the API
  // key are removed from the errors this server reports (run `error` events) and from its log
  // lines. Read before the app's env is applied (set variables win anyway); the list itself is
  // hidden from the app.
  const secretNames = (process.env[SECRET_NAMES_ENV] ?? '').split(',').filter((n) => n !== '');
  delete process.env[SECRET_NAMES_ENV];
  const secretValues = secretNames.map((n) => process.env[n]).filter((v): v is string => typeof v === 'string' && v !== '');
  const redact = makeRedactor(apiKey !== undefined ? [...secretValues, apiKey] : secretValues);

  const logger = createLogger({ name: 'keygate-app', redact });
  const app = await load(values.app);
  for (const w of app.warnings) logger.warn({ app: app.name }, w);
  if (apiKey === undefined) {
    logger.warn({ app: app.name }, 'no API key configured (--api-key or KEYGATE_API_KEY): requests are not authenticated');
  }

  let handle;
  try {
    handle = await startAppServer({ app, host: listen.host, port: listen.port, apiKey, heartbeatMs, logger, redact });
  } catch (err) {
    throw listenFailure(listen.host, listen.port, err);
  }
  const shown = handle.host.includes(':') ? `[${handle.host}]` : handle.host;
  logger.info(
    { app: app.name, host: handle.host, port: handle.port, assistants: app.assistants.map((a) => ({ name: a.name, id: a.id })), env_applied: app.envApplied, auth: apiKey !== undefined },
    'application ready',
  );
  // Handlers before the line: the supervisor may stop the app as soon as it reads it.
  const stopRequested = untilShutdown((sig) => logger.warn({ signal: sig }, sig === 'SIGINT' ? 'second interrupt: exiting now' : 'still shutting down'));
  // The supervisor (control plane) parses this exact line for the real port.
  process.stdout.write(`listening on ${shown}:${handle.port}\n`);

  const signal = await stopRequested;
  logger.info({ signal, active_runs: handle.activeRuns(), grace_ms: graceMs }, 'shutting down');
  try {
    await handle.close(graceMs);
  } catch (err) {
    logger.error({ err: { message: (err as Error)?.message } }, 'shutdown failed');
  }
  logger.info({ app: app.name }, 'stopped');
  // An abandoned assistant (one that ignored its cancellation) may still hold timers or sockets;
  // they must not keep a stopped server's process alive.
  setTimeout(() => process.exit(0), 500).unref();
  return 0;
}

async function validate(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { app: { type: 'string' }, help: { type: 'boolean', short: 'h' } }, strict: true });
  if (values.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  if (!values.app) throw new CliError('--app DIR is required', 2);
  const app = await load(values.app);
  for (const w of app.warnings) process.stderr.write(`warning: ${w}\n`);
  const out = { name: app.name, assistants: app.assistants.map((a) => ({ name: a.name, id: a.id, description: a.description, source: a.source })) };
  process.stdout.write(JSON.stringify(out, null, 2) + '\n');
  return 0;
}

export async function run(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  try {
    if (sub === 'serve') return await serve(rest);
    if (sub === 'validate') return await validate(rest);
  } catch (err) {
    // parseArgs reports unknown or malformed options as TypeErrors with a usable message.
    if (err instanceof TypeError && (err as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
      throw new CliError(`${err.message}\n\n${USAGE}`, 2);
    }
    throw err;
  }
  if (!sub || sub === '--help' || sub === '-h' || sub === 'help') {
    process.stdout.write(USAGE + '\n');
    return sub ? 0 : 2;
  }
  throw new CliError(`unknown 'app' sub-command '${sub}'\n\n${USAGE}`, 2);
}
