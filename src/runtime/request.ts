import { Ajv } from 'ajv';
import { ajvToIssues, type ValidationIssue } from '../validation/errors.js';
import type { RunInput } from './assistant.js';

/** Stream modes this runtime implements. `debug`, `events`, `tasks`, `checkpoints` are not (422). */
export const STREAM_MODES = ['values', 'updates', 'messages', 'messages-tuple', 'custom'] as const;
export type StreamMode = (typeof STREAM_MODES)[number];

export type OnDisconnect = 'cancel' | 'continue';

/** A validated `POST /runs/stream` body, defaults applied. */
export interface RunRequest {
  assistant_id: string;
  input: RunInput;
  stream_mode: StreamMode[];
  on_disconnect: OnDisconnect;
  config: Record<string, unknown>;
  metadata: Record<string, unknown>;
}

const ROLES = ['human', 'user', 'ai', 'assistant', 'system'];
const streamModeSchema = { type: 'string', enum: [...STREAM_MODES] } as const;

/**
 * The body schema. Unknown fields are refused (a misspelt `stream_modes` must not be silently
 * ignored); the production SDKs' always-sent neutral fields are accepted: `stream_subgraphs`
 * (this runtime has no subgraphs) and `stream_resumable: false` (a threadless stream cannot be
 * resumed). `thread_id` is accepted only as null: this runtime is threadless.
 */
export const runRequestSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['assistant_id'],
  properties: {
    assistant_id: { type: 'string', minLength: 1, maxLength: 256 },
    input: {
      type: ['object', 'null'],
      properties: {
        messages: {
          type: 'array',
          maxItems: 10000,
          items: {
            type: 'object',
            required: ['role', 'content'],
            properties: {
              role: { type: 'string', enum: ROLES },
              content: { type: 'string' },
            },
          },
        },
      },
    },
    stream_mode: {
      // if/then/else rather than anyOf: one precise issue (enum, at the item's index) per mistake.
      type: ['string', 'array', 'null'],
      if: { type: 'string' },
      then: streamModeSchema,
      else: { minItems: 1, maxItems: 10, items: streamModeSchema },
    },
    on_disconnect: { type: 'string', enum: ['cancel', 'continue'] },
    config: { type: ['object', 'null'] },
    metadata: { type: ['object', 'null'] },
    thread_id: { type: 'null' },
    stream_subgraphs: { type: 'boolean' },
    stream_resumable: { type: 'boolean', const: false },
  },
} as const;

const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true });
const validate = ajv.compile(runRequestSchema);

export type ParseResult = { ok: true; request: RunRequest } | { ok: false; issues: ValidationIssue[] };

/** Validates a parsed JSON body. Issues carry `loc` starting with `body`. */
export function parseRunRequest(body: unknown): ParseResult {
  if (!validate(body)) {
    const issues = ajvToIssues(validate.errors, ['body']).map((i) => {
      // Say why rather than the bare "must be null": the runtime has no threads to run on.
      if (i.loc.length === 2 && i.loc[1] === 'thread_id') {
        return { ...i, msg: 'This application runs threadless only: thread_id must be null or absent', type: 'value_error' };
      }
      if (i.loc.length === 2 && i.loc[1] === 'stream_resumable') {
        return { ...i, msg: 'Resumable streams are not supported by a threadless run: stream_resumable must be false', type: 'value_error' };
      }
      return i;
    });
    return { ok: false, issues };
  }
  const b = body as unknown as Record<string, unknown>;
  const rawModes = b.stream_mode ?? 'values';
  const modes = [...new Set(Array.isArray(rawModes) ? (rawModes as StreamMode[]) : [rawModes as StreamMode])];
  return {
    ok: true,
    request: {
      assistant_id: b.assistant_id as string,
      input: (b.input as RunInput | null) ?? {},
      stream_mode: modes,
      on_disconnect: (b.on_disconnect as OnDisconnect | undefined) ?? 'cancel',
      config: (b.config as Record<string, unknown> | null) ?? {},
      metadata: (b.metadata as Record<string, unknown> | null) ?? {},
    },
  };
}
