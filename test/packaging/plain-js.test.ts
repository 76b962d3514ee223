// The project's plain JavaScript, which the type check (tsconfig.json: TypeScript only) never
// reads and most of which no test runs: the benchmark (a run needs nginx, squid, mitmproxy and
// minutes), the maintenance scripts, the examples, the test fixtures run inside boxes. A refactor
// once left `npm run bench` calling a function it no longer imported, and nothing noticed until
// the next run failed. TypeScript reads them here as checked JavaScript, and every name and
// import must resolve: the class of a dangling reference, not their types (no annotations).
import { readdirSync } from 'node:fs';
import path from 'node:path';
import ts from 'typescript';
import { expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';

/** Cannot find name (2304, 2552 with a suggestion); module or export missing (2305, 2307, 2614, 2724). */
const UNRESOLVED = new Set([2304, 2552, 2305, 2307, 2614, 2724]);

const DIRS = ['bench', 'bench/lib', 'scripts', 'scripts/lib', 'examples/echo-agent/src', 'examples/github-agent/src', 'test/sandbox/fixtures', 'test/runtime/fixtures/app/src', 'test/proxy'];

it('every name and import in the plain JavaScript (bench, scripts, examples, fixtures) resolves', () => {
  const files = DIRS.flatMap((d) =>
    readdirSync(path.join(REPO_ROOT, d))
      .filter((f) => /\.(mjs|cjs|js)$/.test(f))
      .map((f) => path.join(REPO_ROOT, d, f)),
  );
  expect(files.length).toBeGreaterThan(20);
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
