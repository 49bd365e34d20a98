//! Prometheus metrics under kube-proxy's names, types, help texts, label sets and
//! buckets (from upstream `pkg/proxy/metrics/metrics.go`; help texts carry the
//! `[ALPHA] ` prefix component-base adds), plus svcproxy's own `svcproxy_*` metrics,
//! and the `--metrics-bind-address` server.
//!
//! `ip_family` (`IPv4`, `IPv6`) labels the metrics upstream labels with it since its
//! dual-stack metrics (1.33): sync durations and timestamps, sync failures,
//! network-programming latency, Services without local endpoints. Upstream runs a
//! proxier per family; svcproxy programs both families in one pass, writing each
//! family apart (nftables: a transaction each; iptables: a restore each), so each
//! family's sync duration is the pass's shared part (deciding, translating) plus
//! its own write. A failure still fails both families' series, and
//! network-programming latency and Services without local endpoints are counted per
//! family exactly (from the EndpointSlice's and the Service port's family).
//!
//! Entry points: [`Metrics`] (one private registry, shared with the sync loop) and
//! [`serve`]: `/metrics` (text format 0.0.4), `/healthz` and `/proxyMode`, as
//! kube-proxy's metrics server.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, linear_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use svcproxy_core::model::IpFamily;
use svcproxy_core::objects::Kind;
use svcproxy_dataplane::{Backend, FailureKind};
use tokio::net::TcpListener;

use super::{parse_rfc3339, unix_nanos};

mod lifecycle;
use lifecycle::LifecycleSeries;
pub use lifecycle::{Ownership, OwnershipHow};

/// The metrics svcproxy exports.
pub struct Metrics {
    registry: Registry,
    /// The sync loop's figures.
    sync: SyncSeries,
    /// UDP conntrack cleanup's figures.
    conntrack: ConntrackSeries,
    /// What `/proxyMode` answers: the data plane's mode.
    proxy_mode: &'static str,
    /// The mode's failure counters, with upstream's names for that mode.
    failures: Vec<(FailureKind, IntCounterVec)>,
    healthz_total: IntCounterVec,
    livez_total: IntCounterVec,
    invalid_objects: IntCounterVec,
    /// The counts last reported per kind, to turn the state's running totals into
    /// counter increments.
    invalid_reported: Mutex<BTreeMap<Kind, u64>>,
    /// Trigger times before this are not network-programming latency: the initial
    /// list carries every slice's last change, however old (as upstream's
    /// `trackerStartTime`).
    started: SystemTime,
    /// Upstream's iptables rule gauges, in the modes that count rules.
    iptables_rules: Option<(IntGaugeVec, IntGaugeVec)>,
    health_check_bind_failures: IntGauge,
    /// Service ports' claims on a destination another port holds (each logged).
    lost_claims: IntGauge,
    /// Drift checks that found the kernel without the rules.
    drift_detected: IntCounter,
    /// client-go's REST client families, observed by the API client's layer.
    rest_client: svcproxy_sources::kube::client_metrics::RestClientMetrics,
    /// `/configz`'s body, set once the configuration is known.
    configz: std::sync::OnceLock<String>,
    /// svcproxy's own: sync steps, start-up, ownership.
    lifecycle: LifecycleSeries,
}

/// kube-proxy's figures of the sync loop.
struct SyncSeries {
    sync_duration: HistogramVec,
    sync_full_duration: HistogramVec,
    sync_partial_duration: HistogramVec,
    network_programming_duration: HistogramVec,
    last_timestamp: GaugeVec,
    last_queued_timestamp: GaugeVec,
    endpoint_changes_pending: IntGauge,
    endpoint_changes_total: IntCounter,
    service_changes_pending: IntGauge,
    service_changes_total: IntCounter,
    no_local_endpoints: IntGaugeVec,
}

/// The conntrack cleanup's figures: svcproxy's and kube-proxy's reconciler's.
struct ConntrackSeries {
    conntrack_cleanup_failures: IntCounter,
    conntrack_entries_deleted: IntCounter,
    /// Upstream's conntrack reconciler figures, per family cleaned.
    conntrack_reconciler_deleted: IntCounterVec,
    conntrack_reconciler_duration: HistogramVec,
}

/// The cluster DNS's counters as Prometheus counters: the server counts with
/// atomics (no metrics library in its path); each scrape brings these up to them.
struct DnsCollector {
    counters: Arc<svcproxy_dns::server::Counters>,
    requests: IntCounterVec,
    responses: IntCounterVec,
    cache_hits: IntCounter,
    rate_limited: IntCounter,
    forwarded: IntCounter,
    forward_failures: IntCounter,
    dropped: IntCounter,
    /// TCP connections open, and those closed to protect the others.
    tcp_open: IntGauge,
    tcp_closed: IntCounterVec,
    /// One scrape brings them up at a time.
    syncing: Mutex<()>,
}

impl DnsCollector {
    fn new(counters: Arc<svcproxy_dns::server::Counters>) -> Self {
        let counter = |name: &str, help: &str| {
            IntCounter::with_opts(Opts::new(name, help)).expect("valid counter")
        };
        let vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter")
        };
        let c = DnsCollector {
            counters,
            requests: vec(
                "svcproxy_dns_requests_total",
                "DNS queries received, by transport",
                "proto",
            ),
            responses: vec(
                "svcproxy_dns_responses_total",
                "DNS answers sent, by response code",
                "rcode",
            ),
            cache_hits: counter(
                "svcproxy_dns_cache_hits_total",
                "DNS answers over UDP sent as kept, encoded, from an earlier identical query",
            ),
            rate_limited: counter(
                "svcproxy_dns_rate_limited_total",
                "DNS queries answered without records because the client was over --dns-rate-limit",
            ),
            forwarded: counter(
                "svcproxy_dns_forward_requests_total",
                "DNS queries for names outside the cluster domain relayed to an upstream resolver",
            ),
            forward_failures: counter(
                "svcproxy_dns_forward_failures_total",
                "Relayed DNS queries no upstream answered (answered SERVFAIL)",
            ),
            dropped: counter(
                "svcproxy_dns_dropped_total",
                "Datagrams and messages that were not DNS queries, dropped without an answer",
            ),
            tcp_open: IntGauge::with_opts(Opts::new(
                "svcproxy_dns_tcp_connections",
                "DNS TCP connections open",
            ))
            .expect("valid gauge"),
            tcp_closed: vec(
                "svcproxy_dns_tcp_connections_shed_total",
                "DNS TCP connections closed to protect the others: client_limit (a client \
                 address's idlest, when it opens one past its share), idlest (the idlest, to \
                 make room at the server's cap)",
                "reason",
            ),
            syncing: Mutex::new(()),
        };
        // Every series from the start: dashboards see zeros rather than gaps.
        c.sync();
        c
    }

    /// The counters without labels.
    fn single(&self) -> [&IntCounter; 5] {
        [
            &self.cache_hits,
            &self.rate_limited,
            &self.forwarded,
            &self.forward_failures,
            &self.dropped,
        ]
    }

    fn sync(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let _one = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        let up_to = |c: &IntCounter, n: u64| c.inc_by(n.saturating_sub(c.get()));
        let d = &self.counters;
        up_to(
            &self.requests.with_label_values(&["udp"]),
            d.udp_queries.load(Relaxed),
        );
        up_to(
            &self.requests.with_label_values(&["tcp"]),
            d.tcp_queries.load(Relaxed),
        );
        for (rcode, n) in d.responses() {
            up_to(&self.responses.with_label_values(&[rcode]), n);
        }
        up_to(&self.cache_hits, d.cache_hits.load(Relaxed));
        up_to(&self.rate_limited, d.rate_limited.load(Relaxed));
        up_to(&self.forwarded, d.relayed.load(Relaxed));
        up_to(&self.forward_failures, d.relay_failures.load(Relaxed));
        up_to(&self.dropped, d.dropped.load(Relaxed));
        self.tcp_open
            .set(i64::try_from(d.tcp_open.load(Relaxed)).unwrap_or(i64::MAX));
        up_to(
            &self.tcp_closed.with_label_values(&["client_limit"]),
            d.tcp_over_client_limit.load(Relaxed),
        );
        up_to(
            &self.tcp_closed.with_label_values(&["idlest"]),
            d.tcp_shed.load(Relaxed),
        );
    }
}

impl Collector for DnsCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.requests.desc();
        d.extend(self.responses.desc());
        d.extend(self.tcp_open.desc());
        d.extend(self.tcp_closed.desc());
        for c in self.single() {
            d.extend(c.desc());
        }
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.sync();
        let mut m = self.requests.collect();
        m.extend(self.responses.collect());
        m.extend(self.tcp_open.collect());
        m.extend(self.tcp_closed.collect());
        for c in self.single() {
            m.extend(c.collect());
        }
        m
    }
}

/// The families every sync programs, and upstream's `ip_family` label values.
const FAMILIES: [IpFamily; 2] = IpFamily::BOTH;
const IP_FAMILY: &str = "ip_family";

/// kube-proxy's help texts are component-base's: prefixed with the stability level.
fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

fn register<C: Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique and valid");
    c
}

/// Upstream's SyncProxyRules buckets: 1ms doubling 15 times (up to 16.384s).
fn sync_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 15).expect("valid buckets")
}

/// Upstream's NetworkProgrammingLatency buckets. component-base's `MergeBuckets`
/// starts from a zero bucket, so upstream exposes `le="0"` too.
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0];
    for (start, width, count) in [
        (0.25, 0.25, 2),  // 0.25s, 0.5s
        (1.0, 1.0, 59),   // 1s .. 59s
        (60.0, 5.0, 12),  // 60s .. 115s
        (120.0, 30.0, 7), // 2min .. 5min
    ] {
        b.extend(linear_buckets(start, width, count).expect("valid buckets"));
    }
    b
}

fn unix_seconds(t: SystemTime) -> f64 {
    unix_nanos(t) as f64 / 1e9
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The mode an unset `--proxy-mode` runs.
fn default_backend() -> &'static Backend {
    svcproxy_dataplane::resolve_mode("")
        .expect("the default mode is registered")
        .backend
}

impl Metrics {
    /// Metrics of a proxy of the default mode starting now (the tools that run no
    /// data plane: `snapshot`, `dns`).
    pub fn new() -> Arc<Self> {
        Self::for_backend(default_backend())
    }

    /// Metrics of a proxy running `backend`, starting now.
    pub fn for_backend(backend: &Backend) -> Arc<Self> {
        Self::started_at(SystemTime::now(), backend)
    }

    /// Metrics of a proxy running `backend` that started at `started`.
    pub fn started_at(started: SystemTime, backend: &Backend) -> Arc<Self> {
        let r = Registry::new();
        let reg = Register(&r);

        let m = Metrics {
            sync: SyncSeries::register(&reg),
            conntrack: ConntrackSeries::register(&reg),
            proxy_mode: backend.mode,
            failures: backend
                .failure_counters
                .iter()
                .map(|c| (c.kind, reg.counter_vec(c.name, alpha(c.help), IP_FAMILY)))
                .collect(),
            healthz_total: reg.counter_vec(
                "kubeproxy_proxy_healthz_total",
                alpha("Cumulative proxy healthz HTTP status"),
                "code",
            ),
            livez_total: reg.counter_vec(
                "kubeproxy_proxy_livez_total",
                alpha("Cumulative proxy livez HTTP status"),
                "code",
            ),
            invalid_objects: reg.counter_vec(
                "svcproxy_invalid_objects_total",
                "Objects rejected as invalid (logged and skipped), by kind".to_string(),
                "kind",
            ),
            invalid_reported: Mutex::new(BTreeMap::new()),
            started,
            iptables_rules: backend.counts_rules.then(|| {
                let vec = |name: &str, help: &str| {
                    register(
                        &r,
                        IntGaugeVec::new(Opts::new(name, alpha(help)), &[IP_FAMILY, "table"])
                            .expect("valid gauge"),
                    )
                };
                (
                    vec(
                        "kubeproxy_sync_proxy_rules_iptables_total",
                        "Total number of iptables rules owned by kube-proxy",
                    ),
                    vec(
                        "kubeproxy_sync_proxy_rules_iptables_last",
                        "Number of iptables rules written by kube-proxy in last sync",
                    ),
                )
            }),
            health_check_bind_failures: reg.int_gauge(
                "svcproxy_service_health_check_bind_failures",
                "healthCheckNodePort servers that cannot currently listen on their port"
                    .to_string(),
            ),
            lost_claims: reg.int_gauge(
                "svcproxy_destination_conflicts",
                "Claims on a destination (service IP and port, or NodePort) that another \
                 service port holds and this one therefore does not get (each is logged)"
                    .to_string(),
            ),
            drift_detected: reg.counter(
                "svcproxy_kernel_drift_total",
                "Times the periodic check found the kernel without svcproxy's rules (tables \
                 deleted, re-created or made dormant, iptables flushed), each repaired by a \
                 full sync"
                    .to_string(),
            ),
            rest_client: {
                let rc = svcproxy_sources::kube::client_metrics::RestClientMetrics::new();
                register(&r, rc.requests.clone());
                register(&r, rc.duration.clone());
                rc
            },
            configz: std::sync::OnceLock::new(),
            lifecycle: LifecycleSeries::register(&r),
            registry: r,
        };
        m.register_process();
        m.preset_series();
        Arc::new(m)
    }

    /// The process's own figures (process_resident_memory_bytes,
    /// process_cpu_seconds_total, process_open_fds, ...), as every Go component has.
    fn register_process(&self) {
        #[cfg(target_os = "linux")]
        self.registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metrics register once");
    }

    /// Series that exist from the start, so dashboards see zeros rather than gaps.
    fn preset_series(&self) {
        for family in FAMILIES {
            let f = family.as_str();
            for policy in ["internal", "external"] {
                self.sync
                    .no_local_endpoints
                    .with_label_values(&[f, policy])
                    .set(0);
            }
            for (_, c) in &self.failures {
                c.with_label_values(&[f]);
            }
            for h in [
                &self.sync.sync_duration,
                &self.sync.sync_full_duration,
                &self.sync.sync_partial_duration,
                &self.sync.network_programming_duration,
            ] {
                h.with_label_values(&[f]);
            }
        }
        for kind in Kind::ALL {
            self.invalid_objects.with_label_values(&[kind.as_str()]);
        }
    }

    /// The families the API client's metrics layer observes into.
    pub fn rest_client(&self) -> svcproxy_sources::kube::client_metrics::RestClientMetrics {
        self.rest_client.clone()
    }

    /// Exports the cluster DNS server's counters (`svcproxy_dns_*`), read at each
    /// scrape. Once per process: a second server's would collide.
    pub fn register_dns(&self, counters: Arc<svcproxy_dns::server::Counters>) {
        if let Err(e) = self
            .registry
            .register(Box::new(DnsCollector::new(counters)))
        {
            tracing::warn!("cluster DNS metrics not exported: {e}");
        }
    }

    /// Exports a data plane's own metrics (its collectors, read at each scrape).
    pub fn register_data_plane(&self, collectors: Vec<Box<dyn Collector>>) {
        for c in collectors {
            if let Err(e) = self.registry.register(c) {
                tracing::warn!("data plane metrics not exported: {e}");
            }
        }
    }

    /// Sets `/configz`'s body (the effective configuration as JSON); the first call wins.
    pub fn set_configz(&self, json: &serde_json::Value) {
        let _ = self.configz.set(json.to_string());
    }

    /// A successful sync that took `duration`: each family of `families` its own
    /// figure, or (none given) every family the pass's.
    pub fn observe_sync(&self, full: bool, duration: Duration, families: &[(IpFamily, Duration)]) {
        let now = unix_seconds(SystemTime::now());
        let each: Vec<(IpFamily, Duration)> = if families.is_empty() {
            FAMILIES.iter().map(|f| (*f, duration)).collect()
        } else {
            families.to_vec()
        };
        for (family, duration) in each {
            let secs = duration.as_secs_f64();
            let f = [family.as_str()];
            self.sync.sync_duration.with_label_values(&f).observe(secs);
            if full {
                self.sync
                    .sync_full_duration
                    .with_label_values(&f)
                    .observe(secs);
            } else {
                self.sync
                    .sync_partial_duration
                    .with_label_values(&f)
                    .observe(secs);
            }
            self.sync.last_timestamp.with_label_values(&f).set(now);
        }
    }

    /// A successful kernel sync's time, step by step.
    pub fn observe_sync_steps(&self, steps: &svcproxy_sync::SyncSteps) {
        self.lifecycle.observe_steps(steps);
    }

    /// A start-up step (`listed`, `programmed`) reached now.
    pub fn startup_step(&self, step: &str) {
        let since = SystemTime::now()
            .duration_since(self.started)
            .unwrap_or_default();
        self.lifecycle.startup_step(step, since);
    }

    /// How this process came to program the node, once its first sync is in.
    pub fn set_ownership(&self, ownership: &Ownership) {
        self.lifecycle.set_ownership(ownership);
    }

    /// A failed attempt to apply the rules (`partial`: a partial sync's, which the
    /// modes counting those apart count again).
    pub fn sync_failed(&self, partial: bool) {
        self.lifecycle.sync_failed();
        self.count_failure(FailureKind::Sync);
        if partial {
            self.count_failure(FailureKind::PartialSync);
        }
    }

    /// A failed pass fails every family's sync: nothing it would have written is
    /// known to be in place.
    fn count_failure(&self, kind: FailureKind) {
        for (k, c) in &self.failures {
            if *k == kind {
                for family in FAMILIES {
                    c.with_label_values(&[family.as_str()]).inc();
                }
            }
        }
    }

    /// A failed removal of stale chains or sets.
    // Until the data plane reports cleanup failures apart from sync failures.
    #[allow(dead_code)]
    pub fn cleanup_failed(&self) {
        self.count_failure(FailureKind::Cleanup);
    }

    /// A sync (of every family) was queued at `when`.
    pub fn queued(&self, when: SystemTime) {
        for family in FAMILIES {
            self.sync
                .last_queued_timestamp
                .with_label_values(&[family.as_str()])
                .set(unix_seconds(when));
        }
    }

    /// Changes received but not yet synced.
    pub fn set_pending_changes(&self, services: usize, endpoints: usize) {
        self.sync.service_changes_pending.set(to_i64(services));
        self.sync.endpoint_changes_pending.set(to_i64(endpoints));
    }

    /// Changes taken into a sync (the cumulative counters).
    pub fn add_changes(&self, services: usize, endpoints: usize) {
        self.sync.service_changes_total.inc_by(services as u64);
        self.sync.endpoint_changes_total.inc_by(endpoints as u64);
    }

    /// Observes, for each `endpoints.kubernetes.io/last-change-trigger-time` of the
    /// EndpointSlices a sync took in, the time from that change to `now` (negative
    /// with clock skew, observed anyway as upstream). Unparsable values, and changes
    /// from before svcproxy started, are skipped.
    /// Each under its slice's address family.
    pub fn observe_network_programming(
        &self,
        trigger_times: &[(IpFamily, String)],
        now: SystemTime,
    ) {
        for (family, t) in trigger_times {
            match parse_rfc3339(t) {
                Some(at) if at < self.started => {}
                Some(at) => {
                    let latency = (unix_nanos(now) - unix_nanos(at)) as f64 / 1e9;
                    self.sync
                        .network_programming_duration
                        .with_label_values(&[family.as_str()])
                        .observe(latency);
                }
                None => tracing::debug!(
                    value = %t.escape_debug(),
                    "ignoring an unparsable last-change-trigger-time"
                ),
            }
        }
    }

    /// Services of `family` with a Local traffic policy and no local endpoints, per
    /// policy.
    pub fn set_no_local_endpoints(&self, family: IpFamily, internal: usize, external: usize) {
        let f = family.as_str();
        self.sync
            .no_local_endpoints
            .with_label_values(&[f, "internal"])
            .set(to_i64(internal));
        self.sync
            .no_local_endpoints
            .with_label_values(&[f, "external"])
            .set(to_i64(external));
    }

    /// The state's running totals of rejected objects per kind.
    pub fn set_invalid_objects(&self, counts: &BTreeMap<Kind, u64>) {
        let mut reported = self
            .invalid_reported
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (&kind, &count) in counts {
            let last = reported.entry(kind).or_insert(0);
            if count > *last {
                self.invalid_objects
                    .with_label_values(&[kind.as_str()])
                    .inc_by(count - *last);
                *last = count;
            }
        }
    }

    /// The data plane's rule counts after a sync (upstream's iptables gauges).
    pub fn set_rule_counts(&self, counts: &[svcproxy_dataplane::RuleCount]) {
        let Some((total, last)) = &self.iptables_rules else {
            return;
        };
        for c in counts {
            let labels = [c.family.as_str(), c.table];
            total.with_label_values(&labels).set(to_i64(c.total));
            last.with_label_values(&labels).set(to_i64(c.written));
        }
    }

    /// One sync's UDP conntrack cleanup; each family it cleaned also under
    /// upstream's conntrack reconciler names.
    pub fn conntrack_cleanup(&self, report: &svcproxy_dataplane::ConntrackCleanupReport) {
        self.conntrack
            .conntrack_entries_deleted
            .inc_by(report.deleted as u64);
        if report.error.is_some() {
            self.conntrack.conntrack_cleanup_failures.inc();
        }
        for (family, done) in &report.families {
            let f = [family.as_str()];
            self.conntrack
                .conntrack_reconciler_deleted
                .with_label_values(&f)
                .inc_by(done.deleted as u64);
            self.conntrack
                .conntrack_reconciler_duration
                .with_label_values(&f)
                .observe(done.duration.as_secs_f64());
        }
    }

    pub fn set_health_check_bind_failures(&self, n: usize) {
        self.health_check_bind_failures.set(to_i64(n));
    }

    /// The claims the last plan ignored because another service port holds the
    /// destination.
    pub fn drift_detected(&self) {
        self.drift_detected.inc();
    }

    pub fn set_lost_claims(&self, n: usize) {
        self.lost_claims.set(to_i64(n));
    }

    pub fn count_healthz(&self, code: u16) {
        self.healthz_total
            .with_label_values(&[&code.to_string()])
            .inc();
    }

    pub fn count_livez(&self, code: u16) {
        self.livez_total
            .with_label_values(&[&code.to_string()])
            .inc();
    }

    /// Everything in the Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

fn text(body: String, content_type: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// The generic component `/healthz` kube-proxy installs on its metrics server (a
/// ping check only: the proxy's own health is on the healthz port).
fn ping_healthz(query: Option<String>) -> Response {
    let verbose = query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.split('=').next() == Some("verbose"))
    });
    let body = if verbose {
        "[+]ping ok\nhealthz check passed\n"
    } else {
        "ok"
    };
    text(body.to_string(), "text/plain; charset=utf-8")
}

/// Serves `/metrics`, `/healthz` (and `/healthz/ping`) and `/proxyMode` on `listener`
/// until `shutdown` completes.
///
/// `/healthz` here is what kube-proxy's metrics port answers: an "ok" ping, whatever
/// the proxy's health (that is `--healthz-bind-address`'s job).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            any(|State(m): State<Arc<Metrics>>| async move {
                text(m.render(), "text/plain; version=0.0.4; charset=utf-8")
            }),
        )
        .route(
            "/healthz",
            any(|RawQuery(q): RawQuery| async move { ping_healthz(q) }),
        )
        .route(
            "/healthz/ping",
            any(|| async { text("ok".to_string(), "text/plain; charset=utf-8") }),
        )
        .route(
            "/configz",
            any(|State(m): State<Arc<Metrics>>| async move {
                match m.configz.get() {
                    Some(body) => text(body.clone(), "application/json"),
                    None => {
                        (StatusCode::NOT_FOUND, "no configuration registered\n").into_response()
                    }
                }
            }),
        )
        .route(
            "/proxyMode",
            any(|State(m): State<Arc<Metrics>>| async move {
                text(m.proxy_mode.to_string(), "text/plain; charset=utf-8")
            }),
        )
        .with_state(metrics);
    let addr = listener.local_addr().ok();
    tracing::debug!(?addr, "serving /metrics");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("metrics server on {addr:?}: {e}"))
}

impl SyncSeries {
    fn register(reg: &Register<'_>) -> Self {
        SyncSeries {
            sync_duration: reg.histogram(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                sync_buckets(),
            ),
            sync_full_duration: reg.histogram(
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                sync_buckets(),
            ),
            sync_partial_duration: reg.histogram(
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                sync_buckets(),
            ),
            network_programming_duration: reg.histogram(
                "kubeproxy_network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                network_programming_buckets(),
            ),
            last_timestamp: reg.gauge(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
            ),
            last_queued_timestamp: reg.gauge(
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
            ),
            endpoint_changes_pending: reg.int_gauge(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                alpha("Pending proxy rules Endpoint changes"),
            ),
            endpoint_changes_total: reg.counter(
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                alpha("Cumulative proxy rules Endpoint changes"),
            ),
            service_changes_pending: reg.int_gauge(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                alpha("Pending proxy rules Service changes"),
            ),
            service_changes_total: reg.counter(
                "kubeproxy_sync_proxy_rules_service_changes_total",
                alpha("Cumulative proxy rules Service changes"),
            ),
            // A gauge despite the name, as upstream.
            no_local_endpoints: register(
                reg.0,
                IntGaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                        alpha("Number of services with a Local traffic policy and no endpoints"),
                    ),
                    &[IP_FAMILY, "traffic_policy"],
                )
                .expect("valid gauge"),
            ),
        }
    }
}

impl ConntrackSeries {
    fn register(reg: &Register<'_>) -> Self {
        ConntrackSeries {
            conntrack_cleanup_failures: reg.counter(
                "svcproxy_conntrack_cleanup_failures_total",
                "Syncs whose UDP conntrack cleanup failed".to_string(),
            ),
            conntrack_entries_deleted: reg.counter(
                "svcproxy_conntrack_entries_deleted_total",
                "Stale UDP conntrack entries deleted".to_string(),
            ),
            conntrack_reconciler_deleted: reg.counter_vec(
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                alpha("Cumulative conntrack flows deleted by conntrack reconciler"),
                IP_FAMILY,
            ),
            conntrack_reconciler_duration: reg.histogram(
                "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                "ReconcileConntrackFlowsLatency latency in seconds",
                sync_buckets(),
            ),
        }
    }
}

/// The metric constructors `Metrics::started_at` uses, each registering into one
/// registry (kube-proxy's stability level in the help where upstream marks it).
struct Register<'a>(&'a Registry);

impl Register<'_> {
    fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> HistogramVec {
        register(
            self.0,
            HistogramVec::new(
                HistogramOpts::new(name, alpha(help)).buckets(buckets),
                &[IP_FAMILY],
            )
            .expect("valid histogram"),
        )
    }

    fn gauge(&self, name: &str, help: &str) -> GaugeVec {
        register(
            self.0,
            GaugeVec::new(Opts::new(name, alpha(help)), &[IP_FAMILY]).expect("valid gauge"),
        )
    }

    fn int_gauge(&self, name: &str, help: String) -> IntGauge {
        register(
            self.0,
            IntGauge::with_opts(Opts::new(name, help)).expect("valid gauge"),
        )
    }

    fn counter(&self, name: &str, help: String) -> IntCounter {
        register(
            self.0,
            IntCounter::with_opts(Opts::new(name, help)).expect("valid counter"),
        )
    }

    fn counter_vec(&self, name: &str, help: String, label: &str) -> IntCounterVec {
        register(
            self.0,
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_parse::{Scrape, Value};
    use std::collections::{BTreeSet, HashMap};
    use std::time::UNIX_EPOCH;

    fn mode(name: &str) -> &'static Backend {
        svcproxy_dataplane::resolve_mode(name).unwrap().backend
    }

    async fn scrape(m: Arc<Metrics>) -> (reqwest::header::HeaderMap, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, m, async move {
            let _ = rx.await;
        }));
        let resp = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let headers = resp.headers().clone();
        let body = resp.text().await.unwrap();
        tx.send(()).unwrap();
        task.await.unwrap().unwrap();
        (headers, body)
    }

    fn parse(text: &str) -> Scrape {
        Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
    }

    /// The `# TYPE` of every family in `text`.
    fn types(text: &str) -> HashMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    fn label_sets(s: &Scrape, name: &str) -> BTreeSet<String> {
        s.samples
            .iter()
            .filter(|x| x.metric == name)
            .map(|x| x.labels.to_string())
            .collect()
    }

    /// The IPv4 series of a histogram.
    fn histogram<'a>(s: &'a Scrape, name: &str) -> &'a [prometheus_parse::HistogramCount] {
        histogram_of(s, name, "IPv4")
    }

    fn histogram_of<'a>(
        s: &'a Scrape,
        name: &str,
        family: &str,
    ) -> &'a [prometheus_parse::HistogramCount] {
        match s
            .samples
            .iter()
            .find(|x| x.metric == name && x.labels.get("ip_family") == Some(family))
            .map(|x| &x.value)
        {
            Some(Value::Histogram(b)) => b,
            other => panic!("{name}: not a histogram: {other:?}"),
        }
    }

    fn value(s: &Scrape, name: &str, labels: &str) -> f64 {
        let sample = s
            .samples
            .iter()
            .find(|x| x.metric == name && x.labels.to_string() == labels)
            .unwrap_or_else(|| panic!("{name}{{{labels}}} missing"));
        match sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{name}: unexpected {other:?}"),
        }
    }

    /// The nftables mode, whose metric names these tests check.
    fn nftables() -> &'static Backend {
        svcproxy_dataplane::resolve_mode("nftables")
            .expect("registered")
            .backend
    }

    #[tokio::test]
    async fn metrics_are_served_under_upstream_names_types_and_labels() {
        let m = Metrics::for_backend(nftables());
        let (headers, text) = scrape(m.clone()).await;
        assert_eq!(
            headers["content-type"],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        let t = types(&text);
        let expected = [
            ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
            (
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_network_programming_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
                "counter",
            ),
            ("svcproxy_invalid_objects_total", "counter"),
            ("svcproxy_conntrack_cleanup_failures_total", "counter"),
            ("svcproxy_conntrack_entries_deleted_total", "counter"),
            ("svcproxy_service_health_check_bind_failures", "gauge"),
            ("svcproxy_destination_conflicts", "gauge"),
            ("svcproxy_kernel_drift_total", "counter"),
        ];
        for (name, ty) in expected {
            assert_eq!(t.get(name).map(String::as_str), Some(ty), "{name}");
        }
        // As upstream's per-family gauges: no series before the first sync or
        // queued change (a 0 would read as a sync 56 years ago).
        for name in [
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        ] {
            assert_eq!(t.get(name), None, "{name}");
        }
        let s = parse(&text);
        assert_eq!(
            s.docs["kubeproxy_sync_proxy_rules_duration_seconds"],
            "[ALPHA] SyncProxyRules latency in seconds"
        );
        assert_eq!(
            label_sets(&s, "kubeproxy_sync_proxy_rules_no_local_endpoints_total"),
            ["IPv4", "IPv6"]
                .iter()
                .flat_map(|f| {
                    ["external", "internal"]
                        .map(|p| format!(r#"ip_family="{f}",traffic_policy="{p}""#))
                })
                .collect()
        );
        // Upstream's dual-stack metrics: ip_family where it has it, not elsewhere.
        let both: BTreeSet<String> = BTreeSet::from([
            r#"ip_family="IPv4""#.to_string(),
            r#"ip_family="IPv6""#.to_string(),
        ]);
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_count",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
            "kubeproxy_network_programming_duration_seconds_count",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
        ] {
            assert_eq!(label_sets(&s, name), both, "{name}");
        }
        assert_eq!(
            label_sets(&s, "kubeproxy_sync_proxy_rules_endpoint_changes_total"),
            BTreeSet::from([String::new()])
        );
        assert_eq!(
            label_sets(&s, "svcproxy_invalid_objects_total"),
            Kind::ALL
                .iter()
                .map(|k| format!(r#"kind="{}""#, k.as_str()))
                .collect()
        );
        let sync = histogram(&s, "kubeproxy_sync_proxy_rules_duration_seconds");
        let bounds: Vec<f64> = sync.iter().map(|b| b.less_than).collect();
        let mut want: Vec<f64> = (0..15).map(|i| 0.001 * f64::from(1u32 << i)).collect();
        want.push(f64::INFINITY);
        assert_eq!(bounds, want);
        assert!(text.contains(
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"} 0"#
        ));
        let np = histogram(&s, "kubeproxy_network_programming_duration_seconds");
        let bounds: Vec<f64> = np.iter().map(|b| b.less_than).collect();
        assert_eq!(bounds.len(), 1 + 2 + 59 + 12 + 7 + 1);
        assert_eq!(&bounds[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(bounds[61], 59.0);
        assert_eq!(&bounds[62..64], &[60.0, 65.0]);
        assert_eq!(bounds[73], 115.0);
        assert_eq!(
            &bounds[74..],
            &[
                120.0,
                150.0,
                180.0,
                210.0,
                240.0,
                270.0,
                300.0,
                f64::INFINITY
            ]
        );
        // Counted only once answered, as upstream.
        assert!(!text.contains("kubeproxy_proxy_healthz_total"));
        // iptables mode's rule gauges are not nftables mode's.
        assert!(!text.contains("kubeproxy_sync_proxy_rules_iptables_total"));
    }

    #[tokio::test]
    async fn changes_from_before_the_start_are_not_programming_latency() {
        let started = UNIX_EPOCH + Duration::from_secs(1_714_557_600); // 10:00:00
        let m = Metrics::started_at(started, mode("nftables"));
        m.observe_network_programming(
            &[
                // From the initial list: hours old, not this proxy's latency.
                (IpFamily::V4, "2024-05-01T07:00:00Z".to_string()),
                (IpFamily::V4, "2024-05-01T10:00:01Z".to_string()),
            ],
            started + Duration::from_secs(2),
        );
        let (_, text) = scrape(m).await;
        let s = parse(&text);
        let h = histogram(&s, "kubeproxy_network_programming_duration_seconds");
        let at = |le: f64| h.iter().find(|c| c.less_than == le).unwrap().count;
        assert_eq!(at(1.0), 1.0);
        assert_eq!(at(f64::INFINITY), 1.0);
    }

    #[tokio::test]
    async fn iptables_mode_counts_restore_and_partial_restore_failures_as_upstream() {
        let m = Metrics::started_at(UNIX_EPOCH, mode("iptables"));
        m.sync_failed(false);
        m.sync_failed(true);
        m.set_rule_counts(&[svcproxy_dataplane::RuleCount {
            family: IpFamily::V6,
            table: "nat",
            total: 120,
            written: 7,
        }]);
        let (_, text) = scrape(m).await;
        for line in [
            r#"kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="nat"} 120"#,
            r#"kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv6",table="nat"} 7"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        let s = parse(&text);
        let value = |name: &str| {
            s.samples
                .iter()
                .find(|x| x.metric == name && x.labels.to_string() == r#"ip_family="IPv6""#)
                .map(|x| match x.value {
                    prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                    _ => -1.0,
                })
        };
        assert_eq!(
            value("kubeproxy_sync_proxy_rules_iptables_restore_failures_total"),
            Some(2.0)
        );
        assert_eq!(
            value("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"),
            Some(1.0)
        );
        assert_eq!(
            value("kubeproxy_sync_proxy_rules_nftables_sync_failures_total"),
            None
        );
    }

    #[tokio::test]
    async fn observed_values_appear_in_the_scrape() {
        let m = Metrics::started_at(UNIX_EPOCH, mode("nftables"));
        m.observe_sync(true, Duration::from_millis(3), &[]);
        m.observe_sync(false, Duration::from_millis(20), &[]);
        // Each family written apart: each its own figure.
        m.observe_sync(
            false,
            Duration::from_millis(20),
            &[
                (IpFamily::V4, Duration::from_millis(20)),
                (IpFamily::V6, Duration::from_millis(1)),
            ],
        );
        m.sync_failed(false);
        m.cleanup_failed();
        m.cleanup_failed();
        m.queued(UNIX_EPOCH + Duration::from_millis(1_714_557_600_500));
        m.set_pending_changes(2, 5);
        m.add_changes(3, 7);
        m.add_changes(1, 1);
        let now = UNIX_EPOCH + Duration::from_secs(1_714_557_600);
        m.observe_network_programming(
            &[
                (IpFamily::V4, "2024-05-01T09:59:59.7Z".to_string()),
                (IpFamily::V4, "2024-05-01T09:59:30Z".to_string()),
                (IpFamily::V6, "2024-05-01T09:59:50Z".to_string()),
                (IpFamily::V4, "not a time".to_string()),
            ],
            now,
        );
        m.set_no_local_endpoints(IpFamily::V4, 4, 1);
        m.set_no_local_endpoints(IpFamily::V6, 0, 2);
        m.set_invalid_objects(&BTreeMap::from([(Kind::Service, 2), (Kind::Node, 1)]));
        m.set_invalid_objects(&BTreeMap::from([(Kind::Service, 3), (Kind::Node, 1)]));
        let ct = |deleted: usize, failed: bool, v6: Option<usize>| {
            let mut r = svcproxy_dataplane::ConntrackCleanupReport {
                deleted,
                error: failed.then(|| "netlink: EPERM".to_string()),
                ..Default::default()
            };
            r.families.insert(
                IpFamily::V4,
                svcproxy_dataplane::FamilyCleanup {
                    deleted: deleted - v6.unwrap_or(0),
                    duration: Duration::from_millis(3),
                },
            );
            if let Some(n) = v6 {
                r.families.insert(
                    IpFamily::V6,
                    svcproxy_dataplane::FamilyCleanup {
                        deleted: n,
                        duration: Duration::from_millis(20),
                    },
                );
            }
            r
        };
        m.conntrack_cleanup(&ct(12, false, Some(2)));
        m.conntrack_cleanup(&ct(3, true, None));
        m.set_health_check_bind_failures(1);
        m.set_lost_claims(2);
        m.drift_detected();
        m.count_healthz(200);
        m.count_healthz(503);
        m.count_livez(200);
        let (_, text) = scrape(m).await;
        let s = parse(&text);

        let full = histogram(&s, "kubeproxy_sync_full_proxy_rules_duration_seconds");
        let at = |b: &[prometheus_parse::HistogramCount], le: f64| {
            b.iter().find(|c| c.less_than == le).unwrap().count
        };
        assert_eq!(at(full, 0.002), 0.0);
        assert_eq!(at(full, 0.004), 1.0);
        let partial = histogram(&s, "kubeproxy_sync_partial_proxy_rules_duration_seconds");
        assert_eq!(at(partial, 0.016), 0.0);
        assert_eq!(at(partial, 0.032), 2.0);
        let all = histogram(&s, "kubeproxy_sync_proxy_rules_duration_seconds");
        assert_eq!(at(all, f64::INFINITY), 3.0);
        let v4 = r#"ip_family="IPv4""#;
        let v6 = r#"ip_family="IPv6""#;
        // Every pass programs both families: each family's series observes it,
        // with the family's own figure where the pass had one.
        for f in [v4, v6] {
            assert_eq!(
                value(&s, "kubeproxy_sync_proxy_rules_duration_seconds_count", f),
                3.0
            );
        }
        let partial6 = histogram_of(
            &s,
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "IPv6",
        );
        assert_eq!(at(partial6, 0.002), 1.0);
        assert_eq!(at(partial6, 0.032), 2.0);
        let partial4 = histogram_of(
            &s,
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "IPv4",
        );
        assert_eq!(at(partial4, 0.002), 0.0);
        let np = histogram(&s, "kubeproxy_network_programming_duration_seconds");
        assert_eq!(at(np, 0.25), 0.0);
        assert_eq!(at(np, 0.5), 1.0);
        assert_eq!(at(np, 29.0), 1.0);
        assert_eq!(at(np, 30.0), 2.0);
        assert_eq!(at(np, f64::INFINITY), 2.0);
        // Latency is counted under its slice's family only.
        let np6 = histogram_of(&s, "kubeproxy_network_programming_duration_seconds", "IPv6");
        assert_eq!(at(np6, 9.0), 0.0);
        assert_eq!(at(np6, 10.0), 1.0);
        assert_eq!(at(np6, f64::INFINITY), 1.0);

        let wall = unix_seconds(SystemTime::now());
        for f in [v4, v6] {
            let last = value(&s, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", f);
            assert!(last > wall - 60.0 && last <= wall, "{last}");
            assert_eq!(
                value(
                    &s,
                    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                    f
                ),
                1_714_557_600.5
            );
        }
        for (name, labels, want) in [
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "",
                2.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "",
                5.0,
            ),
            ("kubeproxy_sync_proxy_rules_service_changes_total", "", 4.0),
            ("kubeproxy_sync_proxy_rules_endpoint_changes_total", "", 8.0),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                r#"ip_family="IPv4",traffic_policy="internal""#,
                4.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                r#"ip_family="IPv4",traffic_policy="external""#,
                1.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                r#"ip_family="IPv6",traffic_policy="internal""#,
                0.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                r#"ip_family="IPv6",traffic_policy="external""#,
                2.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                r#"ip_family="IPv4""#,
                1.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                r#"ip_family="IPv6""#,
                1.0,
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
                r#"ip_family="IPv6""#,
                2.0,
            ),
            ("svcproxy_invalid_objects_total", r#"kind="Service""#, 3.0),
            ("svcproxy_invalid_objects_total", r#"kind="Node""#, 1.0),
            (
                "svcproxy_invalid_objects_total",
                r#"kind="EndpointSlice""#,
                0.0,
            ),
            ("svcproxy_conntrack_entries_deleted_total", "", 15.0),
            (
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                r#"ip_family="IPv4""#,
                13.0,
            ),
            (
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                r#"ip_family="IPv6""#,
                2.0,
            ),
            (
                "kubeproxy_conntrack_reconciler_sync_duration_seconds_count",
                r#"ip_family="IPv4""#,
                2.0,
            ),
            (
                "kubeproxy_conntrack_reconciler_sync_duration_seconds_count",
                r#"ip_family="IPv6""#,
                1.0,
            ),
            ("svcproxy_conntrack_cleanup_failures_total", "", 1.0),
            ("svcproxy_service_health_check_bind_failures", "", 1.0),
            ("svcproxy_destination_conflicts", "", 2.0),
            ("svcproxy_kernel_drift_total", "", 1.0),
            ("kubeproxy_proxy_healthz_total", r#"code="200""#, 1.0),
            ("kubeproxy_proxy_healthz_total", r#"code="503""#, 1.0),
            ("kubeproxy_proxy_livez_total", r#"code="200""#, 1.0),
        ] {
            assert_eq!(value(&s, name, labels), want, "{name}{{{labels}}}");
        }
    }

    #[tokio::test]
    async fn the_metrics_port_answers_healthz_and_proxy_mode_as_upstream() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Whatever the proxy's health: this port's /healthz is a liveness ping
        // (the server is not even told the health).
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(
            listener,
            Metrics::for_backend(nftables()),
            async move {
                let _ = rx.await;
            },
        ));
        for (path, body) in [
            ("/healthz", "ok"),
            ("/healthz/ping", "ok"),
            ("/healthz?verbose", "[+]ping ok\nhealthz check passed\n"),
            ("/proxyMode", "nftables"),
        ] {
            let resp = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            assert_eq!(
                resp.headers()["content-type"],
                "text/plain; charset=utf-8",
                "{path}"
            );
            assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
            assert_eq!(resp.text().await.unwrap(), body, "{path}");
        }
        let resp = reqwest::get(format!("http://{addr}/livez")).await.unwrap();
        assert_eq!(resp.status(), 404);
    }
}
