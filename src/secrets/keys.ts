/**
 * A workspace secret's name: environment-variable style, so that `{KEY}` templates are
 * unambiguous and names are safe in file names, URLs and log fields. Shared by the template
 * resolver, every secret store and the APIs that accept names.
 */
export const SECRET_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

/** `{KEY}` inside a header value template (e.g. `Bearer {GITHUB_TOKEN}`). */
export const TEMPLATE_REF_RE = /\{([A-Za-z_][A-Za-z0-9_]{0,127})\}/g;

export function isSecretKey(key: string): boolean {
  return SECRET_KEY_RE.test(key);
}
