import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { compileHostPattern, PatternError, type HostPattern } from './patterns.js';

/**
 * The `access_control` object of a proxy_config: which destinations the sandbox may reach at
 * all, whatever the rules say. Host patterns use the rules' pattern language.
 */
export interface AccessControl {
  /** When present (even empty), only targets whose name (as the client gave it) matches one entry. */
  allow_hosts?: string[];
  /** Targets refused; checked against the name and every address it resolves to. */
  deny_hosts?: string[];
  /** When present (even empty), only these ports: a number or an inclusive range "8000-8999". */
  allow_ports?: (number | string)[];
  deny_ports?: (number | string)[];
  /** Addresses (IP or CIDR) refused after DNS resolution, on top of the built-in ones. */
  deny_addresses?: string[];
}

/** Why a destination is refused: the sentence the sandbox reads, and an RFC 9209 error type. */
export interface EgressRefusal {
  kind: 'host_denied' | 'host_not_allowed' | 'port_denied' | 'port_not_allowed' | 'address_denied' | 'address_builtin';
  type: 'http_request_denied' | 'destination_ip_prohibited';
  reason: string;
}

/**
 * Addresses never reachable through the proxy, whatever the configuration: link-local (where
 * cloud metadata services answer: 169.254.169.254, fd00:ec2::254) and the unspecified addresses
 * (which reach the proxy's own host). IPv4-mapped and NAT64 forms are unwrapped first.
 */
const BUILTIN: { cidr: string; why: string }[] = [
  { cidr: '169.254.0.0/16', why: 'a link-local address (cloud metadata services live there)' },
  { cidr: 'fe80::/10', why: 'an IPv6 link-local address' },
  { cidr: 'fd00:ec2::254/128', why: 'the cloud metadata service address' },
  { cidr: '100.100.100.200/32', why: 'a cloud metadata service address' },
  { cidr: '0.0.0.0/8', why: "an unspecified address (it reaches the proxy's own host)" },
  { cidr: '::/128', why: "the unspecified address (it reaches the proxy's own host)" },
];

function family(ip: string): 'ipv4' | 'ipv6' | undefined {
  return isIPv4(ip) ? 'ipv4' : isIPv6(ip) ? 'ipv6' : undefined;
}

/** `::ffff:a.b.c.d`, `::ffff:0a0b:0c0d` and NAT64 `64:ff9b::a.b.c.d` -> the IPv4 address; else as is (lower-case). */
export function unwrapAddress(ip: string): string {
  const lower = ip.toLowerCase();
  if (!isIPv6(lower)) return lower;
  const m = /^(?:::ffff:|64:ff9b::)(?:(\d+\.\d+\.\d+\.\d+)|([0-9a-f]{1,4}):([0-9a-f]{1,4}))$/.exec(new URL(`http://[${lower}]/`).hostname.slice(1, -1));
  if (!m) return lower;
  if (m[1]) return m[1];
  const hi = parseInt(m[2], 16);
  const lo = parseInt(m[3], 16);
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

/** Parses `a.b.c.d`, `a.b.c.d/n`, `v6`, `v6/n`. Throws PatternError. */
export function parseCidr(raw: string): { address: string; prefix: number; family: 'ipv4' | 'ipv6' } {
  const [addr, bits, extra] = raw.trim().split('/');
  if (extra !== undefined) throw new PatternError('not an IP address or CIDR block');
  const fam = family(addr);
  if (!fam || addr.includes('%')) throw new PatternError('not an IP address or CIDR block');
  const max = fam === 'ipv4' ? 32 : 128;
  const prefix = bits === undefined ? max : /^[0-9]{1,3}$/.test(bits) ? Number(bits) : NaN;
  if (!(prefix >= 0 && prefix <= max)) throw new PatternError(`prefix length must be 0 to ${max}`);
  return { address: addr, prefix, family: fam };
}

/** Parses a port entry: 443 or "8000-8999". Throws PatternError. */
export function parsePortRange(raw: number | string): [number, number] {
  if (typeof raw === 'number') {
    if (!Number.isInteger(raw) || raw < 1 || raw > 65535) throw new PatternError('port out of range (1-65535)');
    return [raw, raw];
  }
  const m = /^([0-9]{1,5})(?:-([0-9]{1,5}))?$/.exec(raw);
  if (!m) throw new PatternError('a port is a number or a range "low-high"');
  const lo = Number(m[1]);
  const hi = m[2] === undefined ? lo : Number(m[2]);
  if (lo < 1 || hi > 65535) throw new PatternError('port out of range (1-65535)');
  if (lo > hi) throw new PatternError('port range low end above high end');
  return [lo, hi];
}

export interface EgressPolicy {
  /** Stable text of the policy: changes exactly when the policy does. */
  readonly key: string;
  /** The target as the client named it (host normalised), before any DNS. */
  checkName(host: string, port: number): EgressRefusal | undefined;
  /** One address the target resolved to (or the --resolve pin), before connecting to it. */
  checkAddress(host: string, port: number, address: string): EgressRefusal | undefined;
  /**
   * A connection already open to the target at `address`, under this policy (it changed since
   * the connection was made): the name's checks, then the address's.
   */
  checkConnection(host: string, port: number, address: string): EgressRefusal | undefined;
  /** Some deny_hosts entry names a host (not an address): the names a target is an alias of must be checked too. */
  readonly deniesNames: boolean;
  /**
   * A name the target stands for in DNS (the search list's expansion of a short name, or a CNAME
   * on the way to its addresses): deny_hosts only.
   */
  checkAlias(host: string, port: number, alias: string): EgressRefusal | undefined;
}

const builtinList = new BlockList();
for (const b of BUILTIN) {
  const c = parseCidr(b.cidr);
  builtinList.addSubnet(c.address, c.prefix, c.family);
}

function builtinWhy(ip: string): string | undefined {
  const fam = family(ip);
  if (!fam || !builtinList.check(ip, fam)) return undefined;
  for (const b of BUILTIN) {
    const c = parseCidr(b.cidr);
    const one = new BlockList();
    one.addSubnet(c.address, c.prefix, c.family);
    if (c.family === fam && one.check(ip, fam)) return b.why;
  }
  return 'a reserved address';
}

const shown = (host: string, port: number) => `${host.includes(':') ? `[${host}]` : host}:${port}`;
const RETRY = 'This is the egress policy of this sandbox, not a network fault: retrying will not help.';

/** False only for a name neither isIPv4 nor isIPv6 (nor unwrapAddress) can take for an address. */
export function mayBeAddress(host: string): boolean {
  return host.includes(':') || /^[0-9.]+$/.test(host);
}

/** Compiles `access_control` (already validated). Throws PatternError for what validation should have caught. */
export function compileEgress(ac: AccessControl | undefined): EgressPolicy {
  const allow = ac?.allow_hosts?.map(compileHostPattern);
  const deny = (ac?.deny_hosts ?? []).map(compileHostPattern);
  const allowPorts = ac?.allow_ports?.map(parsePortRange);
  const denyPorts = (ac?.deny_ports ?? []).map(parsePortRange);
  const denyAddresses = new BlockList();
  for (const raw of ac?.deny_addresses ?? []) {
    const c = parseCidr(raw);
    denyAddresses.addSubnet(c.address, c.prefix, c.family);
  }
  const inRanges = (ranges: [number, number][], p: number) => ranges.some(([lo, hi]) => p >= lo && p <= hi);
  const firstMatch = (list: readonly HostPattern[], h: string, p: number) => list.find((x) => x.test(h, p));
  const key = JSON.stringify(ac ?? {});
  const deniesNames = (ac?.deny_hosts ?? []).some((p) => !mayBeAddress(p.replace(/:[0-9]+$/, '').replace(/^\[|\]$/g, '')));

  const addressRefusal = (host: string, port: number, address: string): EgressRefusal | undefined => {
    const ip = unwrapAddress(address);
    const fam = family(ip);
    if (!fam) return undefined;
    const via = ip === host ? '' : ` (${host} resolves to ${ip})`;
    const why = builtinWhy(ip);
    if (why) return { kind: 'address_builtin', type: 'destination_ip_prohibited', reason: `egress refused: ${shown(host, port)}${via} is ${why}, never reachable through this proxy. ${RETRY}` };
    if (denyAddresses.check(ip, fam)) return { kind: 'address_denied', type: 'destination_ip_prohibited', reason: `egress refused: ${shown(host, port)}${via} is in access_control.deny_addresses. ${RETRY}` };
    const d = firstMatch(deny, ip, port);
    if (d) return { kind: 'host_denied', type: 'destination_ip_prohibited', reason: `egress refused: ${shown(host, port)}${via} matches access_control.deny_hosts entry '${d.source}'. ${RETRY}` };
    return undefined;
  };

  const policy: EgressPolicy = Object.freeze({
    key,
    checkName(host: string, port: number): EgressRefusal | undefined {
      if (inRanges(denyPorts, port)) return { kind: 'port_denied', type: 'http_request_denied', reason: `egress refused: port ${port} is in access_control.deny_ports. ${RETRY}` };
      if (allowPorts && !inRanges(allowPorts, port)) return { kind: 'port_not_allowed', type: 'http_request_denied', reason: `egress refused: port ${port} is not in access_control.allow_ports. ${RETRY}` };
      const d = firstMatch(deny, host, port);
      if (d) return { kind: 'host_denied', type: 'http_request_denied', reason: `egress refused: ${shown(host, port)} matches access_control.deny_hosts entry '${d.source}'. ${RETRY}` };
      if (allow && !firstMatch(allow, host, port)) return { kind: 'host_not_allowed', type: 'http_request_denied', reason: `egress refused: ${shown(host, port)} is not in access_control.allow_hosts. ${RETRY}` };
      // An address literal is checked as an address at once. Only a name made of digits and dots
      // can be an IPv4 literal and only one with a colon an IPv6 one: any other name skips the
      // two address regexps (0.6 % of a busy proxy's time when every request ran them).
      return mayBeAddress(host) ? addressRefusal(host, port, host) : undefined;
    },
    checkAddress: addressRefusal,
    checkConnection(host: string, port: number, address: string): EgressRefusal | undefined {
      return policy.checkName(host, port) ?? addressRefusal(host, port, address);
    },
    deniesNames,
    checkAlias(host: string, port: number, alias: string): EgressRefusal | undefined {
      // allow_hosts is not asked: it speaks of the name the client gave (a CDN's alias of an
      // allowed name is not in it), only a denied name must not be reachable through an alias.
      const d = firstMatch(deny, alias, port);
      if (d) return { kind: 'host_denied', type: 'http_request_denied', reason: `egress refused: ${shown(host, port)} stands for ${alias} in DNS, which matches access_control.deny_hosts entry '${d.source}'. ${RETRY}` };
      return undefined;
    },
  });
  return policy;
}

/** Validation of `access_control` beyond the JSON schema, with locs relative to the config. */
export function accessControlIssues(ac: AccessControl | undefined): { loc: (string | number)[]; msg: string }[] {
  const out: { loc: (string | number)[]; msg: string }[] = [];
  if (!ac) return out;
  for (const list of ['allow_hosts', 'deny_hosts'] as const) {
    ac[list]?.forEach((p, i) => {
      try {
        compileHostPattern(p);
      } catch (err) {
        out.push({ loc: ['access_control', list, i], msg: `Invalid host pattern: ${(err as Error).message}` });
      }
    });
  }
  for (const list of ['allow_ports', 'deny_ports'] as const) {
    ac[list]?.forEach((p, i) => {
      try {
        parsePortRange(p);
      } catch (err) {
        out.push({ loc: ['access_control', list, i], msg: `Invalid port: ${(err as Error).message}` });
      }
    });
  }
  ac.deny_addresses?.forEach((a, i) => {
    try {
      parseCidr(a);
    } catch (err) {
      out.push({ loc: ['access_control', 'deny_addresses', i], msg: `Invalid address: ${(err as Error).message}` });
    }
  });
  return out;
}
