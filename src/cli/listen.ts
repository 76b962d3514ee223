import { CliError } from './errors.js';

/** Parses `HOST:PORT`, `[v6]:PORT` or `:PORT` (port 0 = any free port). */
export function parseListen(value: string, flag = '--listen'): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s]*)):(\d{1,5})$/.exec(value.trim());
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new CliError(`${flag} must be HOST:PORT (e.g. 127.0.0.1:8080), got '${value}'`);
  return { host: m[1] ?? (m[2] || '127.0.0.1'), port };
}
