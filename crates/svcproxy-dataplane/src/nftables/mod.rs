//! The nftables mode (`--proxy-mode nftables`): svcproxy's tables `ip svcproxy`
//! and `ip6 svcproxy`, translated by [`svcproxy_plan::nft`] and written as one
//! atomic transaction per family and sync.
//!
//! - `plane`: [`NftDataPlane`], the planner kept from sync to sync and the
//!   writes (an nf_tables batch over netlink, or `nft -f`), the drift check, the
//!   hand-over's seal, and `explain --live`'s comparison;
//! - [`localhost_rejects`]: kube-proxy 1.37's counter of NodePorts on loopback
//!   the rules reject.
//!
//! The netlink writer, the `nft` command and the table probes it writes through
//! are the kernel's plumbing ([`crate::kernel::nft`]), shared with the modes that
//! keep a table too. Entry points: [`INFO`], [`NftDataPlane`]. With NodePorts on
//! loopback asked for, the registry puts the userspace proxy's forwarder in front
//! of these tables ([`crate::registry`]).

pub mod localhost_rejects;
mod plane;

pub use plane::{cleanup, cleanup_with, NftDataPlane};

use svcproxy_plan::nft::ColdStart;

use crate::seam::{
    Alias, ConfigSection, FailureCounter, FailureKind, KernelObjects, LocalhostDefault,
    ModeDefaults, ModeInfo, NodePortDefault, LARGE_CLUSTER_ENDPOINTS,
};

/// The nftables mode's name.
pub const MODE: &str = "nftables";

/// The flag group of the nftables mode's own flags (`--nft-writer`,
/// `--nft-cold-start`).
pub const FLAGS: &str = "nftables";

/// The nftables mode in the registry.
pub const INFO: ModeInfo = ModeInfo {
    mode: MODE,
    // kube-proxy's Windows mode, asked for on Linux, runs as nftables.
    aliases: &[Alias {
        name: "kernelspace",
        sync_section: ConfigSection::Nftables,
        warning: "\"kernelspace\" mode is not supported by svcproxy; using nftables",
        gate: None,
    }],
    gate: None,
    defaults: ModeDefaults {
        config_section: ConfigSection::Nftables,
        nodeport_addresses: NodePortDefault::Primary,
        localhost_nodeports: LocalhostDefault::WhenGatedAndNamed(
            "KubeProxyNFTablesLocalhostNodePorts",
        ),
    },
    flag_groups: &[FLAGS],
    counts_rules: false,
    large_cluster_endpoints: Some(LARGE_CLUSTER_ENDPOINTS),
    objects: KernelObjects::NftablesTables,
    failure_counters: FAILURE_COUNTERS,
    semantics: svcproxy_plan::nft::SEMANTICS,
};

/// The nftables mode's failure counters, named as upstream names them.
pub const FAILURE_COUNTERS: &[FailureCounter] = &[
    FailureCounter {
        kind: FailureKind::Sync,
        name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
        help: "Cumulative proxy nftables sync failures",
    },
    // Stale chains go in the same transaction as the sync, so a failed
    // cleanup shows as a failed sync and this stays 0 (as upstream names it).
    FailureCounter {
        kind: FailureKind::Cleanup,
        name: "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
        help: "Cumulative proxy nftables cleanup failures",
    },
];

/// How the nftables data plane writes its changes to the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NftWriter {
    /// Every sync is one nf_tables batch over netlink when every statement of its
    /// plan has a typed form (see [`svcproxy_plan::nft::typed`]); otherwise through
    /// `nft -f`.
    #[default]
    Netlink,
    /// Every sync through `nft -f` (the fallback).
    Text,
}

/// The nftables mode's own options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NftablesOptions {
    /// `--nft-writer`.
    pub writer: NftWriter,
    /// `--nft-cold-start`: how a first sync into a node without svcproxy's tables
    /// is cut into transactions; `None` (`single`): one transaction per family.
    pub cold_start: Option<ColdStart>,
}

impl Default for NftablesOptions {
    fn default() -> Self {
        NftablesOptions {
            writer: NftWriter::Netlink,
            cold_start: Some(ColdStart::default()),
        }
    }
}
