// A failure of our own is logged with its class and its code (the cause, for an operator), never
// with what fastify's pino `err` serializer makes of a plain object (`type: "Object"`), and never
// with a value the message quoted. In-process server, a real request, the real log line.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { buildServer, type BuiltServer } from '../../src/server/app.js';

class StorageFault extends Error {
  readonly code = 'E_STORAGE_FAULT';
  constructor(message: string) {
    super(message);
    this.name = 'StorageFault';
  }
}

const lines: string[] = [];
let built: BuiltServer;
let url: string;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kg-error-log-'));
  const logger = createLogger({ destination: { write: (l: string) => void lines.push(l) } });
  built = await buildServer({
    dataDir: dir,
    logger,
    env: { KEYGATE_API_KEY: 'kg_error_log_key_0000000000', DATABASE_URL: '' },
    areas: [
      {
        name: 'faults',
        async register(app) {
          app.get('/fault/ours', async () => {
            throw new StorageFault('the store is gone');
          });
          app.get('/fault/node', async () => {
            // Node's argument checks quote the value they refused.
            throw Object.assign(new TypeError("The argument 'env' is invalid. Received 'quoted-value-x9x9x9x9'"), { code: 'ERR_INVALID_ARG_VALUE' });
          });
        },
      },
    ],
  });
  url = await built.listen('127.0.0.1', 0);
});
afterAll(async () => {
  await built?.close();
  rmSync(dir, { recursive: true, force: true });
});

async function failureLine(p: string): Promise<Record<string, any>> {
  const res = await fetch(url + p, { headers: { 'x-api-key': 'kg_error_log_key_0000000000' } });
  await res.text();
  const found = lines.map((l) => JSON.parse(l)).filter((o) => o.msg === 'request failed' && o.req_path === undefined);
  expect(found.length, lines.join('')).toBeGreaterThan(0);
  lines.length = 0;
  return found.at(-1)!;
}

describe("a logged failure keeps keygate's error type and code", () => {
  it('our own error: its class and code, the status the client got', async () => {
    const line = await failureLine('/fault/ours');
    expect(line.err.type).toBe('StorageFault');
    expect(line.err.code).toBe('E_STORAGE_FAULT');
    expect(line.err.message).toBe('the store is gone');
  });

  it("Node's argument error: class and code kept, the quoted value not", async () => {
    const line = await failureLine('/fault/node');
    expect(line.err.type).toBe('TypeError');
    expect(line.err.code).toBe('ERR_INVALID_ARG_VALUE');
    expect(JSON.stringify(line)).not.toContain('quoted-value-x9x9x9x9');
  });
});

describe('the logger itself', () => {
  it('serialises an Error by class, code and loggable message and stack; a plain err object keeps its own type', () => {
    const out: string[] = [];
    const logger = createLogger({ destination: { write: (l: string) => void out.push(l) } });
    const quoted = Object.assign(new RangeError('The value of "port" is out of range. Received 99999-secretish-q1q1q1'), { code: 'ERR_OUT_OF_RANGE' });
    logger.error({ err: quoted }, 'failed');
    logger.error({ err: { name: 'CaError', message: 'no CA' } }, 'failed');
    logger.error({ err: { type: 'BuildError', code: 'build_failed', message: 'npm failed' } }, 'failed');
    const [a, b, c] = out.map((l) => JSON.parse(l).err);
    expect(a).toMatchObject({ type: 'RangeError', code: 'ERR_OUT_OF_RANGE' });
    expect(a.message).toMatch(/^The value of "port" is out of range\. Received: \[not logged\]$/);
    expect(out[0]).not.toContain('secretish');
    expect(b).toEqual({ type: 'CaError', message: 'no CA' });
    expect(c).toEqual({ type: 'BuildError', code: 'build_failed', message: 'npm failed' });
  });
});
