import { inspect } from '../builtins/util.js';
import { compileHostPattern, compilePathPattern, type HostPattern, type PathPattern } from './patterns.js';
import { compileEgress, type AccessControl, type EgressPolicy } from './egress.js';

/** A header to inject, already resolved (secret values in clear, in memory only). */
export interface ResolvedHeader {
  name: string;
  value: string;
}

export interface ResolvedRule {
  name: string;
  match_hosts: string[];
  match_paths?: string[];
  no_proxy?: string[];
  headers: ResolvedHeader[];
}

/** A proxy_config whose `{KEY}` templates and opaque values have been resolved. */
export interface ResolvedProxyConfig {
  rules: ResolvedRule[];
  no_proxy: string[];
  /** Egress policy (no secrets in it): copied as is. */
  access_control?: AccessControl;
}

export type Decision = 'bypass' | 'intercept' | 'tunnel';

/** A lower-case field name as the variable a CGI-style server reads it through (`_` is `-`). */
export function asVariable(lower: string): string {
  return lower.includes('_') ? lower.replace(/_/g, '-') : lower;
}

/**
 * One rule ready for the data path: patterns compiled, header names lower-cased, the injected
 * list pre-built so a request allocates nothing for it. Header values are kept out of JSON and
 * util.inspect so that logging a rule by mistake cannot print a credential.
 */
export class CompiledRule {
  /** Lower-cased names of the injected headers (what logs may show). */
  readonly headerNames: readonly string[];
  /** For deleting client-sent headers of the same names. */
  readonly headerNameSet: ReadonlySet<string>;
  /**
   * The same names with every `_` read as `-`: the variable CGI, PHP and WSGI servers (and the
   * frameworks on them) read a field through, where `X_Key` and `X-Key` are one. A client field
   * whose name reads so is dropped too (headers.ts), else it is a second value of the injected one.
   */
  readonly headerVariableSet: ReadonlySet<string>;
  /** Some injected name has a `_` (then every client name with a `-` is read as a variable too). */
  readonly headerNameHasUnderscore: boolean;
  readonly #headers: readonly (readonly [string, string])[];

  constructor(
    readonly name: string,
    readonly index: number,
    readonly hosts: readonly HostPattern[],
    readonly noProxy: readonly HostPattern[],
    readonly paths: readonly PathPattern[],
    headers: ResolvedHeader[],
  ) {
    this.#headers = Object.freeze(headers.map((h) => Object.freeze([h.name.toLowerCase(), h.value] as const)));
    this.headerNames = Object.freeze(this.#headers.map((h) => h[0]));
    this.headerNameSet = new Set(this.headerNames);
    this.headerVariableSet = new Set(this.headerNames.map(asVariable));
    this.headerNameHasUnderscore = this.headerNames.some((n) => n.includes('_'));
    Object.freeze(this);
  }

  /** `[lower-case name, value]` pairs to set on a matching request. */
  get headers(): readonly (readonly [string, string])[] {
    return this.#headers;
  }

  matchesHost(host: string, port: number): boolean {
    return this.hosts.some((p) => p.test(host, port)) && !this.noProxy.some((p) => p.test(host, port));
  }

  matchesPath(path: string): boolean {
    return this.paths.length === 0 || this.paths.some((p) => p.test(path));
  }

  toJSON(): object {
    return { name: this.name, headers: this.headerNames };
  }

  [inspect.custom](): string {
    return `CompiledRule(${this.name}: ${this.headerNames.join(', ')})`;
  }
}

export interface CompiledConfig {
  readonly rules: readonly CompiledRule[];
  /** Config-level no_proxy entries as written (for the sandbox's NO_PROXY). */
  readonly noProxy: readonly string[];
  /** Which destinations may be reached at all (access_control plus the built-in denies). */
  readonly egress: EgressPolicy;
  decide(host: string, port: number): Decision;
  /** The first rule for this request, undefined when none applies or the host is under config-level no_proxy. */
  pickRule(host: string, port: number, path: string): CompiledRule | undefined;
}

/**
 * Compiles a resolved configuration into an immutable value. Hosts and paths given to
 * decide/pickRule must already be normalised (normaliseHost, normalisePath). Throws PatternError
 * for a pattern that validation should have caught.
 */
export function compileConfig(resolved: ResolvedProxyConfig): CompiledConfig {
  const bypass = (resolved.no_proxy ?? []).map(compileHostPattern);
  const rules = (resolved.rules ?? []).map(
    (r, i) =>
      new CompiledRule(
        r.name,
        i,
        r.match_hosts.map(compileHostPattern),
        (r.no_proxy ?? []).map(compileHostPattern),
        (r.match_paths ?? []).map(compilePathPattern),
        r.headers ?? [],
      ),
  );
  const noProxy = Object.freeze([...(resolved.no_proxy ?? [])]);
  const config: CompiledConfig = {
    rules: Object.freeze(rules),
    noProxy,
    egress: compileEgress(resolved.access_control),
    decide(host, port) {
      if (bypass.some((p) => p.test(host, port))) return 'bypass';
      for (const rule of rules) if (rule.matchesHost(host, port)) return 'intercept';
      return 'tunnel';
    },
    pickRule(host, port, path) {
      // The whole decision again, config-level no_proxy first: a push that puts an intercepted
      // host under no_proxy reaches the next request on a connection opened before it (decide
      // ran once, at that connection's CONNECT), and "nothing injected" holds for it too.
      if (bypass.length !== 0 && bypass.some((p) => p.test(host, port))) return undefined;
      for (const rule of rules) if (rule.matchesHost(host, port) && rule.matchesPath(path)) return rule;
      return undefined;
    },
  };
  return Object.freeze(config);
}

/** A configuration that intercepts nothing (every CONNECT becomes a blind tunnel). */
export function emptyConfig(): CompiledConfig {
  return compileConfig({ rules: [], no_proxy: [] });
}
