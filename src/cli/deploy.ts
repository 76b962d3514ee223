import { parseArgs } from 'node:util';
import { deploy } from '../deploy/deploy.js';
import { parseDuration } from '../deploy/duration.js';
import { deleteCommand, listCommand, logsCommand } from '../deploy/manage.js';
import { Reporter } from '../deploy/output.js';
import { CliError } from './errors.js';

const HELP = `usage: keygate deploy [DIR] [--name NAME] [--deployment-type dev|prod] [--wait|--no-wait]
                      [--timeout 10m] [--json] [--image URI | --build-image TAG]
       keygate deploy list [--json]
       keygate deploy logs [ID] [--name NAME] [--type build|deploy] [--revision ID] [--since 10m]
                           [--tail N] [--follow] [--json]
       keygate deploy delete <ID> [--force]

Deploys the application in DIR (default: the current directory; it needs a keygate.json) to the
control plane: packs it (honouring .gitignore and .keygateignore; .env, .env.*, node_modules and .git
are never packed), uploads it, and creates the deployment named after the directory, or updates the
deployment of that exact name in place with a new revision. Then waits until the revision is
DEPLOYED and prints its URL. Variables from the env file named in keygate.json ("env": ".env") are
sent as the deployment's secrets (names shown, values never).

  --name NAME               deployment name (default: DIR's name, lowercased, other characters -> '-')
  --deployment-type TYPE    dev (one replica, default) or prod (two replicas); fixed at creation
  --no-wait                 return once the revision is submitted
  --timeout DURATION        how long to wait for a terminal status (default 10m); exit 124 after it
  --json                    one JSON object per line on stdout, ending with {"event":"result",...}
  --image URI               deploy an existing container image (external_docker) instead of DIR
  --build-image TAG         build the Dockerfile in DIR as TAG (docker build -t TAG DIR; on ARM hosts
                            with --platform linux/amd64, the control plane's platform), push it when
                            TAG names a registry (registry.example.com/team/app:1; a tag without one
                            is deployed as is, for an engine on this host), then deploy it like
                            --image. DIR's .env files (at any depth) and the env file keygate.json
                            names must be excluded by its .dockerignore (e.g. **/.env*).
                            Needs a running container runtime (docker, or KEYGATE_DOCKER).

Configuration: KEYGATE_API_KEY and KEYGATE_URL (default http://127.0.0.1:8080), from the environment
(KEYGATE_API_KEY=... keygate deploy) or from .env in the project root.

Exit status: 0 only when the revision is DEPLOYED (or submitted, with --no-wait); 1 on failure;
2 on a usage error; 124 on timeout.
(A directory named list, logs or delete is given as ./list.)`;

type Options = Record<string, { type: 'string' | 'boolean'; short?: string }>;
type Values = Record<string, string | boolean | undefined>;

function parse(argv: string[], options: Options, allowPositionals: boolean): { values: Values; positionals: string[] } {
  try {
    const r = parseArgs({ args: argv, options: { ...options, help: { type: 'boolean', short: 'h' } }, allowPositionals, strict: true });
    return { values: r.values as Values, positionals: r.positionals };
  } catch (err) {
    throw new CliError(`${(err as Error).message}\n\n${HELP}`, 2);
  }
}

function onePositional(positionals: string[], what: string): string | undefined {
  if (positionals.length > 1) throw new CliError(`expected at most one ${what}, got: ${positionals.join(' ')}`, 2);
  return positionals[0];
}

function oneOf<T extends string>(value: string | undefined, allowed: readonly T[], flag: string, fallback: T): T {
  if (value === undefined) return fallback;
  if (!(allowed as readonly string[]).includes(value)) throw new CliError(`${flag} must be one of ${allowed.join(', ')} (got '${value}')`, 2);
  return value as T;
}

export async function run(argv: string[]): Promise<number> {
  const sub = argv[0];
  if (sub === 'list') {
    const { values, positionals } = parse(argv.slice(1), { json: { type: 'boolean' } }, true);
    if (values.help) return help();
    if (positionals.length) throw new CliError(`'deploy list' takes no arguments`, 2);
    return listCommand({ projectDir: process.cwd(), json: Boolean(values.json) });
  }
  if (sub === 'logs') {
    const { values, positionals } = parse(
      argv.slice(1),
      {
        name: { type: 'string' },
        type: { type: 'string' },
        revision: { type: 'string' },
        since: { type: 'string' },
        tail: { type: 'string' },
        follow: { type: 'boolean', short: 'f' },
        json: { type: 'boolean' },
      },
      true,
    );
    if (values.help) return help();
    const id = onePositional(positionals, 'deployment ID');
    if (id && values.name) throw new CliError('give either a deployment ID or --name, not both', 2);
    const tail = values.tail === undefined ? 100 : Number(values.tail);
    if (!Number.isInteger(tail) || tail < 1) throw new CliError('--tail must be a positive whole number', 2);
    return logsCommand({
      projectDir: process.cwd(),
      id,
      name: values.name as string | undefined,
      type: oneOf(values.type as string | undefined, ['build', 'deploy'] as const, '--type', 'deploy'),
      revision: values.revision as string | undefined,
      since: values.since as string | undefined,
      tail,
      follow: Boolean(values.follow),
      json: Boolean(values.json),
    });
  }
  if (sub === 'delete') {
    const { values, positionals } = parse(argv.slice(1), { force: { type: 'boolean' } }, true);
    if (values.help) return help();
    const id = onePositional(positionals, 'deployment ID');
    if (!id) throw new CliError('usage: keygate deploy delete <ID> [--force]', 2);
    return deleteCommand({ projectDir: process.cwd(), id, force: Boolean(values.force) });
  }

  const { values, positionals } = parse(
    argv,
    {
      name: { type: 'string' },
      'deployment-type': { type: 'string' },
      wait: { type: 'boolean' },
      'no-wait': { type: 'boolean' },
      timeout: { type: 'string' },
      json: { type: 'boolean' },
      image: { type: 'string' },
      'build-image': { type: 'string' },
    },
    true,
  );
  if (values.help) return help();
  if (values.image !== undefined && values['build-image'] !== undefined) throw new CliError('give either --image or --build-image, not both', 2);
  if (values['build-image'] === '' || values.image === '') throw new CliError(`${values.image === '' ? '--image' : '--build-image'} needs a value`, 2);
  if (values.wait && values['no-wait']) throw new CliError('--wait and --no-wait contradict each other', 2);
  const timeoutMs = parseDuration((values.timeout as string | undefined) ?? '10m');
  if (timeoutMs === null || timeoutMs <= 0) throw new CliError(`--timeout: '${values.timeout}' is not a duration like 90s, 10m or 1h`, 2);
  const dir = onePositional(positionals, 'directory') ?? '.';
  const reporter = new Reporter({ json: Boolean(values.json) });
  return deploy(
    {
      dir,
      name: values.name as string | undefined,
      deploymentType: oneOf(values['deployment-type'] as string | undefined, ['dev', 'prod'] as const, '--deployment-type', 'dev'),
      wait: !values['no-wait'],
      timeoutMs,
      image: values.image as string | undefined,
      buildImage: values['build-image'] as string | undefined,
    },
    reporter,
  );
}

function help(): number {
  process.stdout.write(HELP + '\n');
  return 0;
}
