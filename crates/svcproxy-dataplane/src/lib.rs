//! svcproxy-dataplane: the only code that touches the kernel.
//!
//! - [`seam`]: the [`DataPlane`] trait every mode implements (sync, full or
//!   partial, from the intent and its delta; render; cleanup of exactly its own
//!   objects; what the node needs), what a sync reports, and what a mode declares
//!   of itself ([`ModeInfo`]).
//! - [`registry`]: [`BACKENDS`], the only code that knows which modes exist;
//!   [`resolve_mode`] turns `--proxy-mode` into a [`Backend`], whose data plane
//!   is made from the typed [`ModeOptions`].
//! - One folder per mode: [`nftables`], [`iptables`], [`userspace`], [`ebpf`]
//!   (with kube-proxy's ipvs mode as its schedulers' entry, [`ebpf::ipvs`]). No
//!   mode imports another's folder; the registry composes them where one mode
//!   uses another's (the userspace proxy's capture is the nftables table).
//! - [`kernel`]: the plumbing the modes share and that uses none of them:
//!   commands, netfilter's netlink, nftables tables, conntrack, sysctls, host
//!   addresses.
//!
//! Which intent to apply, conflicts, the hand-over's seal and which conntrack
//! entries a change leaves stale are decided above this crate, by the sync's
//! orchestration (`svcproxy-sync`).

pub mod ebpf;
mod error;
pub mod iptables;
pub mod kernel;
pub mod nftables;
pub mod registry;
pub mod seam;
pub mod userspace;

pub use ebpf::{EbpfDataPlane, EbpfOptions, IdleTimeouts, MapSizes, XdpMode};
pub use error::{is_permission_error, DataPlaneError, STDERR_LIMIT};
pub use kernel::command::{run_command, CommandOutput};
pub use kernel::conntrack::{
    apply_conntrack_sysctls, apply_conntrack_sysctls_at, ip_protocol, online_cpus, CleanupStats,
    ConntrackCleaner, ConntrackCleanupReport, ConntrackEntry, ConntrackFilter, ConntrackSettings,
    FamilyCleanup, NetlinkConntrack, NetlinkError, NoConntrackCleanup, RecordingCleaner, StaleUdp,
    StaleUdpFlows, DEFAULT_CONNTRACK_TIMEOUT, IPS_DST_NAT,
};
pub use kernel::host_addrs::{host_addresses, AddressChanges};
pub use kernel::nft::{
    Batch, BatchBuilder, BatchStats, NftCommand, RecordingSink, ScriptSink, TableState,
};
pub use kernel::sysctl::{
    prepare_node, prepare_node_at, required_sysctls, NodePreparation, Sysctl,
};
pub use nftables::{NftDataPlane, NftWriter, NftablesOptions};
pub use registry::{
    cleanup_all, cleanup_other_modes, resolve_mode, Backend, ModeChoice, ModeOptions, BACKENDS,
    DEFAULT_MODE, DEFAULT_MODE_WARNING,
};
pub use seam::{
    Alias, ApplyReport, Comparison, ConfigSection, DataPlane, FailureCounter, FailureKind,
    KernelObjects, LocalhostDefault, ModeDefaults, ModeInfo, NodePortDefault, NodeRequirements,
    RuleCount, SyncKind, LARGE_CLUSTER_ENDPOINTS,
};
pub use userspace::{parse_port_range, Scheduler as UserspaceScheduler, UserspaceConfig};
