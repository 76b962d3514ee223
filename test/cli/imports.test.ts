/**
 * The CLI's modules import each other without cycles (type-only and lazy `import()` included):
 * `keygate proxy` hands its start and stop functions to the `--workers` supervisor instead of
 * the supervisor importing the command back. A cycle would let a module run against another
 * one that is not initialised yet, depending on which was loaded first.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';

const CLI_DIR = path.join(REPO_ROOT, 'src/cli');

/** Relative imports of each src/cli module that stay inside src/cli: `from './x.js'`, `import('./x.js')`. */
function cliImportGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of readdirSync(CLI_DIR).filter((f) => f.endsWith('.ts'))) {
    const src = readFileSync(path.join(CLI_DIR, file), 'utf8');
    const deps = [...src.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*)['"]\.\/([^'"/]+)\.js['"]/g)].map((m) => `${m[1]}.ts`);
    graph.set(file, deps);
  }
  return graph;
}

function cycles(graph: Map<string, string[]>): string[] {
  const found: string[] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (n: string) => {
    state.set(n, 'open');
    stack.push(n);
    for (const d of graph.get(n) ?? []) {
      if (state.get(d) === 'open') found.push([...stack.slice(stack.indexOf(d)), d].join(' -> '));
      else if (!state.has(d)) visit(d);
    }
    stack.pop();
    state.set(n, 'done');
  };
  for (const n of graph.keys()) if (!state.has(n)) visit(n);
  return found;
}

describe('src/cli imports', () => {
  it('the finder sees a cycle when there is one', () => {
    expect(cycles(new Map([['a.ts', ['b.ts']], ['b.ts', ['a.ts']], ['c.ts', []]]))).toEqual(['a.ts -> b.ts -> a.ts']);
  });

  it('has no cycle, and proxy.ts still loads the supervisor lazily', () => {
    const graph = cliImportGraph();
    expect(graph.get('proxy.ts')).toContain('proxy-cluster.ts');
    expect(graph.get('proxy-cluster.ts')).toContain('proxy-types.ts');
    expect(cycles(graph)).toEqual([]);
  });
});
