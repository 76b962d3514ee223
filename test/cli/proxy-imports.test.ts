/**
 * What `keygate proxy` loads (issue #20: a sidecar runs beside every sandbox, so its memory
 * counts): the data path, its configuration and secret sources, never the stacks of the other
 * commands (fastify, the database drivers, ajv's compiler, the control plane, sandboxes), and
 * with a CA already on disk not @peculiar/x509 either (only creating a CA needs it). An
 * intercepted request on the fast path does not load undici's WebAssembly HTTP parser nor its
 * Agent (loaded on first use: src/proxy/upstream.ts), and Node's own bundled undici is not
 * loaded at all (an ES import of node:http does that on Node >= 22: src/node-http.ts).
 *
 * Checked on a real process, on every Node this machine has: every module it loads is recorded
 * by a loader hook (ES modules), a require hook (CommonJS) and, at exit, Node's list of its own
 * modules, preloaded with NODE_OPTIONS=--import, from start-up through one intercepted request.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { interceptedTls, rawExchange } from '../helpers/connect.js';
import { machineNodes, type NodeBin } from '../helpers/nodes.js';
import { startOrigin, type TestOrigin } from '../helpers/origin.js';
import { createTestPki, type TestPki } from '../helpers/pki.js';
import { CLI, spawnProxy } from '../helpers/proxy.js';
import { CONFIG, NAMES, SECRET } from '../proxy/fixture.js';

const HOST = 'api.test.local';

/** Modules `keygate proxy` must not load (matched against each loaded file's path). */
const NOT_LOADED: [string, RegExp][] = [
  ['fastify', /\/node_modules\/(fastify|@fastify)\//],
  ['better-sqlite3', /\/node_modules\/better-sqlite3/],
  ['pg', /\/node_modules\/(pg|pg-[a-z-]+)\//],
  ['ajv compiler', /\/node_modules\/ajv\/dist\/(ajv|core|compile\/)/],
  ['@peculiar/x509 with an existing CA', /\/node_modules\/(@peculiar\/|reflect-metadata\/)/],
  ['jose', /\/node_modules\/jose\//],
  ["undici's HTTP parser on the fast path", /\/node_modules\/undici\/lib\/llhttp\/llhttp(_simd)?-wasm/],
  // Loaded on first use (src/proxy/upstream.ts): its client, pools and HTTP/2 dispatcher (with
  // node:http2) are about 1.3 MiB on Node 24, and a fast-path request never needs them.
  ["undici's Agent on the fast path", /\/node_modules\/undici\/lib\/dispatcher\/(agent|pool|client|client-h1|client-h2)\.js$/],
  ["other commands' code", /^(?!.*\/node_modules\/).*\/dist\/(control-plane|sandbox|sandbox-api|runtime|deploy|docker|auth)\//],
  ["Node's bundled undici", /^builtin:.*internal\/deps\/undici/],
  // ES imports of node:util and node:fs read every export, lazy getters included (util.diff and
  // the worker helpers on Node 24; fs's streams): src/builtins/ takes them through require.
  // Loaded with the first h2 client (src/proxy/server.ts): this proxy only saw HTTP/1.1.
  ['node:http2 and the h2 exchange for HTTP/1.1 clients', /^builtin:NativeModule http2$|\/dist\/proxy\/h2\/exchange\.js$/],
  ["node:util's ES facade (Node 24: util.diff)", /^builtin:NativeModule internal\/util\/diff$/],
  ["node:fs's ES facade (fs.ReadStream and co.)", /^builtin:NativeModule internal\/fs\/streams$/],
];

let pki: TestPki;
let origin: TestOrigin;
let dir: string;

beforeAll(async () => {
  pki = await createTestPki([...NAMES]);
  origin = await startOrigin(pki);
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-imports-'));
  writeFileSync(
    path.join(dir, 'hooks.mjs'),
    `import { appendFileSync } from 'node:fs';
export async function load(url, context, next) {
  appendFileSync(process.env.KG_IMPORT_LOG, url + '\\n');
  return next(url, context);
}
`,
  );
  writeFileSync(
    path.join(dir, 'preload.mjs'),
    // node:fs through require: an ES import of it would itself load what the fs check below looks for.
    `import { createRequire, register } from 'node:module';
const { appendFileSync } = createRequire(import.meta.url)('node:fs');
register('./hooks.mjs', import.meta.url);
const Module = createRequire(import.meta.url)('node:module');
const load = Module._load;
Module._load = function (request, parent, isMain) {
  try {
    appendFileSync(process.env.KG_IMPORT_LOG, 'cjs:' + Module._resolveFilename(request, parent, isMain) + '\\n');
  } catch {}
  return load.apply(this, arguments);
};
process.on('exit', () => appendFileSync(process.env.KG_IMPORT_LOG, process.moduleLoadList.map((m) => 'builtin:' + m + '\\n').join('')));
`,
  );
});

afterAll(async () => {
  await origin?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** Runs `keygate proxy` with the hooks (CA in `certsDir`), sends one intercepted request, returns the loaded files. */
async function loadedBy(node: NodeBin, certsDir: string): Promise<string[]> {
  const log = path.join(dir, `loaded-${Date.now()}.txt`);
  writeFileSync(log, '');
  const proxy = await spawnProxy({
    config: CONFIG,
    secrets: { API_TOKEN: SECRET },
    resolve: NAMES.map((n) => `${n}:${origin.port}:127.0.0.1`),
    upstreamCa: [pki.caPem],
    certsDir,
    command: [node.bin, CLI],
    env: { KG_IMPORT_LOG: log, NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${path.join(dir, 'preload.mjs')}`.trim() },
  });
  try {
    const t = await interceptedTls(proxy.port, HOST, origin.port, proxy.caPem);
    const r = await rawExchange(t, `GET /repos/x HTTP/1.1\r\nHost: ${HOST}:${origin.port}\r\nConnection: close\r\n\r\n`);
    expect(r.status).toBe(200);
    t.destroy();
  } finally {
    await proxy.stop();
  }
  return readFileSync(log, 'utf8').split('\n').filter(Boolean);
}

describe('keygate proxy loads the data path only', () => {
  it.each(machineNodes().map((n) => [n.name, n] as const))('%s, with an existing CA: none of the other commands\' stacks, no x509 library, no undici', async (_name, node) => {
    const certsDir = path.join(dir, `certs-${node.major}`);
    // The first start creates the CA (that one may load @peculiar/x509); the second is the one judged.
    await loadedBy(node, certsDir);
    const loaded = await loadedBy(node, certsDir);
    // The hooks saw the process: the data path and its dependencies are in the list.
    expect(loaded.some((f) => f.includes('/dist/proxy/h1/connection.js'))).toBe(true);
    expect(loaded.some((f) => f.includes('/node_modules/pino/'))).toBe(true);
    expect(loaded.some((f) => f.startsWith('builtin:') && f.includes('NativeModule tls'))).toBe(true);
    const found = NOT_LOADED.map(([what, re]) => [what, loaded.filter((f) => re.test(f))] as const).filter(([, files]) => files.length > 0);
    expect(found).toEqual([]);
  });
});
