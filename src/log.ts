import { writeSync } from './builtins/fs.js';
import { pino, type Logger, type DestinationStream, type LoggerOptions } from 'pino';
import { intSetting, logLevelSetting } from './settings.js';

export type { Logger } from 'pino';

/**
 * Paths pino censors wherever they appear. keygate never puts secret values into log objects in
 * the first place; this list is the safety net for the places where a value could slip in
 * (request headers, config objects, provider responses).
 */
export const REDACT_PATHS: string[] = [
  'authorization',
  'password',
  'secret',
  'token',
  'value',
  'access_token',
  'refresh_token',
  'client_secret',
  'api_key',
  'secrets',
  '*.authorization',
  '*.Authorization',
  '*.password',
  '*.secret',
  '*.token',
  '*.value',
  '*.access_token',
  '*.refresh_token',
  '*.id_token',
  '*.client_secret',
  '*.api_key',
  '*.secrets',
  '*["x-api-key"]',
  '*["proxy-authorization"]',
  '*.*.authorization',
  '*.*["x-api-key"]',
  '*.*.value',
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers.cookie',
];

/**
 * An Error's message without the value Node's argument checks quote (`... Received <value>`).
 * The same rule as loggableMessage in src/server/errors.ts, which the servers use; repeated here
 * rather than imported: one more import edge in the proxy's start-up was enough to make path
 * normalisation hot for TurboFan before the optimizer is released (test/cli/v8-flags.test.ts).
 */
function messageForLog(e: Error & { code?: unknown }): string {
  const message = typeof e.message === 'string' ? e.message : String(e);
  if (typeof e.code !== 'string' || !e.code.startsWith('ERR_')) return message;
  return message.replace(/\.?\s*Received\b[\s\S]*$/, '. Received: [not logged]');
}

/**
 * The `err` field of every log line. pino's standard serializer treats any object with a message
 * as an error and sets `type` to its constructor's name, so `{ err: { type, code, message } }`
 * came out as `type: "Object"`, losing the class keygate put there; and it copies a real Error's
 * message and stack verbatim, quoted values included. Here a plain object is kept as given (its
 * `name` becomes `type` when it has none), and an Error becomes its class, its code and its
 * loggable message and stack.
 */
export function serializeErr(err: unknown): unknown {
  if (err instanceof Error) {
    const e = err as Error & { code?: unknown };
    const message = messageForLog(e);
    const out: Record<string, unknown> = { type: e.name || e.constructor?.name || 'Error', message };
    if (typeof e.code === 'string' || typeof e.code === 'number') out.code = e.code;
    if (typeof e.stack === 'string') out.stack = e.message ? e.stack.split(e.message).join(message) : e.stack;
    return out;
  }
  if (err && typeof err === 'object' && !Array.isArray(err)) {
    const o = err as Record<string, unknown>;
    if (o.type === undefined && typeof o.name === 'string') {
      const { name, ...rest } = o;
      return { type: name, ...rest };
    }
    return o;
  }
  return err;
}

export interface LogOptions {
  level?: string;
  name?: string;
  destination?: DestinationStream;
  /**
   * Info and debug lines are gathered for up to this long (or 16 KiB) and written in one go;
   * warnings and errors go out at once, and everything is flushed on exit. 0 writes every line
   * as it comes. Default: KEYGATE_LOG_FLUSH_MS, else 100.
   */
  flushMs?: number;
  /**
   * Applied to every finished line before it is written: removes known secret values wherever
   * they are in it (the message, any field, an error's text), which path-based redaction cannot.
   */
  redact?: (line: string) => string;
}

/** Bytes gathered before a write whatever the clock says. */
const BATCH_BYTES = 16 * 1024;
/**
 * Bytes held while the reader of stdout is not keeping up; lines past this are dropped (and
 * counted) instead of growing the process without bound.
 */
const MAX_HELD_BYTES = 8 * 1024 * 1024;

/**
 * stdout for log lines, written in batches. Before this, every line was its own write on a
 * libuv worker thread: a thread wake-up, a context switch and an event-loop wake-up per proxied
 * request, on a sidecar that usually has one core (bench/README.md has the figures). Lines are
 * gathered here and handed to sonic-boom (which writes whatever it is given as soon as its
 * previous write is done) every flushMs, at 16 KiB, at once for warnings and errors, and
 * synchronously at exit.
 */
class BatchedStdout implements DestinationStream {
  /** pino sets lastLevel on a destination that asks for it, before each write. */
  readonly [pino.symbols.needsMetadataGsym] = true;
  lastLevel = 0;
  private batch = '';
  private dropped = 0;
  private readonly boom: ReturnType<typeof pino.destination>;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly fd: number,
    flushMs: number,
  ) {
    // pino.destination registers a synchronous flush of what it holds at process exit; the batch
    // not yet handed over is written after it (below), so the order is kept.
    this.boom = pino.destination({ dest: fd, sync: false, minLength: 0, maxLength: MAX_HELD_BYTES });
    this.boom.on('drop', () => this.dropped++);
    this.timer = setInterval(() => this.flush(), flushMs).unref();
    process.once('exit', () => {
      clearInterval(this.timer);
      this.writeHeldSync();
    });
  }

  write(line: string): void {
    this.batch += line;
    if (this.lastLevel >= 40 || this.batch.length >= BATCH_BYTES) this.flush();
  }

  flush(cb?: (err?: Error) => void): void {
    if (this.dropped > 0) {
      this.boom.write(`${JSON.stringify({ level: 40, time: new Date().toISOString(), msg: `log output dropped ${this.dropped} times: nothing was reading stdout fast enough` })}\n`);
      this.dropped = 0;
    }
    if (this.batch) {
      const out = this.batch;
      this.batch = '';
      this.boom.write(out);
    }
    cb?.();
  }

  /** pino calls this after a fatal line: everything out before the process goes down. */
  flushSync(): void {
    this.boom.flushSync();
    this.writeHeldSync();
  }

  /** The batch not yet handed to sonic-boom, written synchronously (after what sonic-boom holds). */
  private writeHeldSync(): void {
    const out = this.batch;
    this.batch = '';
    if (!out) return;
    try {
      writeSync(this.fd, out);
    } catch {
      /* stdout is gone: nothing left to tell */
    }
  }
}

let lastMs = -1;
let lastTime = '';
/**
 * pino's isoTime, formatted once per millisecond: a busy proxy logs several lines per
 * millisecond and Date#toISOString was a visible share of each line's cost.
 */
function isoTime(): string {
  const now = Date.now();
  if (now !== lastMs) {
    lastMs = now;
    lastTime = `,"time":"${new Date(now).toISOString()}"`;
  }
  return lastTime;
}

/**
 * One batch per flush interval for the whole process: loggers that share stdout share the
 * batch (their lines stay in order, one exit hook and one timer however many loggers there are).
 */
const batches = new Map<number, BatchedStdout>();
function batchedStdout(flushMs: number): BatchedStdout {
  let b = batches.get(flushMs);
  if (!b) batches.set(flushMs, (b = new BatchedStdout(1, flushMs)));
  return b;
}

function flushMsFromEnv(): number {
  return intSetting(process.env, 'KEYGATE_LOG_FLUSH_MS', 100, { min: 0, max: 10_000, unit: 'milliseconds' });
}

/** One JSON line per event on stdout (or the given stream), with redaction. */
export function createLogger(opts: LogOptions = {}): Logger {
  const options: LoggerOptions = {
    level: opts.level ?? logLevelSetting(process.env, 'info'),
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    serializers: { err: serializeErr },
    base: opts.name ? { name: opts.name } : { pid: process.pid },
    timestamp: isoTime,
    ...(opts.redact ? { hooks: { streamWrite: opts.redact } } : {}),
  };
  if (opts.destination) return pino(options, opts.destination);
  const flushMs = opts.flushMs ?? flushMsFromEnv();
  return pino(options, flushMs > 0 ? batchedStdout(flushMs) : pino.destination({ dest: 1, sync: false }));
}
