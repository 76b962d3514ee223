/**
 * The assistant interface: the whole contract between a keygate application and the runtime that
 * serves it over `POST /runs/stream`.
 *
 * An application is a directory with a `keygate.json` naming its assistants; each names an ESM
 * module whose default export (or named export `assistant`, or the export given after a colon in
 * keygate.json: `"./src/agent.js:myAgent"`) is an {@link Assistant}:
 *
 * ```js
 * // src/agent.js (plain JavaScript, no build step)
 * /** @type {import('keygate/src/runtime/assistant.js').Assistant} *\/
 * export default {
 *   description: 'Echoes the last message back',
 *   async run(input, ctx) {
 *     const msg = ctx.message.start({ node: 'agent' });
 *     for (const word of ['hello', ' world']) msg.push(word);
 *     ctx.update('agent', { messages: [msg.complete()] });
 *   },
 * };
 * ```
 *
 * This module holds types only (plus nothing that runs), so apps can reference it from JSDoc or
 * from TypeScript without pulling in the server.
 */

/** Roles accepted in `input.messages[].role`. `human`/`user` and `ai`/`assistant` are synonyms. */
export type Role = 'human' | 'user' | 'ai' | 'assistant' | 'system';

/** One message of the run input. Extra fields (id, name ...) are kept as given. */
export interface InputMessage {
  role: Role;
  content: string;
  [extra: string]: unknown;
}

/** The run's `input`: `messages` plus whatever else the client sent. */
export interface RunInput {
  messages?: InputMessage[];
  [key: string]: unknown;
}

/** An AI message as the runtime serialises it (the production API's message shape). */
export interface AiMessage {
  content: string;
  additional_kwargs: Record<string, unknown>;
  response_metadata: Record<string, unknown>;
  type: 'ai' | 'AIMessageChunk';
  name: string | null;
  id: string;
  example: boolean;
  tool_calls: unknown[];
  invalid_tool_calls: unknown[];
  usage_metadata: unknown;
  tool_call_chunks?: unknown[];
}

/** A message being streamed token by token. */
export interface MessageStream {
  /** The message id (`run-<uuid>` unless given to `start`). */
  readonly id: string;
  /** The content accumulated so far. */
  readonly content: string;
  /** Appends one chunk: `messages/partial` (accumulated) and `messages` (the chunk) events. */
  push(chunk: string): void;
  /**
   * Ends the message: a `messages/complete` event. Returns the finished message, ready to be put
   * into state with `ctx.update(node, { messages: [message] })`. Calling it twice returns the same
   * message and emits nothing more.
   */
  complete(): AiMessage;
}

export interface MessageStartOptions {
  /** The node (step) producing the message; appears as `langgraph_node` in message metadata. */
  node?: string;
  /** A message id; default `run-<uuid>`. */
  id?: string;
  /** Optional `name` of the message. */
  name?: string;
}

/** Minimal structured logger handed to assistants (pino underneath: JSON lines, redaction). */
export interface AssistantLogger {
  info(obj: Record<string, unknown>, msg?: string): void;
  warn(obj: Record<string, unknown>, msg?: string): void;
  error(obj: Record<string, unknown>, msg?: string): void;
}

/** What an assistant's `run` receives besides its input. */
export interface RunContext {
  readonly runId: string;
  readonly assistantId: string;
  readonly assistantName: string;
  /**
   * Fires when the run is cancelled: the client disconnected (with `on_disconnect: cancel`, the
   * default) or the server is shutting down and the grace period ran out. Pass it to every
   * long-running call (`ctx.fetch(url, { signal: ctx.signal })`) and stop when it fires.
   */
  readonly signal: AbortSignal;
  /** The request's `config` (`{}` when absent). `config.configurable` is where clients put options. */
  readonly config: Record<string, unknown>;
  /** The request's `metadata` (`{}` when absent). */
  readonly metadata: Record<string, unknown>;
  /** The process environment: the app's `env` file plus the variables the deployment was given. */
  readonly env: Readonly<Record<string, string | undefined>>;
  /**
   * `fetch` that honours HTTPS_PROXY / HTTP_PROXY / NO_PROXY (undici's EnvHttpProxyAgent). Node's
   * global fetch ignores those variables; inside a sandbox this is the way out through the auth
   * proxy, which adds the credentials the app itself never holds.
   */
  readonly fetch: typeof globalThis.fetch;
  /** The current state (what the next `values` event will show). */
  readonly state: Readonly<Record<string, unknown>>;
  /**
   * Reports one step: an `updates` event `{"<node>": value}`; an object value is also folded into
   * the state (its `messages` are appended, other keys replace) and a `values` event follows.
   */
  update(node: string, value: unknown): void;
  /** A `custom` event carrying `data` as given. */
  custom(data: unknown): void;
  /** Token streaming. */
  readonly message: { start(opts?: MessageStartOptions): MessageStream };
  /** Resolves after `ms`, or rejects with the abort reason as soon as the run is cancelled. */
  sleep(ms: number): Promise<void>;
  readonly log: AssistantLogger;
}

/**
 * An assistant. `run` may return the final state (an object, folded into the state like an
 * update but without an `updates` event) or nothing. Throwing ends the run with an `error` event
 * `{"error": err.name, "message": err.message}` (never the stack).
 */
export interface Assistant {
  description?: string;
  run(input: RunInput, ctx: RunContext): Promise<Record<string, unknown> | void> | Record<string, unknown> | void;
}
