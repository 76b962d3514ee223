import '@fastify/websocket'; // the route option `websocket` (the plugin itself is registered at the root: src/server/app.ts)
import { Ajv } from 'ajv';
import type { FastifyInstance } from 'fastify';
import { StringDecoder } from 'node:string_decoder';
import type { Readable } from 'node:stream';
import type { WebSocket } from 'ws';
import type { ExecProcess } from '../sandbox/driver.js';
import { principalOf } from '../server/auth.js';
import { HttpError, HttpValidationError } from '../server/errors.js';
import { guardStream } from '../server/streams.js';
import { ajvToIssues } from '../validation/errors.js';
import { exitCodeOf } from './exec.js';
import { CappedOutput } from './output.js';
import { executeBody, nameParams } from './schemas.js';
import type { SandboxService } from './service.js';

/**
 * The streaming form of execute: `GET /api/v2/sandboxes/boxes/{name}/execute/ws` (WebSocket,
 * authenticated like every route, by the upgrade request's X-Api-Key).
 *
 * Client -> server, JSON text frames: first the request (the execute body, plus `stdin: true` to
 * get a stdin pipe), then any of `{"type":"stdin","data":"..."}`, `{"type":"stdin_close"}`,
 * `{"type":"kill","signal":"SIGTERM"}` (default SIGKILL).
 * Server -> client: `{"type":"started"}`, `{"type":"stdout"|"stderr","data":"..."}` as output comes
 * (UTF-8 text; each stream capped like the JSON form), then `{"type":"exit","exit_code":N,"signal":...,
 * "timed_out":bool,"truncated":bool,"duration_ms":N}` and a normal close; or `{"type":"error","detail":...}`
 * (`detail` as in wire.md) and close 1008. The request must come within QUIET_HEARTBEATS heartbeats
 * (an error frame, detail of a 408, and close 1008); a client that answers none of our pings for as
 * long is cut, and its command killed.
 */
const KILL_SIGNALS = new Set(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT']);
/** Output waits while this much is queued to a slow client (backpressure, never an unbounded buffer). */
const HIGH_WATER = 1024 * 1024;
/**
 * Heartbeats a socket may stay quiet: with no execute request yet, or (while it is read) with no
 * answer to our pings. Past them, the client is gone: an upgraded socket has no HTTP timeout left,
 * and one that never sent its request, or went away without a close (a dead network path), held
 * its socket, a heartbeat timer and a credential check per beat, and its command, for good.
 */
export const QUIET_HEARTBEATS = 3;

type Request = { command: string | string[]; timeout_seconds?: number; env?: Record<string, string>; cwd?: string; stdin?: boolean };

const validateRequest = new Ajv({ allErrors: true, strict: false, useDefaults: true }).compile({
  ...executeBody,
  properties: { ...executeBody.properties, stdin: { type: 'boolean', default: false }, type: { const: 'execute' } },
});

function send(ws: WebSocket, msg: unknown): void {
  if (ws.readyState === ws.OPEN) ws.send(JSON.stringify(msg));
}

function errorDetail(err: unknown): unknown {
  if (err instanceof HttpValidationError) return err.issues;
  if (err instanceof HttpError) return err.message;
  return 'Internal server error.';
}

/** Forwards one output stream, pausing it while the client is behind. */
function forward(ws: WebSocket, stream: Readable, type: 'stdout' | 'stderr', cap: CappedOutput): void {
  const decoder = new StringDecoder('utf8');
  stream.on('data', (chunk: Buffer) => {
    const part = cap.add(chunk);
    if (part.length) send(ws, { type, data: decoder.write(part) });
    if (ws.bufferedAmount > HIGH_WATER) {
      stream.pause();
      const wait = setInterval(() => {
        if (ws.bufferedAmount <= HIGH_WATER || ws.readyState !== ws.OPEN) {
          clearInterval(wait);
          stream.resume();
        }
      }, 20);
    }
  });
  stream.once('end', () => {
    const rest = decoder.end();
    if (rest) send(ws, { type, data: rest });
  });
}

/**
 * `heartbeatMs`: how often an open socket is pinged and its caller checked again (the credential
 * it was opened with, the box): a deleted API key, an expired token or a deleted box ends the
 * execution with `{"type":"error"}` and close 1008.
 */
export async function registerExecWebSocket(app: FastifyInstance, service: SandboxService, opts: { heartbeatMs: number }): Promise<void> {
  app.get<{ Params: { name: string } }>(
    '/api/v2/sandboxes/boxes/:name/execute/ws',
    {
      websocket: true,
      // An unknown box (or another workspace's) is a plain 404 before the upgrade, like every route.
      // A request without an upgrade is answered 426 in the wire shape here: the WebSocket
      // plugin would answer it 404 with an empty body, which is neither the error shape nor true.
      preHandler: async (req) => {
        await service.get(principalOf(req).workspaceId, req.params.name);
        if (!req.ws) {
          throw new HttpError(426, 'This route takes a WebSocket upgrade (Upgrade: websocket); without one, use POST .../execute.', { headers: { upgrade: 'websocket' } });
        }
      },
      schema: {
        summary: 'Execute with streaming (WebSocket): output as it comes, stdin, kill, the exit code',
        description:
          'Upgrade with X-Api-Key. Send the execute body as the first JSON text frame (stdin: true for a stdin pipe), then {"type":"stdin","data":"..."}, {"type":"stdin_close"} or {"type":"kill","signal":"SIGTERM"}. Receive {"type":"started"}, {"type":"stdout"|"stderr","data":"..."}, and last {"type":"exit","exit_code":N,"signal":null,"timed_out":false,"truncated":false,"duration_ms":N}. Errors: {"type":"error","detail":...} then close 1008. Closing the socket kills the command. The request must come within 3 heartbeats (KEYGATE_STREAM_HEARTBEAT_MS) of the upgrade; a client that answers no ping for 3 heartbeats is cut and its command killed.',
        tags: ['Sandboxes'],
        params: nameParams,
      },
    },
    (ws, req) => {
      const workspaceId = principalOf(req).workspaceId;
      let proc: ExecProcess | undefined;
      let closed = false;
      const fail = (err: unknown) => {
        send(ws, { type: 'error', detail: errorDetail(err) });
        ws.resume(); // the closing handshake reads the client's close frame
        ws.close(1008);
      };
      let starting = false;
      let beatsWithoutRequest = 0;
      let unansweredPings = 0;
      ws.on('pong', () => (unansweredPings = 0));
      const stopGuard = guardStream(req, opts.heartbeatMs, {
        beat: () => {
          if (ws.readyState !== ws.OPEN) return;
          if (!starting && ++beatsWithoutRequest > QUIET_HEARTBEATS) {
            return fail(new HttpError(408, `No execute request arrived within ${QUIET_HEARTBEATS} heartbeats (${Math.round((QUIET_HEARTBEATS * opts.heartbeatMs) / 1000)} s) of the upgrade: send the execute body as the first frame.`));
          }
          // A socket we stopped reading (stdin backpressure, a start) cannot show us its pongs.
          if (ws.isPaused) unansweredPings = 0;
          else if (++unansweredPings > QUIET_HEARTBEATS) return void ws.terminate(); // the client is gone, and its command goes ('close')
          ws.ping();
        },
        stillThere: () => service.get(workspaceId, req.params.name),
        end: (detail) => {
          proc?.kill('SIGKILL');
          fail(new HttpError(401, detail));
        },
      });
      ws.on('close', () => {
        closed = true;
        stopGuard();
        proc?.kill('SIGKILL'); // the client went away: so does its command
      });
      // Frames that arrive while the execution is starting wait here, in order (bounded: the
      // socket is paused meanwhile, so only frames already received can land here).
      const pending: Record<string, unknown>[] = [];
      const control = (msg: Record<string, unknown>) => {
        if (!proc) return void pending.push(msg);
        if (msg.type === 'stdin' && typeof msg.data === 'string') {
          // Backpressure: a command that does not read its stdin stops us reading the socket, so
          // a client can never make the server buffer stdin without bound (the client's own
          // close, or the timeout, still ends the command).
          const stdin = proc.stdin;
          if (stdin?.writable && !stdin.write(msg.data) && !stdin.destroyed) {
            ws.pause();
            const go = () => {
              stdin.off('drain', go).off('close', go);
              ws.resume();
            };
            stdin.on('drain', go).on('close', go);
          }
        }
        else if (msg.type === 'stdin_close') proc.stdin?.end();
        else if (msg.type === 'kill') proc.kill(typeof msg.signal === 'string' && KILL_SIGNALS.has(msg.signal) ? (msg.signal as NodeJS.Signals) : 'SIGKILL');
        else fail(new HttpValidationError([{ loc: ['body', 'type'], msg: "Expected 'stdin', 'stdin_close' or 'kill'", type: 'value_error' }]));
      };
      ws.on('message', (raw: Buffer, isBinary: boolean) => {
        let msg: Record<string, unknown>;
        try {
          msg = JSON.parse(raw.toString('utf8')) as Record<string, unknown>;
          if (isBinary || typeof msg !== 'object' || msg === null) throw new Error();
        } catch {
          return fail(new HttpValidationError([{ loc: ['body'], msg: 'Each frame must be a JSON object (text)', type: 'json_invalid' }]));
        }
        if (starting) return control(msg);
        starting = true;
        // Frames sent while the execution starts are not read until it has (see control).
        ws.pause();
        void start(msg);
      });

      const start = async (msg: Record<string, unknown>) => {
        if (!validateRequest(msg)) return fail(new HttpValidationError(ajvToIssues(validateRequest.errors).map((i) => ({ ...i, loc: ['body', ...i.loc] }))));
        const body = msg as unknown as Request;
        const startedAt = Date.now();
        try {
          proc = await service.exec(workspaceId, req.params.name, {
            command: body.command,
            timeoutMs: (body.timeout_seconds ?? 60) * 1000,
            env: body.env,
            cwd: body.cwd,
            stdin: body.stdin,
          });
        } catch (err) {
          return fail(err);
        }
        if (closed) return void proc.kill('SIGKILL');
        proc.stdin?.on('error', () => undefined); // the command may exit before reading its stdin
        send(ws, { type: 'started' });
        for (const m of pending.splice(0)) control(m);
        if (!proc.stdin?.writableNeedDrain) ws.resume();
        const out = new CappedOutput();
        const errOut = new CappedOutput();
        forward(ws, proc.stdout, 'stdout', out);
        forward(ws, proc.stderr, 'stderr', errOut);
        try {
          const result = await proc.done;
          send(ws, {
            type: 'exit',
            exit_code: exitCodeOf(result),
            signal: result.signal,
            timed_out: result.timedOut,
            truncated: out.truncated || errOut.truncated,
            duration_ms: Date.now() - startedAt,
          });
          ws.close(1000);
        } catch (err) {
          fail(err);
        }
      };
    },
  );
}
