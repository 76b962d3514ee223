/**
 * How updates fold into the run state (pure). `messages` behaves like the production API's
 * add_messages reducer: new messages are appended, a message whose `id` is already present
 * replaces it in place. Every other key is replaced. Non-object updates leave the state as is.
 */

export type State = Record<string, unknown>;

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

export function foldUpdate(state: State, update: unknown): State {
  if (!isPlainObject(update)) return state;
  const next: State = { ...state };
  for (const [key, value] of Object.entries(update)) {
    // Defined, not assigned: `next.__proto__ = v` would set the state's prototype and drop the key.
    Object.defineProperty(next, key, {
      value: key === 'messages' && Array.isArray(value) ? mergeMessages(state.messages, value) : value,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return next;
}

function idOf(m: unknown): string | undefined {
  return isPlainObject(m) && typeof m.id === 'string' ? m.id : undefined;
}

export function mergeMessages(existing: unknown, added: unknown[]): unknown[] {
  const out = Array.isArray(existing) ? [...existing] : [];
  const index = new Map<string, number>();
  out.forEach((m, i) => {
    const id = idOf(m);
    if (id !== undefined) index.set(id, i);
  });
  for (const m of added) {
    const id = idOf(m);
    const at = id !== undefined ? index.get(id) : undefined;
    if (at !== undefined) {
      out[at] = m;
    } else {
      if (id !== undefined) index.set(id, out.length);
      out.push(m);
    }
  }
  return out;
}
