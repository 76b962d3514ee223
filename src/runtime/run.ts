import { randomUUID } from 'node:crypto';
import type { Logger } from '../log.js';
import type { AiMessage, MessageStartOptions, MessageStream, RunContext } from './assistant.js';
import type { LoadedAssistant } from './app.js';
import type { RunRequest, StreamMode } from './request.js';
import { foldUpdate, type State } from './state.js';

/** The reason a run's signal fires with; its name is what the `error` event reports. */
export class RunCancelledError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CancelledError';
  }
}

export type RunOutcome = 'success' | 'error' | 'cancelled';

export interface ExecuteRunOptions {
  runId: string;
  assistant: LoadedAssistant;
  request: RunRequest;
  /** Aborted (with a RunCancelledError) by the server: client gone or shutdown. */
  signal: AbortSignal;
  /** Receives every event in order; throws on data that cannot be serialised. */
  emit(event: string, data: unknown): void;
  fetch: typeof globalThis.fetch;
  env: Readonly<Record<string, string | undefined>>;
  logger: Logger;
  /**
   * After the signal fires, how long the assistant may take to stop before the run is ended
   * without it (its later output is dropped). Keeps shutdown and cancellation bounded even for
   * an assistant that ignores its signal.
   */
  abandonAfterMs?: number;
  /**
   * Removes secret values (the deployment's secrets, the replica's API key) from text. The error
   * payload goes through it before it is cut or sent: an app's exception often quotes what it was
   * given (an upstream's answer echoing the key it was sent).
   */
  redact?: (s: string) => string;
}

const MAX_ERROR_MESSAGE = 4000;

/**
 * The `error` event payload: name and message, never a stack. Redacted before it is cut, so a cut
 * cannot leave part of a secret behind the redactor's back.
 */
export function errorPayload(err: unknown, redact: (s: string) => string = (s) => s): { error: string; message: string } {
  if (err instanceof Error) {
    let message = String(err.message ?? '');
    // undici's "fetch failed" says nothing by itself; the reason is in its cause.
    const cause = (err as { cause?: unknown }).cause;
    if (cause instanceof Error && cause.message) message += ` (${cause.name}: ${cause.message})`;
    return { error: redact(String(err.name || 'Error')).slice(0, 200), message: redact(message).slice(0, MAX_ERROR_MESSAGE) };
  }
  return { error: 'Error', message: redact(String(err)).slice(0, MAX_ERROR_MESSAGE) };
}

/**
 * Runs one assistant once: `metadata`, the events of the requested modes as the assistant produces
 * them, `error` if it failed, and always `end` last. Resolves when the stream is complete; never
 * rejects.
 */
export async function executeRun(opts: ExecuteRunOptions): Promise<RunOutcome> {
  const { runId, assistant, request, signal, logger } = opts;
  const modes = new Set<StreamMode>(request.stream_mode);
  let finished = false;
  let state: State = { ...request.input };
  let step = 0;

  // Once the run is over, late calls from a still-running assistant are dropped: `end` is final.
  const emit = (event: string, data: unknown) => {
    if (!finished) opts.emit(event, data);
  };
  const emitValues = () => {
    if (modes.has('values')) emit('values', state);
  };

  const log = logger.child({ run_id: runId, assistant: assistant.name });
  const baseMetadata = () => ({
    ...request.metadata,
    run_id: runId,
    assistant_id: assistant.id,
    graph_id: assistant.name,
  });

  const startMessage = (o: MessageStartOptions = {}): MessageStream => {
    const id = o.id ?? `run-${randomUUID()}`;
    const node = o.node ?? assistant.name;
    const metadata = { ...baseMetadata(), langgraph_node: node, langgraph_step: step };
    const name = o.name ?? null;
    let content = '';
    let done: AiMessage | undefined;
    const shape = (text: string, type: AiMessage['type']): AiMessage => ({
      content: text,
      additional_kwargs: {},
      response_metadata: {},
      type,
      name,
      id,
      example: false,
      tool_calls: [],
      invalid_tool_calls: [],
      usage_metadata: null,
      ...(type === 'AIMessageChunk' ? { tool_call_chunks: [] } : {}),
    });
    if (modes.has('messages')) emit('messages/metadata', { [id]: { metadata } });
    return {
      id,
      get content() {
        return content;
      },
      push(chunk: string) {
        if (typeof chunk !== 'string') throw new TypeError('message chunks must be strings');
        if (done) throw new Error(`message ${id} is already complete`);
        content += chunk;
        if (modes.has('messages')) emit('messages/partial', [shape(content, 'AIMessageChunk')]);
        if (modes.has('messages-tuple')) emit('messages', [shape(chunk, 'AIMessageChunk'), metadata]);
      },
      complete() {
        if (done) return done;
        done = shape(content, 'ai');
        if (modes.has('messages')) emit('messages/complete', [done]);
        return done;
      },
    };
  };

  const ctx: RunContext = {
    runId,
    assistantId: assistant.id,
    assistantName: assistant.name,
    signal,
    config: request.config,
    metadata: request.metadata,
    env: opts.env,
    fetch: opts.fetch,
    get state() {
      return state;
    },
    update(node: string, value: unknown) {
      if (typeof node !== 'string' || node === '') throw new TypeError('update(node, value): node must be a non-empty string');
      if (finished) return;
      step++;
      if (modes.has('updates')) emit('updates', { [node]: value ?? null });
      const next = foldUpdate(state, value);
      if (next !== state) {
        state = next;
        emitValues();
      }
    },
    custom(data: unknown) {
      if (modes.has('custom')) emit('custom', data);
    },
    message: { start: startMessage },
    sleep(ms: number) {
      return new Promise<void>((resolve, reject) => {
        if (signal.aborted) return reject(signal.reason);
        const onAbort = () => {
          clearTimeout(t);
          reject(signal.reason);
        };
        const t = setTimeout(() => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        }, ms);
        signal.addEventListener('abort', onAbort, { once: true });
      });
    },
    log: {
      info: (o, m) => log.info({ app_log: o }, m),
      warn: (o, m) => log.warn({ app_log: o }, m),
      error: (o, m) => log.error({ app_log: o }, m),
    },
  };

  emit('metadata', { run_id: runId, attempt: 1 });

  let outcome: RunOutcome;
  try {
    // Inside the try: a state that cannot be serialised fails the run (error, end) like any
    // other failure, instead of rejecting and leaving the stream without its end.
    emitValues();
    const work = Promise.resolve().then(() => assistant.assistant.run(request.input, ctx));
    const result = await raceAbandon(work, signal, opts.abandonAfterMs ?? 2000);
    if (result !== undefined && result !== null) {
      const next = foldUpdate(state, result);
      if (next !== state) {
        state = next;
        emitValues();
      }
    }
    outcome = 'success';
  } catch (err) {
    outcome = signal.aborted ? 'cancelled' : 'error';
    // A cancelled run reports why it was cancelled, not the AbortError its fetch happened to throw.
    const payload = errorPayload(signal.aborted ? signal.reason : err, opts.redact);
    if (outcome === 'error') log.warn({ error: payload.error, message: payload.message }, 'run failed');
    try {
      emit('error', payload);
    } catch {
      // A serialisation failure here cannot happen (two strings); the stream still ends below.
    }
  }
  try {
    emit('end', null);
  } finally {
    finished = true;
  }
  return outcome;
}

const ABANDONED = Symbol('abandoned');

/**
 * Waits for the assistant; once the signal fires, waits at most `graceMs` more and then rejects
 * with the abort reason, leaving an assistant that ignores its signal behind.
 */
function raceAbandon<T>(work: Promise<T>, signal: AbortSignal, graceMs: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      timer = setTimeout(() => reject(signal.reason ?? ABANDONED), graceMs);
    };
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (v) => {
        if (timer) clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e) => {
        if (timer) clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}
