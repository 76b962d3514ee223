import type { Logger } from '../log.js';
import type { Decision } from '../rules/compile.js';
import type { ProxyCore, RequestRecord } from './context.js';
import { requestLine } from './access-line.js';

/**
 * The one place request records are built, logged and emitted, whichever exchange served the
 * request (`via`). A record holds normalised hosts and paths, rule and header NAMES, statuses,
 * counters and fixed error sentences: never a header value.
 */

export interface RecordTarget {
  client: string;
  host: string;
  port: number;
  decision: Decision;
}

export function newRecord(method: string, t: RecordTarget, path: string, via: RequestRecord['via'] = 'node'): RequestRecord {
  return {
    type: 'request',
    client: t.client,
    method,
    host: t.host,
    port: t.port,
    path,
    decision: t.decision,
    via,
    proto: via === 'h2' ? 'h2' : 'h1',
    rule: null,
    injected: [],
    status: 0,
    bytes_in: 0,
    bytes_out: 0,
    duration_ms: 0,
  };
}

/** The path a refused request is logged with: its target without the query (it can hold tokens), bounded. */
export function refusedPath(target: string): string {
  return target.split('?')[0].slice(0, 200);
}

const accessLoggers = new WeakMap<Logger, Logger>();

/**
 * The logger for request and tunnel records: the proxy's logger without pino's redaction pass.
 * Those records are built field by field from normalised hosts and paths, rule and header
 * NAMES, statuses, counters and fixed error sentences (RequestRecord, TunnelRecord): no key of
 * theirs is a redaction path and no header value is ever put in them, so redaction can only scan
 * them and change nothing, and it cost about 80 us per line (ten times the rest of the line) in
 * the benchmark's profiles. Every other log line keeps the redaction safety net.
 */
export function accessLog(core: ProxyCore): Logger {
  let log = accessLoggers.get(core.logger);
  if (!log) {
    log = core.logger.child({}, { redact: [] });
    accessLoggers.set(core.logger, log);
  }
  return log;
}

/** Logs a finished request and emits it (the same object) for metrics. */
export function finishRecord(core: ProxyCore, rec: RequestRecord, started: number): void {
  rec.duration_ms = Math.round((performance.now() - started) * 10) / 10;
  core.events.emit('request', rec);
  requestLine(accessLog(core), rec, rec.status >= 500 || rec.error ? 'warn' : 'info');
}

