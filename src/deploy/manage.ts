import { createInterface } from 'node:readline/promises';
import { CliError } from '../command-error.js';
import { ApiError, ControlPlaneClient, logKey, type Deployment, type LogEntry } from './client.js';
import { parseDuration } from './duration.js';
import { nameForDirectory } from './names.js';
import { formatLogLine, formatTable } from './output.js';
import { requireApiKey, resolveSettings } from './settings.js';

export interface CommonOptions {
  /** Project root: where `.env` is looked up (the current directory). */
  projectDir: string;
  env?: NodeJS.ProcessEnv;
}

async function connect(opts: CommonOptions): Promise<ControlPlaneClient> {
  const settings = resolveSettings(opts.projectDir, opts.env ?? process.env);
  const apiKey = requireApiKey(settings, opts.projectDir);
  const client = new ControlPlaneClient({ baseUrl: settings.url, apiKey });
  try {
    await client.health();
  } catch (err) {
    await client.close();
    throw err;
  }
  return client;
}

/** Runs `fn` over `items` with at most `n` in flight, keeping the order of results. */
async function mapLimit<T, R>(items: T[], n: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  return out;
}

export interface ListedDeployment {
  id: string;
  name: string;
  type: string | null;
  /** Status of the latest revision (kept under this name for scripts; same as `latest_status`). */
  status: string | null;
  latest_status: string | null;
  latest_revision_id: string | null;
  /** The revision answering requests, whatever became of later ones; null when nothing serves. */
  active_revision_id: string | null;
  serving: boolean;
  deployment_status: string | null;
  url: string | null;
  updated_at: string | null;
}

/** `abcd1234` for a revision id: enough to tell revisions apart in a table. */
const shortId = (id: string) => id.slice(0, 8);

/**
 * The SERVING cell: which revision answers requests, apart from how the latest one ended
 * (a failed update leaves the previous revision serving).
 */
export function servingCell(r: Pick<ListedDeployment, 'active_revision_id' | 'latest_revision_id'>): string {
  if (!r.active_revision_id) return 'none';
  return r.active_revision_id === r.latest_revision_id ? `latest (${shortId(r.active_revision_id)})` : `older (${shortId(r.active_revision_id)})`;
}

/** `keygate deploy list [--json]`: every deployment (all pages), what serves it, and its latest revision's status. */
export async function listCommand(opts: CommonOptions & { json: boolean; out?: NodeJS.WritableStream }): Promise<number> {
  const out = opts.out ?? process.stdout;
  const client = await connect(opts);
  try {
    const all = await client.listAllDeployments();
    const rows = await mapLimit(all, 6, async (d): Promise<ListedDeployment> => {
      let status: string | null = null;
      if (d.latest_revision_id) {
        try {
          status = (await client.getRevision(d.id, d.latest_revision_id)).status;
        } catch (err) {
          if (err instanceof ApiError && err.status === 401) throw err;
          status = 'UNKNOWN'; // deleted meanwhile, or unreadable: the list still shows the rest
        }
      }
      const active = d.active_revision_id ?? null;
      return {
        id: d.id,
        name: d.name,
        type: d.source_config?.deployment_type ?? null,
        status,
        latest_status: status,
        latest_revision_id: d.latest_revision_id ?? null,
        active_revision_id: active,
        serving: active !== null,
        deployment_status: d.status ?? null,
        url: d.url ?? (typeof d.source_config?.custom_url === 'string' ? d.source_config.custom_url : null),
        updated_at: d.updated_at ?? null,
      };
    });
    if (opts.json) {
      out.write(JSON.stringify(rows) + '\n');
    } else if (rows.length === 0) {
      out.write('No deployments.\n');
    } else {
      out.write(formatTable(['ID', 'NAME', 'TYPE', 'SERVING', 'LATEST', 'URL', 'UPDATED'], rows.map((r) => [r.id, r.name, r.type, servingCell(r), r.latest_status, r.url, r.updated_at])) + '\n');
    }
    return 0;
  } finally {
    await client.close();
  }
}

/** The deployment a command is about: an ID, else `--name`, else the current directory's name. */
async function resolveTarget(client: ControlPlaneClient, id: string | undefined, name: string | undefined, projectDir: string): Promise<Deployment> {
  if (id) {
    try {
      return await client.getDeployment(id);
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 422)) throw new CliError(`deployment ${id} not found`);
      throw err;
    }
  }
  const wanted = name ?? nameForDirectory(projectDir);
  if (!wanted) throw new CliError('name the deployment: keygate deploy logs ID, or --name NAME');
  const found = await client.findByName(wanted);
  if (!found) throw new CliError(`no deployment named '${wanted}'${name ? '' : ' (named after the current directory)'}; pass an ID or --name`);
  return found;
}

/** `--since 10m` (a duration before now) or an ISO time, as the ISO time the API takes. */
export function sinceToIso(since: string, now = Date.now()): string {
  const ms = parseDuration(since);
  if (ms !== null) return new Date(now - ms).toISOString();
  if (/^\d{4}-\d{2}-\d{2}/.test(since) && !Number.isNaN(Date.parse(since))) return new Date(Date.parse(since)).toISOString();
  throw new CliError(`--since: '${since}' is neither a duration (30s, 10m, 2h) nor an ISO time`, 2);
}

export interface LogsOptions extends CommonOptions {
  id?: string;
  name?: string;
  type: 'build' | 'deploy';
  revision?: string;
  since?: string;
  tail: number;
  follow: boolean;
  json: boolean;
  out?: NodeJS.WritableStream;
}

/** `keygate deploy logs`: the tail of a deployment's build or runtime log, optionally followed. */
export async function logsCommand(opts: LogsOptions): Promise<number> {
  const out = opts.out ?? process.stdout;
  const colour = !opts.json && Boolean((out as NodeJS.WriteStream).isTTY) && !(opts.env ?? process.env).NO_COLOR;
  const since = opts.since ? sinceToIso(opts.since) : undefined;
  const client = await connect(opts);
  const write = (l: LogEntry) => out.write((opts.json ? JSON.stringify(l) : formatLogLine(l, colour)) + '\n');
  try {
    const d = await resolveTarget(client, opts.id, opts.name, opts.projectDir);
    const query = { type: opts.type, revisionId: opts.revision, since };
    // With --since the whole window is shown; without it, the last --tail lines.
    const { lines, nextSince } = await client.tailLogs(d.id, query, since ? Number.MAX_SAFE_INTEGER : opts.tail);
    for (const l of lines) write(l);
    if (!opts.follow) return 0;

    const ac = new AbortController();
    const onSignal = () => ac.abort();
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    // Lines at the boundary timestamp may come again from an inclusive `since`: skip those already shown.
    const boundary = new Set(lines.filter((l) => l.timestamp === nextSince).map(logKey));
    try {
      await client.streamLogs(
        d.id,
        { ...query, since: nextSince ?? since ?? new Date().toISOString() },
        (l) => {
          if (boundary.size && l.timestamp === nextSince && boundary.has(logKey(l))) return;
          write(l);
        },
        ac.signal,
      );
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    }
    // Ctrl-C is how a user stops following: a normal end.
    if (!ac.signal.aborted) process.stderr.write('keygate: the control plane closed the log stream\n');
    return 0;
  } finally {
    await client.close();
  }
}

export interface DeleteOptions extends CommonOptions {
  id: string;
  force: boolean;
  input?: NodeJS.ReadStream;
  prompt?: NodeJS.WriteStream;
}

/** Asks on the terminal; anything but y/yes is No. */
async function confirm(question: string, input: NodeJS.ReadableStream, output: NodeJS.WritableStream): Promise<boolean> {
  const rl = createInterface({ input, output, terminal: true });
  try {
    const answer = await rl.question(question);
    return /^\s*y(es)?\s*$/i.test(answer);
  } catch {
    return false; // stdin closed (Ctrl-D): No
  } finally {
    rl.close();
  }
}

/** `keygate deploy delete <ID> [--force]`. */
export async function deleteCommand(opts: DeleteOptions): Promise<number> {
  const input = opts.input ?? process.stdin;
  const prompt = opts.prompt ?? process.stderr;
  const interactive = Boolean(input.isTTY && prompt.isTTY);
  if (!opts.force && !interactive) {
    throw new CliError(`refusing to delete deployment ${opts.id} without confirmation: there is no terminal to ask on; pass --force`);
  }
  const client = await connect(opts);
  try {
    const d = await resolveTarget(client, opts.id, undefined, opts.projectDir);
    if (!opts.force) {
      const yes = await confirm(`Delete deployment ${d.id} (${d.name})? [y/N] `, input, prompt);
      if (!yes) {
        process.stderr.write('Not deleted.\n');
        return 1;
      }
    }
    try {
      await client.deleteDeployment(d.id);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) throw new CliError(`deployment ${d.id} not found`);
      throw err;
    }
    process.stdout.write(`Deleted deployment ${d.id} (${d.name}).\n`);
    return 0;
  } finally {
    await client.close();
  }
}

