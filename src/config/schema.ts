import { createRequire } from 'node:module';
import type { Ajv as AjvClass, ValidateFunction } from 'ajv';
import { ajvToIssues, type ValidationIssue } from '../validation/errors.js';
import { compileHostPattern, compilePathPattern, PatternError } from '../rules/patterns.js';
import { TEMPLATE_REF_RE } from '../secrets/keys.js';
import { accessControlIssues, type AccessControl } from '../rules/egress.js';

/** An RFC 9110 field name (`token`). */
export const HEADER_NAME_PATTERN = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$";
/**
 * A field value Node and undici will put on the wire unchanged: visible ASCII, SP, HTAB and
 * obs-text (0x80-0xFF); no CR, LF, NUL or other controls, no leading/trailing whitespace.
 */
export const HEADER_VALUE_PATTERN = '^(?:[\\x21-\\x7e\\x80-\\xff](?:[\\t\\x20-\\x7e\\x80-\\xff]*[\\x21-\\x7e\\x80-\\xff])?)?$';
const HEADER_VALUE_RE = new RegExp(HEADER_VALUE_PATTERN);

export const LIMITS = {
  rules: 100,
  hostsPerList: 256,
  pathsPerRule: 256,
  headersPerRule: 32,
  hostPatternLength: 261, // 253 for the name + ':65535' + brackets
  pathPatternLength: 2048,
  ruleNameLength: 128,
  headerNameLength: 256,
  headerValueLength: 16384, // a sealed opaque value of a long token still fits
} as const;

/**
 * Headers a rule may never set: they decide framing, the destination or the connection, so
 * injecting them would let a configuration break the proxy's own guarantees. Every hop-by-hop
 * field the proxy drops from requests (src/proxy/headers.ts) is here: a rule's headers are added
 * after that filter (test/config/config.test.ts checks the two lists).
 */
export const FORBIDDEN_HEADER_NAMES = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'proxy-authenticate',
  'te',
  'trailer',
  'upgrade',
  'expect',
  // Connection-specific since RFC 9113 (node:http2 refuses to send it): every request of the
  // rule to an HTTP/2 origin would fail.
  'http2-settings',
]);

const hostPatternList = {
  type: 'array',
  maxItems: LIMITS.hostsPerList,
  items: { type: 'string', minLength: 1, maxLength: LIMITS.hostPatternLength },
} as const;

const portList = {
  type: 'array',
  maxItems: 256,
  items: { anyOf: [{ type: 'integer', minimum: 1, maximum: 65535 }, { type: 'string', pattern: '^[0-9]{1,5}(-[0-9]{1,5})?$' }] },
} as const;

/** Egress policy: which destinations the sandbox may reach at all (src/rules/egress.ts). */
const accessControlSchema = {
  type: 'object',
  additionalProperties: false,
  description:
    'Egress policy applied to every destination (tunnels, intercepted and plain HTTP), after DNS resolution. Link-local and cloud metadata addresses and the proxy\'s own listeners are always refused.',
  properties: {
    allow_hosts: { ...hostPatternList, description: 'When present, only targets whose name matches an entry are reachable.' },
    deny_hosts: { ...hostPatternList, description: 'Targets refused: the name as given, the name the resolv.conf search list makes of it, and its CNAME chain; IP entries also refuse names resolving to that address. To refuse a destination by any name, deny its addresses (deny_addresses).' },
    allow_ports: { ...portList, description: 'When present, only these ports (443 or "8000-8999").' },
    deny_ports: { ...portList, description: 'Ports refused (443 or "8000-8999").' },
    deny_addresses: {
      type: 'array',
      maxItems: 256,
      items: { type: 'string', minLength: 1, maxLength: 64 },
      description: 'IP addresses or CIDR blocks refused after DNS resolution (e.g. "10.0.0.0/8").',
    },
  },
} as const;

/**
 * The `proxy_config` JSON Schema: the one source for validation (ajv here, fastify routes embed
 * it as a property), and the OpenAPI document. No `$id`/`$schema`/refs so it can be embedded.
 */
export const proxyConfigSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    rules: {
      type: 'array',
      maxItems: LIMITS.rules,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['name', 'match_hosts'],
        properties: {
          name: { type: 'string', minLength: 1, maxLength: LIMITS.ruleNameLength },
          match_hosts: { ...hostPatternList, minItems: 1 },
          match_paths: {
            type: 'array',
            maxItems: LIMITS.pathsPerRule,
            items: { type: 'string', minLength: 1, maxLength: LIMITS.pathPatternLength },
          },
          headers: {
            type: 'array',
            maxItems: LIMITS.headersPerRule,
            items: {
              type: 'object',
              additionalProperties: false,
              required: ['name', 'type', 'value'],
              properties: {
                name: { type: 'string', minLength: 1, maxLength: LIMITS.headerNameLength, pattern: HEADER_NAME_PATTERN },
                type: { type: 'string', enum: ['workspace_secret', 'plaintext', 'opaque'] },
                value: { type: 'string', maxLength: LIMITS.headerValueLength },
              },
            },
          },
          no_proxy: hostPatternList,
        },
      },
    },
    no_proxy: hostPatternList,
    access_control: accessControlSchema,
  },
} as const;

export type HeaderType = 'workspace_secret' | 'plaintext' | 'opaque';

export interface HeaderSpec {
  name: string;
  type: HeaderType;
  value: string;
}

export interface ProxyRule {
  name: string;
  match_hosts: string[];
  match_paths?: string[];
  headers?: HeaderSpec[];
  no_proxy?: string[];
}

export interface ProxyConfig {
  rules?: ProxyRule[];
  no_proxy?: string[];
  access_control?: AccessControl;
}

export type { AccessControl } from '../rules/egress.js';

/** The ajv options the schema is compiled with, at build time and in the fallback below. */
export const AJV_OPTIONS = { allErrors: true, strict: true } as const;
/** The validator `npm run build` generates next to this module (scripts/build-validators.mjs). */
export const PRECOMPILED_VALIDATOR = 'proxy-config.validate.cjs';

const requireHere = createRequire(import.meta.url);
let validator: ValidateFunction | undefined;
let precompiled = false;

/**
 * The schema validator: the standalone one generated at build time (so a sidecar never loads
 * ajv), else compiled here with ajv (running from the TypeScript sources, as the tests do).
 */
function schemaValidator(): ValidateFunction {
  if (validator) return validator;
  try {
    const mod = requireHere(`./${PRECOMPILED_VALIDATOR}`) as ValidateFunction | { default: ValidateFunction };
    validator = typeof mod === 'function' ? mod : mod.default;
    precompiled = true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'MODULE_NOT_FOUND') throw err;
    // Compiled lazily once: ajv code generation is the slow part, validation is cheap.
    const { Ajv } = requireHere('ajv') as { Ajv: typeof AjvClass };
    validator = new Ajv(AJV_OPTIONS).compile(proxyConfigSchema);
  }
  return validator;
}

/** Whether validation uses the build's standalone validator (for tests and diagnostics). */
export function usesPrecompiledValidator(): boolean {
  schemaValidator();
  return precompiled;
}

/** `{KEY}` references, and any brace that is not part of one (a typo that would otherwise be sent verbatim). */
export function templateProblems(value: string): { refs: string[]; stray: boolean } {
  const refs = [...value.matchAll(TEMPLATE_REF_RE)].map((m) => m[1]);
  const rest = value.replace(TEMPLATE_REF_RE, '');
  return { refs, stray: /[{}]/.test(rest) };
}

export function isLegalFieldValue(value: string): boolean {
  return HEADER_VALUE_RE.test(value);
}

function checkHosts(list: string[] | undefined, loc: (string | number)[], issues: ValidationIssue[]): void {
  list?.forEach((p, i) => {
    try {
      compileHostPattern(p);
    } catch (err) {
      issues.push({ loc: [...loc, i], msg: `Invalid host pattern: ${(err as Error).message}`, type: 'value_error' });
    }
  });
}

/**
 * Validates a proxy_config: the JSON schema first, then what a schema cannot say (host and path
 * patterns parse, header values are legal fields, templates are well formed, no duplicate or
 * forbidden header names). Locations are relative to the config object. Messages never quote a
 * header value.
 */
export function validateProxyConfig(value: unknown): ValidationIssue[] {
  const validate = schemaValidator();
  if (!validate(value)) return ajvToIssues(validate.errors);
  const config = value as ProxyConfig;
  const issues: ValidationIssue[] = [];
  checkHosts(config.no_proxy, ['no_proxy'], issues);
  for (const i of accessControlIssues(config.access_control)) issues.push({ ...i, type: 'value_error' });
  const ruleNames = new Map<string, number>();
  (config.rules ?? []).forEach((rule, r) => {
    const at = ['rules', r];
    if (ruleNames.has(rule.name)) {
      issues.push({ loc: [...at, 'name'], msg: `Duplicate rule name '${rule.name}' (also rules[${ruleNames.get(rule.name)}])`, type: 'value_error' });
    } else {
      ruleNames.set(rule.name, r);
    }
    checkHosts(rule.match_hosts, [...at, 'match_hosts'], issues);
    checkHosts(rule.no_proxy, [...at, 'no_proxy'], issues);
    rule.match_paths?.forEach((p, i) => {
      try {
        compilePathPattern(p);
      } catch (err) {
        const msg = err instanceof PatternError ? err.message : 'unparseable';
        issues.push({ loc: [...at, 'match_paths', i], msg: `Invalid path pattern: ${msg}`, type: 'value_error' });
      }
    });
    const seen = new Map<string, number>();
    rule.headers?.forEach((h, j) => {
      const hat = [...at, 'headers', j];
      const lower = h.name.toLowerCase();
      if (FORBIDDEN_HEADER_NAMES.has(lower)) {
        issues.push({ loc: [...hat, 'name'], msg: `Header '${h.name}' cannot be injected (it controls framing, routing or the connection)`, type: 'value_error' });
      }
      if (seen.has(lower)) {
        issues.push({ loc: [...hat, 'name'], msg: `Header '${h.name}' is set twice in rule '${rule.name}' (also headers[${seen.get(lower)}])`, type: 'value_error' });
      } else {
        seen.set(lower, j);
      }
      if (h.type === 'workspace_secret') {
        const { refs, stray } = templateProblems(h.value);
        if (refs.length === 0) {
          issues.push({ loc: [...hat, 'value'], msg: 'A workspace_secret value must reference at least one secret as {KEY}', type: 'value_error' });
        } else if (stray) {
          issues.push({ loc: [...hat, 'value'], msg: 'Malformed {KEY} reference: a key is letters, digits and _, not starting with a digit', type: 'value_error' });
        }
      }
      // Sealed opaque values are checked after decryption (resolve); a template is checked with
      // its references blanked out, the resolved value again at resolve time.
      const candidate = h.type === 'workspace_secret' ? h.value.replace(TEMPLATE_REF_RE, 'x') : h.value;
      if (!(h.type === 'opaque' && candidate.startsWith('kg1.')) && !isLegalFieldValue(candidate)) {
        issues.push({
          loc: [...hat, 'value'],
          msg: 'Not a legal HTTP field value (control characters such as CR, LF or NUL, characters above U+00FF, or leading/trailing whitespace)',
          type: 'value_error',
        });
      }
    });
  });
  return issues;
}
