import { Envelope } from '../secrets/envelope.js';
import { TEMPLATE_REF_RE } from '../secrets/keys.js';
import { ValidationFailure, type ValidationIssue } from '../validation/errors.js';
import type { ResolvedProxyConfig } from '../rules/compile.js';
import { isLegalFieldValue, type ProxyConfig } from './schema.js';

export type { ResolvedProxyConfig } from '../rules/compile.js';

export interface ResolveOptions {
  /** Decrypts a sealed opaque value (Envelope.open). Without it a sealed value is an error. */
  openOpaque?: (stored: string) => string;
}

/** Every `{KEY}` a configuration references, with the loc of the header value holding it. */
export function referencedSecretKeys(config: ProxyConfig): { key: string; loc: (string | number)[] }[] {
  const out: { key: string; loc: (string | number)[] }[] = [];
  (config.rules ?? []).forEach((rule, i) =>
    (rule.headers ?? []).forEach((h, j) => {
      if (h.type !== 'workspace_secret') return;
      for (const m of h.value.matchAll(TEMPLATE_REF_RE)) out.push({ key: m[1], loc: ['rules', i, 'headers', j, 'value'] });
    }),
  );
  return out;
}

/** Characters no field value may hold anywhere: controls other than HTAB, DEL, above U+00FF. */
const ILLEGAL_FIELD_CHAR = /[^\t\x20-\x7e\x80-\xff]/;

/**
 * Which secrets of a template made its resolved value illegal, by name and by what is wrong
 * (never the value): the operator must know which secret to fix. The template's own text was
 * checked at validation, so the cause is in the secrets.
 */
function culprits(template: string, lookup: (key: string) => string | undefined): string {
  const keys = [...new Set([...template.matchAll(TEMPLATE_REF_RE)].map((m) => m[1]))];
  const bad = keys.filter((k) => ILLEGAL_FIELD_CHAR.test(lookup(k) ?? ''));
  if (bad.length) return `secret ${bad.map((k) => `'${k}'`).join(', ')} holds control characters such as CR, LF or NUL, or characters above U+00FF`;
  const trimmed = template.trim();
  const edge = keys.filter((k) => (trimmed.startsWith(`{${k}}`) && /^\s/.test(lookup(k) ?? '')) || (trimmed.endsWith(`{${k}}`) && /\s$/.test(lookup(k) ?? '')));
  if (edge.length) return `secret ${edge.map((k) => `'${k}'`).join(', ')} begins or ends with whitespace (a trailing newline?), which cannot start or end a header value`;
  return `secret ${keys.map((k) => `'${k}'`).join(', ')}: the resolved value is empty or begins or ends with whitespace`;
}

/**
 * Whether the `{KEY}` template of a workspace_secret header resolves to a legal field value with
 * these secrets: null when it does (or a key is missing: that is reported on its own), else why
 * not, naming the secrets and never a value. For checking a change of secrets before it is stored.
 */
export function templateValueProblem(template: string, lookup: (key: string) => string | undefined): string | null {
  let missing = false;
  const value = template.replace(TEMPLATE_REF_RE, (_m, key: string) => {
    const v = lookup(key);
    if (v === undefined) missing = true;
    return v ?? '';
  });
  if (missing || isLegalFieldValue(value)) return null;
  return culprits(template, lookup);
}

/**
 * Resolves a validated configuration into the values the proxy sends: `{KEY}` references
 * replaced by `lookup(KEY)`, sealed opaque values decrypted, plaintext as written. Every problem
 * is collected (all missing keys, not just the first) and thrown as one ValidationFailure whose
 * messages name the rule, the header and the key, never a value.
 */
export function resolveProxyConfig(
  config: ProxyConfig,
  lookup: (key: string) => string | undefined,
  opts: ResolveOptions = {},
): ResolvedProxyConfig {
  const issues: ValidationIssue[] = [];
  const rules = (config.rules ?? []).map((rule, i) => ({
    name: rule.name,
    match_hosts: [...rule.match_hosts],
    match_paths: rule.match_paths ? [...rule.match_paths] : undefined,
    no_proxy: rule.no_proxy ? [...rule.no_proxy] : undefined,
    headers: (rule.headers ?? []).map((h, j) => {
      const loc = ['rules', i, 'headers', j, 'value'];
      const where = `rule '${rule.name}', header '${h.name}'`;
      let value = h.value;
      if (h.type === 'workspace_secret') {
        const missing: string[] = [];
        value = h.value.replace(TEMPLATE_REF_RE, (_m, key: string) => {
          const v = lookup(key);
          if (v === undefined) {
            missing.push(key);
            return '';
          }
          return v;
        });
        for (const key of missing) {
          issues.push({ loc, msg: `Secret '${key}' referenced by ${where} does not exist`, type: 'missing_secret' });
        }
        if (missing.length) return { name: h.name, value: '' };
      } else if (h.type === 'opaque' && Envelope.isSealed(h.value)) {
        if (!opts.openOpaque) {
          issues.push({ loc, msg: `Opaque value of ${where} is encrypted and no key is available to open it`, type: 'value_error' });
          return { name: h.name, value: '' };
        }
        try {
          value = opts.openOpaque(h.value);
        } catch {
          // The envelope's message says why (wrong key, tampered) without the value.
          issues.push({ loc, msg: `Opaque value of ${where} cannot be decrypted`, type: 'value_error' });
          return { name: h.name, value: '' };
        }
      }
      if (!isLegalFieldValue(value)) {
        issues.push({
          loc,
          msg: `Resolved value of ${where} is not a legal HTTP field value (${h.type === 'workspace_secret' ? culprits(h.value, lookup) : 'control characters, characters above U+00FF, or leading/trailing whitespace'})`,
          type: 'value_error',
        });
      }
      return { name: h.name, value };
    }),
  }));
  if (issues.length) throw new ValidationFailure(issues);
  const out: ResolvedProxyConfig = { rules, no_proxy: [...(config.no_proxy ?? [])] };
  if (config.access_control) out.access_control = structuredClone(config.access_control);
  return out;
}
