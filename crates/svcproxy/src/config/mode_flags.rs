//! svcproxy's own flags of the data planes, one group per name a mode gives in
//! its [`ModeInfo::flag_groups`](svcproxy_dataplane::ModeInfo), resolved once into
//! the typed [`ModeOptions`] each mode reads ([`ModeFlags::options`]). The data
//! plane crate knows no command line: the groups are declared here, and
//! [`group`] is how the help and the warnings know which mode reads which flag.

use std::path::PathBuf;
use std::time::Duration;

use svcproxy_core::go_syntax::{parse_duration_arg, parse_go_bool};
use svcproxy_dataplane::registry::flag_groups;
use svcproxy_dataplane::{
    parse_port_range, Backend, EbpfOptions, IdleTimeouts, MapSizes, ModeOptions, NftWriter,
    NftablesOptions, UserspaceConfig, UserspaceScheduler, XdpMode, BACKENDS,
};
use svcproxy_plan::nft::ColdStart;

/// The data planes' own flags, every group flattened into the binary's command
/// line.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ModeFlags {
    #[command(flatten)]
    pub nftables: NftablesFlags,
    #[command(flatten)]
    pub userspace: UserspaceFlags,
    #[command(flatten)]
    pub ebpf: EbpfFlags,
}

impl ModeFlags {
    /// The modes' options, with the packet path's idle timeouts the configuration
    /// gives (ipvs mode's `--ipvs-*-timeout` and `ipvs.*Timeout`); or every
    /// invalid value, as `--flag: why` (every mode's flags are checked, whichever
    /// mode runs, as kube-proxy validates every flag).
    pub fn options(&self, timeouts: IdleTimeouts) -> Result<ModeOptions, Vec<String>> {
        Ok(ModeOptions {
            nftables: self.nftables.options(),
            userspace: self.userspace.config()?,
            ebpf: self.ebpf.options(timeouts),
        })
    }
}

/// The flags of the group named `name`, added to `cmd`; `None` for a name no
/// group has.
pub fn group(name: &str, cmd: clap::Command) -> Option<clap::Command> {
    use clap::Args;
    match name {
        flag_groups::NFTABLES => Some(NftablesFlags::augment_args(cmd)),
        flag_groups::USERSPACE => Some(UserspaceFlags::augment_args(cmd)),
        flag_groups::EBPF => Some(EbpfFlags::augment_args(cmd)),
        _ => None,
    }
}

/// The flags `backend` reads: its groups' (none for a group this binary does not
/// declare, which a test refuses).
pub fn backend_flags(backend: &Backend) -> clap::Command {
    backend
        .flag_groups
        .iter()
        .fold(clap::Command::new(backend.mode), |cmd, name| {
            group(name, cmd.clone()).unwrap_or(cmd)
        })
}

/// One warning for each flag of another mode given on the command line
/// (`explicitly_set(id)`, by clap id) that `active` does not read.
pub fn ignored_flag_warnings(
    active: &Backend,
    explicitly_set: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let ids = |b: &Backend| -> Vec<(String, String)> {
        backend_flags(b)
            .get_arguments()
            .map(|a| {
                let long = a.get_long().unwrap_or_default();
                (a.get_id().to_string(), format!("--{long}"))
            })
            .collect()
    };
    let own = ids(active);
    let mut warnings = Vec::new();
    for b in BACKENDS.iter().filter(|b| *b != active) {
        for (id, flag) in ids(b) {
            if explicitly_set(&id) && !own.iter().any(|(o, _)| *o == id) {
                warnings.push(format!(
                    "{flag}: ignored in {} mode ({} mode only)",
                    active.mode, b.mode
                ));
            }
        }
    }
    warnings
}

/// The nftables mode's own flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct NftablesFlags {
    /// nftables mode only: how changes reach the kernel. 'netlink' (the default): a partial sync of elements and plain service chains (an endpoint moved, a ClusterIP service added or deleted) is one nf_tables batch over netlink, every other sync one nft -f transaction; 'text': every sync through nft -f (svcproxy only).
    #[arg(long, value_name = "netlink|text", default_value = "netlink", value_parser = ["netlink", "text"], help_heading = "svcproxy")]
    pub nft_writer: String,
    /// nftables mode only: how a first sync writes the tables when the node has none of svcproxy's (a node's first start). 'steps' (the default): the skeleton and the API server's and cluster DNS's Services first, then the rest in bounded transactions, so that no other nftables writer waits for the whole table; 'single': one transaction per family, as kube-proxy (svcproxy only).
    #[arg(long, value_name = "steps|single", default_value = "steps", value_parser = ["steps", "single"], help_heading = "svcproxy")]
    pub nft_cold_start: String,
}

impl NftablesFlags {
    fn options(&self) -> NftablesOptions {
        NftablesOptions {
            writer: match self.nft_writer.as_str() {
                "text" => NftWriter::Text,
                _ => NftWriter::Netlink,
            },
            cold_start: (self.nft_cold_start != "single").then(ColdStart::default),
        }
    }
}

/// The userspace proxy's flags (the userspace mode's, read too by the nftables
/// mode's loopback forwarder).
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct UserspaceFlags {
    /// userspace mode only: the ports the proxy's own sockets take, BEGIN-END, BEGIN+OFFSET or PORT (inclusive); empty or 0: the kernel chooses, as kube-proxy's userspace proxy.
    #[arg(long, value_name = "RANGE", help_heading = "kube-proxy")]
    pub proxy_port_range: Option<String>,

    /// userspace mode only: how long an idle UDP flow keeps its upstream socket, greater than 0 (kube-proxy's userspace default).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_duration_arg, help_heading = "kube-proxy")]
    pub udp_timeout: Duration,

    /// userspace mode only: how an endpoint is chosen for a new connection, rr (round-robin) or lc (least active connections) (svcproxy only).
    #[arg(long, value_name = "rr|lc", default_value = "rr", value_parser = ["rr", "lc"], help_heading = "svcproxy")]
    pub userspace_scheduler: String,

    /// userspace mode only: how long an endpoint may take to accept a connection before the next is tried; 1s by default, the TCP initial retransmission timeout: an endpoint that has not answered the SYN by then has lost it or is gone (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration_arg, help_heading = "svcproxy")]
    pub userspace_connect_timeout: Duration,

    /// userspace mode only: connections to an endpoint that left its service are closed this long after it left; 0s keeps them to their end (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_arg, help_heading = "svcproxy")]
    pub userspace_drain_timeout: Duration,

    /// userspace mode only: at SIGTERM the proxy stops accepting and lets open connections finish for at most this long; 25s by default, within a pod's default 30s grace period (svcproxy only).
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_duration_arg, help_heading = "svcproxy")]
    pub userspace_shutdown_timeout: Duration,

    /// userspace mode only: move TCP bytes between a client and its endpoint with splice(2), never through the proxy's memory; false copies them through a buffer (svcproxy only).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true",
          value_parser = parse_go_bool, action = clap::ArgAction::Set, help_heading = "svcproxy")]
    pub userspace_zero_copy: bool,
}

impl UserspaceFlags {
    /// The proxy's settings, or every invalid value (as `--flag: why`).
    pub fn config(&self) -> Result<UserspaceConfig, Vec<String>> {
        let mut errors = Vec::new();
        if self.udp_timeout.is_zero() {
            errors.push("--udp-timeout: must be greater than 0".to_string());
        }
        if self.userspace_connect_timeout.is_zero() {
            errors.push("--userspace-connect-timeout: must be greater than 0".to_string());
        }
        let port_range = match &self.proxy_port_range {
            Some(r) => parse_port_range(r).unwrap_or_else(|e| {
                errors.push(format!("--proxy-port-range: {e}"));
                None
            }),
            None => None,
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(UserspaceConfig {
            scheduler: match self.userspace_scheduler.as_str() {
                "lc" => UserspaceScheduler::LeastConnections,
                _ => UserspaceScheduler::RoundRobin,
            },
            connect_timeout: self.userspace_connect_timeout,
            drain_timeout: self.userspace_drain_timeout,
            udp_timeout: self.udp_timeout,
            port_range,
            shutdown_timeout: self.userspace_shutdown_timeout,
            zero_copy: self.userspace_zero_copy,
        })
    }
}

/// The ebpf and ipvs modes' flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct EbpfFlags {
    /// ebpf and ipvs modes: the cgroup (v2) whose processes' sockets are translated at connect(), every cgroup below it included; unset: the cgroup v2 root, wherever it is mounted (svcproxy only).
    #[arg(long, value_name = "PATH", help_heading = "svcproxy")]
    pub ebpf_cgroup: Option<PathBuf>,

    /// ebpf and ipvs modes: the directory svcproxy owns for its pinned maps and links; its parent must be on a bpffs (svcproxy only).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/sys/fs/bpf/svcproxy",
        help_heading = "svcproxy"
    )]
    pub ebpf_bpffs: PathBuf,

    /// ebpf and ipvs modes: translate at connect() only the host's own processes' sockets; pods' connections keep the service address and meet the packet path, for service meshes that must see it (as Cilium's socketLB.hostNamespaceOnly) (svcproxy only).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = parse_go_bool, action = clap::ArgAction::Set, help_heading = "svcproxy")]
    pub ebpf_host_namespace_only: bool,

    /// ebpf and ipvs modes: service addresses the maps hold (each cluster, external and load-balancer IP and NodePort address, per port), and round-robin lists; loadBalancerSourceRanges' prefixes a quarter of it (svcproxy only).
    #[arg(long, value_name = "N", default_value_t = MapSizes::DEFAULT.services, value_parser = clap::value_parser!(u32).range(1..), help_heading = "svcproxy")]
    pub ebpf_map_size_services: u32,

    /// ebpf and ipvs modes: endpoint slots the maps hold (a full sync writes each list beside its old copy where there is room, and keeps an unchanged list's old copy where there is none) (svcproxy only).
    #[arg(long, value_name = "N", default_value_t = MapSizes::DEFAULT.endpoints, value_parser = clap::value_parser!(u32).range(1..), help_heading = "svcproxy")]
    pub ebpf_map_size_endpoints: u32,

    /// ebpf and ipvs modes: connections the packet path remembers, each way (an LRU: the least recently used go first); the other LRU maps are a quarter of it each (svcproxy only).
    #[arg(long, value_name = "N", default_value_t = MapSizes::DEFAULT.connections, value_parser = clap::value_parser!(u32).range(1..), help_heading = "svcproxy")]
    pub ebpf_map_size_connections: u32,

    /// ebpf and ipvs modes: Maglev table entries the maps hold, of 256 cells each (a table of the default 16381 cells takes 64; the mh scheduler's) (svcproxy only).
    #[arg(long, value_name = "N", default_value_t = MapSizes::DEFAULT.maglev, value_parser = clap::value_parser!(u32).range(1..), help_heading = "svcproxy")]
    pub ebpf_map_size_maglev: u32,

    /// ebpf and ipvs modes: the XDP fast path for NodePort, external-IP and load-balancer traffic from outside. `native` attaches it to every interface that is not a pod's whose driver runs native XDP (veth does; the others keep the tc path alone): drops are made there, and a connection needing no masquerade is sent on to its endpoint there when the kernel says the endpoint's interface takes redirected frames. Those packets skip the netfilter forward hook and any tc program on that interface, so leave it `off` (the default) where a NetworkPolicy is enforced there (svcproxy only).
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "off",
        help_heading = "svcproxy"
    )]
    pub ebpf_xdp: XdpFlag,

    /// ebpf and ipvs modes, with --ebpf-xdp=native: the interfaces the XDP program goes on, by name (default: every interface that is not a pod's). Name the node's external interfaces where --detect-local-mode is a CIDR mode: svcproxy cannot tell pods' veths then, and an XDP program on a veth turns off its pod's segmentation offload (svcproxy only).
    #[arg(
        long,
        value_name = "NAME[,NAME]",
        value_delimiter = ',',
        help_heading = "svcproxy"
    )]
    pub ebpf_xdp_interfaces: Vec<String>,
}

/// `--ebpf-xdp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpFlag {
    /// No XDP program: the tc programs meet every packet.
    #[default]
    Off,
    /// The XDP program in the driver, where the driver runs one.
    Native,
}

impl EbpfFlags {
    fn options(&self, timeouts: IdleTimeouts) -> EbpfOptions {
        let defaults = EbpfOptions::host_defaults();
        EbpfOptions {
            cgroup: self.ebpf_cgroup.clone().unwrap_or(defaults.cgroup),
            pin_dir: self.ebpf_bpffs.clone(),
            host_namespace_only: self.ebpf_host_namespace_only,
            xdp: match self.ebpf_xdp {
                XdpFlag::Off => XdpMode::Off,
                XdpFlag::Native => XdpMode::Native,
            },
            xdp_interfaces: self.ebpf_xdp_interfaces.clone(),
            sizes: MapSizes {
                services: self.ebpf_map_size_services,
                endpoints: self.ebpf_map_size_endpoints,
                connections: self.ebpf_map_size_connections,
                maglev: self.ebpf_map_size_maglev,
            },
            timeouts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_a_mode_reads_is_declared_here() {
        for b in BACKENDS {
            for name in b.flag_groups {
                assert!(
                    group(name, clap::Command::new("t")).is_some(),
                    "{} reads the flag group {name:?}, which the binary does not declare",
                    b.mode
                );
            }
        }
    }

    #[test]
    fn the_flags_defaults_are_the_options_defaults() {
        use clap::{Args, FromArgMatches};
        let cmd = ModeFlags::augment_args(clap::Command::new("defaults"));
        let flags = ModeFlags::from_arg_matches(&cmd.get_matches_from(["defaults"])).unwrap();
        assert_eq!(
            flags.options(IdleTimeouts::default()).unwrap(),
            ModeOptions::default()
        );
    }
}
