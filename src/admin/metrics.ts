import type { EventEmitter } from 'node:events';

/**
 * Prometheus text exposition (format 0.0.4) of what the proxy did, built from its events. A tiny
 * registry instead of a client library: a handful of counters, one gauge per quantity, one
 * histogram. Label values are rule names, decisions and status codes: never header values, never
 * request paths (unbounded, and may carry tokens).
 */

type Labels = Record<string, string>;

function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

function labelText(labels: Labels): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabel(v)}"`);
  return parts.length ? `{${parts.join(',')}}` : '';
}

/**
 * The identity of a label set, for the series maps. Built per event on the request path, so
 * cheap: no escaping, no arrays (labelText, the exposition form, is built at scrape time).
 * Each value is length-prefixed, so no rule name can make two label sets collide.
 */
function seriesKey(labels: Labels): string {
  let key = '';
  for (const k in labels) {
    const v = labels[k];
    key += `${k}=${v.length}:${v};`;
  }
  return key;
}

function formatNumber(n: number): string {
  if (Number.isNaN(n)) return 'NaN';
  if (n === Infinity) return '+Inf';
  if (n === -Infinity) return '-Inf';
  return String(n);
}

interface Metric {
  render(): string[];
}

class Counter implements Metric {
  private readonly values = new Map<string, { labels: Labels; value: number }>();
  constructor(
    readonly name: string,
    readonly help: string,
    private readonly kind: 'counter' | 'gauge' = 'counter',
    /** An unlabelled metric, exposed as 0 from the start so dashboards and alerts see it. */
    private readonly unlabelled = false,
  ) {}

  /** The series of `labels`, created at 0; the object stays this series' for the registry's life. */
  entry(labels: Labels): { labels: Labels; value: number } {
    const key = seriesKey(labels);
    let e = this.values.get(key);
    if (!e) this.values.set(key, (e = { labels, value: 0 }));
    return e;
  }

  inc(labels: Labels = {}, by = 1): void {
    this.entry(labels).value += by;
  }

  set(labels: Labels, value: number): void {
    this.entry(labels).value = value;
  }

  get(labels: Labels = {}): number {
    return this.values.get(seriesKey(labels))?.value ?? 0;
  }

  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.kind}`];
    if (this.values.size === 0 && this.unlabelled) out.push(`${this.name} 0`);
    for (const { labels, value } of this.values.values()) out.push(`${this.name}${labelText(labels)} ${formatNumber(value)}`);
    return out;
  }
}

interface HistogramSeries {
  labels: Labels;
  counts: number[];
  sum: number;
  count: number;
}

class Histogram implements Metric {
  private readonly series = new Map<string, HistogramSeries>();
  constructor(
    readonly name: string,
    readonly help: string,
    readonly buckets: number[],
  ) {}

  observe(labels: Labels, value: number): void {
    this.observeIn(this.entry(labels), value);
  }

  /** The series of `labels`, created empty; the object stays this series' for the registry's life. */
  entry(labels: Labels): HistogramSeries {
    const key = seriesKey(labels);
    let s = this.series.get(key);
    if (!s) this.series.set(key, (s = { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 }));
    return s;
  }

  observeIn(s: HistogramSeries, value: number): void {
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]) s.counts[i]++;
    s.sum += value;
    s.count++;
  }

  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`];
    for (const { labels, counts, sum, count } of this.series.values()) {
      this.buckets.forEach((le, i) => out.push(`${this.name}_bucket${labelText({ ...labels, le: formatNumber(le) })} ${counts[i]}`));
      out.push(`${this.name}_bucket${labelText({ ...labels, le: '+Inf' })} ${count}`);
      out.push(`${this.name}_sum${labelText(labels)} ${formatNumber(sum)}`);
      out.push(`${this.name}_count${labelText(labels)} ${count}`);
    }
    return out;
  }
}

export const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** The subset of the proxy's event records the metrics read (see src/proxy/context.ts). */
interface RequestEvent {
  decision: string;
  rule: string | null;
  status: number;
  injected?: readonly string[];
  duration_ms: number;
  /** The client's protocol (h1 or h2), whichever exchange served it. */
  proto: string;
}
interface TunnelEvent {
  phase: 'open' | 'close';
  decision: string;
  status?: number;
}

interface RequestSeries {
  requests: { value: number };
  injections?: { value: number };
  injectedHeaders?: { value: number };
  duration: HistogramSeries;
}

export class ProxyMetrics {
  readonly requests = new Counter('keygate_proxy_requests_total', 'HTTP requests handled by the proxy, by decision, matching rule, response status and client protocol (h1, h2).');
  readonly injections = new Counter('keygate_proxy_injections_total', 'Requests into which a rule injected headers, by rule.');
  readonly injectedHeaders = new Counter('keygate_proxy_injected_headers_total', 'Header values injected, by rule.');
  readonly upstreamErrors = new Counter('keygate_proxy_upstream_errors_total', 'Upstream connections or requests that failed (unreachable, TLS verification, timeout).', 'counter', true);
  readonly tlsHandshakes = new Counter('keygate_proxy_tls_handshakes_total', 'TLS handshakes with clients on intercepted tunnels, by result.');
  readonly certCacheHits = new Counter('keygate_proxy_certificate_cache_hits_total', 'Intercepted tunnels served with a cached host certificate.', 'counter', true);
  readonly certMints = new Counter('keygate_proxy_certificates_minted_total', 'Host certificates minted by the proxy CA.', 'counter', true);
  readonly tunnels = new Counter('keygate_proxy_tunnels_total', 'Blind tunnels closed, by decision and CONNECT status.');
  readonly openTunnels = new Counter('keygate_proxy_open_tunnels', 'Blind tunnels currently open.', 'gauge', true);
  readonly duration = new Histogram('keygate_proxy_request_duration_seconds', 'Time from request to the end of the response, by decision and client protocol (h1, h2).', DURATION_BUCKETS);
  readonly configGeneration = new Counter('keygate_proxy_config_generation', 'Generation of the configuration in force (0: none applied).', 'gauge', true);
  readonly configApplies = new Counter('keygate_proxy_config_applies_total', 'Configuration pushes and reloads, by source and result (applied or rejected).');
  readonly egressDenied = new Counter('keygate_proxy_egress_denied_total', 'Destinations refused by the egress policy, by kind of refusal.');
  readonly connectionsRefused = new Counter('keygate_proxy_connections_refused_total', 'Client connections refused by a connection limit, by limit.');
  readonly clientErrors = new Counter('keygate_proxy_client_errors_total', 'Malformed or over-limit client requests answered by the proxy itself, by status.');
  readonly fastPathFallbacks = new Counter('keygate_proxy_fast_path_fallbacks_total', 'Intercepted connections handed from the fast path to the Node HTTP path, by reason (head: a request head the strict parser does not take; draining: the proxy is shutting down).');
  readonly caExpiryDays = new Counter('keygate_proxy_ca_expiry_days', 'Whole days until the proxy CA expires (negative once expired).', 'gauge');

  private readonly all: Metric[] = [
    this.requests,
    this.injections,
    this.injectedHeaders,
    this.upstreamErrors,
    this.tlsHandshakes,
    this.certCacheHits,
    this.certMints,
    this.tunnels,
    this.openTunnels,
    this.duration,
    this.configGeneration,
    this.configApplies,
    this.egressDenied,
    this.connectionsRefused,
    this.clientErrors,
    this.fastPathFallbacks,
    this.caExpiryDays,
  ];
  private caExpirySource?: () => { daysLeft: number };

  /**
   * Subscribes to a proxy's events; returns a function that unsubscribes. `caExpiry` (the proxy
   * handle's) is read at each scrape, so the gauge is current for a sidecar that runs for months.
   */
  attach(events: EventEmitter, caExpiry?: () => { daysLeft: number }): () => void {
    this.caExpirySource = caExpiry;
    const onRequest = (r: RequestEvent) => {
      const s = this.requestSeries(r);
      s.requests.value++;
      const injected = r.injected?.length ?? 0;
      if (injected > 0) {
        // Made on the first injection only: a rule that never injected has no series (as before).
        s.injections ??= this.injections.entry({ rule: r.rule ?? '' });
        s.injectedHeaders ??= this.injectedHeaders.entry({ rule: r.rule ?? '' });
        s.injections.value++;
        s.injectedHeaders.value += injected;
      }
      this.duration.observeIn(s.duration, r.duration_ms / 1000);
    };
    const onTunnel = (t: TunnelEvent) => {
      if (t.phase === 'open') {
        this.openTunnels.inc({});
        return;
      }
      this.tunnels.inc({ decision: t.decision, status: String(t.status ?? 0) });
      // Only a tunnel that was established (CONNECT answered 200) was counted as open.
      if (t.status === 200) this.openTunnels.inc({}, -1);
    };
    const onTls = (e: { ok: boolean }) => this.tlsHandshakes.inc({ result: e.ok ? 'ok' : 'failed' });
    const onCert = (e: { cached: boolean }) => (e.cached ? this.certCacheHits.inc() : this.certMints.inc());
    const onUpstreamError = () => this.upstreamErrors.inc();
    const onEgressDenied = (e: { kind: string }) => this.egressDenied.inc({ kind: e.kind });
    const onConnectionRefused = (e: { reason: string }) => this.connectionsRefused.inc({ limit: e.reason });
    const onClientError = (e: { status?: number }) => this.clientErrors.inc({ status: String(e.status ?? 0) });
    const onFallback = (e: { reason: string }) => this.fastPathFallbacks.inc({ reason: e.reason });
    const extra: [string, (e: any) => void][] = [ // eslint-disable-line @typescript-eslint/no-explicit-any
      ['egress_denied', onEgressDenied],
      ['connection_refused', onConnectionRefused],
      ['client_error', onClientError],
      ['fast_path_fallback', onFallback],
    ];
    for (const [name, fn] of extra) events.on(name, fn);
    events.on('request', onRequest);
    events.on('tunnel', onTunnel);
    events.on('tls_handshake', onTls);
    events.on('cert', onCert);
    events.on('upstream_error', onUpstreamError);
    return () => {
      events.off('request', onRequest);
      events.off('tunnel', onTunnel);
      events.off('tls_handshake', onTls);
      events.off('cert', onCert);
      events.off('upstream_error', onUpstreamError);
      for (const [name, fn] of extra) events.off(name, fn);
      // Only the attachment that set the CA source clears it.
      if (this.caExpirySource === caExpiry) this.caExpirySource = undefined;
    };
  }

  /**
   * The series a request event adds to, found through nested maps keyed by the event's own
   * values instead of a series key string built and hashed per request (the decision, protocol
   * and rule name strings are the same objects request after request, so their hashes are
   * cached). A series, once made, lives as long as the registry, as it does in the maps.
   */
  private readonly requestSeriesCache = new Map<string, Map<string, Map<string, Map<number, RequestSeries>>>>();
  private requestSeries(r: RequestEvent): RequestSeries {
    const rule = r.rule ?? '';
    let byProto = this.requestSeriesCache.get(r.decision);
    if (!byProto) this.requestSeriesCache.set(r.decision, (byProto = new Map()));
    let byRule = byProto.get(r.proto);
    if (!byRule) byProto.set(r.proto, (byRule = new Map()));
    let byStatus = byRule.get(rule);
    if (!byStatus) byRule.set(rule, (byStatus = new Map()));
    let s = byStatus.get(r.status);
    if (!s) {
      s = {
        requests: this.requests.entry({ decision: r.decision, rule, status: String(r.status), proto: r.proto }),
        duration: this.duration.entry({ decision: r.decision, proto: r.proto }),
      };
      byStatus.set(r.status, s);
    }
    return s;
  }

  recordApply(source: string, result: 'applied' | 'rejected', generation?: number): void {
    this.configApplies.inc({ source, result });
    if (generation !== undefined) this.configGeneration.set({}, generation);
  }

  render(): string {
    if (this.caExpirySource) this.caExpiryDays.set({}, this.caExpirySource().daysLeft);
    return this.all.flatMap((m) => m.render()).join('\n') + '\n';
  }
}

export const METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';
