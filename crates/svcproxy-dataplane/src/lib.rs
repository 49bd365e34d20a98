//! svcproxy-dataplane: the only code that touches the kernel.
//!
//! - [`DataPlane`] is the seam every mode implements: sync (full or partial, from
//!   the intent and its delta), render, cleanup of exactly its own objects, and
//!   what the node needs. [`resolve_mode`] is the factory keyed on
//!   `--proxy-mode`; [`BACKENDS`] lists the implemented modes, and [`ModeFlags`]
//!   their own flags.
//! - [`Driver`] is what every mode shares around a sync: it decides the intent
//!   ([`svcproxy_plan::IntentBuilder`]), hands it to the data plane, logs
//!   destination conflicts, and after each successful apply deletes the UDP
//!   conntrack entries the change left stale: [`cleanup_filters`] decides which,
//!   purely, and a [`ConntrackCleaner`] deletes them — [`NetlinkConntrack`] over
//!   ctnetlink, [`RecordingCleaner`] in tests.
//! - [`prepare_node`] writes the sysctls a data plane needs, and
//!   [`apply_conntrack_sysctls`] the conntrack table size and timeouts from the
//!   configuration.
//!
//! The nftables mode writes through a [`ScriptSink`]: [`NftCommand`] runs the real
//! `nft` (optionally behind a command prefix such as `ip netns exec NAME`);
//! [`RecordingSink`] records scripts and fails on request, so the commit/abandon
//! logic is tested without a kernel.

mod backend;
mod conntrack;
mod conntrack_sysctl;
mod ctnetlink;
pub mod ebpf;
mod error;
mod host_addrs;
pub mod iptables;
mod ipvs;
pub mod kube_proxy;
pub mod listing;
mod localhost_rejects;
pub mod nft;
mod nft_netlink;
mod nftables_mode;
mod xdp_features;
pub use nft_netlink::{Batch, BatchBuilder, BatchStats};
mod driver;
mod nft_table;
mod node;
mod sink;
pub mod userspace;

pub use backend::{
    cleanup_all, cleanup_other_modes, ignored_flag_warnings, resolve_mode, Alias, ApplyReport,
    Backend, Comparison, ConfigSection, DataPlane, FailureCounter, FailureKind, KernelObjects,
    LocalhostDefault, ModeChoice, ModeDefaults, ModeFlags, NodePortDefault, NodeRequirements,
    RuleCount, SyncKind, BACKENDS, DEFAULT_MODE, DEFAULT_MODE_WARNING,
};
pub use conntrack::{
    cleanup_filters, ip_protocol, CleanupStats, ConntrackCleaner, ConntrackCleanupReport,
    ConntrackEntry, ConntrackError, ConntrackFilter, FamilyCleanup, NoConntrackCleanup,
    RecordingCleaner, StaleUdpFlows, IPS_DST_NAT,
};
pub use conntrack_sysctl::{
    apply_conntrack_sysctls, apply_conntrack_sysctls_at, online_cpus, ConntrackSettings,
};
pub use ctnetlink::{NetlinkConntrack, DEFAULT_CONNTRACK_TIMEOUT};
pub use driver::{Driver, SyncReport};
pub use ebpf::{EbpfDataPlane, EbpfOptions, IdleTimeouts};
pub use error::{is_permission_error, DataPlaneError, STDERR_LIMIT};
pub use host_addrs::{host_addresses, AddressChanges};
pub use nft::NftDataPlane;
pub use nft_table::TableState;
pub use node::{prepare_node, prepare_node_at, required_sysctls, NodePreparation, Sysctl};
pub use sink::{run_command, CommandOutput, NftCommand, RecordingSink, ScriptSink};
