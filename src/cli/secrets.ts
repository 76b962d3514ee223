import { existsSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { EnvelopeError } from '../secrets/envelope.js';
import { isSecretKey } from '../secrets/keys.js';
import { rotateMasterKey } from '../secrets/rotate.js';
import { MAX_SECRET_BYTES, SecretStoreError, openSecretStore, type SecretStore } from '../secrets/store.js';
import { openDb, type Db } from '../store/db.js';
import { resolveDataDir } from './data-dir.js';
import { CliError } from './errors.js';

const HELP = `usage: keygate secrets set KEY      [--data DIR] [--workspace ID]   (value from stdin, or a hidden prompt)
       keygate secrets list         [--data DIR] [--workspace ID]   (names only)
       keygate secrets rm KEY       [--data DIR] [--workspace ID]
       keygate secrets rotate-key   [--data DIR]

Workspace secrets, referenced as {KEY} in workspace_secret headers of a proxy_config. They live
encrypted in <data>/secrets.json (AES-256-GCM under the master key: KEYGATE_MASTER_KEY, else
<data>/master.key), or in the server database when DATABASE_URL is set. KEYGATE_SECRETS_FILE /
KEYGATE_SECRETS_DIR select a read-only plain store instead. A value is never accepted on the
command line (shell history, process list) and never printed.

  --data DIR        data directory (default: KEYGATE_DATA_DIR, else ./data)
  --workspace ID    workspace (default: default)

rotate-key re-encrypts every stored value (secrets file, and every sealed value in the database)
under a new master key. With KEYGATE_MASTER_KEY, put the new key in KEYGATE_NEW_MASTER_KEY first.`;

const VALUE_IN_ARGV = 'a secret value is never taken from the command line (it would end up in shell history and the process list); pipe it on stdin or type it at the prompt';

interface Common {
  dataDir: string;
  workspace?: string;
  positionals: string[];
}

function parse(argv: string[], sub: string): Common {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: { data: { type: 'string' }, workspace: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    // parseArgs quotes the offending argument, which for `set` may be a value typed by mistake.
    if (sub === 'set') throw new CliError(`unknown option: ${VALUE_IN_ARGV}`, 2);
    throw new CliError(`${(err as Error).message}\n${HELP}`, 2);
  }
  if (parsed.values.help) {
    process.stdout.write(HELP + '\n');
    throw new CliError('', 0);
  }
  return { dataDir: resolveDataDir(parsed.values.data), workspace: parsed.values.workspace, positionals: parsed.positionals };
}

async function withStore<T>(c: Common, fn: (store: SecretStore) => Promise<T>): Promise<T> {
  const url = process.env.DATABASE_URL;
  const db = url ? await openDb({ dataDir: c.dataDir, databaseUrl: url }) : undefined;
  try {
    return await fn(await openSecretStore({ dataDir: c.dataDir, workspaceId: c.workspace, db }));
  } finally {
    await db?.close();
  }
}

function keyArg(c: Common, sub: string): string {
  if (c.positionals.length === 0) throw new CliError(`usage: keygate secrets ${sub} KEY`, 2);
  if (c.positionals.length > 1) throw new CliError(sub === 'set' ? VALUE_IN_ARGV : `usage: keygate secrets ${sub} KEY (one name)`, 2);
  const key = c.positionals[0];
  if (!isSecretKey(key)) {
    // Not echoed for `set`: `set TOKEN=ghp_...` must not print the value back.
    if (sub === 'set' && key.includes('=')) throw new CliError(VALUE_IN_ARGV, 2);
    throw new CliError(`invalid secret name${sub === 'set' ? '' : ` '${key.slice(0, 140)}'`}: use letters, digits and _ (not starting with a digit), at most 128 characters`, 2);
  }
  return key;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    size += (chunk as Buffer).length;
    if (size > MAX_SECRET_BYTES + 2) throw new CliError(`the value on stdin is larger than ${MAX_SECRET_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  let text: string;
  try {
    // Fatal: replacing bytes that are not UTF-8 with U+FFFD would store a value other than the one given.
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(Buffer.concat(chunks));
  } catch {
    throw new CliError('the value on stdin is not valid UTF-8; nothing was stored');
  }
  // `echo value | keygate secrets set KEY` adds one newline that is not part of the value.
  return text.endsWith('\r\n') ? text.slice(0, -2) : text.endsWith('\n') ? text.slice(0, -1) : text;
}

/** Reads a line from the terminal without echoing it. */
function promptHidden(question: string): Promise<string> {
  const stdin = process.stdin;
  // Echo goes off before the prompt appears: typing that starts right after the prompt (or
  // type-ahead) is never shown.
  stdin.setRawMode(true);
  process.stderr.write(question);
  return new Promise((resolve, reject) => {
    let value = '';
    const done = (err?: Error) => {
      stdin.setRawMode(false);
      stdin.pause();
      stdin.off('data', onData);
      process.stderr.write('\n');
      if (err) reject(err);
      else resolve(value);
    };
    const onData = (data: Buffer) => {
      for (const ch of data.toString('utf8')) {
        if (ch === '\r' || ch === '\n') return done();
        if (ch === '\u0003') return done(new CliError('cancelled', 130));
        if (ch === '\u0004') {
          if (value === '') return done(new CliError('cancelled', 130));
          return done();
        }
        if (ch === '\u007f' || ch === '\b') value = [...value].slice(0, -1).join('');
        else if (ch >= ' ') value += ch;
      }
    };
    stdin.resume();
    stdin.on('data', onData);
  });
}

async function cmdSet(c: Common): Promise<number> {
  const key = keyArg(c, 'set');
  const value = process.stdin.isTTY ? await promptHidden(`Value for ${key} (input hidden): `) : await readStdin();
  if (value === '') throw new CliError(`no value given for ${key} (empty input); to delete a secret use 'keygate secrets rm ${key}'`);
  await withStore(c, async (store) => {
    const existed = (await store.list()).includes(key);
    await store.set(key, value);
    process.stderr.write(`${existed ? 'updated' : 'stored'} ${key} in ${store.description}\n`);
  });
  return 0;
}

async function cmdList(c: Common): Promise<number> {
  if (c.positionals.length) throw new CliError('usage: keygate secrets list (no arguments)', 2);
  await withStore(c, async (store) => {
    const names = await store.list();
    if (names.length) process.stdout.write(names.join('\n') + '\n');
    else process.stderr.write(`no secrets in ${store.description}\n`);
  });
  return 0;
}

async function cmdRm(c: Common): Promise<number> {
  const key = keyArg(c, 'rm');
  return withStore(c, async (store) => {
    if (!(await store.delete(key))) {
      process.stderr.write(`keygate: no secret ${key} in ${store.description}\n`);
      return 1;
    }
    process.stderr.write(`removed ${key} from ${store.description}\n`);
    return 0;
  });
}

async function cmdRotate(c: Common): Promise<number> {
  if (c.positionals.length) throw new CliError('usage: keygate secrets rotate-key (no arguments; with KEYGATE_MASTER_KEY, the new key comes from KEYGATE_NEW_MASTER_KEY)', 2);
  if (c.workspace) throw new CliError('rotate-key re-encrypts every workspace; --workspace does not apply', 2);
  const url = process.env.DATABASE_URL;
  // Only an existing database: rotating must not create an empty one as a side effect.
  const sqliteFile = path.join(c.dataDir, 'keygate.db');
  const db: Db | undefined = url ? await openDb({ dataDir: c.dataDir, databaseUrl: url }) : existsSync(sqliteFile) ? await openDb({ dataDir: c.dataDir, databaseUrl: '' }) : undefined;
  try {
    const r = await rotateMasterKey({ dataDir: c.dataDir, db });
    const out = [
      `rotated the master key ${r.oldKeyId} -> ${r.newKeyId}${r.resumed ? ' (completed an interrupted rotation)' : ''}`,
      `  secrets file: ${r.secretsFileValues} value(s) re-encrypted`,
      db ? `  database (${db.kind}): ${r.dbValues.reduce((n, v) => n + v.values, 0)} value(s) re-encrypted` : '  database: none',
      ...r.dbValues.map((v) => `    ${v.table}.${v.column}: ${v.values}`),
    ];
    if (r.source === 'env') {
      out.push('Now set KEYGATE_MASTER_KEY to the value of KEYGATE_NEW_MASTER_KEY for every keygate process, remove KEYGATE_NEW_MASTER_KEY, and restart them: values are no longer readable with the old key alone.');
    } else {
      out.push(`The new key is in ${path.join(c.dataDir, 'master.key')}; back it up. Restart running keygate proxies so they stop using the old key.`);
    }
    process.stdout.write(out.join('\n') + '\n');
  } finally {
    await db?.close();
  }
  return 0;
}

export async function run(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (!sub || sub === '--help' || sub === '-h' || sub === 'help') {
    process.stdout.write(HELP + '\n');
    return sub ? 0 : 2;
  }
  const handlers: Record<string, (c: Common) => Promise<number>> = { set: cmdSet, list: cmdList, rm: cmdRm, 'rotate-key': cmdRotate };
  const handler = handlers[sub];
  if (!handler) throw new CliError(`unknown 'secrets' command (expected set, list, rm or rotate-key)\n${HELP}`, 2);
  let c: Common;
  try {
    c = parse(rest, sub);
  } catch (err) {
    if (err instanceof CliError && err.exitCode === 0) return 0;
    throw err;
  }
  try {
    return await handler(c);
  } catch (err) {
    // Store and envelope errors are written to be shown: they name files, keys and key ids only.
    if (err instanceof SecretStoreError || err instanceof EnvelopeError) throw new CliError(err.message);
    throw err;
  }
}
