import { pino, type Logger, type DestinationStream, type LoggerOptions } from 'pino';

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

export interface LogOptions {
  level?: string;
  name?: string;
  destination?: DestinationStream;
}

/** One JSON line per event on stdout (or the given stream), with redaction. */
export function createLogger(opts: LogOptions = {}): Logger {
  const options: LoggerOptions = {
    level: opts.level ?? process.env.KEYGATE_LOG_LEVEL ?? 'info',
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    base: opts.name ? { name: opts.name } : { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  return opts.destination ? pino(options, opts.destination) : pino(options);
}
