/**
 * The stateless LangGraph Platform API shapes a deployed application answers (pure: no sockets).
 * Each assistant of keygate.json is one "system" assistant, as the production server creates one per
 * graph: its graph is the assistant itself, it has one version and no stored config. What is in
 * scope and what is not: src/runtime/README.md.
 */
import { Ajv } from 'ajv';
import { ajvToIssues, type ValidationIssue } from '../validation/errors.js';
import type { LoadedApp, LoadedAssistant } from './app.js';

/** The production API's Assistant object, plus keygate's `id` (same value) and `app`. */
export interface AssistantView {
  assistant_id: string;
  graph_id: string;
  config: Record<string, unknown>;
  context: Record<string, unknown>;
  metadata: Record<string, unknown>;
  name: string;
  description: string | null;
  created_at: string;
  updated_at: string;
  version: number;
  id: string;
  app: string;
}

/**
 * `registeredAt` is when the app's keygate.json last changed: the API never changes an assistant
 * (there is no PATCH), so it is both `created_at` and `updated_at`.
 */
export function assistantView(a: LoadedAssistant, app: LoadedApp, registeredAt: string): AssistantView {
  return {
    assistant_id: a.id,
    graph_id: a.name,
    config: {},
    context: {},
    metadata: { created_by: 'system' },
    name: a.name,
    description: a.description,
    created_at: registeredAt,
    updated_at: registeredAt,
    version: 1,
    id: a.id,
    app: app.name,
  };
}

const SORT_FIELDS = ['assistant_id', 'graph_id', 'name', 'created_at', 'updated_at'] as const;
const SELECT_FIELDS = ['assistant_id', 'graph_id', 'name', 'description', 'config', 'context', 'created_at', 'updated_at', 'metadata', 'version'] as const;

/** `POST /assistants/search` body, as the SDKs send it (null stands for "not given"). */
export const assistantSearchSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    metadata: { type: ['object', 'null'] },
    graph_id: { type: ['string', 'null'], maxLength: 256 },
    name: { type: ['string', 'null'], maxLength: 256 },
    limit: { type: 'integer', minimum: 1, maximum: 1000 },
    offset: { type: 'integer', minimum: 0 },
    sort_by: { type: ['string', 'null'], enum: [...SORT_FIELDS, null] },
    sort_order: { type: ['string', 'null'], enum: ['asc', 'desc', null] },
    select: { type: ['array', 'null'], maxItems: SELECT_FIELDS.length, items: { type: 'string', enum: [...SELECT_FIELDS] } },
  },
} as const;

const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true });
const validateSearch = ajv.compile(assistantSearchSchema);

export interface AssistantSearch {
  metadata?: Record<string, unknown> | null;
  graph_id?: string | null;
  name?: string | null;
  limit?: number;
  offset?: number;
  sort_by?: (typeof SORT_FIELDS)[number] | null;
  sort_order?: 'asc' | 'desc' | null;
  select?: (typeof SELECT_FIELDS)[number][] | null;
}

export type SearchResult =
  | { ok: true; items: Record<string, unknown>[]; /** offset of the next page, or null */ next: number | null }
  | { ok: false; issues: ValidationIssue[] };

/**
 * Exact JSON equality for metadata filters (the production filter matches each key exactly). The
 * caller checks the key is the assistant's own: `metadata.__proto__` is Object.prototype, `{}`.
 */
function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * Filters, sorts and pages the app's assistants as the production search does: `graph_id` exact,
 * `name` a case-insensitive substring, every `metadata` pair exact; default order: `created_at`
 * descending, then `assistant_id` for a stable order (every assistant of an app shares its time).
 */
export function searchAssistants(views: AssistantView[], body: unknown): SearchResult {
  if (!validateSearch(body)) return { ok: false, issues: ajvToIssues(validateSearch.errors, ['body']) };
  const q = body as AssistantSearch;
  const limit = q.limit ?? 10;
  const offset = q.offset ?? 0;
  const name = q.name?.toLowerCase();
  const matched = views.filter(
    (v) =>
      (q.graph_id == null || v.graph_id === q.graph_id) &&
      (name == null || v.name.toLowerCase().includes(name)) &&
      Object.entries(q.metadata ?? {}).every(([k, val]) => Object.hasOwn(v.metadata, k) && sameJson(v.metadata[k], val)),
  );
  const by = q.sort_by ?? 'created_at';
  const dir = (q.sort_order ?? 'desc') === 'asc' ? 1 : -1;
  matched.sort((a, b) => {
    const primary = a[by] < b[by] ? -1 : a[by] > b[by] ? 1 : 0;
    return primary !== 0 ? primary * dir : a.assistant_id < b.assistant_id ? -dir : a.assistant_id > b.assistant_id ? dir : 0;
  });
  const page = matched.slice(offset, offset + limit);
  const items = page.map((v) => (q.select ? Object.fromEntries(q.select.map((f) => [f, v[f]])) : { ...v }));
  return { ok: true, items, next: offset + limit < matched.length ? offset + limit : null };
}

/**
 * `GET /assistants/{id}/graph`: an assistant is one step, so its graph is start -> the assistant ->
 * end, in the production API's drawable-graph shape (`nodes` with `id`, `type`, `data`; `edges`).
 */
export function graphView(a: LoadedAssistant) {
  return {
    nodes: [
      { id: '__start__', type: 'schema', data: '__start__' },
      { id: a.name, type: 'runnable', data: { id: ['keygate', 'assistant', a.name], name: a.name } },
      { id: '__end__', type: 'schema', data: '__end__' },
    ],
    edges: [
      { source: '__start__', target: a.name },
      { source: a.name, target: '__end__' },
    ],
  };
}
