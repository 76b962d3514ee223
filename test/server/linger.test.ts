// A refusal answered before the request body was read (fastify's 413 for a declared length over
// the limit sets `Connection: close`) must reach a client that is still sending: the server reads
// and drops the rest of the body before it closes, instead of resetting the connection under the
// client's writes. Without that, the client's write fails (EPIPE / ECONNRESET) and, depending on
// timing, the answer is lost with it: seen in CI as an EPIPE from undici on the 413 probe.
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli, type RunningCli } from '../helpers/cli.js';
import { pumpChunks } from '../helpers/pump.js';

const KEY = 'kg_test_linger_key_0000000001';
const dataDir = mkdtempSync(path.join(os.tmpdir(), 'keygate-linger-'));
let server: RunningCli;

beforeAll(async () => {
  server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir, '--sandbox-driver', 'none'], {
    env: { KEYGATE_API_KEY: KEY, DATABASE_URL: '', DOCKER_HOST: 'unix:///nonexistent/docker.sock' },
  });
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  rmSync(dataDir, { recursive: true, force: true });
});

/**
 * Declares `size` bytes, waits for the server's answer before sending any of them, then sends
 * them all: the answer, whether the socket failed under the writes, and how it ended.
 */
function sendAfterAnswer(size: number): Promise<{ answer: string; error?: string; ended: boolean }> {
  const url = new URL(server.url);
  return new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    let answer = '';
    let error: string | undefined;
    let ended = false;
    let sent = false;
    s.on('data', (c) => {
      answer += c.toString('latin1');
      if (!sent && answer.includes('\r\n\r\n')) {
        sent = true;
        // The answer is in: now the body the request declared, in pieces, as a client that
        // does not read while it writes would send it.
        const chunk = Buffer.alloc(64 * 1024, 0x20);
        pumpChunks(s, chunk, Math.ceil(size / chunk.length));
      }
    });
    s.on('error', (e: NodeJS.ErrnoException) => (error = e.code ?? e.message));
    s.on('end', () => (ended = true));
    s.on('close', () => resolve({ answer, error, ended }));
    s.write(`POST /v2/deployments HTTP/1.1\r\nHost: x\r\nX-Api-Key: ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${size}\r\n\r\n`);
  });
}

describe('a refusal before the body is read lingers instead of resetting', () => {
  it('413 for a declared length over the limit: the client sends the whole body, then the server closes cleanly', async () => {
    const r = await sendAfterAnswer(40 * 1024 * 1024);
    expect(r.answer).toMatch(/^HTTP\/1\.1 413 /);
    expect(r.answer.toLowerCase()).toContain('connection: close');
    expect(r.answer.slice(r.answer.indexOf('\r\n\r\n') + 4)).toBe(JSON.stringify({ detail: 'Request body is too large.' }));
    expect(r.error).toBeUndefined();
    expect(r.ended).toBe(true);
  });

  it('undici sending a body over the limit always reads the 413 (no EPIPE), many times over', async () => {
    for (let i = 0; i < 5; i++) {
      const res = await request(`${server.url}/v2/deployments`, {
        method: 'POST',
        headers: { 'x-api-key': KEY, 'content-type': 'application/json' },
        body: Buffer.alloc(40 * 1024 * 1024, 0x20),
      });
      expect(res.statusCode).toBe(413);
      expect(await res.body.json()).toEqual({ detail: 'Request body is too large.' });
    }
  });

  it('an answer while a chunked body is still coming (401, no key) closes after a bounded drain, not after the whole upload', async () => {
    // The client would send 160 MiB; the server drops at most 64 MiB of it before it closes.
    const url = new URL(server.url);
    const r = await new Promise<{ answer: string; sent: number }>((resolve) => {
      const s = net.connect(Number(url.port), url.hostname);
      let answer = '';
      let sent = 0;
      s.on('data', (c) => (answer += c.toString('latin1')));
      s.on('error', () => undefined);
      s.on('close', () => resolve({ answer, sent }));
      s.write(`POST /v2/deployments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`);
      const piece = Buffer.concat([Buffer.from(`${(64 * 1024).toString(16)}\r\n`), Buffer.alloc(64 * 1024, 0x20), Buffer.from('\r\n')]);
      const pump = () => {
        while (sent < 160 * 1024 * 1024 && !s.destroyed) {
          sent += 64 * 1024;
          if (!s.write(piece)) return void s.once('drain', pump);
        }
        if (!s.destroyed) s.end('0\r\n\r\n');
      };
      pump();
    });
    expect(r.answer).toMatch(/^HTTP\/1\.1 401 /);
    expect(r.answer.toLowerCase()).toContain('connection: close');
    expect(r.sent).toBeLessThan(160 * 1024 * 1024);
  });

  it('a body beyond what is worth draining is still cut (the bound holds)', async () => {
    // Declared 100 MiB: over the drain bound, so the server closes at once after its answer.
    const url = new URL(server.url);
    const started = Date.now();
    const answer = await new Promise<string>((resolve) => {
      const s = net.connect(Number(url.port), url.hostname);
      let out = '';
      s.on('data', (c) => (out += c.toString('latin1')));
      s.on('error', () => undefined);
      s.on('close', () => resolve(out));
      s.write(`POST /v2/deployments HTTP/1.1\r\nHost: x\r\nX-Api-Key: ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${100 * 1024 * 1024}\r\n\r\n`);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 413 /);
    // Lingering would wait for the body until its 10 s bound; past the size bound it does not wait.
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});
