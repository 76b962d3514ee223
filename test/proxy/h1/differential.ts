/**
 * What the differential tests of the fast path's parsers share: Node's own HTTP parser (llhttp,
 * the native binding `http.Server` uses, reached through `_http_common` in tests only) and a
 * seeded PRNG, so every mutation run is the same run.
 */
import { createRequire } from 'node:module';

export interface NodeHttpParser {
  initialize(type: number, resource: object, maxHeaderSize: number, lenient: number): void;
  execute(buf: Buffer): number | Error;
  finish(): undefined | Error;
  close(): void;
  [k: number]: unknown;
}

export interface NodeHttpParserClass {
  new (): NodeHttpParser;
  REQUEST: number;
  RESPONSE: number;
  kOnHeaders: number;
  kOnHeadersComplete: number;
  kOnBody: number;
  kOnMessageComplete: number;
  kLenientNone: number;
}

const common = createRequire(import.meta.url)('_http_common') as { HTTPParser: NodeHttpParserClass; methods: string[] };
export const HTTPParser = common.HTTPParser;
/** Method names by the index Node's parser reports. */
export const METHODS = common.methods;

export const bytes = (s: string) => Buffer.from(s, 'latin1');

/** Deterministic PRNG (mulberry32). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
