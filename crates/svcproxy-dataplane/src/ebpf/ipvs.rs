//! The ipvs mode: kube-proxy's `--proxy-mode ipvs` run on the eBPF data plane
//! ([`crate::ebpf`]), which carries IPVS's schedulers (`--ipvs-scheduler`,
//! decided per service port in the intent, executed by the programs) without the
//! kernel's IP_VS: the eBPF plane's schedulers' entry. Where upstream's ipvs mode
//! behaves differently from its nftables mode, this entry says so: NodePorts on
//! every local address by default and never on loopback, the `ipvs` section of
//! the config file and the `--ipvs-*` sync periods, and the `KubeProxyIPVS`
//! gate. Entry point: [`INFO`]; the registry makes its data plane as the ebpf
//! mode's, named `ipvs` ([`super::EbpfDataPlane::named`]).

use crate::seam::{
    ConfigSection, KernelObjects, LocalhostDefault, ModeDefaults, ModeInfo, NodePortDefault,
};

/// The `--proxy-mode` name.
pub const MODE: &str = "ipvs";

/// The ipvs mode in the registry.
pub const INFO: ModeInfo = ModeInfo {
    mode: MODE,
    aliases: &[],
    gate: Some("KubeProxyIPVS"),
    defaults: ModeDefaults {
        config_section: ConfigSection::Ipvs,
        // Upstream's ipvs mode: every local address (loopback left out) when
        // nodePortAddresses is unset, and never loopback.
        nodeport_addresses: NodePortDefault::AllLocal,
        localhost_nodeports: LocalhostDefault::Off,
    },
    // The ebpf mode's flags: the same data plane.
    flag_groups: &[super::FLAGS],
    failure_counters: &[],
    counts_rules: false,
    large_cluster_endpoints: None,
    objects: KernelObjects::EbpfMaps,
    semantics: svcproxy_plan::ebpf::SEMANTICS,
};
