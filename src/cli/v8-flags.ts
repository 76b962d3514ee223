import v8 from 'node:v8';

/**
 * V8 settings for the long-running servers (`proxy`, `serve`, `start`), applied before their
 * first upstream connection.
 *
 * undici parses HTTP/1.1 responses with llhttp compiled to WebAssembly. V8 runs it first as
 * baseline (Liftoff) code and, once hot, recompiles the parser function with TurboFan; that one
 * compilation took about 35 MiB of compiler memory for a moment (heaptrack: Zone::Expand under
 * wasm::CompileLazy), which alone set a sidecar's peak RSS under its first burst of requests and
 * left it 8 MiB larger afterwards. Baseline code only: no spike, and the proxy's CPU per request
 * measured the same within noise (bench/README.md). Wasm compiler flags are read when a module
 * is compiled, so this works at run time, unlike heap sizing flags (see the Dockerfile's
 * --max-semi-space-size).
 *
 * KEYGATE_V8_WASM_TIERUP=1 leaves V8's default.
 */
export function leanServerFlags(env: NodeJS.ProcessEnv = process.env): boolean {
  if (env.KEYGATE_V8_WASM_TIERUP === '1') return false;
  v8.setFlagsFromString('--liftoff-only');
  return true;
}
