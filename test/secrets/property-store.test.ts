// Property tests of the writable secret stores (README "Secrets", src/secrets/types.ts): generated
// sequences of set / overwrite / delete / get / list / snapshot / master key rotation, with hostile
// names (case variants, Object.prototype names, 128 and 129 characters, dots, braces, unicode) and
// values (empty, CR/LF/NUL/DEL, obs-text, unicode, the size limit and one byte over), run against
// the real stores: the encrypted file, SQLite and PostgreSQL. Each answer is checked against a
// model (one map per workspace); what is on disk or in the table never holds a value in clear, and
// no error names a value. A second property damages the secrets file (a flipped bit, a cut) and
// checks the store answers the old values or a clear error, never other values.
import fc from 'fast-check';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadKeyring } from '../../src/secrets/keyring.js';
import { rotateMasterKey } from '../../src/secrets/rotate.js';
import { DbSecretStore, EncryptedFileSecretStore, MAX_SECRET_BYTES, SecretStoreError, migrateSecrets, type SecretStore } from '../../src/secrets/store.js';
import { openDb, type Db } from '../../src/store/db.js';
import { freshPgDatabase, pgAvailable } from '../helpers/pg.js';
import { propertyParams } from '../helpers/property.js';

const VALID_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
const ILLEGAL_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/;

const nameArb = fc.oneof(
  fc.constantFrom('TOKEN', 'Token', 'token', 'TOKEn', '_', '__proto__', 'constructor', 'toString', 'hasOwnProperty', 'A'.repeat(128), `B${'b'.repeat(127)}`),
  fc.constantFrom('A'.repeat(129), '', '1ABC', 'A-B', 'A.B', '{A}', 'A}', 'ÉTÉ', 'A\u0000', 'A B', 'kg1', 'TOKEN\n'),
  fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,6}$/),
);

// Values are tagged so the leak check can find them: every generated value ends in a unique marker.
let marker = 0;
const valueArb = fc
  .oneof(
    { weight: 6, arbitrary: fc.string({ unit: 'grapheme', minLength: 0, maxLength: 24 }) },
    { weight: 2, arbitrary: fc.string({ unit: fc.constantFrom('a', ' ', '\t', '\r', '\n', '\u0000', '\u007f', '\u00e9', '\u00ff', '\u2028', '😀', '{', '}', '"', '\\'), maxLength: 12 }) },
    { weight: 1, arbitrary: fc.constantFrom('', ' ', '\t', 'x'.repeat(MAX_SECRET_BYTES), 'é'.repeat(MAX_SECRET_BYTES / 2 + 1), 'kg1.00000000.AAAAAAAAAAAAAAAA.AAAA') },
  )
  .map((v) => ({ v }));

type Cmd =
  | { op: 'set'; ws: number; key: string; value: { v: string } }
  | { op: 'delete'; ws: number; key: string }
  | { op: 'get'; ws: number; key: string }
  | { op: 'list'; ws: number }
  | { op: 'snapshot'; ws: number }
  | { op: 'rotate' };

const wsArb = fc.integer({ min: 0, max: 1 });
const cmdArb: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ op: fc.constant('set' as const), ws: wsArb, key: nameArb, value: valueArb }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('delete' as const), ws: wsArb, key: nameArb }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('get' as const), ws: wsArb, key: nameArb }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('list' as const), ws: wsArb }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('snapshot' as const), ws: wsArb }) },
  { weight: 1, arbitrary: fc.constant({ op: 'rotate' as const }) },
);

const WORKSPACES = ['default', 'ws-2.b:c'];

/** A value the model expects the store to accept (the documented rules, written independently). */
function acceptable(value: string): boolean {
  return value.length > 0 && !ILLEGAL_VALUE.test(value) && Buffer.byteLength(value, 'utf8') <= MAX_SECRET_BYTES;
}

interface Backend {
  name: string;
  open(dataDir: string): Promise<{ stores: SecretStore[]; db?: Db; raw(): Promise<string>; close(): Promise<void> }>;
}

const fileBackend: Backend = {
  name: 'encrypted file',
  async open(dataDir) {
    const file = path.join(dataDir, 'secrets.json');
    const stores = WORKSPACES.map((workspaceId) => new EncryptedFileSecretStore({ file, workspaceId, keys: () => loadKeyring(dataDir, {}).envelope }));
    return { stores, raw: async () => (existsSync(file) ? readFileSync(file, 'utf8') : ''), close: async () => undefined };
  },
};

function dbBackend(name: string, url: () => Promise<string>): Backend {
  return {
    name,
    async open(dataDir) {
      const db = await openDb({ dataDir, databaseUrl: await url() });
      await migrateSecrets(db);
      const stores = WORKSPACES.map((workspaceId) => new DbSecretStore({ db, workspaceId, keys: () => loadKeyring(dataDir, {}).envelope }));
      const raw = async () => JSON.stringify(await db.all('SELECT * FROM workspace_secrets'));
      return { stores, db, raw, close: () => db.close() };
    },
  };
}

const backends: { backend: Backend; skip: boolean }[] = [
  { backend: fileBackend, skip: false },
  { backend: dbBackend('SQLite', async () => ''), skip: false },
  { backend: dbBackend('PostgreSQL', () => freshPgDatabase()), skip: !pgAvailable() },
];

let root: string;
beforeAll(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'kg-prop-secrets-'));
});
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

const sorted = (keys: Iterable<string>) => [...keys].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));

describe.each(backends)('model-based sequences: $backend.name', ({ backend, skip }) => {
  it.skipIf(skip)('every answer matches the model; nothing in clear at rest; no value in an error', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(cmdArb, { minLength: 1, maxLength: 25 }), async (cmds) => {
        const dataDir = mkdtempSync(path.join(root, 'run-'));
        loadKeyring(dataDir, {}); // the key exists from the start, as openSecretStore makes it
        const world = await backend.open(dataDir);
        const model = WORKSPACES.map(() => new Map<string, string>());
        const everStored = new Set<string>();
        const allValues = cmds.flatMap((c) => (c.op === 'set' ? [c.value.v] : []));
        // Values long enough that finding one in text is not chance.
        const findable = [...new Set(allValues)].filter((v) => v.length >= 8 && !/^(.)\1*$/u.test(v));
        const checkError = (err: unknown, what: string) => {
          expect(err, what).toBeInstanceOf(SecretStoreError);
          const text = `${(err as Error).message}\n${(err as Error).stack}`;
          for (const v of findable) expect(text.includes(v), `${what}: an error names a value`).toBe(false);
        };
        try {
          for (const cmd of cmds) {
            if (cmd.op === 'rotate') {
              await rotateMasterKey({ dataDir, db: world.db, env: {} });
              continue;
            }
            const store = world.stores[cmd.ws];
            const m = model[cmd.ws];
            const what = `${cmd.op} ${JSON.stringify('key' in cmd ? cmd.key : '')} in ${WORKSPACES[cmd.ws]}`;
            if (cmd.op === 'set') {
              const ok = VALID_NAME.test(cmd.key) && acceptable(cmd.value.v);
              const err = await store.set(cmd.key, cmd.value.v).then(
                () => undefined,
                (e: unknown) => e,
              );
              if (ok) {
                expect(err, what).toBeUndefined();
                m.set(cmd.key, cmd.value.v);
                everStored.add(cmd.value.v);
              } else checkError(err, what);
            } else if (cmd.op === 'delete' || cmd.op === 'get') {
              const p = cmd.op === 'delete' ? store.delete(cmd.key) : store.get(cmd.key);
              const got = await p.then(
                (r) => ({ r }),
                (e: unknown) => ({ e }),
              );
              if (!VALID_NAME.test(cmd.key)) {
                checkError((got as { e: unknown }).e, what);
                continue;
              }
              expect(got, what).toEqual({ r: cmd.op === 'delete' ? m.has(cmd.key) : m.get(cmd.key) });
              if (cmd.op === 'delete') m.delete(cmd.key);
            } else if (cmd.op === 'list') {
              expect(await store.list(), what).toEqual(sorted(m.keys()));
            } else {
              const snap = await store.snapshot();
              expect([...snap.entries()], what).toEqual(sorted(m.keys()).map((k) => [k, m.get(k)]));
            }
          }
          // At the end: every workspace whole, and nothing in clear at rest.
          for (const [i, store] of world.stores.entries()) {
            expect(await store.snapshot()).toEqual(new Map(sorted(model[i].keys()).map((k) => [k, model[i].get(k)!])));
          }
          const raw = await world.raw();
          for (const v of [...everStored].filter((v) => findable.includes(v))) expect(raw.includes(v), 'a value is stored in clear').toBe(false);
        } finally {
          await world.close();
          rmSync(dataDir, { recursive: true, force: true });
        }
      }),
      propertyParams(backend.name === 'PostgreSQL' ? 12 : 25),
    );
  });
});

describe('a damaged secrets file', () => {
  it('answers the values it held or a clear error naming no value, never other values', async () => {
    const dataDir = mkdtempSync(path.join(root, 'damage-'));
    const file = path.join(dataDir, 'secrets.json');
    const store = new EncryptedFileSecretStore({ file, keys: () => loadKeyring(dataDir, {}).envelope });
    const values = new Map([
      ['ALPHA_TOKEN', 'alpha-value-9d2f41'],
      ['BETA', 'beta-value-0c77e1'],
      ['Beta', 'Beta-value-a15b3c'],
    ]);
    for (const [k, v] of values) await store.set(k, v);
    const good = readFileSync(file);
    try {
      await fc.assert(
        fc.asyncProperty(
          fc.oneof(
            fc.record({ kind: fc.constant('flip' as const), at: fc.nat({ max: good.length - 1 }), bit: fc.integer({ min: 0, max: 7 }) }),
            fc.record({ kind: fc.constant('cut' as const), at: fc.nat({ max: good.length - 1 }), bit: fc.constant(0) }),
          ),
          async ({ kind, at, bit }) => {
            const bad = Buffer.from(good);
            if (kind === 'flip') bad[at] ^= 1 << bit;
            writeFileSync(file, kind === 'cut' ? bad.subarray(0, at) : bad);
            for (const read of [() => store.snapshot(), () => store.get('ALPHA_TOKEN'), () => store.get('BETA')]) {
              const got = await read().then(
                (r) => ({ r }),
                (e: Error) => ({ e }),
              );
              if ('e' in got) {
                expect(got.e).toBeInstanceOf(SecretStoreError);
                for (const v of values.values()) expect(got.e.message).not.toContain(v);
                continue;
              }
              // What is answered is what was stored under that very name, or nothing.
              const r = got.r;
              if (r instanceof Map) for (const [k, v] of r) expect(v).toBe(values.get(k));
              else if (r !== undefined) expect([...values.values()]).toContain(r);
            }
          },
        ),
        propertyParams(150),
      );
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
