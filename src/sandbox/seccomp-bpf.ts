/**
 * The local driver's seccomp filter (pure): the policy of syscall-policy.ts as a classic BPF program
 * (what bwrap's `--seccomp FD` and seccomp(2) take), and the tiny static program that installs it
 * in an execution before anything of the box runs (`seccompHelperElf`).
 *
 * Executions enter a box from the host with nsenter: they are not children of the box's pid 1 and
 * do not inherit its filter. No compiler can be assumed on a user's machine, so the helper is
 * x86_64 machine code written here: prctl(PR_SET_NO_NEW_PRIVS), seccomp(SECCOMP_SET_MODE_FILTER)
 * with the program embedded, then execve(argv[1], argv + 1, envp). On any failure it says so on
 * stderr and exits 126 without running anything.
 */
import { ARG_DENIED, deniedNames, ERRNO } from './syscall-policy.js';
import { GENERIC_SYSCALLS, X86_64_SYSCALLS } from './syscall-tables.js';

/** An architecture the filter can be built for: its audit number and syscall table. */
export interface FilterArch {
  name: 'x86_64' | 'aarch64';
  audit: number;
  table: Readonly<Record<string, number>>;
  /** x86_64's x32 ABI: the same audit arch, numbers with this bit set. */
  x32Bit?: number;
}

export const ARCH_X86_64: FilterArch = { name: 'x86_64', audit: 0xc000003e, table: X86_64_SYSCALLS, x32Bit: 0x40000000 };
export const ARCH_AARCH64: FilterArch = { name: 'aarch64', audit: 0xc00000b7, table: GENERIC_SYSCALLS };

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const LD_W_ABS = 0x20;
const JEQ_K = 0x15;
const JGE_K = 0x35;
const JSET_K = 0x45;
const RET_K = 0x06;
// seccomp return values (linux/seccomp.h).
const RET_KILL_PROCESS = 0x80000000;
const RET_ERRNO = 0x00050000;
const RET_ALLOW = 0x7fff0000;
// struct seccomp_data offsets.
const NR = 0;
const ARCH = 4;
const argLow = (i: number) => 16 + 8 * i;

type Insn = [code: number, jt: number, jf: number, k: number];

/**
 * The filter for `arch`: a foreign architecture (a 32-bit call on a 64-bit host, int 0x80) kills
 * the process; x32 calls are refused; each denied call returns its errno; clone, socket and
 * personality are tested on their first argument; everything else is allowed. `allowed`: denied
 * calls left out (the host-side filter of an execution, which nsenter must get through).
 */
export function filterProgram(arch: FilterArch, allowed: readonly string[] = []): Insn[] {
  const p: Insn[] = [
    [LD_W_ABS, 0, 0, ARCH],
    [JEQ_K, 1, 0, arch.audit],
    [RET_K, 0, 0, RET_KILL_PROCESS],
    [LD_W_ABS, 0, 0, NR],
  ];
  if (arch.x32Bit) p.push([JGE_K, 0, 1, arch.x32Bit], [RET_K, 0, 0, RET_ERRNO | ERRNO.EPERM]);
  for (const [name, errno] of deniedNames()) {
    if (allowed.includes(name)) continue;
    const nr = arch.table[name];
    if (nr === undefined) continue; // not a call of this architecture (iopl on aarch64)
    p.push([JEQ_K, 0, 1, nr], [RET_K, 0, 0, RET_ERRNO | errno]);
  }
  for (const rule of ARG_DENIED) {
    const nr = arch.table[rule.name];
    if (nr === undefined) throw new Error(`${rule.name} is not in the ${arch.name} table`);
    // Once the number matched, the block decides: the accumulator is overwritten by the argument.
    const test: Insn[] =
      rule.kind === 'maskAny'
        ? [[JSET_K, 0, 1, rule.mask]]
        : rule.kind === 'equals'
          ? [[JEQ_K, 0, 1, rule.value]]
          : rule.values.map((v, j): Insn => [JEQ_K, rule.values.length - j, 0, v >>> 0]);
    // maskAny/equals: a match falls to the deny, else jumps to allow. notIn: a match jumps over the
    // later jeqs and the deny to allow; the last one's miss falls to the deny.
    const block: Insn[] = [[LD_W_ABS, 0, 0, argLow(rule.arg)], ...test, [RET_K, 0, 0, RET_ERRNO | ERRNO.EPERM], [RET_K, 0, 0, RET_ALLOW]];
    p.push([JEQ_K, 0, block.length, nr], ...block);
  }
  p.push([RET_K, 0, 0, RET_ALLOW]);
  if (p.length > 4096) throw new Error('seccomp filter too long');
  return p;
}

/** The program as the kernel reads it (struct sock_filter[], little-endian). */
export function filterBytes(arch: FilterArch, allowed: readonly string[] = []): Buffer {
  const p = filterProgram(arch, allowed);
  const b = Buffer.alloc(p.length * 8);
  p.forEach(([code, jt, jf, k], i) => {
    b.writeUInt16LE(code, i * 8);
    b.writeUInt8(jt, i * 8 + 2);
    b.writeUInt8(jf, i * 8 + 3);
    b.writeUInt32LE(k >>> 0, i * 8 + 4);
  });
  return b;
}

/** The architecture of this machine the filter is made for, or null (no filter can be built). */
export function hostFilterArch(): FilterArch | null {
  if (process.arch === 'x64') return ARCH_X86_64;
  return null;
}

const BASE = 0x400000;
const EHDR = 64;
const PHDR = 56;

/**
 * A static x86_64 ELF executable (no libc, no loader) that installs `filter` and execs its
 * arguments: `helper PROGRAM ARGS...`. It is made for x86_64 only (see hostFilterArch).
 */
export function seccompHelperElf(filter: Buffer): Buffer {
  const msg = Buffer.from('keygate: seccomp helper: cannot install the filter or run the program\n');
  const code: number[] = [];
  const emit = (...bytes: number[]) => code.push(...bytes);
  const imm32 = (v: number) => [v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, (v >>> 24) & 0xff];
  const fixups: { at: number; label: 'fail' | 'filter' | 'msg'; kind: 'rel8' | 'rel32' }[] = [];
  emit(0x4c, 0x8b, 0x24, 0x24); // mov r12, [rsp]            argc
  emit(0x4c, 0x8d, 0x6c, 0x24, 0x08); // lea r13, [rsp+8]    argv
  emit(0x4f, 0x8d, 0x74, 0xe5, 0x08); // lea r14, [r13+r12*8+8]  envp
  // prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  emit(0xb8, ...imm32(157)); // mov eax, SYS_prctl
  emit(0xbf, ...imm32(38)); // mov edi, PR_SET_NO_NEW_PRIVS
  emit(0xbe, ...imm32(1)); // mov esi, 1
  emit(0x31, 0xd2); // xor edx, edx
  emit(0x45, 0x31, 0xd2); // xor r10d, r10d
  emit(0x45, 0x31, 0xc0); // xor r8d, r8d
  emit(0x0f, 0x05); // syscall
  emit(0x48, 0x85, 0xc0); // test rax, rax
  emit(0x0f, 0x85, 0, 0, 0, 0); // jnz fail
  fixups.push({ at: code.length - 4, label: 'fail', kind: 'rel32' });
  // struct sock_fprog { u16 len; struct sock_filter *filter; } on the stack
  emit(0x48, 0x8d, 0x05, 0, 0, 0, 0); // lea rax, [rip+filter]
  fixups.push({ at: code.length - 4, label: 'filter', kind: 'rel32' });
  emit(0x50); // push rax
  emit(0x68, ...imm32(filter.length / 8)); // push len
  // seccomp(SECCOMP_SET_MODE_FILTER, 0, &fprog)
  emit(0xb8, ...imm32(317)); // mov eax, SYS_seccomp
  emit(0xbf, ...imm32(1)); // mov edi, SECCOMP_SET_MODE_FILTER
  emit(0x31, 0xf6); // xor esi, esi
  emit(0x48, 0x89, 0xe2); // mov rdx, rsp
  emit(0x0f, 0x05); // syscall
  emit(0x48, 0x85, 0xc0); // test rax, rax
  emit(0x0f, 0x85, 0, 0, 0, 0); // jnz fail
  fixups.push({ at: code.length - 4, label: 'fail', kind: 'rel32' });
  // execve(argv[1], argv + 1, envp)
  emit(0xb8, ...imm32(59)); // mov eax, SYS_execve
  emit(0x49, 0x8b, 0x7d, 0x08); // mov rdi, [r13+8]
  emit(0x49, 0x8d, 0x75, 0x08); // lea rsi, [r13+8]
  emit(0x4c, 0x89, 0xf2); // mov rdx, r14
  emit(0x0f, 0x05); // syscall
  const fail = code.length;
  // write(2, msg, len); exit_group(126)
  emit(0xb8, ...imm32(1)); // mov eax, SYS_write
  emit(0xbf, ...imm32(2)); // mov edi, 2
  emit(0x48, 0x8d, 0x35, 0, 0, 0, 0); // lea rsi, [rip+msg]
  fixups.push({ at: code.length - 4, label: 'msg', kind: 'rel32' });
  emit(0xba, ...imm32(msg.length)); // mov edx, len
  emit(0x0f, 0x05); // syscall
  emit(0xb8, ...imm32(231)); // mov eax, SYS_exit_group
  emit(0xbf, ...imm32(126)); // mov edi, 126
  emit(0x0f, 0x05); // syscall
  while (code.length % 8) emit(0xcc);
  const filterAt = code.length;
  const msgAt = filterAt + filter.length;
  const labels = { fail, filter: filterAt, msg: msgAt };
  const text = Buffer.concat([Buffer.from(code), filter, msg]);
  for (const f of fixups) text.writeInt32LE(labels[f.label] - (f.at + 4), f.at);

  const size = EHDR + PHDR + text.length;
  const h = Buffer.alloc(EHDR + PHDR);
  h.set([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0], 0); // ELF, 64-bit, little-endian, version 1, SysV
  h.writeUInt16LE(2, 16); // ET_EXEC
  h.writeUInt16LE(0x3e, 18); // EM_X86_64
  h.writeUInt32LE(1, 20); // EV_CURRENT
  h.writeBigUInt64LE(BigInt(BASE + EHDR + PHDR), 24); // e_entry
  h.writeBigUInt64LE(BigInt(EHDR), 32); // e_phoff
  h.writeBigUInt64LE(0n, 40); // e_shoff
  h.writeUInt32LE(0, 48); // e_flags
  h.writeUInt16LE(EHDR, 52); // e_ehsize
  h.writeUInt16LE(PHDR, 54); // e_phentsize
  h.writeUInt16LE(1, 56); // e_phnum
  h.writeUInt16LE(64, 58); // e_shentsize
  h.writeUInt16LE(0, 60); // e_shnum
  h.writeUInt16LE(0, 62); // e_shstrndx
  h.writeUInt32LE(1, EHDR); // PT_LOAD
  h.writeUInt32LE(5, EHDR + 4); // PF_R | PF_X
  h.writeBigUInt64LE(0n, EHDR + 8); // p_offset
  h.writeBigUInt64LE(BigInt(BASE), EHDR + 16); // p_vaddr
  h.writeBigUInt64LE(BigInt(BASE), EHDR + 24); // p_paddr
  h.writeBigUInt64LE(BigInt(size), EHDR + 32); // p_filesz
  h.writeBigUInt64LE(BigInt(size), EHDR + 40); // p_memsz
  h.writeBigUInt64LE(0x1000n, EHDR + 48); // p_align
  return Buffer.concat([h, text]);
}
