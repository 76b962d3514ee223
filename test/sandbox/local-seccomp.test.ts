/**
 * Local driver: the syscall filter (syscall-policy.ts) in real boxes, with and without cgroups
 * (executions under tini). Box code, as an attacker would, calls the kernel directly through perl's
 * syscall() (the host template shows the host's perl): io_uring, an AF_VSOCK socket (never
 * connected anywhere: creating it is the test), nested namespaces, the keyring, tracing ... all
 * fail with EPERM (clone3: ENOSYS, so that libc falls back to clone), in an execution and in
 * whatever it starts, while ordinary programs still run.
 */
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Box } from '../../src/sandbox/driver.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { X86_64_SYSCALLS as NR } from '../../src/sandbox/syscall-tables.js';
import { cleanupTmp, localProbe, run, RUN_DIR, spec } from './local-helpers.js';

const probe = await localProbe();
const x64 = process.arch === 'x64';
const perl = existsSync('/usr/bin/perl');

/** name, syscall arguments, errno expected (1 EPERM, 38 ENOSYS). Each would reach the kernel unfiltered. */
const DENIED: [string, string, number][] = [
  ['io_uring_setup', `${NR.io_uring_setup}, 8, 0`, 1],
  ['io_uring_enter', `${NR.io_uring_enter}, -1, 0, 0, 0, 0, 0`, 1],
  ['unshare_user', `${NR.unshare}, 0x10000000`, 1],
  ['unshare_net', `${NR.unshare}, 0x40000000`, 1],
  ['setns', `${NR.setns}, 0, 0`, 1],
  ['clone3', `${NR.clone3}, 0, 0`, 38],
  ['keyctl', `${NR.keyctl}, 0, -3, 0`, 1],
  ['add_key', `${NR.add_key}, 0, 0, 0, 0, 0`, 1],
  ['bpf', `${NR.bpf}, 0, 0, 0`, 1],
  ['userfaultfd', `${NR.userfaultfd}, 0`, 1],
  ['perf_event_open', `${NR.perf_event_open}, 0, 0, -1, -1, 0`, 1],
  ['ptrace_traceme', `${NR.ptrace}, 0, 0, 0, 0`, 1],
  ['process_vm_readv', `${NR.process_vm_readv}, 1, 0, 0, 0, 0, 0`, 1],
  ['mount', `${NR.mount}, 0, 0, 0, 0, 0`, 1],
  ['fsopen', `${NR.fsopen}, 0, 0`, 1],
  ['open_by_handle_at', `${NR.open_by_handle_at}, -1, 0, 0`, 1],
  ['personality_exec', `${NR.personality}, 0x400000`, 1],
  ['syslog', `${NR.syslog}, 3, 0, 0`, 1],
  ['modify_ldt', `${NR.modify_ldt}, 0, 0, 0`, 1],
  // x32: the same calls under another number on the same architecture.
  ['x32_getpid', `${0x40000000 + NR.getpid}`, 1],
];

const PERL = `
use POSIX ();
sub try { my ($n, @a) = @_; $! = 0; my $nr = shift @a; my $r = syscall($nr, @a); if ($r == 0 && $n =~ /^clone/) { POSIX::_exit(0) } print "$n=", ($r == -1 ? $!+0 : "ok"), "\\n"; }
${DENIED.map(([n, a]) => `try("${n}", ${a});`).join('\n')}
print "vsock=", (socket(my $v, 40, 1, 0) ? "ok" : $!+0), "\\n";
print "clone_newnet=", do { my $r = syscall(${NR.clone}, 0x40000000 | 17, 0, 0, 0, 0); if ($r == 0) { POSIX::_exit(0) } $r == -1 ? $!+0 : do { waitpid($r, 0); "ok" } }, "\\n";
print "inet=", (socket(my $i, 2, 1, 0) ? "ok" : $!+0), "\\n";
print "unix=", (socket(my $u, 1, 1, 0) ? "ok" : $!+0), "\\n";
print "personality_query=", (syscall(${NR.personality}, 0xffffffff) == -1 ? $!+0 : "ok"), "\\n";
my $pid = fork(); if ($pid == 0) { POSIX::_exit(7) } waitpid($pid, 0); print "fork=", $? >> 8, "\\n";
`;

const expected = [
  ...DENIED.map(([n, , e]) => `${n}=${e}`),
  'vsock=1',
  'clone_newnet=1',
  'inet=ok',
  'unix=ok',
  'personality_query=ok',
  'fork=7',
].join('\n');

describe.skipIf(!probe.ok || !x64 || !perl).each([{ mode: 'cgroups' as const }, { mode: 'tini' as const }])(
  `local driver: syscall filter, $mode (${probe.why})`,
  ({ mode }) => {
    let driver: LocalDriver;
    let box: Box;

    beforeAll(async () => {
      driver = new LocalDriver({ runDir: `${RUN_DIR}-${mode}`, ...(mode === 'tini' ? { cgroups: false as const } : {}) });
      // Node reserves more address space than the default rlimit (tini mode: RLIMIT_AS) gives.
      box = await driver.start(spec({ id: `seccomp-${mode}`, resources: { memory_mb: 2048 } }));
    });

    afterAll(async () => {
      await driver?.close();
    });

    it("an execution (both its filters: the host side's and the box's), what it starts, the box's pid 1 and main process run filtered", async () => {
      const r = await run(box, ['sh', '-c', 'grep ^Seccomp /proc/self/status; sh -c "grep ^Seccomp: /proc/self/status"; grep ^Seccomp: /proc/1/status; for p in /proc/[0-9]*; do [ "$(cat $p/cmdline | tr "\\0" " ")" = "sleep infinity " ] && grep ^Seccomp: $p/status; done; true']);
      expect(r.exitCode, r.stderr).toBe(0);
      expect(r.stdout.trim().split('\n').map((l) => l.replace(/\s+/g, ' '))).toEqual(['Seccomp: 2', 'Seccomp_filters: 2', 'Seccomp: 2', 'Seccomp: 2', 'Seccomp: 2']);
    });

    it('denied syscalls fail with EPERM (clone3: ENOSYS); sockets but AF_VSOCK, fork and harmless personality work', async () => {
      const r = await run(box, ['perl', '-e', PERL]);
      expect(r.stderr).toBe('');
      expect(r.stdout.trim()).toBe(expected);
      expect(r.exitCode).toBe(0);
    });

    it('ordinary programs run: sh, coreutils, node (libuv without io_uring), the files API', async () => {
      const r = await run(box, ['sh', '-c', 'echo hi > /tmp/x && cat /tmp/x && ls / >/dev/null && (sleep 0.1 & wait) && echo done']);
      expect(r.stdout).toBe('hi\ndone\n');
      if (existsSync('/usr/bin/node')) {
        const n = await run(box, ['node', '-e', "const fs=require('fs');fs.writeFileSync('/tmp/n','x');fs.promises.readFile('/tmp/n','utf8').then(s=>console.log(s+require('child_process').execSync('echo y')))"]);
        expect(n.stderr).toBe('');
        expect(n.stdout).toBe('xy\n\n');
      }
      const { Readable } = await import('node:stream');
      await box.writeFile('/workspace/f.txt', Readable.from([Buffer.from('content')]), 1024);
      const got = await box.readFile('/workspace/f.txt', 1024);
      let s = '';
      for await (const c of got.stream) s += c;
      expect(s).toBe('content');
    });
  },
);

afterAll(() => cleanupTmp());
