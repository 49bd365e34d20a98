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
//! - [`wire`]: the maps' binary layouts, mirrored from `bpf/svcproxy.h`;
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
pub mod kernel;
pub mod wire;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use svcproxy_plan::intent::NodePortDestinations;
use svcproxy_plan::{Intent, IntentDelta, PlanConfig};

use crate::backend::{ApplyReport, Comparison, DataPlane, NodeRequirements, SyncKind};
use crate::error::DataPlaneError;
use crate::sink::NftCommand;
use kernel::Kernel;
use svcproxy_plan::ebpf::{companion_rules, Table, COMPANION_TABLE};

/// Deletes the companion rules' table; none is no error.
fn remove_companion() -> Result<(), DataPlaneError> {
    NftCommand::default().run(&format!(
        "table inet {COMPANION_TABLE}\ndelete table inet {COMPANION_TABLE}\n"
    ))
}

/// The `--proxy-mode` name.
pub const MODE: &str = "ebpf";

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
}

impl EbpfOptions {
    /// The cgroup v2 root wherever it is mounted, and `/sys/fs/bpf/svcproxy`.
    pub fn host_defaults() -> EbpfOptions {
        EbpfOptions {
            cgroup: kernel::cgroup2_root().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup")),
            pin_dir: PathBuf::from("/sys/fs/bpf/svcproxy"),
            host_namespace_only: false,
        }
    }
}

/// The eBPF data plane (socket side).
pub struct EbpfDataPlane {
    opts: EbpfOptions,
    kernel: Option<Kernel>,
    /// The table of the last intent synced (successfully or not), brought
    /// forward by each delta.
    table: Option<Table>,
    /// The marks the companion nftables rules were last written with.
    companion: Option<(u32, u32)>,
}

impl EbpfDataPlane {
    pub fn new(opts: EbpfOptions) -> EbpfDataPlane {
        EbpfDataPlane {
            opts,
            kernel: None,
            table: None,
            companion: None,
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
        crate::host_addrs::host_addresses().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the host's addresses for NodePorts");
            Vec::new()
        })
    }

    fn table(intent: &Intent) -> Table {
        Table::build(intent, &Self::host_addrs(intent))
    }
}

impl DataPlane for EbpfDataPlane {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
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
        let start = Instant::now();
        let first = self.kernel.is_none();
        if first {
            self.kernel = Some(Kernel::open(
                &self.opts.cgroup,
                &self.opts.pin_dir,
                self.opts.host_namespace_only,
            )?);
        }
        let kernel = self.kernel.as_mut().expect("opened above");
        let changes = changes.filter(|_| !first);
        // The fixed companion rules, with the marks of the moment, before the
        // programs set those marks.
        let marks = (table.masquerade_mark, table.reject_mark);
        if changes.is_none() || self.companion != Some(marks) {
            self.companion = None;
            NftCommand::default().run(&companion_rules(marks.0, marks.1))?;
            self.companion = Some(marks);
        }
        let ops = kernel.write(table, changes.as_ref())?;
        let kind = if first {
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

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        if self.kernel.is_none() {
            return Ok(None);
        }
        let missing = kernel::missing_links(&self.opts.pin_dir);
        Ok((!missing.is_empty()).then(|| {
            format!(
                "pinned links removed from {}: {}",
                self.opts.pin_dir.display(),
                missing.join(", ")
            )
        }))
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        let want = Self::table(intent);
        let Some(kernel) = self.kernel.as_ref() else {
            return Ok(Comparison {
                counted_only: None,
                differences: vec!["nothing written yet by this process".to_string()],
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
