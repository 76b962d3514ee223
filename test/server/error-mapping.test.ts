// The pure mapping of the error layer (src/server/errors.ts): every kind of error to the wire.md
// answer, with no message of a foreign error ever passed on.
import { spawnSync } from 'node:child_process';
import { Ajv } from 'ajv';
import { describe, expect, it } from 'vitest';
import { errorResponse, frameworkStatuses, HttpError, HttpValidationError, JSON_DECODE_ISSUE, loggableMessage, loggableStack, MAX_URL_LENGTH, URL_TOO_LONG } from '../../src/server/errors.js';

/** A real ajv failure, shaped as fastify hands it to the error handler. */
function ajvFailure(context: string) {
  const validate = new Ajv({ allErrors: true }).compile({ type: 'object', properties: { token_id: { type: 'string', maxLength: 3 } } });
  validate({ token_id: 'too long' });
  return Object.assign(new Error('validation'), { validation: validate.errors, validationContext: context, statusCode: 400, code: 'FST_ERR_VALIDATION' });
}

const withCode = (code: string, statusCode?: number, message = 'framework message with kg_secret_token_value') => Object.assign(new Error(message), { code, statusCode });

describe('errorResponse', () => {
  it('keeps our own errors as they are', () => {
    expect(errorResponse(new HttpError(409, 'Taken.'))).toMatchObject({ status: 409, body: { detail: 'Taken.' } });
    const issues = [{ loc: ['body', 'name'], msg: 'bad', type: 'value_error' }];
    expect(errorResponse(new HttpValidationError(issues))).toMatchObject({ status: 422, body: { detail: issues } });
  });

  it("carries the headers an error asks for (Allow, WWW-Authenticate), and none when it asks for none", () => {
    expect(errorResponse(new HttpError(405, 'No.', { headers: { Allow: 'POST' } }))).toMatchObject({ status: 405, headers: { Allow: 'POST' } });
    expect(errorResponse(new HttpError(404, 'Gone.')).headers).toBeUndefined();
  });

  it("a parser header overflow is 414 when the head's request line (as the server followed it) is over the URL limit, else 431", () => {
    const overflow = (extra: object) => Object.assign(new Error('Header overflow'), { code: 'HPE_HEADER_OVERFLOW', ...extra });
    expect(errorResponse(overflow({ requestLineBytes: MAX_URL_LENGTH + 1 }))).toMatchObject({ status: 414, body: { detail: URL_TOO_LONG } });
    expect(errorResponse(overflow({ requestLineBytes: MAX_URL_LENGTH })).status).toBe(431);
    // The parser's last chunk alone is never read: what it holds depends on how the bytes arrived.
    expect(errorResponse(overflow({ rawPacket: Buffer.from(`GET /${'u'.repeat(MAX_URL_LENGTH)} HTTP/1.1\r\n`) })).status).toBe(431);
    expect(errorResponse(overflow({ rawPacket: Buffer.from('b'.repeat(20_000)) })).status).toBe(431);
  });

  it('turns ajv failures into 422 with loc in the part they came from', () => {
    expect(errorResponse(ajvFailure('params')).body.detail).toEqual([expect.objectContaining({ loc: ['path', 'token_id'] })]);
    expect(errorResponse(ajvFailure('querystring')).body.detail).toEqual([expect.objectContaining({ loc: ['query', 'token_id'] })]);
    expect(errorResponse(ajvFailure('headers')).status).toBe(422);
  });

  it.each([
    ['FST_ERR_CTP_BODY_TOO_LARGE', 413],
    ['FST_ERR_CTP_INVALID_MEDIA_TYPE', 415],
    ['FST_ERR_BAD_URL', 400],
    ['FST_ERR_MAX_PARAM_LENGTH', 414],
    ['HPE_HEADER_OVERFLOW', 431],
    ['ERR_HTTP_REQUEST_TIMEOUT', 408],
    ['HPE_INVALID_METHOD', 400],
    ['HPE_SOMETHING_NEW', 400],
  ])('%s -> %i with a sentence of ours', (code, status) => {
    const r = errorResponse(withCode(code));
    expect(r.status).toBe(status);
    expect(typeof r.body.detail).toBe('string');
    expect(JSON.stringify(r.body)).not.toContain('kg_secret');
    expect(r.code).toBe(code);
  });

  it('bad and empty JSON bodies are the 422 decode error', () => {
    for (const code of ['FST_ERR_CTP_INVALID_JSON_BODY', 'FST_ERR_CTP_EMPTY_JSON_BODY']) expect(errorResponse(withCode(code, 400)).body).toEqual({ detail: [JSON_DECODE_ISSUE] });
    expect(errorResponse(Object.assign(new SyntaxError('Unexpected token'), { statusCode: 400 })).status).toBe(422);
  });

  it('an unknown 4xx keeps its status, not its message; anything else is a 500 that says nothing', () => {
    const r = errorResponse(withCode('FST_ERR_SOMETHING_LATER', 405));
    expect(r).toMatchObject({ status: 405, body: { detail: 'Method not allowed.' } });
    for (const e of [new Error('db at /secret/path failed'), 'a string', null, undefined, withCode('X', 200)]) {
      const i = errorResponse(e);
      expect(i).toMatchObject({ status: 500, body: { detail: 'Internal server error.' }, internal: true });
    }
  });
});

describe('frameworkStatuses', () => {
  it('authenticated routes can answer 401/403; methods with a body 413/415/422; validated ones 422', () => {
    expect(frameworkStatuses({ method: 'get', authenticated: false, validated: false })).toEqual([]);
    expect(frameworkStatuses({ method: 'get', authenticated: true, validated: true })).toEqual([401, 403, 422]);
    expect(frameworkStatuses({ method: 'delete', authenticated: true, validated: false })).toEqual([401, 403, 413, 415, 422]);
  });
});

describe('loggable messages', () => {
  const secret = 'quoted-by-node-' + 'v9'.repeat(8);
  /** Node's own refusal of an argument: the real error, not an imitation. */
  const refused = (() => {
    try {
      spawnSync('true', ['ok', `${secret}\u0000`]);
    } catch (err) {
      return err as Error;
    }
    throw new Error('spawnSync accepted a NUL');
  })();

  it("drop the value Node's argument checks quote, keep the sentence and the code", () => {
    expect(refused.message).toContain(secret); // what would have been logged
    expect((refused as NodeJS.ErrnoException).code).toBe('ERR_INVALID_ARG_VALUE');
    expect(loggableMessage(refused)).toMatch(/must be a string without null bytes\. Received: \[not logged\]$/);
    expect(loggableMessage(refused)).not.toContain(secret);
    expect(loggableStack(refused)).not.toContain(secret);
    expect(loggableStack(refused)).toMatch(/^TypeError: The argument .* Received: \[not logged\]\n/);
    expect(loggableStack(refused)).toMatch(/\n\s+at /);
  });

  it('leave every other message as it is', () => {
    expect(loggableMessage(new Error('Received 3 rows'))).toBe('Received 3 rows');
    expect(loggableMessage(Object.assign(new Error('ENOENT: open /x'), { code: 'ENOENT' }))).toBe('ENOENT: open /x');
  });
});
