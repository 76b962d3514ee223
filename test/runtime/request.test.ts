import { describe, expect, it } from 'vitest';
import { parseRunRequest } from '../../src/runtime/request.js';

function issues(body: unknown) {
  const r = parseRunRequest(body);
  if (r.ok) throw new Error('expected a validation failure');
  return r.issues;
}

describe('parseRunRequest', () => {
  it('applies defaults', () => {
    const r = parseRunRequest({ assistant_id: 'agent' });
    expect(r).toEqual({
      ok: true,
      request: { assistant_id: 'agent', input: {}, stream_mode: ['values'], on_disconnect: 'cancel', config: {}, metadata: {} },
    });
  });

  it('accepts a string or a list of modes, de-duplicated, and the SDK neutral fields', () => {
    const r = parseRunRequest({
      assistant_id: 'agent',
      input: { messages: [{ role: 'user', content: 'hi', id: 'm1' }], extra: 1 },
      stream_mode: ['updates', 'messages-tuple', 'updates'],
      on_disconnect: 'continue',
      config: { configurable: { x: 1 } },
      metadata: null,
      thread_id: null,
      stream_subgraphs: false,
      stream_resumable: false,
    });
    expect(r.ok && r.request).toMatchObject({ stream_mode: ['updates', 'messages-tuple'], on_disconnect: 'continue', metadata: {} });
    expect(parseRunRequest({ assistant_id: 'a', stream_mode: 'custom' })).toMatchObject({ ok: true, request: { stream_mode: ['custom'] } });
  });

  it('reports the exact loc of each problem', () => {
    expect(issues({})).toEqual([{ loc: ['body', 'assistant_id'], msg: 'Field required', type: 'missing' }]);
    expect(issues({ assistant_id: 'a', stream_mode: 'debug' })).toEqual([
      expect.objectContaining({ loc: ['body', 'stream_mode'], type: 'enum' }),
    ]);
    expect(issues({ assistant_id: 'a', stream_mode: ['values', 'events'] })).toEqual([
      expect.objectContaining({ loc: ['body', 'stream_mode', 1], type: 'enum' }),
    ]);
    expect(issues({ assistant_id: 'a', stream_mode: [] })).toEqual([expect.objectContaining({ loc: ['body', 'stream_mode'], type: 'too_short' })]);
    expect(issues({ assistant_id: 'a', stream_mode: 5 })).toEqual([expect.objectContaining({ loc: ['body', 'stream_mode'] })]);
    expect(issues({ assistant_id: 'a', on_disconnect: 'ignore' })).toEqual([expect.objectContaining({ loc: ['body', 'on_disconnect'], type: 'enum' })]);
    expect(issues({ assistant_id: 'a', input: { messages: [{ role: 'bot', content: 'x' }, { role: 'user' }] } })).toEqual([
      expect.objectContaining({ loc: ['body', 'input', 'messages', 0, 'role'], type: 'enum' }),
      expect.objectContaining({ loc: ['body', 'input', 'messages', 1, 'content'], type: 'missing' }),
    ]);
    expect(issues({ assistant_id: 'a', input: [] })).toEqual([expect.objectContaining({ loc: ['body', 'input'] })]);
    expect(issues({ assistant_id: 'a', stream_modes: 'values' })).toEqual([
      { loc: ['body', 'stream_modes'], msg: 'Extra inputs are not permitted', type: 'extra_forbidden' },
    ]);
    expect(issues([])).toEqual([expect.objectContaining({ loc: ['body'], type: 'dict_type' })]);
    expect(issues(null)).toEqual([expect.objectContaining({ loc: ['body'], type: 'dict_type' })]);
  });

  it('refuses a thread id and resumable streams with a reason', () => {
    expect(issues({ assistant_id: 'a', thread_id: '5f1c4d1e-0000-4000-8000-000000000000' })).toEqual([
      { loc: ['body', 'thread_id'], msg: 'This application runs threadless only: thread_id must be null or absent', type: 'value_error' },
    ]);
    expect(issues({ assistant_id: 'a', stream_resumable: true })[0].loc).toEqual(['body', 'stream_resumable']);
  });
});
