import diagnosticsChannel from 'node:diagnostics_channel';
import { describe, expect, it } from 'vitest';
import { pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino';
import { createLogger } from '../../src/log.js';
import { requestLine } from '../../src/proxy/access-line.js';
import { newRecord } from '../../src/proxy/record.js';
import type { RequestRecord } from '../../src/proxy/context.js';

/**
 * The hand-written access line must be byte for byte what pino writes for
 * `logger.info(rec, 'request')` / `.warn(...)`: the same logger options as src/log.ts, a fixed
 * clock so the two lines can be compared whole.
 */

class Lines implements DestinationStream {
  lines: string[] = [];
  write(s: string): void {
    this.lines.push(s);
  }
}

/** A destination that asks pino for metadata, as src/log.ts's batching one does. */
class MetaLines extends Lines {
  readonly [pino.symbols.needsMetadataGsym] = true;
  lastLevel = 0;
  lastMsg = '';
  levels: number[] = [];
  override write(s: string): void {
    this.levels.push(this.lastLevel);
    super.write(s);
  }
}

const FIXED = () => ',"time":"2026-11-26T01:00:00.000Z"';
function logger(dest: DestinationStream, extra: Partial<LoggerOptions> = {}): Logger {
  return pino({ level: 'info', redact: [], base: { pid: 4242 }, timestamp: FIXED, ...extra }, dest);
}

const awkward = ['plain', 'with "quotes"', 'back\\slash', 'ctl\u0001char', 'tab\there', 'non-ascii é ☃', 'lone \ud800 surrogate', 'x'.repeat(150), 'quote " and ctl \n', ''];

function records(): RequestRecord[] {
  const out: RequestRecord[] = [];
  let i = 0;
  for (const s of awkward) {
    const r = newRecord(i % 2 ? 'GET' : 'POST', { client: `127.0.0.${i}`, host: `h${s}.test`, port: 443, decision: i % 3 ? 'intercept' : 'tunnel' }, `/p/${s}`, (['fast', 'node', 'h2'] as const)[i % 3]);
    r.rule = i % 2 ? null : `rule ${s}`;
    r.injected = i % 4 === 0 ? [] : i % 4 === 1 ? ['authorization'] : ['x-a', `x-"${s}`];
    r.status = [200, 404, 502, 499][i % 4];
    r.bytes_in = i * 1000;
    r.bytes_out = i === 3 ? NaN : 321 * i;
    r.duration_ms = i === 5 ? Infinity : i * 1.25;
    if (i % 3 === 1) r.error = `upstream ${s} failed`;
    out.push(r);
    i++;
  }
  return out;
}

function both(make: (d: DestinationStream) => Logger, rec: RequestRecord, level: 'info' | 'warn'): [string[], string[]] {
  const a = new Lines();
  const b = new Lines();
  make(a)[level](rec, 'request');
  requestLine(make(b), rec, level);
  return [a.lines, b.lines];
}

describe('access line (hand-written serialiser)', () => {
  it('writes the same bytes as pino for every record, at info and warn', () => {
    for (const rec of records()) {
      for (const level of ['info', 'warn'] as const) {
        const [want, got] = both((d) => logger(d), rec, level);
        expect(got).toEqual(want);
        expect(got).toHaveLength(1);
        JSON.parse(got[0]); // valid JSON
      }
    }
  });

  it("keeps a child logger's bindings and a named base", () => {
    const rec = records()[1];
    const [want, got] = both((d) => logger(d, { base: { name: 'sidecar' } }).child({ sandbox: 'sb-"1"' }).child({}, { redact: [] }), rec, 'info');
    expect(got).toEqual(want);
    expect(got[0]).toContain('"sandbox":"sb-\\"1\\""');
  });

  it('writes nothing below the logger level, and warns when info is off', () => {
    const rec = records()[0];
    const [want, got] = both((d) => logger(d, { level: 'warn' }), rec, 'info');
    expect(got).toEqual([]);
    expect(want).toEqual([]);
    const [w2, g2] = both((d) => logger(d, { level: 'warn' }), rec, 'warn');
    expect(g2).toEqual(w2);
    expect(g2).toHaveLength(1);
  });

  it('tells a destination that asks for it the level (the batch flushes warnings at once)', () => {
    const d = new MetaLines();
    const log = logger(d);
    const [rec] = records();
    requestLine(log, rec, 'warn');
    requestLine(log, rec, 'info');
    expect(d.levels).toEqual([40, 30]);
    expect(d.lastMsg).toBe('request');
  });

  it('leaves loggers it cannot stand in for to pino (mixin, serializer for a record key, message prefix)', () => {
    const rec = records()[2];
    const variants: Partial<LoggerOptions>[] = [
      { mixin: () => ({ extra: 1 }) },
      { serializers: { path: () => 'hidden' } },
      { msgPrefix: '[p] ' },
      { messageKey: 'message' },
      { formatters: { log: (o: Record<string, unknown>) => ({ ...o, shaped: true }) } },
    ];
    for (const v of variants) {
      const [want, got] = both((d) => logger(d, v), rec, 'info');
      expect(got).toEqual(want);
    }
    expect(both((d) => logger(d, { serializers: { path: () => 'hidden' } }), rec, 'info')[1][0]).toContain('"path":"hidden"');
  });

  it("leaves the line to pino while pino's tracing channel has a subscriber", () => {
    const ch = diagnosticsChannel.tracingChannel('pino_asJson');
    let traced = 0;
    const handlers = { start: () => traced++, end: () => undefined, asyncStart: () => undefined, asyncEnd: () => undefined, error: () => undefined };
    ch.subscribe(handlers);
    try {
      const [want, got] = both((d) => logger(d), records()[0], 'info');
      expect(got).toEqual(want);
      expect(traced).toBe(2); // pino's own line and the one requestLine handed to it
    } finally {
      ch.unsubscribe(handlers);
    }
  });

  it('leaves a record with another shape to pino', () => {
    const rec = { ...records()[0], extra: 'kept' } as unknown as RequestRecord;
    const [want, got] = both((d) => logger(d), rec, 'info');
    expect(got).toEqual(want);
    expect(got[0]).toContain('"extra":"kept"');
  });

  it("matches src/log.ts's own logger (its clock and base) apart from the time", () => {
    const strip = (s: string) => s.replace(/,"time":"[^"]*"/, '');
    for (const rec of records()) {
      const a = new Lines();
      const b = new Lines();
      createLogger({ destination: a }).child({}, { redact: [] }).info(rec, 'request');
      requestLine(createLogger({ destination: b }).child({}, { redact: [] }), rec, 'info');
      expect(b.lines.map(strip)).toEqual(a.lines.map(strip));
      expect(b.lines[0]).toMatch(/^\{"level":30,"time":"\d{4}-\d\d-\d\dT[^"]+Z","pid":\d+,"type":"request",/);
    }
  });
});
