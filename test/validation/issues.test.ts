/**
 * ajv errors as FastAPI-style issues (src/validation/errors.ts), from a real ajv compile.
 */
import { Ajv } from 'ajv';
import { describe, expect, it } from 'vitest';
import { ajvToIssues } from '../../src/validation/errors.js';

const ajv = new Ajv({ allErrors: true });
const validate = ajv.compile({
  type: 'object',
  properties: { value: { type: ['string', 'null'] }, count: { type: 'integer' } },
  required: ['value'],
  additionalProperties: false,
});

function issuesOf(data: unknown) {
  validate(data);
  return ajvToIssues(validate.errors, ['body']);
}

describe('ajv errors as issues', () => {
  it('a nullable field of the wrong type is named after its type, in words', () => {
    expect(issuesOf({ value: 123 })).toEqual([{ loc: ['body', 'value'], msg: 'Must be string or null', type: 'string_type' }]);
  });

  it('single types keep their pydantic names', () => {
    expect(issuesOf({ value: 'x', count: 'many' })).toEqual([{ loc: ['body', 'count'], msg: 'Must be integer', type: 'int_type' }]);
    expect(issuesOf([])).toEqual([{ loc: ['body'], msg: 'Must be object', type: 'dict_type' }]);
  });

  it('missing and extra fields point at the field', () => {
    expect(issuesOf({ extra: 1 })).toEqual([
      { loc: ['body', 'value'], msg: 'Field required', type: 'missing' },
      { loc: ['body', 'extra'], msg: 'Extra inputs are not permitted', type: 'extra_forbidden' },
    ]);
  });
});
