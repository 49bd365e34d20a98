//! The nftables mode as the registry runs it: a composition of two data planes.
//!
//! - [`crate::nft::NftDataPlane`] alone, in the usual case;
//! - with NodePorts on loopback asked for (`--nodeport-localhost`), the userspace
//!   proxy's loopback forwarder ([`UserspaceDataPlane::localhost_nodeports`]) in
//!   front of the same tables: the set chains DNAT as usual and redirect only
//!   connections to loopback to the forwarder, which connects from the node.
//!
//! This is the only module that knows both; `nft` knows nothing of the userspace
//! proxy, and the userspace proxy uses `nft` for its capture. Entry point:
//! [`BACKEND`].

use svcproxy_core::model::IpFamily;
use svcproxy_plan::PlanConfig;

use crate::backend::{
    Alias, Backend, ConfigSection, DataPlane, LocalhostDefault, ModeDefaults, ModeFlags,
    NodePortDefault,
};
use crate::nft::{self, NftDataPlane};
use crate::userspace::UserspaceDataPlane;

/// The nftables mode in the registry.
pub const BACKEND: Backend = Backend {
    mode: nft::MODE,
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
    flags: <nft::NftablesFlags as clap::Args>::augment_args,
    counts_rules: false,
    objects: crate::backend::KernelObjects::NftablesTables,
    failure_counters: nft::FAILURE_COUNTERS,
    semantics: svcproxy_plan::nft::SEMANTICS,
    new,
};

fn new(cfg: &PlanConfig, flags: &ModeFlags) -> Box<dyn DataPlane> {
    let localhost = IpFamily::BOTH
        .into_iter()
        .any(|f| cfg.serves_localhost_nodeports(f));
    if localhost {
        Box::new(UserspaceDataPlane::localhost_nodeports(
            cfg,
            flags.userspace_config(),
        ))
    } else {
        Box::new(
            NftDataPlane::new()
                .with_writer(flags.nftables.writer())
                .with_cold_start(flags.nftables.cold_start())
                .with_config(cfg),
        )
    }
}
