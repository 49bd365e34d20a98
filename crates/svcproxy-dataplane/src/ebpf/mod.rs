//! The eBPF data plane. Socket side: cgroup programs (`bpf/sock.c`) translate a
//! connection to a service address once, at connect() (sendmsg() for an
//! unconnected UDP socket), to an endpoint chosen from BPF maps, and show the
//! service address back at recvmsg() and getpeername(); no packet of such a
//! connection meets a NAT rule. Packet side: tc programs (`bpf/tc.c`) on every
//! Ethernet interface of the node translate connections no local socket made
//! (from outside, from other nodes, from pods whose sockets are left to the
//! packet path) and their replies, with two fixed nftables rules for what a tc
//! program cannot do well (masquerade, reject).
//!
//! - [`svcproxy_plan::ebpf`]: the intent as map contents (pure), `render`'s
//!   text, and the fixed rules;
//! - [`wire`]: the maps' binary layouts, mirrored from `bpf/lib/*.h`;
//! - [`kernel`]: loading, attaching, pinning, and writing the maps.
//!
//! Every verdict comes from the intent
//! ([`svcproxy_plan::intent::ServiceIntent::socket_verdict`] and
//! [`svcproxy_plan::intent::ServiceIntent::packet_verdict`]); the programs look
//! up, pick and rewrite.
//!
//! Tested with real sockets (`svcproxy-e2e/tests/ebpf_socket.rs`) and real
//! packets through a two-node namespace cluster
//! (`svcproxy-e2e/tests/ebpf_packet.rs`).

mod batch;
pub mod ipvs;
pub mod kernel;
mod metrics;
pub mod wire;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use svcproxy_core::model::Protocol;
use svcproxy_plan::intent::NodePortDestinations;
use svcproxy_plan::{Intent, IntentDelta, PlanConfig};

use crate::error::DataPlaneError;
use crate::kernel::conntrack::StaleUdp;
use crate::kernel::nft::{NftCommand, ScriptSink};
use crate::seam::{
    ApplyReport, Comparison, ConfigSection, DataPlane, KernelObjects, LocalhostDefault,
    ModeDefaults, ModeInfo, NodePortDefault, NodeRequirements, SyncKind,
};
use kernel::Kernel;
use svcproxy_plan::ebpf::{companion_rules, Changes, Table, COMPANION_TABLE};

/// Deletes the companion rules' table; none is no error.
fn remove_companion() -> Result<(), DataPlaneError> {
    // Asked over netlink first: nothing to remove needs no `nft` at all.
    if matches!(
        crate::kernel::nft::inet_table_state(COMPANION_TABLE),
        Ok(crate::kernel::nft::TableState::Missing)
    ) {
        return Ok(());
    }
    NftCommand::default().run(&format!(
        "table inet {COMPANION_TABLE}\ndelete table inet {COMPANION_TABLE}\n"
    ))
}

/// The `--proxy-mode` name.
pub const MODE: &str = "ebpf";

/// The flag group of the ebpf and ipvs modes' own flags (`--ebpf-*`).
pub const FLAGS: &str = "ebpf";

/// The ebpf mode in the registry.
pub const INFO: ModeInfo = ModeInfo {
    mode: MODE,
    aliases: &[],
    gate: None,
    defaults: ModeDefaults {
        // Sync periods as the nftables mode, the mode it replaces.
        config_section: ConfigSection::Nftables,
        nodeport_addresses: NodePortDefault::Primary,
        localhost_nodeports: LocalhostDefault::Off,
    },
    flag_groups: &[FLAGS],
    failure_counters: &[],
    counts_rules: false,
    large_cluster_endpoints: None,
    objects: KernelObjects::EbpfMaps,
    semantics: svcproxy_plan::ebpf::SEMANTICS,
};

/// Where build.rs left the XDP benchmark's and tests' own programs
/// (`bpf/bench.c`: a frame generator, a bare-redirect floor, a pass and a
/// counting sink); svcproxy never loads them, and the binary does not carry them.
pub const BENCH_OBJECT: &str = concat!(env!("OUT_DIR"), "/bench.o");

/// `--ebpf-xdp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpMode {
    /// No XDP program: the tc programs meet every packet.
    #[default]
    Off,
    /// The XDP program in the driver, where the driver runs one.
    Native,
}

/// The sizes of the maps that grow with the cluster (`max_entries`): four
/// flags, and every other map that grows derived from one of them
/// ([`MapSizes::by_map`]). The maps bounded by one node's own things keep a
/// fixed size (docs/ebpf.md, "Maps").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// `svcproxy_svc` and `svcproxy_vip`; `svcproxy_rr` (a round-robin list per
    /// service address at most) and `svcproxy_fw` (a quarter: the source ranges
    /// of fenced ports) derive from it.
    pub services: u32,
    /// `svcproxy_slot` (and `svcproxy_member`, the same).
    pub endpoints: u32,
    /// `svcproxy_ct`; the other LRU maps (a quarter each) derive from it.
    pub connections: u32,
    /// `svcproxy_mh`: Maglev table entries of 256 cells (a table of the default
    /// 16,381 cells takes 64).
    pub maglev: u32,
}

impl MapSizes {
    pub const DEFAULT: MapSizes = MapSizes {
        services: 262_144,
        endpoints: 2_097_152,
        connections: 262_144,
        maglev: 262_144,
    };

    /// Each sized map's name and size. The LRU maps besides `svcproxy_ct`
    /// (remapped client ports, unconnected UDP sockets' flows and replies,
    /// affinity, live-connection counts, the XDP cache) are a quarter of
    /// `svcproxy_ct`'s, at least 1024: each holds an entry for some of the
    /// connections, or of their clients or endpoints.
    pub fn by_map(&self) -> Vec<(&'static str, u32)> {
        let quarter = |n: u32| (n / 4).max(1024);
        let mut maps = vec![
            ("svcproxy_svc", self.services),
            ("svcproxy_vip", self.services),
            ("svcproxy_rr", self.services),
            ("svcproxy_fw", quarter(self.services)),
            ("svcproxy_slot", self.endpoints),
            ("svcproxy_member", self.endpoints),
            ("svcproxy_mh", self.maglev),
            ("svcproxy_ct", self.connections),
        ];
        for lru in kernel::LRU_MAPS.into_iter().filter(|m| *m != "svcproxy_ct") {
            maps.push((lru, quarter(self.connections)));
        }
        maps
    }
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes::DEFAULT
    }
}

/// Where the programs attach and pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbpfOptions {
    /// The cgroup (v2) whose processes' sockets are translated, descendants
    /// included.
    pub cgroup: PathBuf,
    /// The directory svcproxy owns on a bpffs, for its maps and links.
    pub pin_dir: PathBuf,
    /// Translate only the host's own processes' sockets; pods' connections keep
    /// the service address and meet the packet path (for meshes that must see
    /// it, as Cilium's `socketLB.hostNamespaceOnly`).
    pub host_namespace_only: bool,
    /// The XDP fast path on the interfaces from outside.
    pub xdp: XdpMode,
    /// Where it goes, by name (empty: every interface that is not a pod's).
    pub xdp_interfaces: Vec<String>,
    /// The maps' sizes.
    pub sizes: MapSizes,
    /// The packet path's idle timeouts (ipvs mode's `--ipvs-*-timeout`).
    pub timeouts: IdleTimeouts,
}

/// How long the packet path keeps an idle connection's endpoint: kube-proxy's
/// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout` and `--ipvs-udp-timeout`
/// (`ipvs.tcpTimeout`, `tcpFinTimeout`, `udpTimeout`). `None` (kube-proxy's 0:
/// "leave as is"): no idle timeout; the connection table's LRU alone forgets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleTimeouts {
    /// An established TCP connection.
    pub tcp: Option<std::time::Duration>,
    /// A TCP connection once a FIN or RST passed.
    pub tcp_fin: Option<std::time::Duration>,
    /// A UDP flow: past it, the flow's next datagram is scheduled afresh.
    pub udp: Option<std::time::Duration>,
}

impl EbpfOptions {
    /// The cgroup v2 root wherever it is mounted, and `/sys/fs/bpf/svcproxy`.
    pub fn host_defaults() -> EbpfOptions {
        EbpfOptions {
            cgroup: kernel::cgroup2_root().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup")),
            pin_dir: PathBuf::from("/sys/fs/bpf/svcproxy"),
            host_namespace_only: false,
            xdp: XdpMode::Off,
            xdp_interfaces: Vec::new(),
            sizes: MapSizes::DEFAULT,
            timeouts: IdleTimeouts::default(),
        }
    }
}

/// The eBPF data plane (socket side).
pub struct EbpfDataPlane {
    /// The `--proxy-mode` it runs as (`ebpf`, or `ipvs`).
    mode: &'static str,
    opts: EbpfOptions,
    kernel: Option<Kernel>,
    /// The table of the last intent synced (successfully or not), brought
    /// forward by each delta.
    table: Option<Table>,
    /// The marks the companion nftables rules were last written with.
    companion: Option<(u32, u32, Option<u16>)>,
    /// The SCTP limit was logged.
    sctp_warned: bool,
    /// The ports svcproxy's own masquerade takes, read from the node once (at
    /// the first load of the programs; a reload keeps them, since the replies
    /// of connections masqueraded before are recognised by them).
    snat: Option<Option<(u16, u16)>>,
    /// The node's `ip_local_port_range` was found to reach into them (said once).
    snat_overlap_said: bool,
    /// What the metrics read.
    stats: std::sync::Arc<std::sync::Mutex<metrics::MapStats>>,
    /// This process sealed the maps for a successor: its next write removes
    /// the seal (the maps then no longer hold what it vouched for).
    sealed_here: bool,
    /// The LRU maps' eviction counter: `None` until the maps are first opened,
    /// then whether it could be started.
    evictions: Option<Option<std::sync::Arc<kernel::Evictions>>>,
    /// Pods' connected UDP sockets cannot be destroyed (no `CAP_SYS_ADMIN`):
    /// said once.
    pods_sockets_said: bool,
    /// Stale sockets were not found where svcproxy can look: said once.
    unfound_said: bool,
    /// The kernel refuses to list or destroy sockets for good: not tried again.
    sockets_refused: bool,
}

impl EbpfDataPlane {
    /// Says once when the node's `ip_local_port_range` has grown, since the
    /// masquerade's ports were read, into them: the node's sockets may then take
    /// a port a masqueraded connection holds. Only with XDP, the one path that
    /// takes those ports. The ports stay (the replies of connections masqueraded
    /// already are recognised by them): a restart of svcproxy takes the ports
    /// above the new range.
    fn check_port_range(&mut self) {
        let Some(Some((lo, _))) = self.snat else {
            return;
        };
        if self.snat_overlap_said || self.opts.xdp != XdpMode::Native {
            return;
        }
        if let Some(range) = kernel::local_range_overlapping(lo) {
            tracing::warn!(
                ip_local_port_range = range.trim(),
                masquerade_ports = %format!("{lo}-65535"),
                "the node's ip_local_port_range now reaches into the ports svcproxy's own \
                 masquerade took at start: the node's sockets and masqueraded connections \
                 may meet on one port; restart svcproxy to take the ports above the new range"
            );
            self.snat_overlap_said = true;
        }
    }

    /// The same data plane, answering `/proxyMode` as `mode` (the registry's
    /// ipvs mode).
    pub fn named(mut self, mode: &'static str) -> EbpfDataPlane {
        self.mode = mode;
        self
    }

    /// The data plane of `opts`; an `--ebpf-bpffs` naming a bpffs itself (its
    /// mount point, or `/sys/fs/bpf` before one is mounted there) is taken to
    /// mean svcproxy's own directory inside it ([`kernel::own_pin_dir`]).
    pub fn new(mut opts: EbpfOptions) -> EbpfDataPlane {
        opts.pin_dir = kernel::own_pin_dir(&opts.pin_dir);
        EbpfDataPlane {
            mode: MODE,
            opts,
            kernel: None,
            table: None,
            companion: None,
            sctp_warned: false,
            snat: None,
            snat_overlap_said: false,
            stats: Default::default(),
            sealed_here: false,
            evictions: None,
            pods_sockets_said: false,
            unfound_said: false,
            sockets_refused: false,
        }
    }

    /// The host's addresses, read only when NodePorts answer on every local
    /// address.
    fn host_addrs(intent: &Intent) -> Vec<IpAddr> {
        let all_local = intent.families().any(|f| {
            f.node()
                .is_some_and(|n| n.nodeports == NodePortDestinations::AllLocal)
        });
        if !all_local {
            return Vec::new();
        }
        crate::kernel::host_addrs::host_addresses().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the host's addresses for NodePorts");
            Vec::new()
        })
    }

    fn table(intent: &Intent) -> Table {
        Table::build(intent, &Self::host_addrs(intent))
    }

    /// The programs loaded and the maps opened, unless they are already.
    fn open_kernel(&mut self) -> Result<&mut Kernel, DataPlaneError> {
        if self.kernel.is_none() {
            let xdp = self.opts.xdp;
            let snat = *self.snat.get_or_insert_with(|| kernel::snat_ports(xdp));
            self.kernel = Some(Kernel::open(&self.opts, snat)?);
            self.count_evictions();
        }
        Ok(self.kernel.as_mut().expect("opened above"))
    }

    /// The LRU maps just opened counted by the eviction counter, started the
    /// first time (without it, the mode runs on and the log says why, once).
    fn count_evictions(&mut self) {
        match &self.evictions {
            None => {
                let started = if !kernel::may_trace() {
                    // Not tried: the DaemonSet of deploy/ does not grant it.
                    tracing::info!("the LRU maps' evictions are not counted (svcproxy_ebpf_map_evictions_total is absent): the counter is a tracing program, which needs CAP_PERFMON; everything else works");
                    None
                } else {
                    match kernel::Evictions::start(&self.opts.pin_dir) {
                        Ok(e) => Some(std::sync::Arc::new(e)),
                        Err(e) => {
                            tracing::warn!(error = %e, "the LRU maps' evictions are not counted (svcproxy_ebpf_map_evictions_total is absent): the counter is a tracing program, which this kernel refuses (it needs BPF trampolines: `bpftool feature probe kernel` says whether program_type tracing is available); everything else works");
                            None
                        }
                    }
                };
                let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.evictions = started.clone();
                self.evictions = Some(started);
            }
            Some(Some(e)) => {
                if let Err(e) = e.watch(&self.opts.pin_dir) {
                    tracing::warn!(error = %e, "the LRU maps made afresh are not counted for evictions");
                }
            }
            Some(None) => {}
        }
    }

    /// The fixed companion rules, with the marks of the moment (before the
    /// programs set those marks), unless they were written with them already
    /// and `changed_only`.
    fn write_companion(&mut self, table: &Table, changed_only: bool) -> Result<(), DataPlaneError> {
        let marks = (
            table.masquerade_mark,
            table.reject_mark,
            self.snat.flatten().map(|(lo, _)| lo),
        );
        if changed_only && self.companion == Some(marks) {
            return Ok(());
        }
        self.companion = None;
        NftCommand::default().run(&companion_rules(marks.0, marks.1, marks.2))?;
        self.companion = Some(marks);
        Ok(())
    }

    /// `table` written into the open maps, whole or by its `changes`, after the
    /// companion rules; returns the map writes and deletions.
    fn write_table(
        &mut self,
        table: &Table,
        changes: Option<&Changes>,
    ) -> Result<usize, DataPlaneError> {
        self.write_companion(table, changes.is_some())?;
        // A seal vouches for what the maps hold: a full write (a predecessor's
        // seal not adopted) or any write after this process sealed removes it.
        if changes.is_none() || self.sealed_here {
            kernel::unseal(&self.opts.pin_dir)?;
            self.sealed_here = false;
        }
        let kernel = self.kernel.as_mut().expect("opened before");
        let written = kernel.write(table, changes);
        self.note_stats(written.is_err());
        written
    }

    /// What the metrics read, after a write (`failed`: it did not succeed).
    fn note_stats(&self, failed: bool) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.fill = kernel.fill();
        stats.sizes = self.opts.sizes;
        stats.overflow = kernel.overflow.clone();
        stats.failed_writes += u64::from(failed);
    }

    /// The packet path's live-connection counts brought back to its
    /// connections, where a list counts them (lc).
    fn reconcile_lc(&mut self) {
        let (Some(kernel), Some(table)) = (self.kernel.as_mut(), self.table.as_ref()) else {
            return;
        };
        if table
            .lists
            .values()
            .any(|l| l.scheduler.counts_connections())
        {
            if let Err(e) = kernel.reconcile_flows() {
                tracing::warn!(error = %e, "the packet path's connection counts (lc) were not reconciled; the next sync tries again");
            }
        }
    }
}

impl DataPlane for EbpfDataPlane {
    fn mode(&self) -> &'static str {
        self.mode
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        self.check_port_range();
        let never_synced = self.table.is_none();
        let addrs = Self::host_addrs(intent);
        // The table follows the intent whether or not the write succeeds (the
        // delta is from the previous intent, applied or not); a failed write
        // makes the kernel's next write a full one.
        let changes = match self.table.as_mut() {
            Some(t) if !full => t.update(intent, delta, &addrs),
            _ => {
                self.table = Some(Table::build(intent, &addrs));
                None
            }
        };
        let table = self.table.as_ref().expect("set above");
        if !self.sctp_warned && table.entries.keys().any(|d| d.protocol == Protocol::Sctp) {
            tracing::warn!(
                "SCTP is translated at connect() only on the ebpf data plane: connections from the \
                 node's processes reach SCTP services, SCTP packets from outside the node or \
                 from pods whose sockets are not translated are not (SCTP's checksum covers \
                 the ports and a tc program cannot recompute it)"
            );
            self.sctp_warned = true;
        }
        let start = Instant::now();
        let first = self.kernel.is_none();
        self.open_kernel()?;
        let changes = changes.filter(|_| !first);
        let table = self.table.take().expect("set above");
        let written = self.write_table(&table, changes.as_ref());
        self.table = Some(table);
        let ops = written?;
        self.reconcile_lc();
        let kind = if first || never_synced {
            SyncKind::Recreate
        } else if changes.is_none() {
            SyncKind::Resync
        } else {
            SyncKind::Partial
        };
        Ok(ApplyReport {
            kind,
            apply_duration: start.elapsed(),
            // The maps hold both families.
            family_apply: Vec::new(),
            // Map writes and deletions: the work sent to the kernel.
            script_bytes: ops,
            rules: Vec::new(),
            stale_flows: Vec::new(),
        })
    }

    fn render(&self, intent: &Intent) -> String {
        Self::table(intent).render()
    }

    fn close_stale_udp(&mut self, stale: &StaleUdp<'_>) -> Result<usize, DataPlaneError> {
        if self.kernel.is_none() || self.sockets_refused {
            return Ok(0);
        }
        // Pods' sockets are translated unless --ebpf-host-namespace-only; their
        // namespaces can be entered only with CAP_SYS_ADMIN.
        let pods = !self.opts.host_namespace_only;
        let others = pods && kernel::may_enter_namespaces();
        if pods && !others && !std::mem::replace(&mut self.pods_sockets_said, true) {
            tracing::info!("connected UDP sockets of pods stay on an endpoint that left until they close: destroying them takes entering the pods' network namespaces, which needs CAP_SYS_ADMIN (and /run/netns, where the runtime names them); the node's own are destroyed");
        }
        // A NodePort's stale flows are those to this node's addresses (asked
        // only if a translation might be one).
        let node = std::cell::OnceCell::new();
        let node_address = |ip: IpAddr| {
            ip.is_loopback()
                || node
                    .get_or_init(|| crate::kernel::host_addrs::host_addresses().unwrap_or_default())
                    .contains(&ip)
        };
        let closed = match kernel::close_stale(&self.opts.pin_dir, stale, others, &node_address) {
            Ok(c) => c,
            Err(e) if e.permanent => {
                self.sockets_refused = true;
                tracing::warn!(error = %e, "connected UDP sockets whose endpoint left cannot be destroyed on this node (the kernel needs CONFIG_INET_DIAG_DESTROY and CONFIG_INET_UDP_DIAG, and svcproxy CAP_NET_ADMIN): they keep their endpoint until they close; not tried again");
                return Ok(0);
            }
            Err(e) => {
                return Err(DataPlaneError::Kernel {
                    what: "destroying stale connected UDP sockets".into(),
                    reason: e.to_string(),
                })
            }
        };
        if closed.unfound > 0 && others && !std::mem::replace(&mut self.unfound_said, true) {
            tracing::info!(unfound = closed.unfound, "connected UDP sockets whose endpoint left were not found in any network namespace svcproxy can name (/run/netns, and the processes it sees in /proc): they keep their endpoint until they close (said once)");
        }
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .destroyed_sockets += closed.destroyed as u64;
        Ok(closed.destroyed)
    }

    fn seal(&mut self, seal: &str) -> Result<bool, DataPlaneError> {
        // Only maps this process's last write brought to its table, with the
        // companion rules in place.
        let in_step = self.kernel.as_ref().is_some_and(Kernel::in_step);
        if !in_step || self.companion.is_none() || self.table.is_none() {
            return Ok(false);
        }
        kernel::write_seal(&self.opts.pin_dir, seal)?;
        self.sealed_here = true;
        Ok(true)
    }

    fn sealed(&mut self) -> Result<bool, DataPlaneError> {
        Ok(!kernel::seals(&self.opts.pin_dir).is_empty())
    }

    fn adopt(
        &mut self,
        intent: &Intent,
        _delta: &IntentDelta,
        seal: &str,
    ) -> Result<bool, DataPlaneError> {
        if !kernel::seals(&self.opts.pin_dir).iter().any(|s| s == seal) {
            return Ok(false);
        }
        // This process's programs are loaded and attached as at any start
        // (beside the predecessor's, whose links are then released); the maps
        // are taken as they are if they hold exactly this sync's table.
        let table = Self::table(intent);
        if !self.open_kernel()?.adopt(&table)? {
            return Ok(false);
        }
        // The two fixed rules, rewritten in one transaction (the same rules,
        // unless the node's port range moved since the predecessor read it).
        self.write_companion(&table, false)?;
        kernel::unseal(&self.opts.pin_dir)?;
        self.table = Some(table);
        self.note_stats(false);
        self.reconcile_lc();
        Ok(true)
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        self.kernel = None;
        self.table = None;
        self.companion = None;
        kernel::cleanup(&self.opts.pin_dir)?;
        remove_companion()
    }

    fn node_requirements(&self, _cfg: &PlanConfig) -> NodeRequirements {
        NodeRequirements::default()
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![Box::new(metrics::EbpfCollector::new(
            self.stats.clone(),
            self.opts.pin_dir.clone(),
        ))]
    }

    fn preflight(&mut self) -> Result<(), DataPlaneError> {
        kernel::preflight(&self.opts.cgroup, &self.opts.pin_dir)
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        if self.kernel.is_none() {
            return Ok(None);
        }
        let mut missing = kernel::missing_links(&self.opts.pin_dir);
        missing.extend(
            self.kernel
                .as_ref()
                .map(Kernel::missing_links)
                .unwrap_or_default(),
        );
        if !missing.is_empty() {
            // The next sync loads and attaches the programs again.
            self.kernel = None;
        } else if let (Some(kernel), Some(table)) = (self.kernel.as_mut(), self.table.as_ref()) {
            // Interfaces that came since the last sync (a new pod's veth) get the
            // packet programs now rather than at the next sync: the drift check
            // runs every few seconds.
            if let Err(e) = kernel.attach_interfaces(table) {
                tracing::warn!(error = %e, "cannot attach the packet programs to new interfaces");
            }
        }
        if !missing.is_empty() {
            return Ok(Some(format!(
                "pinned links removed from {}: {}",
                self.opts.pin_dir.display(),
                missing.join(", ")
            )));
        }
        // The fixed rules (masquerade, reject) deleted by hand or by a firewall
        // reload: the next sync, full, writes them again.
        if self.companion.is_some() {
            let listed = NftCommand::default().list(&["list", "table", "inet", COMPANION_TABLE])?;
            if listed.is_none() {
                self.companion = None;
                return Ok(Some(format!("table inet {COMPANION_TABLE} was deleted")));
            }
        }
        Ok(None)
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        let want = Self::table(intent);
        let Some(kernel) = self.kernel.as_ref() else {
            // Another process wrote the maps (`explain --live` beside the
            // daemon): compared by content, lists resolved to their endpoints.
            return Ok(Comparison {
                counted_only: None,
                differences: pinned_differences(&self.opts.pin_dir, &want)?,
                ahead: Vec::new(),
            });
        };
        let (have, mut differences) = kernel.read();
        differences.extend(table_differences(&want, &have));
        Ok(Comparison {
            counted_only: None,
            differences,
            ahead: Vec::new(),
        })
    }
}

/// What the maps pinned in `pin_dir` hold that `want` does not, and the
/// reverse, line by line ([`kernel::dump`]'s lines).
fn pinned_differences(
    pin_dir: &std::path::Path,
    want: &Table,
) -> Result<Vec<String>, DataPlaneError> {
    if !pin_dir.join("svcproxy_cfg").exists() {
        return Ok(vec![format!("nothing pinned in {}", pin_dir.display())]);
    }
    let have: std::collections::BTreeSet<String> = kernel::dump(pin_dir)?
        .lines()
        .filter(|l| {
            [
                "service ",
                "source-range ",
                "pod-cidr ",
                "local-address ",
                "marks ",
                "cluster-ip ",
                "guard-cidr ",
                "problem ",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(String::from)
        .collect();
    let want = kernel::expected_lines(want);
    let mut out: Vec<String> = want
        .difference(&have)
        .map(|l| format!("missing: {l}"))
        .collect();
    out.extend(have.difference(&want).map(|l| format!("extra: {l}")));
    Ok(out)
}

/// One line per entry, list or local address that `have` lacks, holds beyond
/// `want`, or holds differently.
pub fn table_differences(want: &Table, have: &Table) -> Vec<String> {
    let mut out = Vec::new();
    let want_lines: std::collections::BTreeSet<String> =
        want.render().lines().map(String::from).collect();
    let have_lines: std::collections::BTreeSet<String> =
        have.render().lines().map(String::from).collect();
    for l in want_lines.difference(&have_lines) {
        out.push(format!("missing: {l}"));
    }
    for l in have_lines.difference(&want_lines) {
        out.push(format!("extra: {l}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::kernel::{LRU_MAPS, MAPS};
    use super::MapSizes;

    /// The maps of a fixed size, each bounded by one node's own things or one
    /// entry (docs/ebpf.md, "Maps"); every other map is sized by a flag.
    const FIXED: [&str; 12] = [
        "svcproxy_local",
        "svcproxy_podnet",
        "svcproxy_ifc",
        "svcproxy_guard",
        "svcproxy_xdp_tx",
        "svcproxy_peer",
        "svcproxy_cfg",
        "svcproxy_timeouts",
        "svcproxy_xdp_stats",
        "svcproxy_snat",
        "svcproxy_snat_stats",
        "svcproxy_remap_stats",
    ];

    #[test]
    fn every_map_is_sized_by_a_flag_or_fixed_by_nature() {
        let sized: Vec<&str> = MapSizes::DEFAULT.by_map().iter().map(|m| m.0).collect();
        for map in MAPS {
            assert!(
                sized.contains(&map) != FIXED.contains(&map),
                "{map}: sized by a flag, or fixed, not both nor neither"
            );
        }
        for map in LRU_MAPS {
            assert!(
                sized.contains(&map),
                "{map}: an LRU map grows with the connections"
            );
        }
    }

    #[test]
    fn the_default_sizes_are_the_last_release_s_so_an_upgrade_remakes_no_map() {
        let want = [
            ("svcproxy_svc", 262_144),
            ("svcproxy_vip", 262_144),
            ("svcproxy_rr", 262_144),
            ("svcproxy_fw", 65_536),
            ("svcproxy_slot", 2_097_152),
            ("svcproxy_member", 2_097_152),
            ("svcproxy_mh", 262_144),
            ("svcproxy_ct", 262_144),
            ("svcproxy_remap", 65_536),
            ("svcproxy_rev", 65_536),
            ("svcproxy_flow", 65_536),
            ("svcproxy_aff", 65_536),
            ("svcproxy_affip", 65_536),
            ("svcproxy_conns", 65_536),
            ("svcproxy_flows", 65_536),
            ("svcproxy_xdp_nat", 65_536),
            ("svcproxy_udpsock", 65_536),
        ];
        assert_eq!(MapSizes::DEFAULT.by_map(), want.to_vec());
        // Derived maps follow their flag, and never go below 1024.
        let small = MapSizes {
            services: 8,
            endpoints: 8,
            connections: 8,
            maglev: 8,
        };
        for (map, size) in small.by_map() {
            let floor = if ["svcproxy_fw"].contains(&map) || LRU_MAPS.contains(&map) {
                if map == "svcproxy_ct" {
                    8
                } else {
                    1024
                }
            } else {
                8
            };
            assert_eq!(size, floor, "{map}");
        }
    }
}
