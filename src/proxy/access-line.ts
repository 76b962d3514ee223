import diagnosticsChannel from 'node:diagnostics_channel';
import { pino, type Logger } from 'pino';
import type { RequestRecord } from './context.js';

/**
 * The access line of a request, serialised by hand into the logger's own destination: the same
 * bytes pino writes for `logger.info(rec, 'request')` (test/proxy/access-line.test.ts compares
 * them over many records), without pino's generic path. In the 32-connection profile that path
 * (LOG, write, asJson's loop over the keys with a type switch and a stringifier look-up per
 * key) was about 10 % of the proxy's busy time for a record whose shape never changes.
 *
 * Only what is in the record goes into the line, so it holds what the record holds: normalised
 * hosts and paths, rule and header NAMES, statuses, counters, fixed error sentences; never a
 * header value (RequestRecord). The redaction pass is already off for these lines (accessLog in
 * record.ts says why).
 *
 * The logger's own parts are read from it (its level, time function, bindings, line ending and
 * destination), so a child logger's bindings and the batching destination of src/log.ts apply
 * as before. A logger this serialiser cannot stand in for exactly (a mixin, hooks, formatters,
 * serializers or stringifiers for a record key, a nested or renamed message key, a message
 * prefix) gets the line from pino itself, as does every line while someone subscribes to
 * pino's `pino_asJson` tracing channel.
 */

const S = pino.symbols;
/** pino traces its serialisation on this channel; with a subscriber, pino writes the line itself. */
const asJsonChannel = diagnosticsChannel.tracingChannel('pino_asJson');
/** Not in pino's type declarations, but in pino.symbols at run time (10.x). */
const msgPrefixSym = (pino.symbols as unknown as Record<string, symbol>).msgPrefixSym;
type Internals = Record<string | symbol, unknown>;

const nodeMajor = Number(process.versions.node.split('.')[0]);

/** pino's own string quoting (lib/tools.js asString), so the bytes are the same on every Node. */
function pinoQuote(str: string): string {
  let result = '';
  let last = 0;
  let found = false;
  let point = 255;
  const l = str.length;
  if (l > 100) return JSON.stringify(str);
  for (let i = 0; i < l && point >= 32; i++) {
    point = str.charCodeAt(i);
    if (point === 34 || point === 92) {
      result += str.slice(last, i) + '\\';
      last = i;
      found = true;
    }
  }
  if (!found) result = str;
  else result += str.slice(last);
  return point < 32 ? JSON.stringify(str) : '"' + result + '"';
}
const quote: (s: string) => string = nodeMajor >= 25 ? (s) => JSON.stringify(s) : pinoQuote;

/** A number as pino writes it: not finite is null. */
function num(n: number): string {
  return Number.isFinite(n) ? String(n) : 'null';
}

const RECORD_KEYS = ['type', 'client', 'method', 'host', 'port', 'path', 'decision', 'via', 'proto', 'rule', 'injected', 'status', 'bytes_in', 'bytes_out', 'duration_ms', 'error'];

const plainCache = new WeakMap<Logger, boolean>();

/** True when pino would write exactly what `requestLine` writes for this logger. */
function plain(log: Logger): boolean {
  let ok = plainCache.get(log);
  if (ok !== undefined) return ok;
  const l = log as unknown as Internals;
  const hooks = (l[S.hooksSym] ?? {}) as Record<string, unknown>;
  const formatters = (l[S.formattersSym] ?? {}) as Record<string, unknown>;
  const serializers = (l[S.serializersSym] ?? {}) as Record<string, unknown>;
  const stringifiers = (l[S.stringifiersSym] ?? {}) as Record<string | symbol, unknown>;
  const lsCache = l[S.lsCacheSym] as Record<number, unknown> | undefined;
  ok =
    !l[S.mixinSym] &&
    !hooks.logMethod &&
    !hooks.streamWrite &&
    !formatters.log &&
    !l[S.nestedKeySym] &&
    l[S.messageKeySym] === 'msg' &&
    (msgPrefixSym === undefined || typeof l[msgPrefixSym] !== 'string') &&
    !stringifiers[S.wildcardFirstSym] &&
    RECORD_KEYS.every((k) => !serializers[k] && !stringifiers[k]) &&
    !serializers.msg &&
    !stringifiers.msg &&
    typeof lsCache?.[30] === 'string' &&
    typeof lsCache?.[40] === 'string' &&
    typeof l[S.timeSym] === 'function' &&
    typeof l[S.endSym] === 'string';
  plainCache.set(log, ok);
  return ok;
}

/** The record's fields, in the record's key order (newRecord's; `error` comes last when set). */
export function requestFields(rec: RequestRecord): string {
  let s =
    ',"type":' + quote(rec.type) +
    ',"client":' + quote(rec.client) +
    ',"method":' + quote(rec.method) +
    ',"host":' + quote(rec.host) +
    ',"port":' + num(rec.port) +
    ',"path":' + quote(rec.path) +
    ',"decision":' + quote(rec.decision) +
    ',"via":' + quote(rec.via) +
    ',"proto":' + quote(rec.proto) +
    ',"rule":' + (rec.rule === null ? 'null' : quote(rec.rule)) +
    ',"injected":';
  const inj = rec.injected;
  if (inj.length === 0) s += '[]';
  else {
    s += '[' + JSON.stringify(inj[0]);
    for (let i = 1; i < inj.length; i++) s += ',' + JSON.stringify(inj[i]);
    s += ']';
  }
  s +=
    ',"status":' + num(rec.status) +
    ',"bytes_in":' + num(rec.bytes_in) +
    ',"bytes_out":' + num(rec.bytes_out) +
    ',"duration_ms":' + num(rec.duration_ms);
  if (rec.error !== undefined) s += ',"error":' + quote(rec.error);
  return s;
}

/**
 * Whether `rec` has exactly newRecord's keys in newRecord's order (plus `error` last), with the
 * types the serialiser writes. Anything else (a key added elsewhere) goes through pino.
 */
function fixedShape(rec: RequestRecord): boolean {
  let i = 0;
  for (const k in rec) {
    if (k !== RECORD_KEYS[i]) return false;
    i++;
  }
  return (i === 15 || i === 16) && Array.isArray(rec.injected) && (rec.rule === null || typeof rec.rule === 'string');
}

/** Writes the access line of `rec` at `level` ('info' or 'warn') through `log`. */
export function requestLine(log: Logger, rec: RequestRecord, level: 'info' | 'warn'): void {
  if (!plain(log) || !fixedShape(rec) || asJsonChannel.hasSubscribers !== false) {
    log[level](rec, 'request');
    return;
  }
  if (!log.isLevelEnabled(level)) return;
  const l = log as unknown as Internals;
  const n = level === 'warn' ? 40 : 30;
  const time = (l[S.timeSym] as () => string)();
  const line = (l[S.lsCacheSym] as Record<number, string>)[n] + time + (l[S.chindingsSym] as string) + requestFields(rec) + ',"msg":"request"' + (l[S.endSym] as string);
  const stream = l[S.streamSym] as Internals & { write(line: string): void };
  // What pino tells a destination that asks for it (src/log.ts's batch flushes at once on a warning).
  if (stream[S.needsMetadataGsym] === true) {
    stream.lastLevel = n;
    stream.lastObj = rec;
    stream.lastMsg = 'request';
    stream.lastTime = time.slice(l[S.timeSliceIndexSym] as number);
    stream.lastLogger = log;
  }
  stream.write(line);
}
