/**
 * Property tests of the files API and execution against REAL boxes (sandbox.md, properties 4 and
 * 5), through the real HTTP API of an in-process server (every area, SQLite) on the `local` driver
 * (bubblewrap). Generated trees (directories, files, symlinks absolute, relative, dangling, looping,
 * to `/`, `..` chains, /proc/self/root and host-looking paths, fifos, hard links, names with spaces,
 * unicode, newlines, URL metacharacters and near NAME_MAX) are planted by code in the box; then
 * GET and PUT `files?path=` are driven as clients write the query (percent-encoded every way, with
 * `//`, `/./`, `..`, a trailing slash, relative, empty, NUL, overlong) and every answer is checked
 * against the box's own view, read by executing test(1) and base64 in the box:
 * - GET answers exactly the box's bytes, or 404 (the box sees nothing there) / 422 (a directory, a
 *   fifo, unreadable, a malformed path), in wire.md's shape, never a 5xx;
 * - a PUT the API accepts is what the box then reads at that path; one it refuses leaves the box's
 *   view unchanged, is one the box itself could not do either, and leaves no temporary behind;
 * - nothing on the host changes: read and write canaries (and the files the links point at) are
 *   byte-identical, no uploaded name appears on the host outside the box's /workspace, and no
 *   answer names a host path of the data directory;
 * - files under /workspace survive stop/start; DELETE leaves nothing of the box on the host;
 * - execute returns exactly the bytes a command wrote (as UTF-8), its exit code, and caps output.
 *
 * KEYGATE_FUZZ_SEED=random KEYGATE_FUZZ_RUNS=N explores; the committed run is the fixed seed.
 * Run by property-files.test.ts (local) and property-files-docker.test.ts (docker).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerEngine } from '../../src/docker/engine.js';
import { DockerBoxDriver } from '../../src/sandbox/docker.js';
import { LocalDriver } from '../../src/sandbox/local.js';
import { ensureBoxImage } from '../helpers/box-image.js';
import { dockerSocket } from '../helpers/docker-engine.js';
import { propertyParams } from '../helpers/property.js';
import { startInProcess, type InProcessServer } from '../server/inprocess.js';
import { bothDrivers, type DriverKind } from './both-drivers.js';
import { cleanupTmp, TMP } from './local-helpers.js';
import { Api, type Answer, encodePathParam, type Encoding, fileHash, listTree, nameArb, parseViews, plan, PLANT, treeArb, VIEW, type View } from './property-files-helpers.js';


const HOST_DIR = path.join(TMP, 'host-canaries');
const READ_CANARY = path.join(HOST_DIR, 'read-canary.txt');
const WRITE_CANARY = path.join(HOST_DIR, 'write-canary.txt');
const READ_SECRET = 'kg-read-canary-7f3a91';

const filesUrl = (box: string, rawParam: string) => `/api/v2/sandboxes/boxes/${box}/files?path=${rawParam}`;
let caseNo = 0;


/** The whole suite on one driver (one test file per driver, so that each runs in its own worker and time budget). */
export async function filesSuite(kind: DriverKind): Promise<void> {
  const why = (await bothDrivers()).find(([k]) => k === kind)![1];
  if (why) console.warn(`[keygate tests] property-files on the ${kind} driver skipped: ${why}`);
  afterAll(() => cleanupTmp());
  suite(kind, why);
}

function suite(kind: DriverKind, why: string | null): void {
let s: InProcessServer;
let api: Api;
const BOX = `pf-${kind}`;
let boxId: string;
/** Where cases plant their trees: the box's own /workspace, and its tmpfs /tmp. */
const BASES = ['/workspace', '/tmp'];

async function views(paths: string[]): Promise<View[]> {
  if (!paths.length) return [];
  const r = await api.exec(BOX, ['/bin/sh', '-c', VIEW, 'sh', ...paths], { cwd: '/' });
  expect(r.exit_code, r.stderr).toBe(0);
  return parseViews(r.stdout, paths.length);
}

/** wire.md's error shapes, a clear message, no 5xx, nothing of the host's data directory or staging. */
function errorProblems(a: Answer): string[] {
  const out: string[] = [];
  if (a.status >= 500) out.push(`status ${a.status}`);
  const d = (a.json as { detail?: unknown } | undefined)?.detail;
  if (a.status === 422) {
    if (!Array.isArray(d) || !d.length) out.push('422 without a detail list');
    else
      for (const i of d as { loc?: unknown[]; msg?: unknown; type?: unknown }[]) {
        if (!Array.isArray(i.loc) || !['query', 'body', 'path', 'header'].includes(String(i.loc[0]))) out.push(`bad loc ${JSON.stringify(i.loc)}`);
        if (typeof i.msg !== 'string' || i.msg.length < 5) out.push(`bad msg ${JSON.stringify(i.msg)}`);
        if (typeof i.type !== 'string') out.push('no type');
      }
  } else if (typeof d !== 'string' || d.length < 5) out.push(`detail is not a sentence: ${a.text.slice(0, 200)}`);
  for (const host of [s.dataDir, TMP, '/run/keygate-stage', boxId]) if (a.text.includes(host)) out.push(`answer names a host path: ${host}`);
  // What the server logged about a failure of its own (never a host path in an answer, but the log says why).
  if (a.status >= 500) out.push(...s.lines.slice(-4).map((l) => `log: ${l.slice(0, 1500)}`));
  return out;
}

/** The host paths that must stay as they are, with their hashes now. */
function hostState(): Map<string, string> {
  const m = new Map<string, string>();
  for (const p of [READ_CANARY, WRITE_CANARY, '/etc/passwd', '/etc/hostname', path.join(s.dataDir, 'api-key')]) m.set(p, fileHash(p));
  m.set('#canary-dir', [...listTree(HOST_DIR).keys()].sort().join('\n'));
  return m;
}

/** Host places an upload must never reach: the canaries, the data directory (but the box's own mounted /workspace), /, /tmp. */
function hostNamesUnder(): Set<string> {
  // The host side of the box's /workspace (its mounted file system), where uploads belong.
  const mine = path.join(s.dataDir, 'sandboxes', boxId);
  const names = new Set<string>();
  for (const p of listTree(s.dataDir, (d) => d.startsWith(mine) && path.basename(d) === 'workspace').keys()) names.add(path.basename(p));
  for (const p of listTree(HOST_DIR).keys()) names.add(path.basename(p));
  for (const d of ['/', '/tmp', '/etc', TMP]) for (const n of readdirSync(d)) names.add(n);
  return names;
}

describe.skipIf(why)(`files API and execution on real boxes, ${kind} driver`, () => {
  beforeAll(async () => {
    mkdirSync(HOST_DIR, { recursive: true });
    writeFileSync(READ_CANARY, READ_SECRET);
    writeFileSync(WRITE_CANARY, 'untouched');
    let configDir: string | undefined;
    if (kind === 'docker') {
      const image = await ensureBoxImage(new DockerEngine(dockerSocket()!));
      configDir = path.join(TMP, 'pf-config');
      mkdirSync(configDir, { recursive: true });
      writeFileSync(path.join(configDir, 'templates.json'), JSON.stringify([{ name: 'host', description: 'the test box image', image, environment: {} }]));
    }
    const driver = kind === 'local' ? new LocalDriver({ runDir: path.join(TMP, 'pf-run') }) : new DockerBoxDriver({ scope: `kg-pf-${process.pid}` });
    s = await startInProcess({ driver, configDir });
    api = new Api(s.url, s.key);
    const r = await api.json('POST', '/api/v2/sandboxes/boxes', { template_name: 'host', name: BOX, wait_for_ready: true, resources: { disk_mb: 64 } });
    expect(r.status, r.text).toBe(201);
    expect((r.json as { status: string }).status).toBe('ready');
    boxId = (r.json as { id: string }).id;
  }, 120_000);

  afterAll(async () => {
    await api?.close();
    await s?.close();
  });

  const hostPaths = [READ_CANARY, WRITE_CANARY, HOST_DIR, path.join(TMP, 'data')];

  /** A path as given to the API, and what the server must decode it to. */
  const variantArb = fc.record({
    how: fc.constantFrom<Encoding>('component', 'form', 'minimal', 'lowerhex'),
    shape: fc.constantFrom('plain', 'plain', 'plain', 'through-up', 'double-slash', 'dot', 'dotdot', 'up-from-root', 'trailing-slash', 'relative', 'nul', 'overlong', 'empty', 'via-root-link', 'host-absolute'),
    pick: fc.nat(),
  });

  function shaped(p: string, shape: string, pick: number, linkToRoot: string | undefined, entries: string[] = []): { path: string; valid: boolean } {
    const parts = p.split('/');
    switch (shape) {
      case 'through-up':
        // `..` after an entry of the tree that may be a symlink: the box resolves it physically
        // (the link's target's parent), not by striking out the previous name.
        return entries.length ? { path: `${entries[pick % entries.length]}/../${parts.at(-1)}`, valid: true } : { path: p, valid: true };
      case 'double-slash': {
        const i = 1 + (pick % (parts.length - 1));
        return { path: [...parts.slice(0, i), '', ...parts.slice(i)].join('/'), valid: true };
      }
      case 'dot':
        return { path: p.replace(/\/(?=[^/]*$)/, '/./'), valid: true };
      case 'dotdot': {
        // Up from a real directory of the box (the case's base): /workspace/../workspace/x is /workspace/x.
        return { path: `/${parts[1]}/..${p}`, valid: true };
      }
      case 'up-from-root':
        return { path: '/..'.repeat(1 + (pick % 6)) + p, valid: true };
      case 'trailing-slash':
        return { path: p + '/', valid: false };
      case 'relative':
        return { path: p.slice(1), valid: false };
      case 'nul':
        return { path: p + '\0x', valid: false };
      case 'overlong':
        return { path: `/workspace/${'o/'.repeat(2100)}x`, valid: false };
      case 'empty':
        return { path: '', valid: false };
      case 'via-root-link':
        return linkToRoot ? { path: linkToRoot + p, valid: true } : { path: p, valid: true };
      case 'host-absolute':
        return { path: hostPaths[pick % hostPaths.length], valid: true };
      default:
        return { path: p, valid: true };
    }
  }

  it('GET and PUT answer what the box sees, and never touch the host', async () => {
    await fc.assert(
      fc.asyncProperty(
        treeArb(hostPaths),
        fc.array(fc.record({ target: fc.nat(), v: variantArb }), { minLength: 3, maxLength: 8 }),
        fc.array(fc.record({ target: fc.nat(), v: variantArb, body: fc.uint8Array({ maxLength: 2000 }), newName: fc.option(fc.oneof(nameArb, fc.integer({ min: 256, max: 300 }).map((n) => 'N'.repeat(n))), { nil: undefined }), deeper: fc.option(nameArb, { nil: undefined }) }), { minLength: 1, maxLength: 4 }),
        fc.constantFrom(...BASES),
        async (tree, gets, puts, base) => {
          const root = `${base}/c${++caseNo}`;
          const before = hostState();
          const namesBefore = hostNamesUnder();
          const { paths, argv } = plan(root, tree);
          const planted = await api.exec(BOX, ['/bin/sh', '-c', `mkdir -p -- "$1" && shift && ${PLANT}`, 'sh', root, ...argv], { cwd: '/' });
          expect(planted.exit_code, planted.stderr).toBe(0);
          // A link in the box to its own root, for paths that go through one.
          const linkToRoot = `${root}/to-root`;
          await api.exec(BOX, ['ln', '-s', '/', linkToRoot]);

          // GET: exactly the box's view.
          for (const g of gets) {
            const { path: p, valid } = shaped(paths[g.target % paths.length], g.v.shape, g.v.pick, linkToRoot, paths);
            const a = await api.send('GET', filesUrl(BOX, encodePathParam(p, g.v.how)));
            if (!a) continue;
            const [view] = valid ? await views([p]) : [undefined];
            const what = `GET ${JSON.stringify(p)} (${g.v.how}): ${a.status} ${a.text.slice(0, 300)}; box: ${JSON.stringify(view && { ...view, data: 'data' in view ? view.data.toString('base64') : undefined })}`;
            if (a.status !== 200) expect(errorProblems(a), what).toEqual([]);
            if (!view) expect(a.status, what).toBe(422);
            else if (view.kind === 'FILE') {
              expect(a.status, what).toBe(200);
              expect(a.headers['content-type'], what).toBe('application/octet-stream');
              expect(a.body.equals(view.data), what).toBe(true);
              expect(a.text.includes(READ_SECRET), what).toBe(false);
            } else expect(a.status, what).toBe(view.kind === 'ENOENT' ? 404 : 422);
          }

          // PUT: lands where the box sees it, or changes nothing and is something the box could not do either.
          const uploaded: string[] = [];
          for (const u of puts) {
            const existing = paths[u.target % paths.length];
            const target = u.newName !== undefined ? `${path.posix.dirname(existing)}/${u.deeper ? `${u.deeper}/` : ''}${u.newName}` : existing;
            const { path: p, valid } = shaped(target, u.v.shape, u.v.pick, linkToRoot, paths);
            const body = Buffer.from(u.body);
            const [pre] = valid ? await views([p]) : [undefined];
            const listing = () => api.exec(BOX, ['/bin/sh', '-c', 'find "$1" | sort | base64 -w0', 'sh', root]).then((r) => r.stdout);
            const treeBefore = await listing();
            const a = await api.send('PUT', filesUrl(BOX, encodePathParam(p, u.v.how)), body, { 'content-type': 'application/octet-stream' });
            if (!a) continue;
            const what = `PUT ${JSON.stringify(p)} (${u.v.how}, ${body.length} bytes): ${a.status} ${a.text.slice(0, 300)}; before: ${pre?.kind}`;
            if (a.status !== 201) expect(await listing(), `${what}: a refused PUT changed the box's tree`).toBe(treeBefore);
            if (!valid) {
              expect(a.status, what).toBe(422);
              expect(errorProblems(a), what).toEqual([]);
              continue;
            }
            const [post] = await views([p]);
            if (a.status === 201) {
              expect(a.json, what).toEqual({ path: p, size: body.length });
              expect(post.kind, what).toBe('FILE');
              expect(post.kind === 'FILE' && post.data.equals(body), what).toBe(true);
              uploaded.push(path.posix.basename(p));
            } else {
              expect(errorProblems(a), what).toEqual([]);
              expect([404, 413, 422], what).toContain(a.status);
              expect(JSON.stringify(post), what).toBe(JSON.stringify(pre));
              // A refusal is one the box itself would meet: its own shell cannot put the file there.
              const self = await api.exec(BOX, ['/bin/sh', '-c', 'mkdir -p -- "${1%/*}" 2>/dev/null; [ ! -d "$1" ] && rm -f -- "$1" 2>/dev/null; printf x > "$1"', 'sh', p], { cwd: '/' });
              expect(self.exit_code, `${what}; yet the box itself wrote it (${self.stderr})`).not.toBe(0);
            }
          }
          // The upload temporaries' own names (a tree may plant look-alikes).
          const tmpName = `.kg-upload-${'[0-9a-f]'.repeat(16)}`;
          const leftovers = await api.exec(BOX, ['/bin/sh', '-c', 'find / -xdev -name "$1" 2>/dev/null; find /workspace /tmp -name "$1" 2>/dev/null; true', 'sh', tmpName], { cwd: '/' });
          expect(leftovers.stdout, 'temporary upload files left in the box').toBe('');

          // The host: canaries byte-identical, no uploaded name anywhere keygate's or the host's top level.
          expect(hostState()).toEqual(before);
          expect(readFileSync(WRITE_CANARY, 'utf8')).toBe('untouched');
          const onHost = hostNamesUnder();
          for (const n of uploaded) expect(onHost.has(n) && !namesBefore.has(n), `uploaded ${JSON.stringify(n)} appeared on the host`).toBe(false);
        },
      ),
      propertyParams(kind === 'local' ? 4 : 2, { endOnFailure: !process.env.KEYGATE_FUZZ_SHRINK }),
    );
  }, 300_000);

  // Shrunk from the property: mv of the counted upload onto a 256-byte name failed in the box
  // (ENAMETOOLONG) and the API answered 500 "Internal server error." for the caller's path.
  it('a PUT to a file name longer than the box allows is a 422 that says so, not a 500; nothing is left behind', async () => {
    for (const name of ['N'.repeat(256), 'é'.repeat(128)]) {
      const p = `/workspace/long-name/${name}`;
      const a = (await api.send('PUT', filesUrl(BOX, encodeURIComponent(p)), 'x'))!;
      expect(a.status, a.text).toBe(422);
      expect(errorProblems(a)).toEqual([]);
      expect(a.text).toMatch(/too long/);
      const ls = await api.exec(BOX, 'ls -A /workspace/long-name');
      expect(ls.stdout).toBe('');
    }
    // The longest name the box allows still works.
    const ok = (await api.send('PUT', filesUrl(BOX, encodeURIComponent(`/workspace/long-name/${'N'.repeat(255)}`)), 'x'))!;
    expect(ok.status, ok.text).toBe(201);
  });

  // Found reading the route with the property: the parents of a PUT's path were made before the
  // path was checked and kept when the write was refused, so a 422 changed the box.
  it('a refused PUT creates no directory in the box', async () => {
    const mk = await api.exec(BOX, 'mkdir -p /workspace/rf');
    expect(mk.exit_code).toBe(0);
    for (const p of ['/workspace/rf/a/b/', '/workspace/rf/c/d/' + 'N'.repeat(256), '/workspace/rf/e/f/..', '/workspace/rf/g/h/.']) {
      const a = (await api.send('PUT', filesUrl(BOX, encodeURIComponent(p)), 'x'))!;
      expect(a.status, `${p}: ${a.text}`).toBe(422);
      expect(errorProblems(a)).toEqual([]);
      const ls = await api.exec(BOX, 'find /workspace/rf -mindepth 1');
      expect(ls.stdout, p).toBe('');
    }
  });

  // The symlink-exchange race of `docker cp` (CVE-2018-15664) and its like: the box swaps a
  // directory of its /workspace with a link to / while files are read and written through it.
  it('a box swapping a directory for a link to / while files move never reaches a host file', async () => {
    // Swaps until its timeout kills it (timed_out), while the requests below run.
    const swapper = api.exec(BOX, ['/bin/sh', '-c', 'cd /workspace && while :; do mkdir -p sw.d; rm -rf sw; mv -T sw.d sw 2>/dev/null || mv sw.d sw; ln -sfn / sw.l; mv -T sw.l sw 2>/dev/null; done'], { timeout_seconds: 3 });
    const through = `/workspace/sw${READ_CANARY}`;
    const writeThrough = `/workspace/sw${WRITE_CANARY}`;
    const ops: Promise<void>[] = [];
    for (let i = 0; i < (kind === 'local' ? 8 : 5); i++) {
      const g = api.send('GET', filesUrl(BOX, encodeURIComponent(through))).then((a) => {
        expect(a!.status).toBeLessThan(500);
        expect(a!.text).not.toContain(READ_SECRET);
      });
      const w = api.send('PUT', filesUrl(BOX, encodeURIComponent(writeThrough)), 'PWNED').then((a) => {
        expect(a!.status).toBeLessThan(500);
      });
      ops.push(g, w);
      if (i % 4 === 3) await Promise.all(ops.splice(0));
    }
    await Promise.all(ops);
    await swapper;
    expect(readFileSync(WRITE_CANARY, 'utf8')).toBe('untouched');
    expect(readFileSync(READ_CANARY, 'utf8')).toBe(READ_SECRET);
  }, 120_000);

  // Docker: the engine strikes out `..` by name, so `ln/..` after a link to a directory read and
  // wrote the file beside the link, not the one the box sees (found by the property's through-up paths).
  it('`..` after a symlink resolves as the box resolves it, for GET and PUT', async () => {
    const mk = await api.exec(BOX, 'mkdir -p /workspace/dd/sub/x && ln -s /workspace/dd/sub/x /workspace/dd/ln && printf physical > /workspace/dd/sub/f && printf lexical > /workspace/dd/f');
    expect(mk.exit_code, mk.stderr).toBe(0);
    const a = (await api.send('GET', filesUrl(BOX, encodeURIComponent('/workspace/dd/ln/../f'))))!;
    expect(a.status, a.text).toBe(200);
    expect(a.text).toBe('physical');
    const w = (await api.send('PUT', filesUrl(BOX, encodeURIComponent('/workspace/dd/ln/../g')), 'written'))!;
    expect(w.status, w.text).toBe(201);
    const seen = await api.exec(BOX, 'cat /workspace/dd/sub/g; ls /workspace/dd');
    expect(seen.stdout).toBe('written' + 'f\nln\nsub\n');
  });

  // /proc files announce size 0: GET answered 200 with an empty body where the box's own cat
  // prints their content (found by giving the property's links /proc targets).
  it('a file that announces size 0 but holds content (/proc) reads as the box reads it, and never a 5xx', async () => {
    for (const p of ['/proc/version', '/proc/sys/kernel/ostype']) {
      const a = (await api.send('GET', filesUrl(BOX, encodeURIComponent(p))))!;
      const [view] = await views([p]);
      expect(view.kind).toBe('FILE');
      expect(a.status, a.text).toBe(200);
      expect(a.text.length).toBeGreaterThan(0);
      expect(a.body.equals((view as { data: Buffer }).data), p).toBe(true);
    }
    // An empty regular file is still an empty answer.
    await api.exec(BOX, ': > /workspace/empty');
    const e = (await api.send('GET', filesUrl(BOX, encodeURIComponent('/workspace/empty'))))!;
    expect([e.status, e.body.length]).toEqual([200, 0]);
    // Opened, then a read error, or nothing to read: never a 5xx.
    for (const p of ['/proc/self/mem', '/proc/1/mem', '/proc/self/pagemap', '/proc/1/environ', '/proc/self/clear_refs']) {
      const mem = (await api.send('GET', filesUrl(BOX, encodeURIComponent(p))))!;
      expect(mem.status, mem.text).toBeLessThan(500);
      if (mem.status !== 200) expect(errorProblems(mem)).toEqual([]);
    }
  });

  // Found probing the query: fast-querystring keeps a value it cannot decode as it came, so
  // ?path=/workspace/%FF (the byte 0xFF, not UTF-8) wrote a file named "%FF" and answered 201.
  it('a path that is not percent-encoded UTF-8 is a 422, and writes nothing', async () => {
    await api.exec(BOX, 'mkdir -p /workspace/pct');
    for (const raw of ['/workspace/pct/%FF', '/workspace/pct/100%', '/workspace/pct/a%2', '%2Fworkspace%2Fpct%2F%C3', '/workspace/pct/%E2%82']) {
      for (const method of ['PUT', 'GET']) {
        const a = (await api.send(method, filesUrl(BOX, raw), method === 'PUT' ? 'x' : undefined))!;
        expect(a.status, `${method} ${raw}: ${a.text}`).toBe(422);
        expect(errorProblems(a)).toEqual([]);
        expect((a.json as { detail: { loc: unknown[] }[] }).detail[0].loc).toEqual(['query', 'path']);
      }
    }
    expect((await api.exec(BOX, 'ls -A /workspace/pct')).stdout).toBe('');
    // Well-formed escapes of the same characters work.
    const ok = (await api.send('PUT', filesUrl(BOX, encodeURIComponent('/workspace/pct/100%')), 'x'))!;
    expect(ok.status, ok.text).toBe(201);
    expect((await api.exec(BOX, 'ls -A /workspace/pct')).stdout).toBe('100%\n');
  });

  it('execute returns the bytes a command wrote (as UTF-8), its exit code, never a 5xx', async () => {
    await fc.assert(
      fc.asyncProperty(fc.uint8Array({ maxLength: 4000 }), fc.uint8Array({ maxLength: 2000 }), fc.integer({ min: 0, max: 255 }), fc.boolean(), async (out, err, code, viaString) => {
        const o = Buffer.from(out).toString('base64');
        const e = Buffer.from(err).toString('base64');
        const script = 'printf %s "$1" | base64 -d; printf %s "$2" | base64 -d >&2; exit "$3"';
        const command = viaString ? `set -- '${o}' '${e}' ${code}; ${script}` : ['/bin/sh', '-c', script, 'sh', o, e, String(code)];
        const r = await api.exec(BOX, command);
        expect(r.exit_code).toBe(code);
        expect(r.signal).toBeNull();
        expect(r.stdout).toBe(Buffer.from(out).toString('utf8'));
        expect(r.stderr).toBe(Buffer.from(err).toString('utf8'));
        expect(r.truncated).toBe(false);
      }),
      propertyParams(6),
    );
  }, 120_000);

  // The docker driver read and wrote through the engine's archive API, which sees the container's
  // root file system: a file the box made in its tmpfs /tmp was a 404, /proc/version was a 404,
  // and a PUT to /tmp was refused as read-only. Both drivers now answer what the box sees.
  it("the files API sees the box's tmpfs /tmp and /proc as the box does", async () => {
    const made = await api.exec(BOX, 'mkdir -p /tmp/seen && printf "made in the box" > /tmp/seen/by-box');
    expect(made.exit_code, made.stderr).toBe(0);
    const got = (await api.send('GET', filesUrl(BOX, encodeURIComponent('/tmp/seen/by-box'))))!;
    expect(got.status, got.text).toBe(200);
    expect(got.text).toBe('made in the box');
    const put = (await api.send('PUT', filesUrl(BOX, encodeURIComponent('/tmp/seen/by-api')), 'put by the API'))!;
    expect(put.status, put.text).toBe(201);
    const read = await api.exec(BOX, 'cat /tmp/seen/by-api');
    expect(read.stdout).toBe('put by the API');
    const version = (await api.send('GET', filesUrl(BOX, encodeURIComponent('/proc/version'))))!;
    expect(version.status, version.text).toBe(200);
    expect(version.text).toBe((await api.exec(BOX, 'cat /proc/version')).stdout);
  });

  // At its process limit the box cannot start the files API's reader or writer: that was a 500
  // ("read failed in the box: [FATAL tini] fork failed").
  it('a box at its process limit answers the files API 409 saying so, never a 5xx; nothing changes', async () => {
    const FULL = `${BOX}-full`;
    const r = await api.json('POST', '/api/v2/sandboxes/boxes', { template_name: 'host', name: FULL, wait_for_ready: true, resources: { pids: 40, disk_mb: 16 } });
    expect(r.status, r.text).toBe(201);
    expect((await api.exec(FULL, 'echo kept > /workspace/kept')).exit_code).toBe(0);
    // On a connection of its own (one Api connection carries one request at a time).
    const side = new Api(s.url, s.key);
    // It fills the box, then says so without a fork (a builtin's redirect); nothing else runs in
    // the box meanwhile, so that no process of ours ends and leaves room (it is seen from the host:
    // the box's /workspace is a mounted file system under the data directory).
    const filler = side.exec(FULL, '(i=0; while [ $i -lt 200 ]; do sleep 1009 & i=$((i+1)); done); echo full > /workspace/full-marker; exec sleep 1010', { timeout_seconds: 12 }).finally(() => side.close());
    let fillerEnded: unknown;
    filler.then((res) => (fillerEnded = res), (e: Error) => (fillerEnded = e.message));
    const stateDir = path.join(s.dataDir, 'sandboxes', (r.json as { id: string }).id);
    const full = () => [...listTree(stateDir).keys()].some((p) => path.basename(p) === 'full-marker');
    for (const until = Date.now() + 20_000; !full() && fillerEnded === undefined && Date.now() < until; ) await new Promise((res) => setTimeout(res, 100));
    const url = filesUrl(FULL, encodeURIComponent('/workspace/kept'));
    const a = (await api.send('GET', url))!;
    expect(a.status, `${a.text}; the filler: ${JSON.stringify(fillerEnded)}; ${s.lines.slice(-3).join('\n')}`).toBe(409);
    expect(errorProblems(a)).toEqual([]);
    expect(a.text).toMatch(/process or memory limit/);
    // A process of the box may end meanwhile (the writer then fits): either way, never a 5xx.
    const put = (await api.send('PUT', url, 'changed'))!;
    expect([201, 409], put.text + s.lines.slice(-3).join('\n')).toContain(put.status);
    if (put.status === 409) expect(put.text).toMatch(/process or memory limit/);
    await filler;
    const back = (await api.send('GET', url))!;
    expect([back.status, back.text]).toEqual([200, put.status === 201 ? 'changed' : 'kept\n']);
    expect((await api.json('DELETE', `/api/v2/sandboxes/boxes/${FULL}`)).status).toBe(204);
  }, 120_000);

  it('execute caps each stream at 10 MiB and says truncated', async () => {
    const cap = 10 * 1024 * 1024;
    const r = await api.exec(BOX, `head -c ${cap + 3} /dev/zero | tr '\\0' a; printf 'é' >&2; exit 7`);
    expect(r.exit_code).toBe(7);
    expect(r.truncated).toBe(true);
    expect(r.stdout.length).toBe(cap);
    expect(r.stdout).toMatch(/^a+$/);
    expect(r.stderr).toBe('é');
  }, 120_000);

  it('files under /workspace survive stop/start (and /tmp does not); a stopped box is a 409', async () => {
    await fc.assert(
      fc.asyncProperty(fc.uniqueArray(fc.record({ name: nameArb, data: fc.uint8Array({ maxLength: 3000 }) }), { minLength: 1, maxLength: 5, selector: (f) => f.name }), async (files) => {
        const dir = `/workspace/persist-${++caseNo}`;
        for (const f of files) {
          for (const base of [dir, `/tmp/persist-${caseNo}`]) {
            const a = (await api.send('PUT', filesUrl(BOX, encodeURIComponent(`${base}/${f.name}`)), Buffer.from(f.data)))!;
            expect(a.status, a.text).toBe(201);
          }
        }
        const stopped = await api.json('POST', `/api/v2/sandboxes/boxes/${BOX}/stop`);
        expect((stopped.json as { status: string }).status, stopped.text).toBe('stopped');
        const refused = (await api.send('GET', filesUrl(BOX, encodeURIComponent(`${dir}/${files[0].name}`))))!;
        expect(refused.status, refused.text).toBe(409);
        expect(errorProblems(refused)).toEqual([]);
        const started = await api.json('POST', `/api/v2/sandboxes/boxes/${BOX}/start`);
        expect((started.json as { status: string }).status, started.text).toBe('ready');
        for (const f of files) {
          const a = (await api.send('GET', filesUrl(BOX, encodeURIComponent(`${dir}/${f.name}`))))!;
          expect(a.status, a.text).toBe(200);
          expect(a.body.equals(Buffer.from(f.data))).toBe(true);
          const gone = (await api.send('GET', filesUrl(BOX, encodeURIComponent(`/tmp/persist-${caseNo}/${f.name}`))))!;
          expect(gone.status, gone.text).toBe(404);
        }
        const [view] = await views([`${dir}/${files[0].name}`]);
        expect(view.kind === 'FILE' && view.data.equals(Buffer.from(files[0].data))).toBe(true);
      }),
      propertyParams(1),
    );
  }, 120_000);

  it('DELETE removes the box and everything of it on the host; its files are a 404 after', async () => {
    const stateDir = path.join(s.dataDir, 'sandboxes', boxId);
    expect(existsSync(stateDir)).toBe(true);
    const d = await api.json('DELETE', `/api/v2/sandboxes/boxes/${BOX}`);
    expect(d.status, d.text).toBe(204);
    expect(existsSync(stateDir)).toBe(false);
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(boxId);
    if (kind === 'docker') {
      const engine = new DockerEngine(dockerSocket()!);
      const containers = await engine.json<{ Names: string[] }[]>('GET', '/containers/json?all=1');
      expect(containers.body.flatMap((c) => c.Names).filter((n) => n.includes(boxId))).toEqual([]);
      const volumes = await engine.json<{ Volumes: { Name: string }[] | null }>('GET', '/volumes');
      expect((volumes.body.Volumes ?? []).map((v) => v.Name).filter((n) => n.includes(boxId))).toEqual([]);
    }
    expect([...listTree(s.dataDir).keys()].filter((p) => p.includes(boxId))).toEqual([]);
    const a = (await api.send('GET', filesUrl(BOX, encodeURIComponent('/workspace/x'))))!;
    expect(a.status, a.text).toBe(404);
    expect(errorProblems(a)).toEqual([]);
  }, 60_000);
});
}
