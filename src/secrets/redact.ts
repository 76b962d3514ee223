import { inspect } from 'node:util';

/**
 * Removing known secret values from text on its way out (logs, error messages). Shared by
 * the control plane (replica output, revision status messages) and the application runtime (its
 * error events and log lines), so both remove the same forms.
 */

/** Shortest piece of a multi-line secret redacted on its own (a lone `{` or `-----` is not worth it). */
const MIN_LINE_PIECE = 4;

export const REDACTED = '[redacted]';

/**
 * The forms in which a secret value shows up in text: the value itself; trimmed (a value read from
 * a file usually ends in a newline the app's `console.log` does not repeat); each line of a
 * multi-line value (a PEM key or a JSON credential: logs are cut into lines before they are
 * redacted, so the whole value never meets the redactor in one piece); JSON-escaped (an app that
 * logs JSON) and util.inspect-escaped (Node's own error messages quote values that way).
 */
export function secretForms(value: string): string[] {
  const forms = new Set<string>();
  if (!value) return [];
  forms.add(value);
  const trimmed = value.trim();
  if (trimmed) forms.add(trimmed);
  const lines = value.split(/\r?\n|\r/);
  if (lines.length > 1) for (const l of lines) if (l.trim().length >= MIN_LINE_PIECE) forms.add(l.trim());
  for (const v of [value, trimmed]) {
    if (!v) continue;
    forms.add(JSON.stringify(v).slice(1, -1));
    forms.add(inspect(v, { maxStringLength: Infinity, breakLength: Infinity }).slice(1, -1));
  }
  return [...forms].filter((f) => f.length > 0);
}

/**
 * Replaces every occurrence of a secret value, in any of the forms {@link secretForms} lists, with
 * `[redacted]`. Longest forms first, so a secret that contains another is removed whole.
 */
export function makeRedactor(values: string[]): (s: string) => string {
  const vals = [...new Set(values.flatMap(secretForms))].sort((a, b) => b.length - a.length);
  if (vals.length === 0) return (s) => s;
  return (s) => {
    let out = s;
    for (const v of vals) if (out.includes(v)) out = out.split(v).join(REDACTED);
    return out;
  };
}

/**
 * The environment variable through which the control plane tells a replica which of its variables
 * are deployment secrets (their names, comma-separated; never values): the runtime redacts their
 * values, and its own API key, from the errors it reports and from its log lines.
 */
export const SECRET_NAMES_ENV = 'KEYGATE_SECRET_NAMES';
