import { watch, readFileSync, statSync, type FSWatcher } from '../builtins/fs.js';
import path from 'node:path';
import type { Logger } from '../log.js';
import { ValidationFailure } from '../validation/errors.js';
import type { AppliedConfig, ConfigHolder } from './config-holder.js';

/**
 * Re-reading the configuration: on SIGHUP, or when the config file or the secret source changes
 * on disk. Each reload goes through the holder (validate, resolve, compile, then swap), so a
 * broken file or a missing secret is logged with its reason and the configuration in force stays.
 *
 * Files are watched through their directory: editors and `kubectl`/kubelet replace files by
 * renaming, which a watch on the file itself would lose after the first change.
 */
export interface ReloaderOptions {
  holder: ConfigHolder;
  /** The proxy_config file to re-read; without one, the last applied configuration is re-resolved. */
  configFile?: string;
  /** Files or directories whose change triggers a reload (the config file, the secrets file or directory). */
  watch?: string[];
  /** Changes within this window become one reload (default 250 ms). */
  debounceMs?: number;
  logger?: Logger;
}

export class Reloader {
  private watchers: FSWatcher[] = [];
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private again = false;
  private readonly onHup = () => void this.reload('sighup');

  constructor(private readonly opts: ReloaderOptions) {}

  /**
   * Re-reads and applies. Never throws: a rejected configuration is logged at error level with
   * its issues and `undefined` is returned.
   */
  async reload(source: string): Promise<AppliedConfig | undefined> {
    const { holder, configFile, logger } = this.opts;
    try {
      if (!configFile) return await holder.reapply(source);
      let value: unknown;
      try {
        value = JSON.parse(readFileSync(configFile, 'utf8'));
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        // JSON.parse messages quote the text: never log them (the file holds opaque values).
        throw new Error(`cannot read ${configFile}: ${code ?? 'not valid JSON'}`);
      }
      return await holder.apply(value, { source });
    } catch (err) {
      logger?.error(
        {
          source,
          file: configFile,
          issues: err instanceof ValidationFailure ? err.issues.map((i) => ({ loc: i.loc, msg: i.msg })) : undefined,
          reason: err instanceof ValidationFailure ? undefined : (err as Error).message,
        },
        'reload rejected; the previous configuration stays in force',
      );
      return undefined;
    }
  }

  /** Coalesces bursts of changes; a change during a reload schedules one more afterwards. */
  private schedule(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (this.running) {
        this.again = true;
        return;
      }
      this.running = this.reload('file').finally(() => {
        this.running = undefined;
        if (this.again) {
          this.again = false;
          this.schedule();
        }
      });
    }, this.opts.debounceMs ?? 250);
    this.timer.unref?.();
  }

  /** Starts watching (and handling SIGHUP when `sighup` is true). */
  start({ sighup = true }: { sighup?: boolean } = {}): void {
    if (sighup) process.on('SIGHUP', this.onHup);
    const byDir = new Map<string, Set<string> | 'all'>();
    for (const p of this.opts.watch ?? []) {
      const abs = path.resolve(p);
      let isDir = false;
      try {
        isDir = statSync(abs).isDirectory();
      } catch {
        /* not there yet: watch its directory for it to appear */
      }
      if (isDir) byDir.set(abs, 'all');
      else {
        const dir = path.dirname(abs);
        const cur = byDir.get(dir);
        if (cur !== 'all') byDir.set(dir, new Set([...(cur ?? []), path.basename(abs)]));
      }
    }
    for (const [dir, names] of byDir) {
      try {
        const w = watch(dir, { persistent: false }, (_event, filename) => {
          // Lock and temp files of the secrets store's own writes come and go: the rename onto the real name is the change.
          if (names === 'all' || (filename && names.has(filename.toString()))) this.schedule();
        });
        w.on('error', (err) => this.opts.logger?.warn({ dir, reason: err.message }, 'watching for configuration changes stopped'));
        this.watchers.push(w);
      } catch (err) {
        this.opts.logger?.warn({ dir, reason: (err as Error).message }, 'cannot watch for configuration changes (reload with SIGHUP)');
      }
    }
  }

  async stop(): Promise<void> {
    process.off('SIGHUP', this.onHup);
    clearTimeout(this.timer);
    for (const w of this.watchers) w.close();
    this.watchers = [];
    await this.running;
  }
}
