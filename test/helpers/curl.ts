// curl as a user types it, for the tests that need a client other than Node's (its own
// Expect: 100-continue, its header handling). `-w` appends the status on a line of its own.
import { spawnSync } from 'node:child_process';

export interface CurlResult {
  status: number;
  /** Parsed JSON when the body is JSON, else the text (SSE, plain text). */
  body: any;
  stderr: string;
}

export function curl(args: string[]): CurlResult {
  const r = spawnSync('curl', ['-sS', '-w', '\n%{http_code}', ...args], { encoding: 'utf8', timeout: 60_000, maxBuffer: 64 * 1024 * 1024 });
  const lines = r.stdout.split('\n');
  const status = Number(lines.pop());
  const text = lines.join('\n');
  let body: any = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON: the caller's assertion on the shape shows it */
  }
  return { status, body, stderr: r.stderr };
}
