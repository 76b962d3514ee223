import type { ErrorObject } from 'ajv';

/** FastAPI-style validation error item, as wire.md prescribes. */
export interface ValidationIssue {
  loc: (string | number)[];
  msg: string;
  type: string;
}

/** The 422 body: `{"detail":[{loc,msg,type}]}`. */
export interface HTTPValidationError {
  detail: ValidationIssue[];
}

/** Thrown by pure validators (config resolution, templates) to report issues with exact locations. */
export class ValidationFailure extends Error {
  constructor(readonly issues: ValidationIssue[]) {
    super(issues.map((i) => `${formatLoc(i.loc)}: ${i.msg}`).join('; '));
    this.name = 'ValidationFailure';
  }
}

/** `["body","rules",0,"name"]` -> `body.rules[0].name` (for CLI messages). */
export function formatLoc(loc: (string | number)[]): string {
  return loc.reduce<string>((acc, part) => {
    if (typeof part === 'number') return `${acc}[${part}]`;
    return acc ? `${acc}.${part}` : part;
  }, '');
}

/** Splits an ajv JSON pointer (`/rules/0/match_hosts`) into loc items, numbers where numeric. */
function pointerToLoc(pointer: string): (string | number)[] {
  if (!pointer) return [];
  return pointer
    .split('/')
    .slice(1)
    .map((raw) => raw.replace(/~1/g, '/').replace(/~0/g, '~'))
    .map((part) => (/^(0|[1-9][0-9]*)$/.test(part) ? Number(part) : part));
}

const TYPE_BY_KEYWORD: Record<string, string> = {
  required: 'missing',
  additionalProperties: 'extra_forbidden',
  enum: 'enum',
  const: 'literal_error',
  pattern: 'string_pattern_mismatch',
  minLength: 'string_too_short',
  maxLength: 'string_too_long',
  minItems: 'too_short',
  maxItems: 'too_long',
  minimum: 'greater_than_equal',
  maximum: 'less_than_equal',
  format: 'value_error',
  uniqueItems: 'value_error',
};

function issueType(e: ErrorObject): string {
  if (e.keyword === 'type') {
    // A nullable field's schema has two types, which ajv gives joined ("string,null"): the issue
    // is named after the non-null one, as pydantic names it.
    const t = String((e.params as { type?: string }).type ?? 'value').split(',')[0];
    return `${t === 'integer' ? 'int' : t === 'boolean' ? 'bool' : t === 'array' ? 'list' : t === 'object' ? 'dict' : t}_type`;
  }
  return TYPE_BY_KEYWORD[e.keyword] ?? 'value_error';
}

function issueMsg(e: ErrorObject): string {
  switch (e.keyword) {
    case 'required':
      return 'Field required';
    case 'additionalProperties':
      return 'Extra inputs are not permitted';
    case 'type':
      return `Must be ${String((e.params as { type?: string }).type ?? 'valid').split(',').join(' or ')}`;
    case 'enum':
      return `Input should be ${((e.params as { allowedValues?: unknown[] }).allowedValues ?? []).map((v) => `'${String(v)}'`).join(', ')}`;
    default:
      // ajv messages never include the offending value, so they are safe to return verbatim.
      return e.message ? e.message.charAt(0).toUpperCase() + e.message.slice(1) : 'Invalid value';
  }
}

/**
 * Maps ajv errors to FastAPI-style issues. `prefix` is prepended to every loc (`['body']` for an
 * HTTP body). The missing or extra property's name is appended so `loc` points at the field itself.
 * Errors from `oneOf`/`anyOf` branches are folded into their most specific child to keep one
 * message per problem.
 */
export function ajvToIssues(errors: ErrorObject[] | null | undefined, prefix: (string | number)[] = []): ValidationIssue[] {
  if (!errors) return [];
  const issues: ValidationIssue[] = [];
  const seen = new Set<string>();
  for (const e of errors) {
    if (e.keyword === 'oneOf' || e.keyword === 'anyOf' || e.keyword === 'if') continue;
    const loc = [...prefix, ...pointerToLoc(e.instancePath)];
    if (e.keyword === 'required') loc.push((e.params as { missingProperty: string }).missingProperty);
    if (e.keyword === 'additionalProperties') loc.push((e.params as { additionalProperty: string }).additionalProperty);
    const issue = { loc, msg: issueMsg(e), type: issueType(e) };
    const key = JSON.stringify(issue);
    if (!seen.has(key)) {
      seen.add(key);
      issues.push(issue);
    }
  }
  if (issues.length === 0 && errors.length > 0) {
    const e = errors[0];
    issues.push({ loc: [...prefix, ...pointerToLoc(e.instancePath)], msg: issueMsg(e), type: issueType(e) });
  }
  return issues;
}
