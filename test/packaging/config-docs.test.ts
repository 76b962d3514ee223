// Every KEYGATE_* variable that the API server, the control plane, the deploy tool, the sandbox
// area, the proxy and the CLI read is documented in the README or an area README (issue #17: four
// were documented nowhere).
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT } from '../helpers/cli.js';

/** Source read by these surfaces (owners of other areas keep their own lists). */
const SOURCES = ['src/server', 'src/control-plane', 'src/deploy', 'src/cli', 'src/sandbox-api/area.ts', 'src/proxy', 'src/admin', 'src/runtime'];

function files(rel: string): string[] {
  const abs = path.join(REPO_ROOT, rel);
  if (statSync(abs).isFile()) return [abs];
  return readdirSync(abs, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts'))
    .map((f) => path.join(abs, f));
}

/**
 * Names read from an environment object: `env.KEYGATE_X`, `env?.KEYGATE_X`, `env['KEYGATE_X']`,
 * and through src/settings.ts: `intSetting(env, 'KEYGATE_X', ...)`, `switchSetting(env, 'KEYGATE_X')`.
 */
function variablesRead(text: string): string[] {
  return [...text.matchAll(/env\??\.(KEYGATE_[A-Z0-9_]+)|env\[['"](KEYGATE_[A-Z0-9_]+)['"]\]|Setting\([^,()]+,\s*['"](KEYGATE_[A-Z0-9_]+)['"]/g)].map((m) => m[1] ?? m[2] ?? m[3]);
}

const docs = [path.join(REPO_ROOT, 'README.md'), ...readdirSync(path.join(REPO_ROOT, 'src')).map((d) => path.join(REPO_ROOT, 'src', d, 'README.md'))]
  .filter((f) => {
    try {
      return statSync(f).isFile();
    } catch {
      return false;
    }
  })
  .map((f) => readFileSync(f, 'utf8'))
  .join('\n');

describe('configuration documentation', () => {
  const read = [...new Set(SOURCES.flatMap(files).flatMap((f) => variablesRead(readFileSync(f, 'utf8'))))].sort();

  it('finds the variables it is about (the scan works)', () => {
    expect(read).toEqual(
      expect.arrayContaining(['KEYGATE_SANDBOX_PROXY_CA_FILE', 'KEYGATE_SANDBOX_PROXY_RESOLVE', 'KEYGATE_MAX_UPLOAD_BYTES', 'KEYGATE_RELAY_GC', 'KEYGATE_V8_WASM_TIERUP']),
    );
  });

  it('documents every one of them', () => {
    expect(read.filter((v) => !new RegExp(`\\b${v}\\b`).test(docs))).toEqual([]);
  });

  it('says what the memory switches take', () => {
    const readme = readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8');
    expect(readme).toMatch(/`KEYGATE_RELAY_GC=0`/);
    expect(readme).toMatch(/`KEYGATE_V8_WASM_TIERUP=1`/);
  });

  it('says what the sandbox proxy variables take', () => {
    const readme = readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8');
    expect(readme).toMatch(/`KEYGATE_SANDBOX_PROXY_RESOLVE=HOST:PORT:ADDR\[,\.\.\.\]`/);
    expect(readme).toMatch(/`KEYGATE_SANDBOX_PROXY_CA_FILE=\/path\/ca\.pem\[,\.\.\.\]`/);
  });
});
