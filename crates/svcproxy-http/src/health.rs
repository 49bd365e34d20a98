//! Proxy health, as kube-proxy's ProxyHealthServer defines it, and the
//! `--healthz-bind-address` server (`/healthz`, `/livez`).
//!
//! Entry points: [`ProxyHealth`] (shared by the runner, the healthCheckNodePort servers
//! and the HTTP handlers) and [`serve`]. The proxy is *healthy* unless an update has
//! waited longer than the health timeout without being applied (nor a drift of the
//! kernel's rules gone unrepaired that long); it is *ready* once the first sync
//! succeeded. `/livez` reports health alone; `/healthz` (the readiness probe, and what
//! cloud load balancers of `externalTrafficPolicy: Cluster` services check) also
//! requires readiness, that the Node is not on its way out, and that no drift found
//! by the periodic check is waiting for its repair.
//!
//! Time comes from a [`Clock`]: wall time for the bodies, monotonic time for the
//! timeout, so that a wall-clock step (NTP at boot) never flips the verdict.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use tokio::net::TcpListener;

use super::go_time_string;
use super::metrics::Metrics;

/// Where [`ProxyHealth`] reads the time.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time, reported in bodies.
    fn wall(&self) -> SystemTime;
    /// Monotonic time, for the health timeout.
    fn monotonic(&self) -> Instant;
}

/// The system's clocks.
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
    fn monotonic(&self) -> Instant {
        Instant::now()
    }
}

/// One reading of both clocks.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    wall: SystemTime,
    mono: Instant,
}

#[derive(Debug)]
struct Inner {
    last_updated: Option<Stamp>,
    /// Updates received and not yet covered by a successful sync, oldest first,
    /// numbered from 1 in the order they arrived.
    pending: VecDeque<(u64, Stamp)>,
    /// Updates received so far.
    received: u64,
    node_eligible: bool,
    /// Since when the kernel has not held the rules (a drift check found them
    /// deleted, re-created or made dormant by someone else), until a sync repairs it.
    drift_since: Option<Stamp>,
    /// While a warm standby: the PID of the svcproxy that programs the node.
    standby_for: Option<u32>,
}

/// The proxy's health, shared between the sync loop and the HTTP servers.
pub struct ProxyHealth {
    timeout: Duration,
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

/// A snapshot of [`ProxyHealth`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthStatus {
    /// No update has waited longer than the health timeout.
    pub healthy: bool,
    /// A sync has succeeded since start.
    pub ready: bool,
    /// The last successful sync.
    pub last_updated: Option<SystemTime>,
    pub current_time: SystemTime,
    /// False while the Node is being deleted or drained by the cluster autoscaler.
    pub node_eligible: bool,
    /// The kernel lost the rules and no sync has put them back yet.
    pub drift: bool,
    /// A warm standby's owner (see [`ProxyHealth::set_standby`]).
    pub standby_for: Option<u32>,
}

impl ProxyHealth {
    /// `health_timeout` is upstream's: twice the sync period.
    pub fn new(health_timeout: Duration) -> Arc<Self> {
        Self::with_clock(health_timeout, Arc::new(SystemClock))
    }

    pub fn with_clock(health_timeout: Duration, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(ProxyHealth {
            timeout: health_timeout,
            clock,
            inner: Mutex::new(Inner {
                last_updated: None,
                // As upstream (its sync loop starts with `Updated()`), waiting for
                // the initial lists is not unhealthy: /livez stays 200, so that an
                // API server unreachable at boot does not become a restart loop that
                // delays recovery. /healthz is not ready until the first sync.
                pending: VecDeque::new(),
                received: 0,
                // As upstream: eligible until a Node event says otherwise.
                node_eligible: true,
                drift_since: None,
                standby_for: None,
            }),
        })
    }

    fn now(&self) -> Stamp {
        Stamp {
            wall: self.clock.wall(),
            mono: self.clock.monotonic(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state stays consistent even if a holder panicked: every update is a
        // single assignment.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An update reached svcproxy (counted when it arrives, not when the sync loop
    /// takes it: a hung sync must not hide it). Returns its number.
    pub fn queued_update(&self) -> u64 {
        let now = self.now();
        let mut inner = self.lock();
        inner.received += 1;
        let n = inner.received;
        // Only the oldest matters for the timeout, but a sync may cover some and not
        // the rest; the queue is bounded by what the channel holds.
        inner.pending.push_back((n, now));
        n
    }

    /// A sync succeeded that covers every update received so far.
    #[cfg(test)]
    pub fn updated(&self) {
        let through = self.lock().received;
        self.updated_through(through);
    }

    /// A sync succeeded that covers the updates numbered up to `through` (later ones
    /// arrived while it ran and still wait); the rules are current as of now.
    pub fn updated_through(&self, through: u64) {
        let now = self.now();
        let mut inner = self.lock();
        while inner.pending.front().is_some_and(|(n, _)| *n <= through) {
            inner.pending.pop_front();
        }
        inner.last_updated = Some(now);
        // Checks and syncs take turns: a sync that succeeded after the drift was
        // found rewrote everything.
        inner.drift_since = None;
    }

    /// The kernel lost the rules behind svcproxy's back: `/healthz` says 503 until a
    /// sync has put them back, and if none does within the health timeout the proxy
    /// is unhealthy (`/livez` too), as for an update not applied in time.
    pub fn drift_detected(&self) {
        let now = self.now();
        let mut inner = self.lock();
        inner.drift_since.get_or_insert(now);
    }

    /// While `Some`, this process is a warm standby of the svcproxy with that PID: its
    /// "syncs" keep only its own state, and `/healthz` says so. Ready once its
    /// sources have listed, as the owner's rules serve the node meanwhile.
    pub fn set_standby(&self, owner_pid: Option<u32>) {
        self.lock().standby_for = owner_pid;
    }

    /// False while the Node has a deletionTimestamp or the
    /// `ToBeDeletedByClusterAutoscaler` taint.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    /// The timeout rule alone (what healthCheckNodePort answers report as
    /// `serviceProxyHealthy`).
    pub fn is_healthy(&self) -> bool {
        self.status().healthy
    }

    pub fn status(&self) -> HealthStatus {
        let now = self.now();
        let inner = self.lock();
        let waited_too_long =
            |since: &Stamp| now.mono.saturating_duration_since(since.mono) >= self.timeout;
        let healthy = !inner
            .pending
            .front()
            .is_some_and(|(_, p)| waited_too_long(p))
            && !inner.drift_since.as_ref().is_some_and(waited_too_long);
        HealthStatus {
            healthy,
            drift: inner.drift_since.is_some(),
            ready: inner.last_updated.is_some(),
            last_updated: inner.last_updated.map(|s| s.wall),
            current_time: now.wall,
            node_eligible: inner.node_eligible,
            standby_for: inner.standby_for,
        }
    }
}

/// A JSON answer with the headers kube-proxy sets on every health answer.
pub(super) fn json_response(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Upstream's answer body quirk: a healthy proxy reports lastUpdated = currentTime
/// (older releases updated it on every sync loop, and clients rely on it being recent).
fn reported_last_updated(ok: bool, s: &HealthStatus) -> String {
    go_time_string(if ok {
        Some(s.current_time)
    } else {
        s.last_updated
    })
}

/// `/healthz`: 200 when healthy, ready, the Node is eligible and the kernel holds the
/// rules (no drift waiting for repair); 503 otherwise. A warm standby answers the
/// same way (its readiness is its sources', the owner's rules serve the node), its
/// body saying `"role": "standby"`: a `maxSurge` rollout waits for the new pod to be
/// ready before it stops the old one.
pub(super) fn healthz(health: &ProxyHealth, metrics: Option<&Metrics>) -> Response {
    let s = health.status();
    let ok = s.healthy && s.ready && s.node_eligible && !s.drift;
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if let Some(m) = metrics {
        m.count_healthz(code.as_u16());
    }
    // Upstream's body; a warm standby adds its role and the owner's PID.
    let role = match s.standby_for {
        Some(pid) => format!(r#", "role": "standby", "ownerPID": {pid}"#),
        None => String::new(),
    };
    let body = format!(
        r#"{{"lastUpdated": "{}","currentTime": "{}", "nodeEligible": {}{role}}}"#,
        reported_last_updated(ok, &s),
        go_time_string(Some(s.current_time)),
        s.node_eligible
    );
    json_response(code, body)
}

/// `/livez`: 200 when healthy (ignores readiness and the Node); 503 otherwise.
pub(super) fn livez(health: &ProxyHealth, metrics: Option<&Metrics>) -> Response {
    let s = health.status();
    let code = if s.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if let Some(m) = metrics {
        m.count_livez(code.as_u16());
    }
    let body = format!(
        r#"{{"lastUpdated": "{}","currentTime": "{}"}}"#,
        reported_last_updated(s.healthy, &s),
        go_time_string(Some(s.current_time)),
    );
    json_response(code, body)
}

type AppState = (Arc<ProxyHealth>, Option<Arc<Metrics>>);

/// Serves `/healthz` and `/livez` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    health: Arc<ProxyHealth>,
    metrics: Option<Arc<Metrics>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route(
            "/healthz",
            any(|State((h, m)): State<AppState>| async move { healthz(&h, m.as_deref()) }),
        )
        .route(
            "/livez",
            any(|State((h, m)): State<AppState>| async move { livez(&h, m.as_deref()) }),
        )
        .with_state((health, metrics));
    let addr = listener.local_addr().ok();
    tracing::debug!(?addr, "serving /healthz and /livez");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("health server on {addr:?}: {e}"))
}

/// A clock tests move by hand.
#[cfg(test)]
pub mod testing {
    use super::*;

    pub struct ManualClock {
        wall: SystemTime,
        mono: Instant,
        offset: Mutex<Duration>,
    }

    impl ManualClock {
        pub fn new(wall: SystemTime) -> Arc<Self> {
            Arc::new(ManualClock {
                wall,
                mono: Instant::now(),
                offset: Mutex::new(Duration::ZERO),
            })
        }

        pub fn advance(&self, d: Duration) {
            *self.offset.lock().unwrap() += d;
        }
    }

    impl Clock for ManualClock {
        fn wall(&self) -> SystemTime {
            self.wall + *self.offset.lock().unwrap()
        }
        fn monotonic(&self) -> Instant {
            self.mono + *self.offset.lock().unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::ManualClock;
    use super::*;
    use std::time::UNIX_EPOCH;

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// 2024-05-01 10:00:00 UTC.
    fn start_time() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_714_557_600)
    }

    fn health() -> (Arc<ProxyHealth>, Arc<ManualClock>) {
        let clock = ManualClock::new(start_time());
        (ProxyHealth::with_clock(TIMEOUT, clock.clone()), clock)
    }

    #[test]
    fn healthy_but_not_ready_however_long_the_initial_sync_takes() {
        let (h, clock) = health();
        let s = h.status();
        assert!(s.healthy && !s.ready && s.node_eligible);
        assert_eq!(s.last_updated, None);
        clock.advance(TIMEOUT);
        let s = h.status();
        assert!(s.healthy && !s.ready);
        h.updated();
        let s = h.status();
        assert!(s.healthy && s.ready);
        assert_eq!(s.last_updated, Some(start_time() + TIMEOUT));
    }

    #[test]
    fn a_sync_clears_only_the_updates_it_covered() {
        let (h, clock) = health();
        h.updated();
        assert_eq!(h.queued_update(), 1);
        clock.advance(TIMEOUT / 2);
        assert_eq!(h.queued_update(), 2);
        // A sync that took update 1 only (2 arrived while it ran).
        h.updated_through(1);
        clock.advance(TIMEOUT / 2);
        assert!(h.is_healthy(), "update 2 has waited half the timeout");
        clock.advance(TIMEOUT / 2);
        assert!(!h.is_healthy(), "update 2 has waited the whole timeout");
        h.updated_through(2);
        assert!(h.is_healthy());
    }

    #[test]
    fn a_queued_update_left_unapplied_past_the_timeout_is_unhealthy() {
        let (h, clock) = health();
        h.updated();
        clock.advance(Duration::from_secs(600));
        assert!(h.is_healthy(), "nothing pending: healthy however long ago");
        h.queued_update();
        clock.advance(Duration::from_secs(40));
        // A later update does not reset the clock: the oldest pending one counts.
        h.queued_update();
        clock.advance(Duration::from_secs(20));
        assert!(!h.is_healthy());
        h.updated();
        assert!(h.is_healthy());
    }

    /// An HTTP client without connection reuse, so each request sees the server as is.
    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    }

    async fn start_server(
        h: Arc<ProxyHealth>,
        metrics: Option<Arc<Metrics>>,
    ) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, h, metrics, async move {
            let _ = rx.await;
        }));
        (base, tx)
    }

    async fn get(base: &str, path: &str) -> (u16, reqwest::header::HeaderMap, String) {
        let resp = client().get(format!("{base}{path}")).send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, headers, resp.text().await.unwrap())
    }

    #[tokio::test]
    async fn healthz_is_not_ready_before_the_first_sync_while_livez_is_alive() {
        let (h, _clock) = health();
        let (base, _stop) = start_server(h.clone(), None).await;
        let (code, headers, body) = get(&base, "/healthz").await;
        assert_eq!(code, 503);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(
            body,
            r#"{"lastUpdated": "0001-01-01 00:00:00 +0000 UTC","currentTime": "2024-05-01 10:00:00 +0000 UTC", "nodeEligible": true}"#
        );
        let (code, headers, body) = get(&base, "/livez").await;
        assert_eq!(code, 200);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        // Healthy: lastUpdated is reported as now (upstream's compatibility quirk).
        assert_eq!(
            body,
            r#"{"lastUpdated": "2024-05-01 10:00:00 +0000 UTC","currentTime": "2024-05-01 10:00:00 +0000 UTC"}"#
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v.is_object());
    }

    #[tokio::test]
    async fn a_drift_fails_healthz_until_a_sync_repairs_it_and_livez_once_overdue() {
        let (h, clock) = health();
        let (base, _stop) = start_server(h.clone(), None).await;
        h.updated();
        assert_eq!(get(&base, "/healthz").await.0, 200);
        h.drift_detected();
        assert!(h.status().drift);
        assert_eq!(get(&base, "/healthz").await.0, 503);
        // The repair is under way: the process itself is fine.
        assert_eq!(get(&base, "/livez").await.0, 200);
        // A second check before the repair does not restart the clock.
        clock.advance(TIMEOUT / 2);
        h.drift_detected();
        clock.advance(TIMEOUT / 2);
        assert_eq!(
            get(&base, "/livez").await.0,
            503,
            "unrepaired for the whole timeout"
        );
        h.updated_through(0);
        assert!(!h.status().drift);
        assert_eq!(get(&base, "/healthz").await.0, 200);
        assert_eq!(get(&base, "/livez").await.0, 200);
    }

    #[tokio::test]
    async fn both_probes_fail_once_a_queued_update_is_overdue() {
        let (h, clock) = health();
        let metrics = Metrics::new();
        let (base, _stop) = start_server(h.clone(), Some(metrics.clone())).await;
        h.updated();
        clock.advance(Duration::from_millis(250));
        assert_eq!(get(&base, "/healthz").await.0, 200);
        h.queued_update();
        clock.advance(TIMEOUT);
        let (code, _, body) = get(&base, "/healthz").await;
        assert_eq!(code, 503);
        // Unhealthy: lastUpdated is the real last sync.
        assert_eq!(
            body,
            r#"{"lastUpdated": "2024-05-01 10:00:00 +0000 UTC","currentTime": "2024-05-01 10:01:00.25 +0000 UTC", "nodeEligible": true}"#
        );
        let (code, _, body) = get(&base, "/livez").await;
        assert_eq!(code, 503);
        assert_eq!(
            body,
            r#"{"lastUpdated": "2024-05-01 10:00:00 +0000 UTC","currentTime": "2024-05-01 10:01:00.25 +0000 UTC"}"#
        );
        h.updated();
        assert_eq!(get(&base, "/healthz").await.0, 200);
        assert_eq!(get(&base, "/livez").await.0, 200);
        let text = metrics.render();
        for line in [
            r#"kubeproxy_proxy_healthz_total{code="200"} 2"#,
            r#"kubeproxy_proxy_healthz_total{code="503"} 1"#,
            r#"kubeproxy_proxy_livez_total{code="200"} 1"#,
            r#"kubeproxy_proxy_livez_total{code="503"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[tokio::test]
    async fn a_warm_standby_says_so_once_its_sources_have_listed() {
        let (h, _clock) = health();
        let (base, _stop) = start_server(h.clone(), None).await;
        h.set_standby(Some(4242));
        // Not ready until its state is complete, as an owner before its first sync.
        assert_eq!(get(&base, "/healthz").await.0, 503);
        h.updated();
        let (code, _, body) = get(&base, "/healthz").await;
        assert_eq!(code, 200);
        assert_eq!(
            body,
            r#"{"lastUpdated": "2024-05-01 10:00:00 +0000 UTC","currentTime": "2024-05-01 10:00:00 +0000 UTC", "nodeEligible": true, "role": "standby", "ownerPID": 4242}"#
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["role"], "standby");
        assert_eq!(get(&base, "/livez").await.0, 200);
        // Taken over: upstream's body again.
        h.set_standby(None);
        let (_, _, body) = get(&base, "/healthz").await;
        assert!(!body.contains("role"), "{body}");
    }

    #[tokio::test]
    async fn a_node_on_its_way_out_fails_healthz_but_not_livez() {
        let (h, clock) = health();
        let (base, _stop) = start_server(h.clone(), None).await;
        h.updated();
        h.set_node_eligible(false);
        clock.advance(Duration::from_secs(1));
        let (code, _, body) = get(&base, "/healthz").await;
        assert_eq!(code, 503);
        assert_eq!(
            body,
            r#"{"lastUpdated": "2024-05-01 10:00:00 +0000 UTC","currentTime": "2024-05-01 10:00:01 +0000 UTC", "nodeEligible": false}"#
        );
        let (code, _, body) = get(&base, "/livez").await;
        assert_eq!(code, 200);
        assert_eq!(
            body,
            r#"{"lastUpdated": "2024-05-01 10:00:01 +0000 UTC","currentTime": "2024-05-01 10:00:01 +0000 UTC"}"#
        );
        h.set_node_eligible(true);
        assert_eq!(get(&base, "/healthz").await.0, 200);
    }

    #[tokio::test]
    async fn other_paths_are_not_found_and_shutdown_stops_the_server() {
        let (h, _clock) = health();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, h, None, async move {
            let _ = rx.await;
        }));
        let base = format!("http://{addr}");
        assert_eq!(get(&base, "/metrics").await.0, 404);
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
        assert!(client().get(&base).send().await.is_err());
    }
}
