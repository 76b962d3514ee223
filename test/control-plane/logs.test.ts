import { inspect } from 'node:util';
import { describe, expect, it } from 'vitest';
import { isoToMicros, LineSplitter, makeRedactor, microsToIso, monotonicIso, parseSince } from '../../src/control-plane/logs.js';
import { canTransition, recoveryAction } from '../../src/control-plane/state.js';

describe('log helpers', () => {
  it('timestamps strictly increase and round-trip through microseconds', () => {
    const a = monotonicIso();
    const b = monotonicIso();
    expect(b > a).toBe(true);
    expect(microsToIso(isoToMicros(a))).toBe(a);
    expect(microsToIso(isoToMicros(a) + 1) > a).toBe(true);
  });

  it('parses since as ISO time or as a duration back from now', () => {
    const now = Date.parse('2026-01-01T00:10:00.000Z');
    expect(parseSince('10m', now)).toBe('2026-01-01T00:00:00.000000Z');
    expect(parseSince('30', now)).toBe('2026-01-01T00:09:30.000000Z');
    expect(parseSince('2026-01-01T00:00:00Z')).toBe('2026-01-01T00:00:00.000000Z');
    expect(parseSince('yesterday')).toBeNull();
  });

  it('redacts every exact occurrence of a secret, longest first', () => {
    const r = makeRedactor(['abc', 'abcdef', '']);
    expect(r('x abcdef y abc z')).toBe('x [redacted] y [redacted] z');
    expect(makeRedactor([])('same')).toBe('same');
  });

  it('redacts a secret in the forms it takes in output: trimmed, line by line, JSON- and inspect-escaped', () => {
    const pem = '-----BEGIN KEY-----\nAAAAsecretline1\nBBBBsecretline2\n-----END KEY-----\n';
    const r = makeRedactor([pem, 'pw-with-newline\n', 'say "hi"\\now', 'nul\u0000inside']);
    expect(r('AAAAsecretline1')).toBe('[redacted]');
    expect(r('x BBBBsecretline2 y')).toBe('x [redacted] y');
    expect(r(JSON.stringify({ k: pem }))).toBe('{"k":"[redacted]"}');
    expect(r('password: pw-with-newline')).toBe('password: [redacted]');
    expect(r(JSON.stringify({ k: 'say "hi"\\now' }))).toBe('{"k":"[redacted]"}');
    expect(r(`Received ${inspect('nul\u0000inside')}`)).toBe("Received '[redacted]'");
    // Short pieces of a multi-line value are not worth breaking every other line for.
    expect(makeRedactor(['{\n  "a": 1\n}'])('{ ok }')).toBe('{ ok }');
  });

  it('splits lines across chunks (UTF-8 safe) and redacts whole lines', () => {
    const lines: string[] = [];
    const s = new LineSplitter((l) => lines.push(l), makeRedactor(['s3cr3t']));
    const euro = Buffer.from('€');
    s.write(Buffer.concat([Buffer.from('one s3c'), Buffer.from('r3t '), euro.subarray(0, 1)]));
    s.write(Buffer.concat([euro.subarray(1), Buffer.from('\r\ntwo\nthr')]));
    s.end();
    s.write('');
    expect(lines).toEqual(['one [redacted] €', 'two', 'thr']);
  });

  it('revision transitions follow the state machine; restart recovery is decided per status', () => {
    expect(canTransition('QUEUED', 'BUILDING')).toBe(true);
    expect(canTransition('DEPLOYED', 'BUILDING')).toBe(false);
    expect(canTransition('BUILDING', 'DEPLOYED')).toBe(false);
    expect(recoveryAction('BUILDING', true)).toBe('interrupt-and-rebuild');
    expect(recoveryAction('DEPLOYING', false)).toBe('interrupt');
    expect(recoveryAction('QUEUED', true)).toBe('requeue');
    expect(recoveryAction('QUEUED', false)).toBe('skip');
    expect(recoveryAction('DEPLOYED', true)).toBe('keep');
  });
});
