import { lookup, Resolver } from 'node:dns/promises';
import { isIP } from 'node:net';
import { readFileOrEmpty, statSync } from '../builtins/fs.js';
import type { EgressPolicy, EgressRefusal } from '../rules/egress.js';
import { layerError, ProxyError } from './errors.js';

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
 * A system file's parsed form, looked at (stat) at most once a second and parsed again only when
 * it changed: /etc/hosts can be a large block list, and a lookup happens per new connection.
 */
function watchedFile<T>(file: string, parse: (text: string) => T): () => T {
  let at = 0;
  let stamp = '';
  let value: T | undefined;
  return () => {
    const now = Date.now();
    if (value !== undefined && now - at < 1000) return value;
    at = now;
    let next = 'missing';
    try {
      const st = statSync(file);
      next = `${st.mtimeMs}:${st.size}:${st.ino}`;
    } catch {
      // Gone: parsed as empty.
    }
    if (value === undefined || next !== stamp) {
      stamp = next;
      value = parse(readFileOrEmpty(file));
    }
    return value;
  };
}

/** The names /etc/hosts lists (lower-case, one trailing dot removed): answered from the file, as written. */
export function etcHostsNames(text: string): Set<string> {
  const names = new Set<string>();
  for (const line of text.split('\n')) {
    const fields = line.replace(/#.*/, '').trim().split(/\s+/);
    for (const n of fields.slice(1)) if (n) names.add(n.toLowerCase().replace(/\.$/, ''));
  }
  return names;
}
const hostsNames = watchedFile('/etc/hosts', etcHostsNames);
const listedInEtcHosts = (host: string) => hostsNames().has(host);

/** What of resolv.conf decides which names a short name stands for: the search list and ndots. */
export interface SearchConf {
  search: string[];
  ndots: number;
}

/**
 * resolv.conf's `search` (or `domain`: the last of the two wins, as in glibc), `options ndots:N`,
 * with the LOCALDOMAIN and RES_OPTIONS variables over them, as the system resolver reads them.
 */
export function parseResolvConf(text: string, env: NodeJS.ProcessEnv = process.env): SearchConf {
  let search: string[] = [];
  let ndots = 1;
  const options = (words: string[]) => {
    for (const w of words) {
      const m = /^ndots:([0-9]+)$/.exec(w);
      if (m) ndots = Math.min(Number(m[1]), 15);
    }
  };
  for (const line of text.split('\n')) {
    const [key, ...words] = line.replace(/[#;].*/, '').trim().split(/\s+/);
    if (key === 'search') search = words;
    else if (key === 'domain') search = words.slice(0, 1);
    else if (key === 'options') options(words);
  }
  if (env.LOCALDOMAIN !== undefined) search = env.LOCALDOMAIN.trim().split(/\s+/).filter(Boolean);
  if (env.RES_OPTIONS) options(env.RES_OPTIONS.trim().split(/\s+/));
  const clean = search.map((d) => d.toLowerCase().replace(/^\.+|\.+$/g, '')).filter((d) => d !== '');
  return { search: [...new Set(clean)], ndots };
}

const currentSearchConf = watchedFile('/etc/resolv.conf', (text) => parseResolvConf(text));

/**
 * The fully qualified names `host` stands for, in the order the system resolver tries them: the
 * name itself first when it has at least ndots dots, else the search domains first.
 */
export function searchCandidates(host: string, conf: SearchConf): string[] {
  if (conf.search.length === 0) return [host];
  const expanded = conf.search.map((d) => `${host}.${d}`);
  const dots = host.split('.').length - 1;
  return dots >= conf.ndots ? [host, ...expanded] : [...expanded, host];
}

/** Answers that mean "not this name, try the next one" (NXDOMAIN, no address records). */
const NO_SUCH_NAME = new Set(['ENOTFOUND', 'ENODATA', 'EAI_NONAME', 'EAI_NODATA']);

/**
 * The system resolver for `host`, with the search list applied here rather than by the
 * resolver: each candidate is asked for as an absolute name (`name.`, no search list behind it),
 * so the proxy knows which fully qualified name it reached and checks that one too. Left to the
 * resolver, `secret` (search `corp.internal`) reached `secret.corp.internal` past a deny_hosts
 * entry for that name: the decision was made on one name and the connection went to another.
 * Short names keep working (a Kubernetes service name, `my-svc`, through its search list). A
 * name /etc/hosts lists is asked for as written: glibc's files backend does not match `name.`.
 */
async function systemLookup(host: string): Promise<{ addresses: string[]; name: string }> {
  // As glibc's `hosts: files dns`: the file answers the name as given, before any search domain
  // (only the DNS backend applies the search list, and the file never sees the expansions).
  if (listedInEtcHosts(host)) {
    const answers = await lookup(host, { all: true, verbatim: true });
    return { addresses: answers.map((a) => a.address), name: host };
  }
  let last: unknown;
  for (const name of searchCandidates(host, currentSearchConf())) {
    try {
      const answers = await lookup(`${name}.`, { all: true, verbatim: true });
      if (answers.length) return { addresses: answers.map((a) => a.address), name };
    } catch (err) {
      if (!NO_SUCH_NAME.has((err as NodeJS.ErrnoException).code ?? '')) throw err;
      last = err;
    }
  }
  throw last ?? layerError(`no address for ${host}`, 'ENOTFOUND');
}

function withTimeout<T>(p: Promise<T>, ms: number | undefined, host: string): Promise<T> {
  if (!ms) return p;
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<never>((_r, reject) => {
      timer = setTimeout(() => reject(layerError(`resolving ${host} timed out`, 'ETIMEDOUT')), ms);
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
  const policy = opts.policy;
  // The name and port again, under the policy in force now: the plan checked them under the one
  // in force when the request came, and a request still waiting for a connection when the policy
  // changes is dialled after it (the HTTP/1.1 pool's queue, an HTTP/2 request waiting for a session).
  const named = policy?.checkName(host, port);
  if (named) throw new EgressDenied(named, host, port);
  // The alias walk runs beside the lookup (it adds no round trip), only when a deny_hosts entry
  // names a host: the addresses themselves are checked below whatever the names were.
  const walk = (name: string) => withTimeout(aliasesOf(name, opts.cnames ?? dnsCnames), opts.timeoutMs, host);
  const aliases = byName && policy?.deniesNames ? walk(host) : undefined;
  aliases?.catch(() => undefined);
  // A pin may name a host itself (`--resolve api.test:443:localhost`): its addresses are looked
  // up and checked like any others, so the connection never goes to an address nobody checked.
  const target = opts.pinned ?? host;
  let addresses: string[];
  let reached = host;
  if (isIP(target)) addresses = [target];
  else if (opts.lookupAll) addresses = await withTimeout(opts.lookupAll(target), opts.timeoutMs, target);
  else {
    const r = await withTimeout(systemLookup(target), opts.timeoutMs, target);
    addresses = r.addresses;
    if (byName) reached = r.name;
  }
  if (addresses.length === 0) throw layerError(`no address for ${host}`, 'ENOTFOUND');
  if (policy && byName) {
    // The name the search list made of `host` is the name connected to: deny_hosts applies to it.
    const names = reached === host ? [] : [reached];
    if (aliases) names.push(...(await aliases));
    if (aliases && reached !== host) names.push(...(await walk(reached)));
    for (const alias of names) {
      const refusal = policy.checkAlias(host, port, alias);
      if (refusal) throw new EgressDenied(refusal, host, port);
    }
  }
  for (const address of addresses) {
    const refusal = policy?.checkAddress(host, port, address);
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
      // A ProxyError: its reason reaches the sandbox as is (not "request failed (ETIMEOUT)").
      throw new ProxyError(502, 'dns_error', `cannot check the DNS aliases of ${host} against access_control.deny_hosts (${code ?? 'DNS error'}): not connected`);
    }
    if (next.length === 0) return seen;
    name = next[0].toLowerCase().replace(/\.$/, '');
    if (seen.includes(name) || seen.length >= MAX_ALIASES) throw new ProxyError(502, 'dns_error', `${host} has a CNAME chain too long or looping to check against access_control.deny_hosts: not connected`);
    seen.push(name);
  }
}

/** c-ares reads the servers of resolv.conf when a resolver is made: a new one when the file changes. */
const cnameResolver = watchedFile('/etc/resolv.conf', () => new Resolver({ timeout: 2000, tries: 2 }));
/** The CNAME records of `name`, asked as an absolute name (no search list) of the resolv.conf servers. */
function dnsCnames(name: string): Promise<string[]> {
  return cnameResolver().resolveCname(`${name}.`);
}
