//! svcproxy-dataplane: the only code that touches the kernel.
//!
//! A thin apply layer over the pure planner ([`svcproxy_plan`]): [`NftDataPlane::sync`]
//! plans the tables for a [`SnapshotUpdate`](svcproxy_core::state::SnapshotUpdate),
//! pipes the script to `nft -f -` (one atomic transaction), and then commits the plan
//! (the next plan may be partial) or abandons it (the next plan recreates the tables,
//! whatever the kernel holds). Also: [`NftDataPlane::render`] (what a first sync
//! applies, for `svcproxy render`), [`cleanup`] (removes exactly svcproxy's tables),
//! [`prepare_node`] (the sysctls the rules need, in the current network namespace) and
//! [`apply_conntrack_sysctls`] (the conntrack table size and timeouts from the
//! configuration).
//!
//! After each successful sync, the UDP conntrack entries the change left stale
//! (removed endpoints, cached rejects of services that got endpoints) are deleted:
//! [`cleanup_filters`] decides which, purely, and a [`ConntrackCleaner`] deletes them —
//! [`NetlinkConntrack`] over ctnetlink, [`RecordingCleaner`] in tests.
//!
//! Where scripts go is a [`ScriptSink`]: [`NftCommand`] runs the real `nft` (optionally
//! behind a command prefix such as `ip netns exec NAME`); [`RecordingSink`] records
//! scripts and fails on request, so the commit/abandon logic is tested without a
//! kernel.

mod conntrack;
mod conntrack_sysctl;
mod ctnetlink;
mod dataplane;
mod error;
mod node;
mod sink;

pub use conntrack::{
    cleanup_filters, ip_protocol, CleanupStats, ConntrackCleaner, ConntrackCleanupReport,
    ConntrackEntry, ConntrackError, ConntrackFilter, NoConntrackCleanup, RecordingCleaner,
    IPS_DST_NAT,
};
pub use conntrack_sysctl::{
    apply_conntrack_sysctls, apply_conntrack_sysctls_at, online_cpus, ConntrackSettings,
};
pub use ctnetlink::{NetlinkConntrack, DEFAULT_CONNTRACK_TIMEOUT};
pub use dataplane::{cleanup, cleanup_with, NftDataPlane, SyncReport};
pub use error::{DataPlaneError, STDERR_LIMIT};
pub use node::{prepare_node, prepare_node_at, required_sysctls, NodePreparation, Sysctl};
pub use sink::{NftCommand, RecordingSink, ScriptSink};
