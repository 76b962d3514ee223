import { isIPv4, isIPv6 } from 'node:net';
import { CliError } from './errors.js';

/**
 * The one `--listen HOST:PORT` syntax of every keygate server (`proxy`, `serve`, `start`, `app
 * serve`):
 *
 *   HOST:PORT     HOST an IPv4 address (127.0.0.1, 0.0.0.0) or a host name (localhost)
 *   [IPv6]:PORT   e.g. [::1]:8080, [::]:8080
 *
 * PORT is a decimal number from 0 to 65535; 0 picks a free port. There is no default host: an
 * empty one (`:8080`) is refused rather than guessed, since "all interfaces" and "loopback" are
 * both common readings and only one of them is safe. No spaces, no unbracketed IPv6 (its last
 * `:` would be ambiguous), no zone ids. A refusal is a usage error (exit 2) naming the flag.
 */
export function parseListen(value: string, flag = '--listen'): { host: string; port: number } {
  const fail = (why: string) => new CliError(`${flag} must be HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:8080 (${why}), got '${value}'`, 2);
  const colon = value.lastIndexOf(':');
  if (colon < 0) throw fail('no port');
  const rawHost = value.slice(0, colon);
  const rawPort = value.slice(colon + 1);
  if (!/^[0-9]{1,5}$/.test(rawPort) || Number(rawPort) > 65535) throw fail('the port is a number from 0 to 65535');
  let host: string;
  if (rawHost.startsWith('[') || rawHost.endsWith(']')) {
    host = rawHost.slice(1, -1);
    if (!rawHost.startsWith('[') || !rawHost.endsWith(']') || !isIPv6(host) || host.includes('%')) throw fail('an IPv6 address goes in brackets');
  } else {
    host = rawHost;
    if (host === '') throw fail('the host is empty');
    if (host.includes(':')) throw fail('an IPv6 address goes in brackets');
    // A name of letters, digits, '-' and '.'; all digits and dots must be a real IPv4 address.
    if (!/^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$/.test(host) || host.includes('..')) throw fail('not an address or host name');
    if (/^[0-9.]+$/.test(host) && !isIPv4(host)) throw fail('not an IPv4 address');
  }
  return { host, port: Number(rawPort) };
}

/**
 * What a server command says when its address cannot be bound (taken, not ours to bind, a host
 * name that does not resolve): one line naming the address and the system's code, exit 1. Any
 * other error is returned unchanged: it is not the operator's, and keeps its stack.
 */
export function listenFailure(host: string, port: number, err: unknown): unknown {
  const e = err as NodeJS.ErrnoException;
  if (typeof e?.code !== 'string' || !['listen', 'bind', 'getaddrinfo'].includes(e.syscall ?? '')) return err;
  return new CliError(`cannot listen on ${host.includes(':') ? `[${host}]` : host}:${port}: ${e.code}`);
}
