import os from 'node:os';
import net from 'node:net';
import { readFileOrEmpty } from '../builtins/fs.js';

/**
 * Whether a connection to `address` would reach this host: the question the proxy asks before it
 * dials a port it must never reach on this host (keygate's API, its own listener).
 *
 * os.networkInterfaces() is not the answer on its own: libuv lists only interfaces that are up
 * AND running, so an address on a bridge with no carrier (docker0 with no container attached)
 * is missing from it, while the kernel still delivers connections to that address locally. A box
 * reached keygate's API through its proxy at 172.17.0.1 that way (test/sandbox-api/hostile-api).
 * So on Linux the kernel's own tables are read as well: the IPv4 routing trie's LOCAL entries
 * (/proc/net/fib_trie, every address the kernel answers for, whatever the link state) and every
 * IPv6 address assigned (/proc/net/if_inet6). Read at each call: addresses come and go with
 * containers. The callers ask only for connections to a denied port, so the reads are rare.
 */

/** Spellings that reach this host whatever its interfaces: loopback, `localhost` and the unspecified addresses. */
export const LOOPBACK_NAMES: ReadonlySet<string> = new Set(['localhost', '127.0.0.1', '::1', '0.0.0.0', '::']);

/** `a` is a loopback or unspecified spelling, or in 127/8. */
export function isLoopback(a: string): boolean {
  return LOOPBACK_NAMES.has(a) || a.startsWith('127.');
}

/** `address` as BlockList-comparable family, or undefined for a name. */
function familyOf(address: string): 'ipv4' | 'ipv6' | undefined {
  const f = net.isIP(address);
  return f === 4 ? 'ipv4' : f === 6 ? 'ipv6' : undefined;
}

/** The IPv4 addresses the kernel routes to this host (`/32 host LOCAL` in the local table). */
export function parseFibTrieLocal(text: string): string[] {
  const out = new Set<string>();
  let last: string | undefined;
  for (const line of text.split('\n')) {
    const ip = /\|-- (\d+\.\d+\.\d+\.\d+)\s*$/.exec(line);
    if (ip) {
      last = ip[1];
      continue;
    }
    if (last && /^\s*\/32 host LOCAL\s*$/.test(line)) out.add(last);
  }
  return [...out];
}

/** The IPv6 addresses of /proc/net/if_inet6 (32 hex digits each), in colon form. */
export function parseIfInet6(text: string): string[] {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const hex = /^([0-9a-f]{32})\s/i.exec(line)?.[1];
    if (hex) out.push(hex.match(/.{4}/g)!.join(':').toLowerCase());
  }
  return out;
}

/** Every address of this host the kernel and libuv know of, now. */
export function localAddresses(): string[] {
  const out: string[] = [];
  for (const list of Object.values(os.networkInterfaces())) for (const i of list ?? []) out.push(i.address);
  if (process.platform === 'linux') out.push(...parseFibTrieLocal(readFileOrEmpty('/proc/net/fib_trie')), ...parseIfInet6(readFileOrEmpty('/proc/net/if_inet6')));
  return out;
}

/** `a` (lower-case, IPv4-mapped forms already unwrapped) reaches this host: loopback, unspecified, or one of its addresses. */
export function isLocalAddress(a: string): boolean {
  if (isLoopback(a)) return true;
  const fam = familyOf(a);
  if (!fam) return false;
  // A BlockList compares addresses, not spellings (`fd00::2` and `fd00:0:0:0:0:0:0:2` alike).
  const mine = new net.BlockList();
  for (const x of localAddresses()) {
    const bare = x.split('%')[0]; // a link-local address's zone (`fe80::1%eth0`) is not part of it
    const f = familyOf(bare);
    if (f) mine.addAddress(bare, f);
  }
  return mine.check(a, fam);
}
