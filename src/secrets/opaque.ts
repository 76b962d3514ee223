import { Envelope, EnvelopeError } from './envelope.js';

/**
 * `opaque` header values are write-only: stored sealed with the envelope (no associated data, like
 * every value kept in the database, so key rotation finds and re-seals them), decrypted only in
 * memory when a configuration is resolved, and never returned.
 *
 * The functions are generic over the shape of a proxy_config (src/config/schema.ts `ProxyConfig`)
 * and return a copy of the same type; the input is never modified.
 */
interface HeaderLike {
  name: string;
  type: string;
  value?: string;
}
interface RuleLike {
  headers?: HeaderLike[];
}
export interface ProxyConfigLike {
  rules?: RuleLike[];
}

function mapHeaders<C extends ProxyConfigLike>(config: C, fn: (h: HeaderLike) => HeaderLike): C {
  const copy = structuredClone(config);
  for (const rule of copy.rules ?? []) {
    if (Array.isArray(rule.headers)) rule.headers = rule.headers.map(fn);
  }
  return copy;
}

/** A copy with every plain `opaque` value sealed; values already sealed are kept as they are. */
export function sealOpaqueValues<C extends ProxyConfigLike>(config: C, env: Envelope): C {
  return mapHeaders(config, (h) => (h.type === 'opaque' && typeof h.value === 'string' && !Envelope.isSealed(h.value) ? { ...h, value: env.seal(h.value) } : h));
}

/**
 * The form an API returns or a command prints: `opaque` headers without a `value` key,
 * `workspace_secret` values as their `{KEY}` template (the stored form), `plaintext` as stored.
 * Callers must pass the stored (template) configuration, never a resolved one.
 */
export function redactProxyConfig<C extends ProxyConfigLike>(config: C): C {
  return mapHeaders(config, (h) => {
    if (h.type !== 'opaque') return h;
    const { value: _omitted, ...rest } = h;
    return rest as HeaderLike;
  });
}

/** For `resolveProxyConfig(..., { openOpaque })`: opens a sealed opaque value, naming no value on failure. */
export function opaqueOpener(env: Envelope): (stored: string) => string {
  return (stored) => {
    try {
      return env.open(stored);
    } catch (err) {
      if (err instanceof EnvelopeError) throw new EnvelopeError(`an opaque header value cannot be decrypted: ${err.message}`);
      throw err;
    }
  };
}
