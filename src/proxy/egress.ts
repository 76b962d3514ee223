import { lookup, Resolver } from 'node:dns/promises';
import { isIP } from 'node:net';
import { readFileOrEmpty } from '../builtins/fs.js';
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
  /** For tests: the CNAME targets of a name ([] for none), instead of asking DNS. */
  cnames?: (name: string) => Promise<string[]>;
}

/**
 * The names /etc/hosts lists (lower-case, one trailing dot removed), re-read at most once a
 * second: a name listed there is the one name the system resolver answers from the file.
 */
let hostsFile: { at: number; names: Set<string> } | undefined;
export function etcHostsNames(text = readFileOrEmpty('/etc/hosts')): Set<string> {
  const names = new Set<string>();
  for (const line of text.split('\n')) {
    const fields = line.replace(/#.*/, '').trim().split(/\s+/);
    for (const n of fields.slice(1)) if (n) names.add(n.toLowerCase().replace(/\.$/, ''));
  }
  return names;
}
function listedInEtcHosts(host: string): boolean {
  const now = Date.now();
  if (!hostsFile || now - hostsFile.at > 1000) hostsFile = { at: now, names: etcHostsNames() };
  return hostsFile.names.has(host);
}

/**
 * The system resolver, asked for exactly `host`: as an absolute name (`host.`), so the search
 * list of resolv.conf (or LOCALDOMAIN) never expands it. Without the root dot, a sandbox could
 * CONNECT to `secret` and reach `secret.corp.internal` (search `corp.internal`) past a deny_hosts
 * entry for that name: the decision was made on one name and the connection went to another.
 * A name /etc/hosts lists is asked for as written: glibc's files backend does not match `name.`,
 * and with the usual `hosts: files dns` the file answers it before any search is tried.
 */
async function systemLookup(host: string): Promise<string[]> {
  const name = host.endsWith('.') || listedInEtcHosts(host) ? host : `${host}.`;
  const answers = await lookup(name, { all: true, verbatim: true });
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
  const byName = !opts.pinned && !isIP(host);
  // The alias walk runs beside the lookup (it adds no round trip), only when a deny_hosts entry
  // names a host: the addresses themselves are checked below whatever the names were.
  const aliases = byName && opts.policy?.deniesNames ? withTimeout(aliasesOf(host, opts.cnames ?? dnsCnames), opts.timeoutMs, host) : undefined;
  aliases?.catch(() => undefined);
  // A pin may name a host itself (`--resolve api.test:443:localhost`): its addresses are looked
  // up and checked like any others, so the connection never goes to an address nobody checked.
  const name = opts.pinned ?? host;
  const addresses = isIP(name) ? [name] : await withTimeout((opts.lookupAll ?? systemLookup)(name), opts.timeoutMs, name);
  if (addresses.length === 0) throw Object.assign(new Error(`no address for ${host}`), { code: 'ENOTFOUND' });
  if (aliases) {
    for (const alias of await aliases) {
      const refusal = opts.policy!.checkAlias(host, port, alias);
      if (refusal) throw new EgressDenied(refusal, host, port);
    }
  }
  for (const address of addresses) {
    const refusal = opts.policy?.checkAddress(host, port, address);
    if (refusal) throw new EgressDenied(refusal, host, port, address);
    if (opts.isSelf?.(address, port)) throw new EgressDenied({ kind: 'address_denied', type: 'destination_ip_prohibited', reason: SELF_REASON }, host, port, address);
  }
  return addresses[0];
}

/** How many CNAMEs a chain may have before the name is refused (resolvers give up near here too). */
const MAX_ALIASES = 8;

/**
 * The names `host` is an alias of: its CNAME chain, followed hop by hop. A name with no CNAME
 * (or one DNS does not know: /etc/hosts answered it) has none. Any other DNS failure rejects,
 * so a deny_hosts entry is never passed over because its check could not be made.
 */
async function aliasesOf(host: string, cnames: (name: string) => Promise<string[]>): Promise<string[]> {
  const seen: string[] = [];
  let name = host;
  for (;;) {
    let next: string[];
    try {
      next = await cnames(name);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENODATA' || code === 'ENOTFOUND') return seen;
      throw Object.assign(new Error(`checking the DNS aliases of ${host} against access_control.deny_hosts failed (${code ?? (err as Error).message})`), { code });
    }
    if (next.length === 0) return seen;
    name = next[0].toLowerCase().replace(/\.$/, '');
    if (seen.includes(name) || seen.length >= MAX_ALIASES) throw Object.assign(new Error(`${host} has a CNAME chain too long or looping to check against access_control.deny_hosts`), { code: 'ELOOP' });
    seen.push(name);
  }
}

let resolver: Resolver | undefined;
/** The CNAME records of `name`, asked as an absolute name (no search list) of the resolv.conf servers. */
function dnsCnames(name: string): Promise<string[]> {
  resolver ??= new Resolver({ timeout: 2000, tries: 2 });
  return resolver.resolveCname(`${name}.`);
}
