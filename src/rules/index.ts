// Pure decisions of the proxy: no sockets, no I/O. Everything here can be tested in isolation.
export { normaliseHost, tryNormaliseHost, parseAuthority, formatAuthority, isIpLiteral, RuleInputError } from './host.js';
export { normalisePath, isPathRefusal, type NormalisedPath, type PathRefusal } from './path.js';
export { compileHostPattern, compilePathPattern, PatternError, type HostPattern, type PathPattern } from './patterns.js';
export {
  compileConfig,
  emptyConfig,
  CompiledRule,
  type CompiledConfig,
  type Decision,
  type ResolvedProxyConfig,
  type ResolvedRule,
  type ResolvedHeader,
} from './compile.js';
export { compileEgress, parseCidr, parsePortRange, unwrapAddress, type AccessControl, type EgressPolicy, type EgressRefusal } from './egress.js';
