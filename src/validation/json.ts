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
