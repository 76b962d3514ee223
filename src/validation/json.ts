import type { ValidationIssue } from './errors.js';
/**
 * Where a JSON text stops parsing, as "line L, column C", WITHOUT the parser's own message: V8's
 * messages quote the text around the error (`Unexpected token 'x', "...secret..." is not valid
 * JSON`), and keygate's JSON files and bodies hold secret and opaque values.
 */
export function jsonErrorLocation(text: string, err: unknown): string {
  const message = err instanceof Error ? err.message : '';
  const pos = /position (\d+)/.exec(message);
  if (pos) {
    const offset = Math.min(Number(pos[1]), text.length);
    const before = text.slice(0, offset);
    const line = before.split('\n').length;
    const column = offset - before.lastIndexOf('\n');
    return `line ${line}, column ${column}`;
  }
  const lc = /line (\d+) column (\d+)/.exec(message);
  if (lc) return `line ${lc[1]}, column ${lc[2]}`;
  if (/end of (JSON )?input/i.test(message) || text.trim() === '') return 'unexpected end of input';
  return 'syntax error';
}

/** `JSON.parse` that throws `SyntaxError("invalid JSON at line L, column C")` and nothing more. */
export function parseJsonSafely(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new SyntaxError(`invalid JSON at ${jsonErrorLocation(text, err)}`);
  }
}

/**
 * The largest page offset a list route accepts: the largest integer a JSON number holds exactly.
 * A bigger one (coerced from the query string: `1e400` is Infinity) would reach the database as
 * a value it refuses (SQLite's "datatype mismatch", PostgreSQL's bigint range): a 500 for what
 * is the client's mistake, so the schema refuses it with a 422 at `query.offset` first.
 */
export const MAX_OFFSET = Number.MAX_SAFE_INTEGER;

/** A UTF-16 surrogate without its partner: JSON can carry one (`"\ud800"`), UTF-8 cannot. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Where a value sits in the body: its parent's place and its key, made into a `loc` only when reported. */
interface Place {
  parent: Place | null;
  key: string | number;
}

function locOf(place: Place | null, prefix: (string | number)[]): (string | number)[] {
  const keys: (string | number)[] = [];
  for (let p = place; p !== null; p = p.parent) keys.push(p.key);
  return [...prefix, ...keys.reverse()];
}

/**
 * Strings of a parsed JSON value (keys and values) that are not valid Unicode: a lone surrogate
 * (`"\ud800"` is valid JSON) becomes U+FFFD the moment it is written as UTF-8 (a database, a
 * sealed value, a file, an argv), so what was stored would silently differ from what was sent.
 * Refused like pydantic refuses such a string (`string_unicode`), with each one's `loc`, never
 * its value. Iterative (a body may nest deeper than the stack) and linear in the body's size: a
 * place links to its parent, and a `loc` is built only for a string reported (copied per value,
 * a body nested 30,000 deep took 10 s). At most `max` issues.
 */
export function unicodeIssues(value: unknown, prefix: (string | number)[], max = 20): ValidationIssue[] {
  return valueIssues(value, prefix, max, false);
}

/**
 * Deepest nesting of arrays and objects a body checked by {@link jsonBodyIssues} may have (the body
 * itself is level 1). JSON.parse takes any depth, but JSON.stringify recurses and overflows the
 * stack at a few thousand levels (about 4,000 from a fresh stack on Node 20 and 24, fewer from a
 * deep one), so a deeper value could be read but never written back. The production LangGraph
 * server's parser (orjson) stops at 1024.
 */
export const JSON_MAX_DEPTH = 1000;

export interface JsonBodyLimits {
  /** Default {@link JSON_MAX_DEPTH}. */
  maxDepth?: number;
  /** Most issues reported (default 20). */
  max?: number;
}

/**
 * What in a parsed JSON body could not be written back as it was sent: nesting deeper than
 * `maxDepth` (one issue, `json_invalid` at the prefix: the body as a whole), else each string or
 * key that is not Unicode text (as {@link unicodeIssues} words it: `string_unicode`) and each number
 * that is not finite (`finite_number`: a literal such as `1e400` parses to Infinity, which
 * JSON.stringify writes as `null`; the production server's parser refuses it), with its `loc`,
 * never its value. Iterative and linear in the body's size, like unicodeIssues.
 */
export function jsonBodyIssues(value: unknown, prefix: (string | number)[], limits: JsonBodyLimits = {}): ValidationIssue[] {
  const maxDepth = limits.maxDepth ?? JSON_MAX_DEPTH;
  const max = limits.max ?? 20;
  // Depth first, over the whole body: a deep body is refused whatever else it holds.
  const levels: [unknown, number][] = [[value, 1]];
  while (levels.length) {
    const [v, depth] = levels.pop()!;
    if (v === null || typeof v !== 'object') continue;
    if (depth > maxDepth) {
      return [{ loc: prefix, msg: `JSON decode error: arrays and objects nested deeper than ${maxDepth} levels`, type: 'json_invalid' }];
    }
    for (const x of Array.isArray(v) ? v : Object.values(v)) if (x !== null && typeof x === 'object') levels.push([x, depth + 1]);
  }
  return valueIssues(value, prefix, max, true);
}

/**
 * The walk of unicodeIssues and jsonBodyIssues, in document order: each string or key that is not
 * Unicode text (a key is reported where it stands and its value skipped) and, with `finite`, each
 * number that is not finite. Iterative, and linear in the value's size: a place links to its
 * parent, and a `loc` is built only for what is reported.
 */
function valueIssues(value: unknown, prefix: (string | number)[], max: number, finite: boolean): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  const stack: [unknown, Place | null, boolean?][] = [[value, null]];
  while (stack.length && issues.length < max) {
    const [v, place, badKey] = stack.pop()!;
    if (badKey) {
      issues.push({ loc: locOf(place, prefix), msg: 'Field name is not valid Unicode text (a lone UTF-16 surrogate)', type: 'string_unicode' });
    } else if (typeof v === 'string') {
      if (LONE_SURROGATE.test(v)) issues.push({ loc: locOf(place, prefix), msg: 'Input should be a valid string: it holds a lone UTF-16 surrogate, which is not Unicode text', type: 'string_unicode' });
    } else if (typeof v === 'number') {
      if (finite && !Number.isFinite(v)) issues.push({ loc: locOf(place, prefix), msg: 'Input should be a finite number: this JSON number is too large for a double', type: 'finite_number' });
    } else if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) stack.push([v[i], { parent: place, key: i }]);
    } else if (v !== null && typeof v === 'object') {
      const entries = Object.entries(v);
      for (let i = entries.length - 1; i >= 0; i--) {
        const [k, x] = entries[i];
        if (LONE_SURROGATE.test(k)) stack.push([undefined, { parent: place, key: k }, true]);
        else stack.push([x, { parent: place, key: k }]);
      }
    }
  }
  return issues;
}
