import { formatBytes, formatElapsed } from './duration.js';
import type { LogEntry } from './client.js';

/** Colours only for a terminal, and never when NO_COLOR is set to anything (https://no-color.org). */
export function colourEnabled(stream: NodeJS.WriteStream | { isTTY?: boolean }, env: NodeJS.ProcessEnv = process.env): boolean {
  return Boolean(stream.isTTY) && !env.NO_COLOR;
}

const SGR = { red: 31, green: 32, yellow: 33, blue: 34, magenta: 35, cyan: 36, grey: 90, bold: 1 } as const;
export type Colour = keyof typeof SGR;

export function paint(on: boolean, colour: Colour, text: string): string {
  return on ? `\u001b[${SGR[colour]}m${text}\u001b[0m` : text;
}

/** `[####------]  42%  1.2 MiB/2.9 MiB` for a width of bar cells. */
export function progressBar(sent: number, total: number, width = 24): string {
  const frac = total > 0 ? Math.min(1, sent / total) : 1;
  const filled = Math.round(frac * width);
  return `[${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${String(Math.floor(frac * 100)).padStart(3)}%  ${formatBytes(sent)}/${formatBytes(total)}`;
}

/** Plain-text table with left-aligned columns; empty cells show as '-'. */
export function formatTable(headers: string[], rows: (string | null | undefined)[][]): string {
  const cells = rows.map((r) => headers.map((_, i) => (r[i] === null || r[i] === undefined || r[i] === '' ? '-' : String(r[i]))));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => r[i].length)));
  const line = (r: string[]) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]))).join('  ');
  return [line(headers), ...cells.map(line)].join('\n');
}

export function statusColour(status: string): Colour {
  if (status === 'DEPLOYED') return 'green';
  if (status.endsWith('_FAILED') || status === 'INTERRUPTED') return 'red';
  if (status === 'SKIPPED' || status === 'UNKNOWN') return 'yellow';
  return 'cyan';
}

/** One log line for people: `2025-01-01T10:00:00.000Z build  npm ci ...`. */
export function formatLogLine(l: LogEntry, colour = false): string {
  const lvl = (l.level ?? '').toLowerCase();
  const tag = paint(colour, 'grey', `${l.timestamp} ${l.type.padEnd(6)}`);
  const msg = lvl === 'error' || lvl === 'fatal' ? paint(colour, 'red', l.message) : lvl === 'warn' || lvl === 'warning' ? paint(colour, 'yellow', l.message) : l.message;
  return `${tag} ${msg}`;
}

export interface Streams {
  stdout: NodeJS.WritableStream & { isTTY?: boolean };
  stderr: NodeJS.WritableStream & { isTTY?: boolean };
}

/**
 * Everything `keygate deploy` tells its user. Human mode: the narrative on stdout, warnings on
 * stderr, and the ephemeral progress bar/spinner on stderr only when it is a terminal. JSON mode:
 * exactly one JSON object per line on stdout and nothing else there.
 */
export class Reporter {
  readonly json: boolean;
  readonly #out: Streams['stdout'];
  readonly #err: Streams['stderr'];
  readonly #colourOut: boolean;
  readonly #colourErr: boolean;
  readonly #live: boolean;
  #ephemeral = false;
  #spinnerTimer?: NodeJS.Timeout;
  #lastDraw = 0;

  constructor(opts: { json: boolean; streams?: Streams; env?: NodeJS.ProcessEnv }) {
    const env = opts.env ?? process.env;
    this.json = opts.json;
    this.#out = opts.streams?.stdout ?? process.stdout;
    this.#err = opts.streams?.stderr ?? process.stderr;
    this.#colourOut = !this.json && colourEnabled(this.#out, env);
    this.#colourErr = colourEnabled(this.#err, env);
    this.#live = !this.json && Boolean(this.#err.isTTY) && !env.CI;
  }

  get colour(): boolean {
    return this.#colourOut;
  }

  emit(obj: Record<string, unknown>): void {
    this.#out.write(JSON.stringify(obj) + '\n');
  }

  #clear(): void {
    if (this.#ephemeral) {
      this.#err.write('\r\u001b[2K');
      this.#ephemeral = false;
    }
  }

  #print(line: string): void {
    this.#clear();
    this.#out.write(line + '\n');
  }

  step(n: number, total: number, title: string): void {
    if (this.json) return this.emit({ event: 'step', step: n, total, title });
    this.#print(paint(this.#colourOut, 'bold', `[${n}/${total}] ${title}`));
  }

  /** A detail line under the current step. */
  info(message: string, fields: Record<string, unknown> = {}): void {
    if (this.json) return this.emit({ event: 'info', message, ...fields });
    this.#print(`      ${message}`);
  }

  ok(message: string, fields: Record<string, unknown> = {}): void {
    if (this.json) return this.emit({ event: 'check', ok: true, message, ...fields });
    this.#print(`      ${paint(this.#colourOut, 'green', '✓')} ${message}`);
  }

  warn(message: string): void {
    if (this.json) return this.emit({ event: 'warning', message });
    this.#clear();
    this.#err.write(`${paint(this.#colourErr, 'yellow', 'warning:')} ${message}\n`);
  }

  /** Upload progress: redrawn at most ~10 times a second, only on a terminal. */
  progress(sent: number, total: number): void {
    if (!this.#live) return;
    const now = Date.now();
    if (sent < total && now - this.#lastDraw < 100) return;
    this.#lastDraw = now;
    this.#err.write(`\r\u001b[2K      ${progressBar(sent, total)}`);
    this.#ephemeral = true;
  }

  status(status: string, elapsedMs: number, revisionId: string, message?: string | null): void {
    if (this.json) return this.emit({ event: 'status', status, elapsed_s: Math.round(elapsedMs / 100) / 10, revision_id: revisionId, ...(message ? { message } : {}) });
    const extra = message ? ` ${message}` : '';
    this.#print(`      ${paint(this.#colourOut, statusColour(status), status)} (${formatElapsed(elapsedMs)})${extra}`);
  }

  /** A spinner with the running time of the current status, on a terminal only. */
  spin(label: () => string): void {
    if (!this.#live || this.#spinnerTimer) return;
    const frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let i = 0;
    this.#spinnerTimer = setInterval(() => {
      this.#err.write(`\r\u001b[2K      ${paint(this.#colourErr, 'cyan', frames[i++ % frames.length])} ${label()}`);
      this.#ephemeral = true;
    }, 100);
    this.#spinnerTimer.unref();
  }

  stopSpin(): void {
    if (this.#spinnerTimer) clearInterval(this.#spinnerTimer);
    this.#spinnerTimer = undefined;
    this.#clear();
  }

  log(entry: LogEntry): void {
    if (this.json) return this.emit({ event: 'log', ...entry });
    this.#print(`      ${formatLogLine(entry, this.#colourOut)}`);
  }

  /**
   * A line of a local tool's output (docker build/push), streamed as it comes: on stderr for people,
   * so stdout keeps the narrative; a `log` event in JSON mode.
   */
  toolOutput(origin: string, line: string, stream: 'stdout' | 'stderr'): void {
    if (this.json) return this.emit({ event: 'log', timestamp: new Date().toISOString(), type: 'build', origin, stream, message: line });
    this.#clear();
    this.#err.write(`      ${paint(this.#colourErr, 'grey', '│')} ${line}\n`);
  }

  /** Plain line in human mode (headings, the URL). */
  line(text: string): void {
    if (this.json) return;
    this.#print(text);
  }

  fail(message: string): void {
    if (this.json) return;
    this.#clear();
    this.#err.write(`${paint(this.#colourErr, 'red', 'error:')} ${message}\n`);
  }

  close(): void {
    this.stopSpin();
  }
}
