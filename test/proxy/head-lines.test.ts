/**
 * HeadLines (src/server/head-lines.ts, the proxy's answer in src/proxy/limits.ts) without a socket: the answer to an overflowing head depends on
 * its bytes only. Node's parser reports the chunk it was reading; whatever the chunking, the
 * tracker fed the earlier chunks and asked with the last one gives the same 414 or 431.
 */
import { describe, expect, it } from 'vitest';
import { HeadLines, headOverflowAnswer } from '../../src/proxy/limits.js';
import { prng } from './h1/differential.js';

const limits = { maxHeaderBytes: 4096, maxRequestLineBytes: 1024 };

/** The answer when the parser fails at the end of `bytes`, the bytes having arrived cut at `cuts`. */
function answerWith(bytes: Buffer, cuts: number[]): number {
  const lines = new HeadLines();
  let from = 0;
  for (const c of cuts) {
    lines.feed(bytes.subarray(from, c));
    from = c;
  }
  return headOverflowAnswer(lines, limits, bytes.subarray(from), bytes.length - from).status;
}

function randomCuts(rand: () => number, length: number): number[] {
  const cuts = new Set<number>();
  const n = Math.floor(rand() * 12);
  for (let i = 0; i < n; i++) cuts.add(1 + Math.floor(rand() * (length - 1)));
  return [...cuts].sort((a, b) => a - b);
}

describe('HeadLines', () => {
  const cases: [string, string, number][] = [
    ['a big field after a short request line', `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(6000)}`, 431],
    ['a request line alone over the limit', `GET /${'p'.repeat(6000)}`, 414],
    ['a long request line, then a big field', `GET /${'p'.repeat(2000)} HTTP/1.1\r\nX-Big: ${'a'.repeat(6000)}`, 414],
    ['a second head on a kept-alive connection, big field', `GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nX-Big: ${'a'.repeat(6000)}`, 431],
    ['a second head on a kept-alive connection, long line', `GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /${'p'.repeat(6000)}`, 414],
    ['a first head with a long line, a second with a short one', `GET /${'p'.repeat(2000)} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nX-Big: ${'a'.repeat(6000)}`, 431],
  ];
  it.each(cases)('%s: %i, in any chunking', (_name, text, status) => {
    const bytes = Buffer.from(text, 'latin1');
    expect(answerWith(bytes, [])).toBe(status);
    expect(answerWith(bytes, [bytes.indexOf('\n') + 1].filter((c) => c > 0))).toBe(status);
    expect(answerWith(bytes, Array.from({ length: bytes.length - 1 }, (_, i) => i + 1))).toBe(status);
    const rand = prng(431);
    for (let i = 0; i < 300; i++) expect(answerWith(bytes, randomCuts(rand, bytes.length))).toBe(status);
  });
});

describe('HeadLines.overflowed: a parse error past the head limit is the overflow', () => {
  /** Whether the error at the end of `bytes` counts as the overflow, the bytes cut at `cuts`. */
  function overflowedWith(bytes: Buffer, cuts: number[], code: string): boolean {
    const lines = new HeadLines();
    let from = 0;
    for (const c of cuts) {
      lines.feed(bytes.subarray(from, c));
      from = c;
    }
    return lines.overflowed(code, limits.maxHeaderBytes, bytes.subarray(from), bytes.length - from);
  }
  it.each([
    ['a bad field name byte past the limit', `GET / HTTP/1.1\r\nHost: x\r\nX-${'n'.repeat(5000)} `, true],
    ['a bad request-target byte past the limit', `GET /${'p'.repeat(5000)}\u0001`, true],
    ['a bad byte within the limit', `GET / HTTP/1.1\r\nHost: x\r\nX-${'n'.repeat(3000)} `, false],
    ['a body error after a big head that was within the limit', `POST / HTTP/1.1\r\nX-A: ${'a'.repeat(3000)}\r\n\r\n${'z'.repeat(5000)}`, false],
  ])('%s: %s in any chunking', (_name, text, expected) => {
    const bytes = Buffer.from(text, 'latin1');
    const rand = prng(18);
    for (let i = 0; i < 200; i++) expect(overflowedWith(bytes, randomCuts(rand, bytes.length), 'HPE_INVALID_HEADER_TOKEN')).toBe(expected);
    expect(overflowedWith(bytes, [], 'ERR_HTTP_REQUEST_TIMEOUT')).toBe(false);
  });
});
