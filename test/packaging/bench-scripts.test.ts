// The benchmark's scripts (bench/*.mjs, bench/lib/*.mjs) are plain JavaScript that no test runs
// (a run needs nginx, squid, mitmproxy and minutes). A refactor once left `npm run bench` calling
// a function it no longer imported, and nothing noticed until the next run failed. TypeScript
// reads them here as checked JavaScript, and every name and import must resolve: the class of a
// dangling reference, not their types (the scripts carry no annotations).
import { readdirSync } from 'node:fs';
import path from 'node:path';
import ts from 'typescript';
import { expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';

/** Cannot find name (2304, 2552 with a suggestion); module or export missing (2305, 2307, 2614, 2724). */
const UNRESOLVED = new Set([2304, 2552, 2305, 2307, 2614, 2724]);

it('every name and import in the benchmark scripts resolves', () => {
  const dirs = ['bench', 'bench/lib'];
  const files = dirs.flatMap((d) =>
    readdirSync(path.join(REPO_ROOT, d))
      .filter((f) => f.endsWith('.mjs'))
      .map((f) => path.join(REPO_ROOT, d, f)),
  );
  expect(files.length).toBeGreaterThan(10);
  const program = ts.createProgram(files, {
    allowJs: true,
    checkJs: true,
    noEmit: true,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    types: ['node'],
    skipLibCheck: true,
  });
  const unresolved = ts
    .getPreEmitDiagnostics(program)
    .filter((d) => UNRESOLVED.has(d.code))
    .map((d) => `${path.relative(REPO_ROOT, d.file?.fileName ?? '?')}: ${ts.flattenDiagnosticMessageText(d.messageText, ' ')}`);
  expect(unresolved).toEqual([]);
}, 60_000);
