import { Readable } from 'node:stream';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { memoryOf } from '../helpers/proxy.js';
import { useProxyFixture } from './fixture.js';

const fx = useProxyFixture();

/** Next chunk from an async iterator, failing (instead of hanging) if it does not come in time. */
async function nextWithin<T>(it: AsyncIterator<T>, ms: number, what: string): Promise<IteratorResult<T>> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      it.next(),
      new Promise<never>((_r, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} did not arrive within ${ms} ms (buffered by the proxy?)`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

describe('server-sent events', () => {
  it('arrive one by one: the origin writes event N+1 only after the client has seen event N', async () => {
    const res = await request(fx.f.url('api.test.local', '/sse?n=4'), { dispatcher: fx.agent });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('text/event-stream');
    const it = res.body[Symbol.asyncIterator]();
    let text = '';
    for (let i = 1; i <= 4; i++) {
      while (!text.includes(`data: ${i}\n\n`)) {
        const r = await nextWithin(it, 5000, `event ${i}`);
        expect(r.done, `stream ended before event ${i}`).toBe(false);
        text += Buffer.from(r.value as Uint8Array).toString('utf8');
      }
      expect(text).not.toContain(`data: ${i + 1}`);
      fx.f.origin.release();
    }
    const end = await nextWithin(it, 5000, 'end of stream');
    expect(end.done).toBe(true);
  });
});

describe('large uploads', () => {
  it('streams 1 GiB through an intercepted tunnel with the proxy’s memory bounded', async () => {
    const total = 1024 * 1024 * 1024;
    const chunk = Buffer.alloc(1024 * 1024, 0x61);
    let sent = 0;
    // Generated lazily: only what the socket accepts is ever in memory on the client side.
    const body = new Readable({
      read() {
        if (sent >= total) return void this.push(null);
        sent += chunk.length;
        this.push(chunk);
      },
    });
    const before = memoryOf(fx.f.proxy.pid);
    const res = await request(fx.f.url('api.test.local', '/upload'), {
      dispatcher: fx.agent,
      method: 'POST',
      body,
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(total) },
    });
    const answer = (await res.body.json()) as { bytes: number };
    expect(res.statusCode).toBe(200);
    expect(answer.bytes).toBe(total);
    const after = memoryOf(fx.f.proxy.pid);
    const growthMb = (after.hwmKb - before.hwmKb) / 1024;
    expect(growthMb, `proxy peak RSS grew by ${growthMb.toFixed(1)} MB`).toBeLessThan(200);
  }, 180_000);

  it('streams a chunked upload of unknown length too', async () => {
    let n = 0;
    const body = Readable.from(
      (async function* () {
        for (; n < 64; n++) yield Buffer.alloc(64 * 1024, 0x62);
      })(),
    );
    const res = await request(fx.f.url('api.test.local', '/upload'), { dispatcher: fx.agent, method: 'POST', body });
    expect(((await res.body.json()) as { bytes: number }).bytes).toBe(64 * 64 * 1024);
  });
});
