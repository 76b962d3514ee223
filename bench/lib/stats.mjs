// Latency summaries shared by the load generators (bench/client.mjs, bench/h2-client.mjs).

export function percentile(sorted, p) {
  if (!sorted.length) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

/** Latencies in ms -> count, p50/p90/p99, mean, max. */
export function summary(lat) {
  const sorted = Float64Array.from(lat).sort();
  const sum = sorted.reduce((a, b) => a + b, 0);
  return {
    n: sorted.length,
    p50_ms: percentile(sorted, 50),
    p90_ms: percentile(sorted, 90),
    p99_ms: percentile(sorted, 99),
    mean_ms: sorted.length ? sum / sorted.length : null,
    max_ms: sorted.length ? sorted[sorted.length - 1] : null,
  };
}
