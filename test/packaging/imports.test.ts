// Module boundaries (#18 item 3): the deploy library does not reach into the CLI, and nothing that
// src/server/plugins.ts loads imports it back (areas take their types from src/server/area.ts).
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';

const SRC = path.join(REPO_ROOT, 'src');
const files = readdirSync(SRC, { recursive: true, encoding: 'utf8' })
  .filter((f) => f.endsWith('.ts'))
  .map((f) => `src/${f.split(path.sep).join('/')}`);

/** Every relative module a file imports, statically (types included) or with import(). */
function importsOf(file: string): string[] {
  const text = readFileSync(path.join(REPO_ROOT, file), 'utf8');
  const specs = [...text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*|^\s*import\s+)['"](\.{1,2}\/[^'"]+)['"]/gm)].map((m) => m[1]);
  return specs.map((s) => path.posix.normalize(path.posix.join(path.posix.dirname(file), s)).replace(/\.js$/, '.ts'));
}
const graph = new Map(files.map((f) => [f, importsOf(f)]));

function reaches(from: string, to: string): boolean {
  const seen = new Set<string>();
  const stack = [from];
  while (stack.length) {
    const f = stack.pop()!;
    if (f === to) return true;
    if (seen.has(f)) continue;
    seen.add(f);
    stack.push(...(graph.get(f) ?? []));
  }
  return false;
}

describe('module boundaries', () => {
  it('the scan sees imports (plugins.ts loads the three areas)', () => {
    expect(graph.get('src/server/plugins.ts')).toEqual(expect.arrayContaining(['src/auth/area.ts', 'src/control-plane/area.ts', 'src/sandbox-api/area.ts']));
  });

  it('src/deploy does not import src/cli', () => {
    const offenders = files.filter((f) => f.startsWith('src/deploy/')).flatMap((f) => graph.get(f)!.filter((i) => i.startsWith('src/cli/')).map((i) => `${f} -> ${i}`));
    expect(offenders).toEqual([]);
  });

  it('nothing plugins.ts imports imports plugins.ts back', () => {
    const back = graph.get('src/server/plugins.ts')!.filter((m) => reaches(m, 'src/server/plugins.ts'));
    expect(back).toEqual([]);
  });
});
