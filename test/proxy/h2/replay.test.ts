/**
 * src/proxy/h2/replay.ts: what of a request body is kept for a second attempt, and that each
 * attempt reads the body whole, in order, from a source read only once.
 */
import { describe, expect, it } from 'vitest';
import { REPLAY_MAX, ReplayBody } from '../../../src/proxy/h2/replay.js';

/** A source that counts its reads: each chunk can be read from it once. */
function source(chunks: Buffer[]): { body: ReplayBody; reads: () => number } {
  let reads = 0;
  async function* gen() {
    for (const c of chunks) {
      reads++;
      yield c;
    }
  }
  return { body: ReplayBody.of(gen()), reads: () => reads };
}

async function readAll(b: ReplayBody, max = Infinity): Promise<string> {
  let out = '';
  for (let i = 0; i < max; i++) {
    const c = await b.next();
    if (c === null) break;
    out += c.toString();
  }
  return out;
}

describe('ReplayBody', () => {
  it('a second attempt reads the same bytes, in order, the source read once', async () => {
    const s = source(['a', 'b', 'c', 'd'].map((x) => Buffer.from(x)));
    expect(await readAll(s.body, 2)).toBe('ab');
    expect(s.body.rewind()).toBe(true);
    expect(await readAll(s.body)).toBe('abcd');
    expect(s.reads()).toBe(4);
  });

  it('past REPLAY_MAX bytes nothing is kept and no attempt can start again', async () => {
    const s = source([Buffer.alloc(REPLAY_MAX), Buffer.alloc(1)]);
    await s.body.next();
    expect(s.body.replayable).toBe(true);
    await s.body.next();
    expect(s.body.replayable).toBe(false);
    expect(s.body.rewind()).toBe(false);
  });

  it('released while an attempt is still sending what was kept: that attempt still gets every byte', async () => {
    const s = source(['1', '2', '3', '4', '5'].map((x) => Buffer.from(x)));
    expect(await readAll(s.body, 3)).toBe('123');
    s.body.rewind();
    expect(await readAll(s.body, 1)).toBe('1');
    // The origin answered (it processed the stream): nothing is kept any more, but for what this
    // attempt has not sent yet.
    s.body.release();
    expect(s.body.replayable).toBe(false);
    expect(await readAll(s.body)).toBe('2345');
  });

  it('is itself the iterable a dispatcher reads (the HTTP/1.1 pool, for an origin that chose http/1.1)', async () => {
    const s = source(['x', 'y'].map((x) => Buffer.from(x)));
    await s.body.next();
    s.body.rewind();
    let out = '';
    for await (const c of s.body) out += c.toString();
    expect(out).toBe('xy');
    expect(ReplayBody.of(s.body)).toBe(s.body);
  });
});
