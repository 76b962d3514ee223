import { createRequire } from 'node:module';
import type * as Http from 'node:http';

/**
 * `node:http`, loaded with `require` rather than an ES import. Since Node 22, `node:http` has lazy
 * getters (`WebSocket`, `CloseEvent`, `MessageEvent`) backed by Node's bundled undici, and an
 * ES import builds the module's ES facade by reading every export, getters included. So the
 * first `import ... from 'node:http'` anywhere in the process loaded all of Node's bundled
 * undici, about 13 MiB of RSS on Node 24 (bench/README.md), for features keygate never uses.
 * Modules that a sidecar loads take `http` and `STATUS_CODES` from here; `import type` from
 * 'node:http' is fine (erased at build). test/cli/proxy-imports.test.ts checks that
 * `keygate proxy` does not load that undici.
 */
const http = createRequire(import.meta.url)('node:http') as typeof Http;

export default http;
export const STATUS_CODES = http.STATUS_CODES;
