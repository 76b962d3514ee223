/**
 * The box's relay to its proxy (127.0.0.1:3128 inside) carries each direction's end on its own,
 * as the proxy itself does: a program that sends its request and then half-closes (shutdown of
 * its sending side, as `nc -N`, HTTP/1.0 clients and many RPC clients do) still gets the answer
 * that comes after its FIN. Real boxes of both drivers; the box's proxy is a plain TCP server
 * that answers only once it has read the box's FIN, and only after a pause.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxDriver } from '../../src/sandbox/driver.js';
import { DockerBoxDriver } from '../../src/sandbox/docker.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { announceSkip } from '../helpers/docker-engine.js';
import { bareSpec, bothDrivers } from './both-drivers.js';
import { run } from './local-helpers.js';

const TMP = mkdtempSync(path.join(os.tmpdir(), 'kg-relay-hc-'));
const SCOPE = `keygate-test-relayhc-${randomBytes(3).toString('hex')}`;

/** Reads until the FIN, then (after a pause, so the answer surely follows it) the byte count and its own FIN. */
let counter: net.Server;
const heard: string[] = [];
/** On the box's first bytes: a few bytes back, then a TCP reset. */
let resetter: net.Server;
beforeAll(async () => {
  resetter = net.createServer((s) => {
    s.on('error', () => undefined);
    s.once('data', () => s.write('partial', () => setTimeout(() => s.resetAndDestroy(), 100)));
  });
  await new Promise<void>((r) => resetter.listen(0, '127.0.0.1', r));
  counter = net.createServer({ allowHalfOpen: true }, (s) => {
    let got = '';
    s.on('error', () => undefined);
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('end', () => {
      heard.push(got);
      setTimeout(() => s.end(`answer after FIN: ${got.length} bytes`), 300);
    });
  });
  await new Promise<void>((r) => counter.listen(0, '127.0.0.1', r));
});
afterAll(async () => {
  await new Promise((r) => counter?.close(r));
  await new Promise((r) => resetter?.close(r));
  rmSync(TMP, { recursive: true, force: true });
});

// Perl with no modules (both the host's root and the docker test image have it): connect to
// 127.0.0.1:3128, send, shut the sending side, read to the end.
const CLIENT = `
socket(my $s, 2, 1, 6) or die "socket: $!";
connect($s, pack('Sna4x8', 2, 3128, pack('C4', 127, 0, 0, 1))) or die "connect: $!";
syswrite($s, "ping-from-box") or die "write: $!";
shutdown($s, 1) or die "shutdown: $!";
my $got = '';
while (1) { my $n = sysread($s, my $b, 4096); die "read: $!" unless defined $n; last unless $n; $got .= $b; }
print "got[$got]\\n";
`;

// The same client, reading to the end or to an error, and saying which.
const READER = `
socket(my $s, 2, 1, 6) or die "socket: $!";
connect($s, pack('Sna4x8', 2, 3128, pack('C4', 127, 0, 0, 1))) or die "connect: $!";
syswrite($s, "ping-from-box") or die "write: $!";
my $got = '';
while (1) { my $n = sysread($s, my $b, 4096); unless (defined $n) { print "got[$got] error[$!]\\n"; exit 0; } last unless $n; $got .= $b; }
print "got[$got] end\\n";
`;

describe.each(await bothDrivers())('the relay to the proxy and a half-close (%s driver)', (which, why) => {
  const skip = announceSkip(`relay half-close tests (${which})`, why);
  describe.skipIf(skip)(which, () => {
    let driver: SandboxDriver;
    afterAll(async () => {
      await driver?.close();
    });

    it("a program that half-closes after its request gets the answer sent after its FIN", async () => {
      driver = which === 'local' ? new LocalDriver({ runDir: path.join(TMP, 'run') }) : new DockerBoxDriver({ scope: SCOPE });
      const s = await bareSpec(which, `hc${process.pid}`, TMP, { disk_mb: 32 });
      s.proxy = { host: '127.0.0.1', port: (counter.address() as net.AddressInfo).port };
      const box = await driver.start(s);
      const before = heard.length;
      const r = await run(box, ['perl', '-e', CLIENT], { timeoutMs: 20_000 });
      expect(heard.slice(before)).toEqual(['ping-from-box']);
      expect(r.stderr).toBe('');
      expect(r.stdout).toBe('got[answer after FIN: 13 bytes]\n');
      expect(r.exitCode).toBe(0);
      await driver.destroy(s.id, s.stateDir);
    }, 90_000);

    // A reset is not an end: a program in the box must not take a cut stream for a whole one.
    // The local driver's relay is one TCP hop and sends the reset on; the docker driver's goes
    // through a unix socket between its two relays, which carries no reset: an end there.
    it('a reset of the proxy side reaches the program in the box as a reset (local), as an end (docker)', async () => {
      driver ??= which === 'local' ? new LocalDriver({ runDir: path.join(TMP, 'run') }) : new DockerBoxDriver({ scope: SCOPE });
      const s = await bareSpec(which, `rs${process.pid}`, TMP, { disk_mb: 32 });
      s.proxy = { host: '127.0.0.1', port: (resetter.address() as net.AddressInfo).port };
      const box = await driver.start(s);
      const r = await run(box, ['perl', '-e', READER], { timeoutMs: 20_000 });
      expect(r.stdout).toBe(which === 'local' ? 'got[partial] error[Connection reset by peer]\n' : 'got[partial] end\n');
      await driver.destroy(s.id, s.stateDir);
    }, 90_000);
  });
});
