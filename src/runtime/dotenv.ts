/**
 * Parser for `.env` files (the common dotenv dialect): `KEY=value`, optional `export ` prefix,
 * `#` comments, single quotes (literal), double quotes (with \n \r \t \" \\ escapes, may span
 * lines), unquoted values trimmed with a trailing ` #comment` removed. Pure: no I/O.
 *
 * Errors name the line number, never the value (an env file holds secrets).
 */

export class DotenvError extends Error {
  constructor(
    readonly line: number,
    reason: string,
  ) {
    super(`line ${line}: ${reason}`);
    this.name = 'DotenvError';
  }
}

const KEY_RE = /^[A-Za-z_][A-Za-z0-9_.-]*$/;

export function parseDotenv(text: string): Map<string, string> {
  const out = new Map<string, string>();
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const lineNo = i + 1;
    const raw = lines[i];
    const trimmed = raw.trim();
    if (trimmed === '' || trimmed.startsWith('#')) continue;
    const body = trimmed.startsWith('export ') ? trimmed.slice(7).trimStart() : trimmed;
    const eq = body.indexOf('=');
    if (eq <= 0) throw new DotenvError(lineNo, 'expected KEY=value');
    const key = body.slice(0, eq).trim();
    if (!KEY_RE.test(key)) throw new DotenvError(lineNo, 'invalid variable name');
    let rest = body.slice(eq + 1).trimStart();
    let value: string;
    if (rest.startsWith("'")) {
      const end = rest.indexOf("'", 1);
      if (end < 0) throw new DotenvError(lineNo, 'unterminated single-quoted value');
      value = rest.slice(1, end);
      assertOnlyComment(rest.slice(end + 1), lineNo);
    } else if (rest.startsWith('"')) {
      // A double-quoted value may continue on the following lines until its closing quote.
      let acc = rest.slice(1);
      const startLine = lineNo;
      let close = findClosingQuote(acc);
      while (close < 0) {
        i++;
        if (i >= lines.length) throw new DotenvError(startLine, 'unterminated double-quoted value');
        acc += '\n' + lines[i];
        close = findClosingQuote(acc);
      }
      value = unescapeDouble(acc.slice(0, close));
      assertOnlyComment(acc.slice(close + 1), i + 1);
    } else {
      const hash = rest.search(/\s#/);
      if (hash >= 0) rest = rest.slice(0, hash);
      value = rest.trim();
    }
    out.set(key, value);
  }
  return out;
}

function findClosingQuote(s: string): number {
  for (let j = 0; j < s.length; j++) {
    if (s[j] === '\\') {
      j++;
      continue;
    }
    if (s[j] === '"') return j;
  }
  return -1;
}

function unescapeDouble(s: string): string {
  return s.replace(/\\([nrt"\\])/g, (_m, c: string) => ({ n: '\n', r: '\r', t: '\t', '"': '"', '\\': '\\' })[c] ?? c);
}

function assertOnlyComment(tail: string, lineNo: number): void {
  const t = tail.trim();
  if (t !== '' && !t.startsWith('#')) throw new DotenvError(lineNo, 'unexpected text after the closing quote');
}
