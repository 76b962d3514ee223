/**
 * `.dockerignore` as docker reads it (moby/patternmatcher), not as git reads `.gitignore`: every
 * pattern is anchored at the root of the build context (`.env*` is the root's `.env` only, `**`
 * reaches any depth), a pattern that matches a directory excludes everything under it, `!`
 * re-includes, and the last matching pattern decides. Used to tell which files docker would send.
 */

interface Pattern {
  re: RegExp;
  exclusion: boolean;
}

const ESCAPED = new Set(['.', '+', '(', ')', '|', '{', '}', '$', '^']);

/** One pattern -> anchored regular expression, as moby's patternmatcher compiles it. */
function compile(pattern: string): RegExp {
  let re = '^';
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern[i];
    if (ch === '*') {
      if (pattern[i + 1] === '*') {
        i++;
        if (pattern[i + 1] === '/') i++; // `**/` is `**`
        re += i + 1 >= pattern.length ? '.*' : '(.*/)?';
      } else {
        re += '[^/]*';
      }
    } else if (ch === '?') {
      re += '[^/]';
    } else if (ch === '\\') {
      i++;
      if (i < pattern.length) re += '\\' + pattern[i];
    } else if (ESCAPED.has(ch)) {
      re += '\\' + ch;
    } else {
      re += ch;
    }
  }
  try {
    return new RegExp(re + '$');
  } catch {
    return /$^/; // a pattern docker would refuse matches nothing here
  }
}

/** path.posix.normalize without a trailing or leading slash (`filepath.Clean`, then the root's `/` dropped). */
function clean(p: string): string {
  const parts: string[] = [];
  for (const seg of p.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..') parts.pop();
    else parts.push(seg);
  }
  return parts.join('/');
}

export class DockerIgnore {
  private readonly patterns: Pattern[] = [];

  constructor(text: string) {
    for (const raw of text.split(/\r?\n/)) {
      let line = raw.trim();
      if (line === '' || line.startsWith('#')) continue;
      let exclusion = false;
      if (line.startsWith('!')) {
        exclusion = true;
        line = line.slice(1).trim();
      }
      const p = clean(line);
      if (p === '') continue;
      this.patterns.push({ re: compile(p), exclusion });
    }
  }

  /** Whether a `!` pattern exists (a directory excluded may then still hold files docker sends). */
  get hasExclusions(): boolean {
    return this.patterns.some((p) => p.exclusion);
  }

  /** Whether docker leaves `rel` (slash-separated, relative to the context root) out of the context. */
  ignores(rel: string): boolean {
    const file = clean(rel);
    const parents = file.split('/');
    let matched = false;
    for (const p of this.patterns) {
      let hit = p.re.test(file);
      // A pattern that matches a parent directory matches everything under it.
      for (let i = 1; !hit && i < parents.length; i++) hit = p.re.test(parents.slice(0, i).join('/'));
      if (hit) matched = !p.exclusion;
    }
    return matched;
  }
}
