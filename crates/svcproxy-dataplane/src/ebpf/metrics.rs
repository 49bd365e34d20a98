//! The ebpf mode's own metrics, read at each scrape from what the last write
//! left: how full the maps svcproxy fills are, what did not fit, and how many
//! writes failed.
//!
//! - `svcproxy_ebpf_map_entries{map}`: keys svcproxy holds in the map, and the
//!   entries each LRU map holds (counted from its pin at each scrape: the
//!   programs fill those);
//! - `svcproxy_ebpf_map_max_entries{map}`: the map's size (the flags', and the
//!   LRU maps' as the kernel has them);
//! - `svcproxy_ebpf_map_overflow_keys{map}`: keys that did not fit (0 when all did);
//! - `svcproxy_ebpf_unprogrammed_service_ports`: service ports not served as planned
//!   for want of room (their addresses untranslated, or refused for want of room
//!   for their endpoints);
//! - `svcproxy_ebpf_map_write_failures_total`: writes of the maps that failed;
//! - `svcproxy_ebpf_xdp_packets_total{verdict}`: packets the XDP fast path
//!   (`--ebpf-xdp=native`) `forwarded` itself (to an endpoint, or a reply of a
//!   connection it masqueraded to its client), `dropped`, or
//!   `passed` to the stack, read from its counters at each scrape;
//! - `svcproxy_ebpf_masquerade_ports_total{result}`: svcproxy's own masquerade
//!   (the XDP fast path's): ports `taken` for new connections, and new
//!   connections that found none free (`exhausted`: left to the kernel's);
//! - `svcproxy_ebpf_client_ports_remapped_total{result}`: new connections of the
//!   packet path whose translated tuple another connection held at the endpoint
//!   (one client port, two service addresses): given another client port
//!   (`remapped`), or left to share the tuple for want of a free port (`shared`);
//! - `svcproxy_ebpf_map_evictions_total{map}`: entries each LRU map evicted to
//!   make room (live or long closed), counted by a tracing program since this
//!   process started
//!   (absent where it cannot run: see `kernel::Evictions`).

use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::kernel::Overflow;
use super::MapSizes;

/// What the collector reads, written after each sync.
#[derive(Debug, Default)]
pub struct MapStats {
    pub fill: Vec<(&'static str, usize)>,
    pub sizes: MapSizes,
    pub overflow: Overflow,
    pub failed_writes: u64,
    /// The LRU maps' eviction counter, where it runs.
    pub evictions: Option<Arc<super::kernel::Evictions>>,
    /// Connected UDP sockets destroyed because their endpoint left, since start.
    pub destroyed_sockets: u64,
}

pub struct EbpfCollector {
    stats: Arc<Mutex<MapStats>>,
    /// Where the XDP program's counters are pinned.
    pin_dir: std::path::PathBuf,
    descs: Vec<Desc>,
}

fn xdp_family() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "svcproxy_ebpf_xdp_packets_total",
            "Packets the XDP fast path forwarded itself (to an endpoint, or a reply to its client), dropped, or passed to the stack (ebpf mode, --ebpf-xdp=native).",
        ),
        &["verdict"],
    )
    .expect("valid")
}

fn masquerade_family() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "svcproxy_ebpf_masquerade_ports_total",
            "Ports svcproxy's own masquerade took for new connections (taken), and new connections that found none free and were left to the kernel's masquerade (exhausted) (ebpf mode, --ebpf-xdp=native).",
        ),
        &["result"],
    )
    .expect("valid")
}

fn remap_family() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "svcproxy_ebpf_client_ports_remapped_total",
            "New connections of the packet path whose translated tuple another connection held at the endpoint: given another client port (remapped), or left to share the tuple for want of a free port (shared) (ebpf mode).",
        ),
        &["result"],
    )
    .expect("valid")
}

fn evictions_family() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "svcproxy_ebpf_map_evictions_total",
            "Entries each LRU BPF map evicted to make room, since svcproxy started: a live connection's, a reply's source, a session's endpoint, or one of a connection long closed (ebpf mode, where the kernel runs tracing programs).",
        ),
        &["map"],
    )
    .expect("valid")
}

fn destroyed_family() -> IntCounter {
    IntCounter::new(
        "svcproxy_ebpf_udp_sockets_destroyed_total",
        "Connected UDP sockets translated at connect() that svcproxy destroyed because their service no longer reaches their endpoint (the endpoint left, or the service port went), so that the client's next call fails and it retries on a fresh socket (ebpf mode).",
    )
    .expect("valid")
}

fn gauges(name: &str, help: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &["map"]).expect("valid")
}

fn families() -> (IntGaugeVec, IntGaugeVec, IntGaugeVec, IntGauge, IntCounter) {
    (
        gauges(
            "svcproxy_ebpf_map_entries",
            "Keys svcproxy holds in each BPF map it fills (ebpf mode).",
        ),
        gauges(
            "svcproxy_ebpf_map_max_entries",
            "Size (max_entries) of each BPF map svcproxy fills (ebpf mode).",
        ),
        gauges(
            "svcproxy_ebpf_map_overflow_keys",
            "Keys that did not fit in each BPF map at the last write (ebpf mode).",
        ),
        IntGauge::new(
            "svcproxy_ebpf_unprogrammed_service_ports",
            "Service ports not served as planned for want of room in the BPF maps (ebpf mode).",
        )
        .expect("valid"),
        IntCounter::new(
            "svcproxy_ebpf_map_write_failures_total",
            "Writes of the BPF maps that failed (ebpf mode).",
        )
        .expect("valid"),
    )
}

impl EbpfCollector {
    pub fn new(stats: Arc<Mutex<MapStats>>, pin_dir: std::path::PathBuf) -> Self {
        let (a, b, c, d, e) = families();
        let f = xdp_family();
        let g = masquerade_family();
        let h = remap_family();
        let i = evictions_family();
        let j = destroyed_family();
        let mut descs = Vec::new();
        for m in [
            a.desc(),
            b.desc(),
            c.desc(),
            d.desc(),
            e.desc(),
            f.desc(),
            g.desc(),
            h.desc(),
            i.desc(),
            j.desc(),
        ] {
            descs.extend(m.into_iter().cloned());
        }
        EbpfCollector {
            stats,
            pin_dir,
            descs,
        }
    }
}

impl Collector for EbpfCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (entries, max, overflow, ports, failures) = families();
        let s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        for (map, n) in &s.fill {
            entries.with_label_values(&[map]).set(*n as i64);
        }
        for (map, size) in s.sizes.by_map() {
            max.with_label_values(&[map]).set(i64::from(size));
            let over = s.overflow.keys.get(map).copied().unwrap_or(0);
            overflow.with_label_values(&[map]).set(over as i64);
        }
        ports.set(s.overflow.ports.len() as i64);

        failures.inc_by(s.failed_writes);
        let destroyed = destroyed_family();
        destroyed.inc_by(s.destroyed_sockets);
        let evictions = s.evictions.clone();
        let opened = !s.fill.is_empty();
        drop(s);
        // The LRU maps, once the maps exist (counted with the lock let go: a
        // sync need not wait for it).
        if opened {
            for (map, n, size) in super::kernel::lru_fill(&self.pin_dir) {
                entries.with_label_values(&[map]).set(n as i64);
                max.with_label_values(&[map]).set(i64::from(size));
            }
        }
        // A family without samples (nothing written yet) is left out.
        let mut out: Vec<MetricFamily> = entries
            .collect()
            .into_iter()
            .filter(|f| !f.get_metric().is_empty())
            .collect();
        out.extend(max.collect());
        out.extend(overflow.collect());
        out.extend(ports.collect());
        out.extend(failures.collect());
        out.extend(destroyed.collect());
        if let Some(counts) = super::kernel::xdp_packets(&self.pin_dir) {
            let xdp = xdp_family();
            for (verdict, n) in ["forwarded", "dropped", "passed"].iter().zip(counts) {
                xdp.with_label_values(&[verdict]).inc_by(n);
            }
            out.extend(xdp.collect());
        }
        if let Some(counts) = super::kernel::masquerade_ports(&self.pin_dir) {
            let ports = masquerade_family();
            for (result, n) in ["taken", "exhausted"].iter().zip(counts) {
                ports.with_label_values(&[result]).inc_by(n);
            }
            out.extend(ports.collect());
        }
        if let Some(counts) = super::kernel::remapped_client_ports(&self.pin_dir) {
            let remaps = remap_family();
            for (result, n) in ["remapped", "shared"].iter().zip(counts) {
                remaps.with_label_values(&[result]).inc_by(n);
            }
            out.extend(remaps.collect());
        }
        if let Some(e) = evictions {
            let family = evictions_family();
            for (map, n) in e.counts() {
                family.with_label_values(&[map]).inc_by(n);
            }
            out.extend(family.collect());
        }
        out
    }
}
