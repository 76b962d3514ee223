import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import type { EgressPolicy, EgressRefusal } from '../rules/egress.js';
import { ProxyError } from './errors.js';

/** A destination the egress policy refuses: 403 with a sentence telling the sandbox why. */
export class EgressDenied extends ProxyError {
  constructor(
    readonly refusal: EgressRefusal,
    readonly host: string,
    readonly port: number,
    readonly address?: string,
  ) {
    super(403, refusal.type, refusal.reason, 'KEYGATE_EGRESS_DENIED');
    this.name = 'EgressDenied';
  }
}

const SELF_REASON = "egress refused: that address is one of this proxy's own listeners. This is the egress policy of this sandbox, not a network fault: retrying will not help.";

export interface ResolveAllowedOptions {
  /** The --resolve pin for this host:port: used instead of DNS. */
  pinned?: string;
  policy?: EgressPolicy;
  isSelf?: (address: string, port: number) => boolean;
  /** DNS gives up after this long (ETIMEDOUT -> 504). */
  timeoutMs?: number;
  /** For tests: a resolver other than the system's. */
  lookupAll?: (host: string) => Promise<string[]>;
}

async function systemLookup(host: string): Promise<string[]> {
  const answers = await lookup(host, { all: true, verbatim: true });
  return answers.map((a) => a.address);
}

function withTimeout<T>(p: Promise<T>, ms: number | undefined, host: string): Promise<T> {
  if (!ms) return p;
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<never>((_r, reject) => {
      timer = setTimeout(() => reject(Object.assign(new Error(`resolving ${host} timed out`), { code: 'ETIMEDOUT' })), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/**
 * Resolves host:port once and returns the address to connect to, after checking every answer:
 * one refused answer refuses the name (a resolver mixing a public and a metadata address
 * cannot steer which one is dialled). The caller connects to exactly the returned address.
 */
export async function resolveAllowed(host: string, port: number, opts: ResolveAllowedOptions): Promise<string> {
  const addresses = opts.pinned ? [opts.pinned] : isIP(host) ? [host] : await withTimeout((opts.lookupAll ?? systemLookup)(host), opts.timeoutMs, host);
  if (addresses.length === 0) throw Object.assign(new Error(`no address for ${host}`), { code: 'ENOTFOUND' });
  for (const address of addresses) {
    const refusal = opts.policy?.checkAddress(host, port, address);
    if (refusal) throw new EgressDenied(refusal, host, port, address);
    if (opts.isSelf?.(address, port)) throw new EgressDenied({ kind: 'address_denied', type: 'destination_ip_prohibited', reason: SELF_REASON }, host, port, address);
  }
  return addresses[0];
}
