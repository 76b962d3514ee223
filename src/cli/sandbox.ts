import { createReadStream, createWriteStream, statSync } from 'node:fs';
import { readFile, rename, rm } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import { Agent, type Dispatcher } from 'undici';
import WebSocket from 'ws';
import { apiRequest, describeDetail, errorDetail, networkFailure, parseJsonText } from '../api-client.js';
import { jsonErrorLocation } from '../validation/json.js';
import { resolveSettings } from '../deploy/settings.js';
import { parseCliArgs } from './args.js';
import { CliError } from './errors.js';

const HELP = `usage: keygate sandbox create NAME [--template T] [--proxy-config FILE] [--idle-ttl SECONDS]
                              [--memory-mb N] [--cpus N] [--pids N] [--disk-mb N] [--no-wait] [--json]
       keygate sandbox ls [--json]
       keygate sandbox exec NAME [--timeout SECONDS] [--env K=V]... [--cwd DIR] [-i] [--json] -- COMMAND...
       keygate sandbox cp SRC DST          (one of them NAME:/path inside the box)
       keygate sandbox rm NAME...

Works against the sandbox API of 'keygate serve'. The API key and URL are read like 'keygate deploy'
reads them: KEYGATE_API_KEY and KEYGATE_URL from the environment, else from .env in the current
directory (URL default http://127.0.0.1:8080).

  create   create a box from a template (default: the first one this server's driver can build) and
           wait until it is ready; --proxy-config FILE is a proxy_config JSON document
  ls       list the workspace's boxes (every page)
  exec     run COMMAND in the box, streaming its output (WebSocket); exits with the command's exit code.
           A single argument is a shell command line; several are an argv. -i forwards stdin.
           --json waits and prints the JSON result (stdout, stderr, exit_code, truncated ...) instead
  cp       copy a file into (DST = NAME:/path) or out of (SRC = NAME:/path) a box, streaming
  rm       delete boxes (processes, files, proxy)`;

interface Box {
  name: string;
  template_name: string;
  driver: string;
  status: string;
  status_reason: string | null;
  idle_ttl_seconds: number;
  created_at: string;
}

/** The sandbox API's HTTP side; the API key travels only in X-Api-Key, never in a message. */
class SandboxClient {
  readonly agent = new Agent({ connectTimeout: 10_000 });
  constructor(
    readonly baseUrl: string,
    private readonly apiKey: string,
  ) {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { 'x-api-key': this.apiKey, 'user-agent': 'keygate-sandbox', ...extra };
  }

  /** The one message for an API that cannot be reached, whichever command (HTTP or WebSocket) tried. */
  unreachable(err: unknown): CliError {
    return new CliError(`cannot reach the sandbox API at ${this.baseUrl}: ${networkFailure(err)}; is 'keygate serve' running there? (set KEYGATE_URL)`);
  }

  async call(what: string, method: Dispatcher.HttpMethod, path: string, opts: { json?: unknown; body?: Dispatcher.DispatchOptions['body']; headers?: Record<string, string> } = {}): Promise<Dispatcher.ResponseData> {
    const res = await apiRequest(
      this.agent,
      this.baseUrl + path,
      method,
      this.headers(opts.headers),
      { json: opts.json, body: opts.body, timeoutMs: 0 },
      (err) => this.unreachable(err),
      (err) => new CliError(`${what}: ${(err as Error).message}`),
    );
    if (res.statusCode >= 400) {
      const detail = await errorDetail(res);
      if (res.statusCode === 401) throw new CliError('the sandbox API rejected the API key (401)');
      throw new CliError(`${what}: ${detail} (${res.statusCode})`);
    }
    return res;
  }

  async json<T>(what: string, method: Dispatcher.HttpMethod, path: string, json?: unknown): Promise<T> {
    const res = await this.call(what, method, path, { json });
    const text = await res.body.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  async listAll(): Promise<Box[]> {
    const all: Box[] = [];
    for (let offset = 0; ; ) {
      const page = await this.json<{ resources: Box[]; offset: number }>('cannot list sandboxes', 'GET', `/api/v2/sandboxes/boxes?limit=100&offset=${offset}`);
      all.push(...page.resources);
      if (page.resources.length < 100) return all;
      offset = page.offset;
    }
  }
}

const boxPath = (name: string) => `/api/v2/sandboxes/boxes/${encodeURIComponent(name)}`;

function client(): SandboxClient {
  const settings = resolveSettings(process.cwd());
  if (!settings.apiKey) throw new CliError('no API key: set KEYGATE_API_KEY (in the environment or in .env)');
  return new SandboxClient(settings.url, settings.apiKey);
}

function parseIntOpt(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new CliError(`--${name} must be a non-negative number`, 2);
  return n;
}

async function create(c: SandboxClient, argv: string[]): Promise<number> {
  const { values, positionals } = parseCliArgs(
    {
      args: argv,
      allowPositionals: true,
      options: {
        template: { type: 'string' },
        'proxy-config': { type: 'string' },
        'idle-ttl': { type: 'string' },
        'memory-mb': { type: 'string' },
        'disk-mb': { type: 'string' },
        cpus: { type: 'string' },
        pids: { type: 'string' },
        'no-wait': { type: 'boolean' },
        json: { type: 'boolean' },
      },
    },
    HELP,
  );
  if (positionals.length !== 1) throw new CliError(`create takes one NAME\n${HELP}`, 2);
  let template = values.template;
  if (!template) {
    const t = await c.json<{ resources: { name: string; drivers: string[] }[]; driver: string }>('cannot list templates', 'GET', '/api/v2/sandboxes/templates');
    template = t.resources.find((r) => r.drivers.includes(t.driver))?.name;
    if (!template) throw new CliError(`no template of this server can be built by its '${t.driver}' driver; see config/templates.json`);
  }
  let proxyConfig: unknown;
  if (values['proxy-config']) {
    let text: string;
    try {
      text = await readFile(values['proxy-config'], 'utf8');
    } catch (err) {
      throw new CliError(`--proxy-config ${values['proxy-config']}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    try {
      proxyConfig = JSON.parse(text);
    } catch (err) {
      // V8's message quotes the text around the error, and the file holds opaque values.
      throw new CliError(`--proxy-config ${values['proxy-config']} is not valid JSON (${jsonErrorLocation(text, err)})`);
    }
  }
  const resources = Object.fromEntries(
    (
      [
        ['memory_mb', parseIntOpt('memory-mb', values['memory-mb'])],
        ['cpus', parseIntOpt('cpus', values.cpus)],
        ['pids', parseIntOpt('pids', values.pids)],
        ['disk_mb', parseIntOpt('disk-mb', values['disk-mb'])],
      ] as const
    ).filter(([, v]) => v !== undefined),
  );
  const box = await c.json<Box>('cannot create the sandbox', 'POST', '/api/v2/sandboxes/boxes', {
    name: positionals[0],
    template_name: template,
    wait_for_ready: !values['no-wait'],
    ...(proxyConfig ? { proxy_config: proxyConfig } : {}),
    ...(values['idle-ttl'] !== undefined ? { idle_ttl_seconds: parseIntOpt('idle-ttl', values['idle-ttl']) } : {}),
    ...(Object.keys(resources).length ? { resources } : {}),
  });
  if (values.json) process.stdout.write(JSON.stringify(box) + '\n');
  else process.stdout.write(`${box.name}: ${box.status}${box.status_reason ? ` (${box.status_reason})` : ''}, template ${box.template_name}, driver ${box.driver}\n`);
  return box.status === 'failed' ? 1 : 0;
}

async function ls(c: SandboxClient, argv: string[]): Promise<number> {
  const { values } = parseCliArgs({ args: argv, options: { json: { type: 'boolean' } } }, HELP);
  const boxes = await c.listAll();
  if (values.json) {
    process.stdout.write(JSON.stringify(boxes) + '\n');
    return 0;
  }
  const rows = [['NAME', 'STATUS', 'DRIVER', 'TEMPLATE', 'IDLE TTL', 'CREATED'], ...boxes.map((b) => [b.name, b.status, b.driver, b.template_name, String(b.idle_ttl_seconds), b.created_at])];
  const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  process.stdout.write(rows.map((r) => r.map((v, i) => v.padEnd(widths[i])).join('  ').trimEnd()).join('\n') + '\n');
  return 0;
}

function ordinal(n: number): string {
  return n % 10 === 1 && n % 100 !== 11 ? 'st' : n % 10 === 2 && n % 100 !== 12 ? 'nd' : n % 10 === 3 && n % 100 !== 13 ? 'rd' : 'th';
}

function parseEnv(list: string[] | undefined): Record<string, string> | undefined {
  if (!list?.length) return undefined;
  const out: Record<string, string> = {};
  list.forEach((kv, n) => {
    const i = kv.indexOf('=');
    // Not echoed: an argument without its KEY may be the value alone (a token pasted on its own).
    if (i <= 0) throw new CliError(`--env expects KEY=VALUE: the ${n + 1}${ordinal(n + 1)} --env has ${i === 0 ? 'nothing before "="' : 'no "="'} (its text is not shown)`, 2);
    out[kv.slice(0, i)] = kv.slice(i + 1);
  });
  return out;
}

async function exec(c: SandboxClient, argv: string[]): Promise<number> {
  const { values, positionals } = parseCliArgs(
    {
      args: argv,
      allowPositionals: true,
      options: {
        timeout: { type: 'string', default: '600' },
        env: { type: 'string', multiple: true },
        cwd: { type: 'string' },
        interactive: { type: 'boolean', short: 'i' },
        json: { type: 'boolean' },
      },
    },
    HELP,
  );
  const [name, ...cmd] = positionals;
  if (!name || !cmd.length) throw new CliError(`exec takes NAME and a COMMAND\n${HELP}`, 2);
  const request = {
    command: cmd.length === 1 ? cmd[0] : cmd,
    timeout_seconds: parseIntOpt('timeout', values.timeout),
    ...(values.env ? { env: parseEnv(values.env) } : {}),
    ...(values.cwd ? { cwd: values.cwd } : {}),
  };
  if (values.json) {
    const result = await c.json<{ exit_code: number }>('cannot execute', 'POST', `${boxPath(name)}/execute`, request);
    process.stdout.write(JSON.stringify(result) + '\n');
    return result.exit_code;
  }
  return streamExec(c, name, { ...request, stdin: Boolean(values.interactive) });
}

/** The WebSocket form of execute: output as it comes, stdin forwarded, Ctrl-C kills the command. */
function streamExec(c: SandboxClient, name: string, req: Record<string, unknown>): Promise<number> {
  const url = `${c.baseUrl.replace(/^http/, 'ws')}${boxPath(name)}/execute/ws`;
  const ws = new WebSocket(url, { headers: c.headers() });
  return new Promise<number>((resolve, reject) => {
    let code: number | undefined;
    const onSigint = () => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: 'kill', signal: 'SIGINT' }));
    const cleanup = () => {
      process.off('SIGINT', onSigint);
      process.stdin.pause();
    };
    ws.on('unexpected-response', (_r, res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString('utf8')));
      res.on('end', () => {
        cleanup();
        reject(new CliError(res.statusCode === 401 ? 'the sandbox API rejected the API key (401)' : `cannot execute: ${describeDetail(parseJsonText(text), `HTTP ${res.statusCode}`)} (${res.statusCode})`));
      });
    });
    ws.on('open', () => {
      process.on('SIGINT', onSigint);
      ws.send(JSON.stringify(req));
      if (req.stdin) {
        process.stdin.on('data', (d: Buffer) => ws.send(JSON.stringify({ type: 'stdin', data: d.toString('utf8') })));
        process.stdin.on('end', () => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: 'stdin_close' })));
      }
    });
    ws.on('message', (raw: Buffer) => {
      const msg = JSON.parse(raw.toString('utf8')) as { type: string; data?: string; exit_code?: number; detail?: string; truncated?: boolean };
      if (msg.type === 'stdout') process.stdout.write(msg.data ?? '');
      else if (msg.type === 'stderr') process.stderr.write(msg.data ?? '');
      else if (msg.type === 'exit') {
        code = msg.exit_code;
        if (msg.truncated) process.stderr.write('keygate: output truncated at the cap of 10 MiB per stream\n');
      } else if (msg.type === 'error') {
        cleanup();
        reject(new CliError(`cannot execute: ${msg.detail}`));
      }
    });
    ws.on('error', (err) => {
      cleanup();
      // Before the connection opened, the API was not reached: said as every other command says it.
      reject(ws.readyState === WebSocket.CONNECTING || (err as NodeJS.ErrnoException).syscall === 'connect' ? c.unreachable(err) : new CliError(`cannot execute: ${err.message}`));
    });
    ws.on('close', () => {
      cleanup();
      if (code === undefined) reject(new CliError('cannot execute: the connection closed before the command ended'));
      else resolve(code);
    });
  });
}

/** `NAME:/path` -> {name, path}; anything else is a local path. */
function remote(arg: string): { name: string; path: string } | undefined {
  const m = /^([a-z0-9][a-z0-9-]*):(\/.*)$/.exec(arg);
  return m ? { name: m[1], path: m[2] } : undefined;
}

async function cp(c: SandboxClient, argv: string[]): Promise<number> {
  const { positionals } = parseCliArgs({ args: argv, allowPositionals: true, options: {} }, HELP);
  if (positionals.length !== 2) throw new CliError(`cp takes SRC and DST\n${HELP}`, 2);
  const [src, dst] = positionals.map(remote);
  if (Boolean(src) === Boolean(dst)) throw new CliError('cp: exactly one of SRC and DST must be NAME:/path inside a box', 2);
  if (dst) {
    let size: number;
    try {
      size = statSync(positionals[0]).size;
    } catch (err) {
      throw new CliError(`cp: ${positionals[0]}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    // Exactly the bytes counted in Content-Length: a file still being written (a log) is sent as
    // it was at the stat, not cut off by a length mismatch halfway through.
    const res = await c.call('cannot upload', 'PUT', `${boxPath(dst.name)}/files?path=${encodeURIComponent(dst.path)}`, {
      body: size === 0 ? Readable.from([]) : createReadStream(positionals[0], { start: 0, end: size - 1 }),
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) },
    });
    await res.body.dump();
    return 0;
  }
  const res = await c.call('cannot download', 'GET', `${boxPath(src!.name)}/files?path=${encodeURIComponent(src!.path)}`);
  // Written next to the target and renamed, so a failed download never leaves half a file.
  const tmp = `${positionals[1]}.keygate-${process.pid}.part`;
  try {
    await pipeline(res.body, createWriteStream(tmp, { mode: 0o644 }));
    await rename(tmp, positionals[1]);
  } catch (err) {
    await rm(tmp, { force: true });
    throw new CliError(`cp: ${(err as Error).message}`);
  }
  return 0;
}

async function rmBoxes(c: SandboxClient, argv: string[]): Promise<number> {
  const { positionals } = parseCliArgs({ args: argv, allowPositionals: true, options: {} }, HELP);
  if (!positionals.length) throw new CliError(`rm takes at least one NAME\n${HELP}`, 2);
  for (const name of positionals) {
    const res = await c.call(`cannot delete '${name}'`, 'DELETE', boxPath(name));
    await res.body.dump();
    process.stdout.write(`deleted ${name}\n`);
  }
  return 0;
}

const SUB: Record<string, (c: SandboxClient, argv: string[]) => Promise<number>> = { create, ls, exec, cp, rm: rmBoxes };

export async function run(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (!sub || sub === '--help' || sub === '-h') {
    process.stdout.write(HELP + '\n');
    return sub ? 0 : 2;
  }
  const fn = SUB[sub];
  if (!fn) throw new CliError(`unknown 'sandbox' command '${sub}'\n${HELP}`, 2);
  // Help needs no API key. After `--` the words are the box's command (`exec b1 -- ls --help`).
  const end = rest.indexOf('--');
  if ((end < 0 ? rest : rest.slice(0, end)).some((a) => a === '--help' || a === '-h')) {
    process.stdout.write(HELP + '\n');
    return 0;
  }
  const c = client();
  try {
    return await fn(c, rest);
  } finally {
    await c.agent.close().catch(() => undefined);
  }
}
