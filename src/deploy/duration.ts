/**
 * Durations on the command line: `90` (seconds), `500ms`, `30s`, `10m`, `2h`, `1d`, or a
 * combination such as `1m30s`. Returns milliseconds, or null when the text is not a duration.
 */
export function parseDuration(text: string): number | null {
  const t = text.trim();
  if (/^\d+(?:\.\d+)?$/.test(t)) return Math.round(Number(t) * 1000);
  const unit: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/gy;
  let total = 0;
  let pos = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(t)) !== null) {
    total += Number(m[1]) * unit[m[2]];
    pos = re.lastIndex;
  }
  if (pos === 0 || pos !== t.length) return null;
  return Math.round(total);
}

/** Elapsed time as the status lines show it: `3.1s`, `74.0s`, `2m05s`. */
export function formatElapsed(ms: number): string {
  const s = Math.max(0, ms) / 1000;
  if (s < 100) return `${s.toFixed(1)}s`;
  const whole = Math.floor(s);
  return `${Math.floor(whole / 60)}m${String(whole % 60).padStart(2, '0')}s`;
}

/** Byte counts for people: `512 B`, `1.5 KiB`, `12.3 MiB`. */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = -1;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}
