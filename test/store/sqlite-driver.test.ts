/**
 * The embedded database on every Node keygate supports (src/store/db.ts picks the SQLite driver
 * per Node). better-sqlite3 12 aborts Node 24 the first time the garbage collector frees a
 * statement, and 13 crashes Node 20; each run here is a fresh process that prepares thousands of
 * statements, collects them, and must exit cleanly with its data intact.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';
import { machineNodes } from '../helpers/nodes.js';

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe.each(machineNodes())('$name: SQLite', (node) => {
  it('statements freed by the garbage collector, then a clean close and exit', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kg-sqlite-'));
    dirs.push(dir);
    const script = `
      const { openSqlite } = await import(${JSON.stringify(pathToFileURL(path.join(REPO_ROOT, 'dist/store/db.js')).href)});
      const db = await openSqlite(${JSON.stringify(path.join(dir, 'keygate.db'))});
      await db.run('CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)');
      for (let i = 0; i < 3000; i++) {
        // A different SQL text each time: a new statement object, garbage right after.
        await db.run('INSERT INTO t (v) VALUES (?) -- ' + i, ['v' + i]);
        if (i % 500 === 0) globalThis.gc();
      }
      globalThis.gc();
      const row = await db.get('SELECT count(*) AS n FROM t');
      await db.close();
      globalThis.gc();
      process.stdout.write(String(row.n));`;
    const r = spawnSync(node.bin, ['--expose-gc', '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    expect(r.stderr).toBe('');
    expect({ status: r.status, signal: r.signal }).toEqual({ status: 0, signal: null });
    expect(r.stdout).toBe('3000');
  }, 70_000);
});
