#!/usr/bin/env node
// Summarises a `perf record` of a proxy (`node bench/phase.mjs --perf FILE`, keygate with
// KEYGATE_NODE_ARGS=--perf-basic-prof for JavaScript names) as shares of its samples by kind of
// work: TLS (OpenSSL and Node's TLS binding), the kernel's network stack, the rest of the kernel
// (syscall entry, scheduling, the VM's interrupt handling), V8's garbage collector, JavaScript by
// origin (keygate's dist/, Node's own node:, node_modules), V8's builtins and runtime, Node's C++
// bindings and libuv, the C library. The evidence for what bounds a target (bench/README.md).
//
// usage: node bench/perf-summary.mjs FILE [FILE...]   (one column per file)
import { execFileSync } from 'node:child_process';

const files = process.argv.slice(2);
if (!files.length) {
  console.error('usage: node bench/perf-summary.mjs PERF.DATA [PERF.DATA...]');
  process.exit(2);
}

const KINDS = [
  ['TLS: OpenSSL + node::crypto', (dso, sym) => /^node::crypto::|^(ssl|SSL|tls|TLS|EVP_|evp_|ossl_|OSSL_|aes|AES|gcm|CRYPTO_|BIO_|ERR_|OPENSSL|_aesni|aesni|sha|SHA|ec_|EC_|BN_|bn_|x25519|X25519|X509|x509|RAND|ChaCha|Poly|ctr|CRYPTO|WPACKET|PACKET|ct_|dtls|OBJ_|ASN1|asn1|HMAC|hmac|EVP|md_|evp)/.test(sym)],
  ['kernel: network (TCP/IP, netfilter, sockets)', (dso, sym) => dso === '[kernel.kallsyms]' && /tcp|inet|ip_|ipv4|ipv6|skb|sock|nf_|netif|net_|__netif|dev_|loopback|sk_|_copy_to_iter|_copy_from_iter|copy_user|lock_sock|release_sock|__sys_(send|recv)|sys_(send|recv)|raw_v|udp|neigh|conntrack|napi|xmit|qdisc/.test(sym)],
  ['kernel: syscalls, scheduling, interrupts, other', (dso) => dso === '[kernel.kallsyms]'],
  ['V8 garbage collector', (dso, sym) => /^v8::internal::(Scavenger|Scavenge|Heap|MarkCompact|Sweeper|MinorMark|ConcurrentMarking|MarkingVisitor|.*Marking|.*Evacuat|RememberedSet|SlotSet|MemoryAllocator|PagedSpace|SemiSpace|NewSpace|LargeObjectSpace|.*Visitor|LocalHeap|MainMarking|IncrementalMarking|ArrayBufferSweeper|GCTracer|Factory::AllocateRaw|MemoryChunk|PageMetadata|MutablePageMetadata)|^Builtins_RecordWrite/.test(sym)],
  ['JavaScript: keygate (dist/)', (dso, sym) => /^JS:.*\/dist\//.test(sym)],
  ['JavaScript: Node (node:)', (dso, sym) => /^JS:.*node:/.test(sym)],
  ['JavaScript: node_modules', (dso, sym) => /^JS:.*node_modules/.test(sym)],
  ['JavaScript: other JIT code', (dso, sym) => /^JS:|^\[JIT\]/.test(dso + sym) || dso.startsWith('[JIT]') || /^(Stub|Builtin|Handler|RegExp):/.test(sym)],
  ['V8 builtins (ICs, strings, calls)', (dso, sym) => /^Builtins_/.test(sym)],
  ['V8 runtime and API', (dso, sym) => /^v8::|^Runtime_|^v8_/.test(sym)],
  ['Node C++ bindings and libuv', (dso, sym) => /^node::|^uv_|^uv__|^napi_/.test(sym)],
  ['C library (malloc, memcpy, ...)', (dso) => /^libc|^libstdc|^libm|^ld-linux/.test(dso)],
  ['other', () => true],
];

function summarise(file) {
  const out = execFileSync('perf', ['report', '-i', file, '--sort', 'dso,sym', '--stdio', '--no-children'], { encoding: 'utf8', maxBuffer: 256 * 1048576, stdio: ['ignore', 'pipe', 'ignore'] });
  const shares = new Map(KINDS.map(([k]) => [k, 0]));
  let total = 0;
  for (const line of out.split('\n')) {
    // "    1.33%  node               [.] Builtins_StringAdd_CheckNone"
    const m = /^\s+([\d.]+)%\s+(\S+(?: tid \d+)?)\s+\[[.k]\]\s+(.*)$/.exec(line);
    if (!m) continue;
    const pct = Number(m[1]);
    const [dso, sym] = [m[2], m[3].trim()];
    total += pct;
    const kind = KINDS.find(([, test]) => test(dso, sym))[0];
    shares.set(kind, shares.get(kind) + pct);
  }
  return { shares, total };
}

const results = files.map(summarise);
console.log(`| kind of work | ${files.join(' | ')} |`);
console.log(`|---|${files.map(() => '---').join('|')}|`);
for (const [kind] of KINDS) {
  // perf rounds each symbol's share: the column is scaled to the sum of what it printed.
  const cells = results.map((r) => `${((r.shares.get(kind) * 100) / r.total).toFixed(1)} %`);
  if (results.every((r) => r.shares.get(kind) < 0.05)) continue;
  console.log(`| ${kind} | ${cells.join(' | ')} |`);
}
