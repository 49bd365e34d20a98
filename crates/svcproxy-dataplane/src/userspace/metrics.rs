//! The userspace proxy's metrics (`svcproxy_userspace_*`): [`UserspaceCollector`]
//! reads its [`Stats`] at each scrape; the data plane hands it to the metrics
//! registry through [`crate::DataPlane::collectors`].

use std::sync::Arc;

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts};

use super::{PortCounters, Stats};

/// The userspace proxy's counters, read at each scrape: per service port (and
/// family) for at most [`MAX_PORT_SERIES`](super::MAX_PORT_SERIES) ports,
/// the others together under `service_port="_other"`, so the series stay few and
/// each stays monotonic.
pub struct UserspaceCollector {
    stats: Arc<Stats>,
    /// The families as declared (each scrape fills fresh ones of the same shape).
    templates: Vec<Box<dyn Collector>>,
}

const USERSPACE_LABELS: [&str; 2] = ["ip_family", "service_port"];

/// One of the userspace proxy's families: name, help, and how to read a port's
/// counters (`None`: a gauge, `active`).
type UserspaceFamily = (&'static str, &'static str, fn(&PortCounters) -> u64);

const USERSPACE_COUNTERS: [UserspaceFamily; 7] = [
    (
        "svcproxy_userspace_connections_accepted_total",
        "TCP connections the userspace proxy took for a service port",
        |c| c.accepted.load(std::sync::atomic::Ordering::Relaxed),
    ),
    (
        "svcproxy_userspace_connect_retries_total",
        "Endpoints that refused or did not accept in time, each followed by the next",
        |c| c.retried.load(std::sync::atomic::Ordering::Relaxed),
    ),
    (
        "svcproxy_userspace_connections_failed_total",
        "Client connections reset because no endpoint of the service port could be reached",
        |c| c.failed.load(std::sync::atomic::Ordering::Relaxed),
    ),
    (
        "svcproxy_userspace_bytes_to_endpoints_total",
        "Bytes the userspace proxy copied from clients to endpoints (counted when a connection ends)",
        |c| c.bytes_to_endpoints.load(std::sync::atomic::Ordering::Relaxed),
    ),
    (
        "svcproxy_userspace_bytes_to_clients_total",
        "Bytes the userspace proxy copied from endpoints to clients (counted when a connection ends)",
        |c| c.bytes_to_clients.load(std::sync::atomic::Ordering::Relaxed),
    ),
    (
        "svcproxy_userspace_udp_flows_total",
        "UDP flows (client address and service port) the userspace proxy opened",
        |c| c.udp_flows.load(std::sync::atomic::Ordering::Relaxed),
    ),
    (
        "svcproxy_userspace_udp_datagrams_total",
        "UDP datagrams the userspace proxy relayed, both ways",
        |c| c.udp_datagrams.load(std::sync::atomic::Ordering::Relaxed),
    ),
];

const USERSPACE_ACTIVE: (&str, &str) = (
    "svcproxy_userspace_connections_active",
    "TCP connections open through the userspace proxy",
);

const USERSPACE_UNROUTED: (&str, &str) = (
    "svcproxy_userspace_connections_unrouted_total",
    "TCP connections reset because their original destination was no service port's (a capture rule ahead of the proxy's routes)",
);

const USERSPACE_DRAINED: (&str, &str) = (
    "svcproxy_userspace_connections_drained_total",
    "TCP connections closed because their endpoint left and --userspace-drain-timeout passed",
);

impl UserspaceCollector {
    pub fn new(stats: Arc<Stats>) -> Self {
        let (counters, active, unrouted, drained) = Self::families();
        let mut templates: Vec<Box<dyn Collector>> =
            counters.into_iter().map(|c| Box::new(c) as _).collect();
        templates.push(Box::new(active));
        templates.push(Box::new(unrouted));
        templates.push(Box::new(drained));
        UserspaceCollector { stats, templates }
    }

    fn families() -> (Vec<IntCounterVec>, IntGaugeVec, IntCounter, IntCounter) {
        let counters = USERSPACE_COUNTERS
            .iter()
            .map(|(name, help, _)| {
                IntCounterVec::new(Opts::new(*name, *help), &USERSPACE_LABELS).expect("valid")
            })
            .collect();
        let active = IntGaugeVec::new(
            Opts::new(USERSPACE_ACTIVE.0, USERSPACE_ACTIVE.1),
            &USERSPACE_LABELS,
        )
        .expect("valid");
        let single = |(name, help): (&str, &str)| {
            IntCounter::with_opts(Opts::new(name, help)).expect("valid")
        };
        (
            counters,
            active,
            single(USERSPACE_UNROUTED),
            single(USERSPACE_DRAINED),
        )
    }
}

impl Collector for UserspaceCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.templates.iter().flat_map(|t| t.desc()).collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use std::sync::atomic::Ordering::Relaxed;
        let (counters, active, unrouted, drained) = Self::families();
        let fill = |family: &str, port: &str, c: &PortCounters| {
            let labels = [family, port];
            for ((_, _, read), vec) in USERSPACE_COUNTERS.iter().zip(&counters) {
                vec.with_label_values(&labels).inc_by(read(c));
            }
            active
                .with_label_values(&labels)
                .set(i64::try_from(c.active.load(Relaxed)).unwrap_or(i64::MAX));
        };
        {
            let book = self.stats.ports.lock().unwrap_or_else(|e| e.into_inner());
            for ((family, name), c) in &book.named {
                let port = format!("{name}/{}", name.protocol.as_str().to_ascii_lowercase());
                fill(family.as_str(), &port, c);
            }
            if book.rest.accepted.load(Relaxed) + book.rest.udp_flows.load(Relaxed) > 0 {
                fill("", "_other", &book.rest);
            }
        }
        unrouted.inc_by(self.stats.unrouted.load(Relaxed));
        drained.inc_by(self.stats.drained.load(Relaxed));
        let mut out: Vec<prometheus::proto::MetricFamily> =
            counters.iter().flat_map(|c| c.collect()).collect();
        out.extend(active.collect());
        out.extend(unrouted.collect());
        out.extend(drained.collect());
        out
    }
}

/// kube-proxy 1.37's localhost NodePort figures (KEP-6032), in nftables mode when
/// NodePorts are served on loopback: `kubeproxy_nftables_localhost_nodeport_listeners`
/// (the NodePort service ports served on loopback, TCP and UDP: svcproxy's forwarder
/// holds two listeners per family and routes each connection by its NodePort, where
/// upstream opens one listener per NodePort) and
/// `kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total`, per
/// `ip_family`, for the families served.
pub struct LocalhostNodePortCollector {
    stats: Arc<Stats>,
    families: [bool; 2],
    templates: (IntGaugeVec, IntCounterVec),
}

const LOCALHOST_LISTENERS: (&str, &str) = (
    "kubeproxy_nftables_localhost_nodeport_listeners",
    "[ALPHA] Number of localhost NodePort listeners",
);

const LOCALHOST_FAILURES: (&str, &str) = (
    "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
    "[ALPHA] Cumulative localhost NodePort listener creation failures",
);

impl LocalhostNodePortCollector {
    pub fn new(stats: Arc<Stats>, families: [bool; 2]) -> Self {
        LocalhostNodePortCollector {
            stats,
            families,
            templates: Self::families(),
        }
    }

    fn families() -> (IntGaugeVec, IntCounterVec) {
        (
            IntGaugeVec::new(
                Opts::new(LOCALHOST_LISTENERS.0, LOCALHOST_LISTENERS.1),
                &["ip_family"],
            )
            .expect("valid"),
            IntCounterVec::new(
                Opts::new(LOCALHOST_FAILURES.0, LOCALHOST_FAILURES.1),
                &["ip_family"],
            )
            .expect("valid"),
        )
    }
}

impl Collector for LocalhostNodePortCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.templates.0.desc();
        d.extend(self.templates.1.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use std::sync::atomic::Ordering::Relaxed;
        let (listeners, failures) = Self::families();
        for family in svcproxy_core::model::IpFamily::BOTH {
            let i = super::tcp::family_index(family);
            if !self.families[i] {
                continue;
            }
            let label = [family.as_str()];
            listeners.with_label_values(&label).set(
                i64::try_from(self.stats.loopback_listeners[i].load(Relaxed)).unwrap_or(i64::MAX),
            );
            failures
                .with_label_values(&label)
                .inc_by(self.stats.listener_failures[i].load(Relaxed));
        }
        let mut out = listeners.collect();
        out.extend(failures.collect());
        out
    }
}
