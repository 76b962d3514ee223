// Property test of what `keygate deploy` packs (src/deploy/files.ts + pack.ts): generated project
// directories with ignore files (negations, `**`, directory rules), env files, node_modules, .git,
// symlinks inside and out (to a canary secret beside the project), hard-linked files. Checked: the
// archive holds exactly the selected files, each with its content on disk (links as links), never
// an env file, node_modules or .git at any depth, never the canary's content, and the control
// plane's upload scan accepts it (what the CLI packs, the server takes).
import fc from 'fast-check';
import { linkSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as tar from 'tar';
import { afterAll, describe, expect, it } from 'vitest';
import { scanTarball } from '../../src/control-plane/tarball.js';
import { selectFiles } from '../../src/deploy/files.js';
import { packToFile } from '../../src/deploy/pack.js';
import { CliError } from '../../src/command-error.js';
import { propertyParams } from '../helpers/property.js';
import { tarEntries } from './helpers.js';

const CANARY = 'CANARY-outside-the-project-5c1e';
const top = mkdtempSync(path.join(os.tmpdir(), 'keygate-pack-prop-'));
afterAll(() => rmSync(top, { recursive: true, force: true }));

const dirName = fc.constantFrom('src', 'lib', 'build', 'node_modules', '.git', 'sub', 'a b');
const fileName = fc.constantFrom('index.js', 'x.ts', '.env', '.env.local', '.envrc', 'README.md', 'data.json', 'secret.key');
const relFile = fc.tuple(fc.array(dirName, { maxLength: 2 }), fileName).map(([d, f]) => [...d, f].join('/'));
const pattern = fc.constantFrom('build/', '*.ts', '!x.ts', '**/data.json', '!src/data.json', 'sub', 'secret.*', '!secret.key', '/README.md', 'src/**', '!src/index.js', '# comment', '');

type Op =
  | { op: 'file'; rel: string; body: string }
  | { op: 'ignore'; dir: string; which: '.gitignore' | '.keygateignore'; lines: string[] }
  | { op: 'symlink'; rel: string; target: string }
  | { op: 'hardlink'; rel: string; to: string };

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ op: fc.constant('file' as const), rel: relFile, body: fc.string({ maxLength: 20 }) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('ignore' as const), dir: fc.constantFrom('', 'src', 'sub'), which: fc.constantFrom('.gitignore' as const, '.keygateignore' as const), lines: fc.array(pattern, { maxLength: 4 }) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('symlink' as const), rel: relFile, target: fc.constantFrom('index.js', '../index.js', 'src', '../../canary', '../canary', 'sub/../../canary', 'missing') }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('hardlink' as const), rel: relFile, to: fc.oneof(relFile, fc.constant('<canary>')) }) },
);

describe('packing a project directory', () => {
  it('packs exactly the selection, never an env file, never outside content, and the server accepts it', async () => {
    let packed = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 12 }), async (ops) => {
        const outer = mkdtempSync(path.join(top, 'case-'));
        const canary = path.join(outer, 'canary');
        writeFileSync(canary, CANARY);
        const root = path.join(outer, 'proj');
        mkdirSync(root);
        writeFileSync(path.join(root, 'keygate.json'), '{"assistants":{"agent":"./index.js"}}');
        writeFileSync(path.join(root, 'index.js'), 'export default 1;');
        for (const o of ops) {
          const abs = path.join(root, o.op === 'ignore' ? o.dir : o.rel);
          try {
            if (o.op === 'ignore') {
              mkdirSync(abs, { recursive: true });
              writeFileSync(path.join(abs, o.which), o.lines.join('\n'));
              continue;
            }
            mkdirSync(path.dirname(abs), { recursive: true });
            rmSync(abs, { force: true });
            if (o.op === 'file') writeFileSync(abs, o.body);
            else if (o.op === 'symlink') symlinkSync(o.target, abs);
            else {
              const to = o.to === '<canary>' ? canary : path.join(root, o.to);
              linkSync(to, abs);
            }
          } catch {
            /* a path that cannot be made (a file where a directory would go): skipped */
          }
        }
        let sel;
        try {
          sel = selectFiles(root);
        } catch (err) {
          // Refusing is fine when a kept symlink leads outside; nothing else may throw.
          expect(err).toBeInstanceOf(CliError);
          expect((err as Error).message).toMatch(/refusing to pack symlink/);
          rmSync(outer, { recursive: true, force: true });
          return;
        }
        const file = path.join(outer, 'app.tar.gz');
        await packToFile(sel, file);
        const got = await tarEntries(file);
        expect([...got.keys()].sort()).toEqual([...sel.files].sort());
        for (const [p, e] of got) {
          const parts = p.split('/');
          expect(parts.some((c) => c === 'node_modules' || c === '.git' || c === '.env' || c.startsWith('.env.')), p).toBe(false);
          const abs = path.join(root, p);
          if (e.type === 'SymbolicLink') expect(e.linkpath).toBe(readlinkSync(abs));
          else {
            expect(e.type, p).toBe('File');
            expect(e.body).toBe(readFileSync(abs, 'utf8'));
          }
          // A symlink is stored as a link: the canary's content only travels in a hard link the
          // user made inside the project (that is a file of the project).
          if (e.type === 'SymbolicLink') expect(e.body).not.toContain(CANARY);
        }
        await expect(scanTarball(file, { maxEntries: 1000, maxUnpackedBytes: 1_000_000 })).resolves.toMatchObject({ hasKeygateJson: true });
        packed++;
        rmSync(outer, { recursive: true, force: true });
      }),
      propertyParams(150),
    );
    expect(packed).toBeGreaterThan(20);
  }, 120_000);
});
