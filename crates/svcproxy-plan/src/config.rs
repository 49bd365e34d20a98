//! What the planner needs to know beyond the snapshot: masquerading, local-traffic
//! detection, which addresses accept NodePorts, and which families to program.
//!
//! Entry point: [`PlanConfig`]. Everything here that ends up in rule text is either
//! a number, an address or CIDR (printed by the standard library), or an
//! [`InterfaceName`], which can only be built from a validated string.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol, Scheduler};

/// Upstream kube-proxy's default `--iptables-masquerade-bit`: mark 0x4000.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("interface name {0:?} is not 1-15 characters of [A-Za-z0-9_.-]")]
    InterfaceName(String),
    #[error("masquerade bit {0} is outside 0..=31")]
    MasqueradeBit(u8),
}

/// A network interface name (or name prefix) safe to print inside double quotes:
/// 1 to 15 characters of `[A-Za-z0-9_.-]` (Linux allows 15).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InterfaceName(String);

impl InterfaceName {
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        let ok = !name.is_empty()
            && name.len() <= 15
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(InterfaceName(name.to_string()))
        } else {
            Err(ConfigError::InterfaceName(name.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InterfaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How traffic from this node's pods is recognised (`--detect-local-mode`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalDetection {
    /// No detection: nothing is masqueraded for being non-local, and pod traffic to
    /// external IPs is not short-circuited.
    #[default]
    None,
    /// `ClusterCIDR`: sources inside these CIDRs (`--cluster-cidr`) are local pods.
    ClusterCidr(Vec<IpNet>),
    /// `NodeCIDR`: sources inside these CIDRs are local pods. Empty means "this node's
    /// `spec.podCIDRs` from the snapshot".
    NodeCidr(Vec<IpNet>),
    /// `BridgeInterface`: packets arriving on this interface come from local pods.
    BridgeInterface(InterfaceName),
    /// `InterfaceNamePrefix`: packets arriving on interfaces with this prefix.
    InterfaceNamePrefix(InterfaceName),
}

/// Which destination addresses accept NodePort traffic (`--nodeport-addresses`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// The node's primary IP of each family: the configured bind address of its
    /// family, else the snapshot Node's first address (upstream nftables mode's
    /// default, `primary`). A family without one takes every local address, as
    /// upstream (it turns `primary` into `<ip>/32` CIDRs, and a family without a CIDR
    /// matches all).
    #[default]
    Primary,
    /// The host's own addresses inside these CIDRs (the snapshot's `host_ips`, so
    /// NodePorts follow the host's addresses as they change). Per family, as
    /// upstream: a family with no CIDR here, or with a `/0`, takes every local
    /// address. Loopback addresses are never selected this way (see
    /// [`PlanConfig::localhost_nodeports`]).
    Cidrs(Vec<IpNet>),
    /// Every local address except loopback (`fib daddr type local`), as upstream does
    /// for `0.0.0.0/0` and `::/0`.
    AllLocal,
    /// `primary` listed with CIDRs (kube-proxy 1.37): per family, the primary IP and
    /// the host's addresses inside the family's CIDRs; a `/0` takes every local
    /// address, and a family with neither takes every local address.
    PrimaryAnd(Vec<IpNet>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// `--masquerade-all`: masquerade all traffic to cluster IPs.
    pub masquerade_all: bool,
    /// Bit of the packet mark that asks for masquerade (0..=31).
    pub masquerade_bit: u8,
    pub local_detection: LocalDetection,
    /// This node's IPs (either family), used to decide whether a node address lies
    /// inside `loadBalancerSourceRanges`. Empty for a family: the snapshot Node's
    /// addresses of that family.
    pub node_ips: Vec<IpAddr>,
    pub nodeport_addresses: NodePortAddresses,
    /// Accept NodePorts on loopback (upstream's `localhostNodePorts`,
    /// `--nodeport-localhost`): see [`PlanConfig::serves_localhost_nodeports`].
    pub localhost_nodeports: bool,
    /// How the mode serves localhost NodePorts (set by [`ModeSemantics::apply`]).
    pub localhost_by: LocalhostNodePorts,
    /// kube-proxy 1.37's `KubeProxyNFTablesLocalhostNodePorts` (KEP-6032) is on in
    /// a mode that follows it: see [`PlanConfig::rejected_localhost_nodeports`].
    pub localhost_gate: Option<LocalhostGate>,
    /// Guard the service address space, as upstream's nftables mode does: a cluster IP
    /// on a port no service exposes is rejected, and an unallocated address inside a
    /// ServiceCIDR is dropped. Upstream's iptables mode does neither (such packets are
    /// just routed); see [`ModeSemantics`].
    pub guard_service_ips: bool,
    /// `nf_conntrack_tcp_be_liberal` is set (`--conntrack-tcp-be-liberal`): conntrack
    /// accepts out-of-window TCP packets rather than marking them INVALID.
    pub conntrack_tcp_be_liberal: bool,
    /// Drop forwarded packets conntrack marks INVALID (unless
    /// `conntrack_tcp_be_liberal`), as upstream's iptables mode does: such a packet
    /// would otherwise reach a pod un-DNATed and draw a spurious reset
    /// (kubernetes#74839). See [`ModeSemantics`].
    pub drop_invalid_forwarded: bool,
    /// The scheduler of every service port without its own
    /// (`svcproxy.io/scheduler`): `--ipvs-scheduler` in ipvs mode, `--scheduler`
    /// otherwise.
    pub scheduler: Scheduler,
    /// The mode executes schedulers (set by [`ModeSemantics::apply`]); where it
    /// does not, every choice is random whatever the Service or `scheduler` say.
    pub schedulers: bool,
    /// The Maglev table size (cells) of every service port without its own
    /// (`svcproxy.io/maglev-table-size`): `--maglev-table-size`, one of
    /// [`MAGLEV_TABLE_SIZES`](svcproxy_core::model::MAGLEV_TABLE_SIZES). Every node
    /// of a cluster should have the same, so that they make the same choice.
    pub maglev_table_size: u32,
    /// Program the IPv4 table.
    pub ipv4: bool,
    /// Program the IPv6 table.
    pub ipv6: bool,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            masquerade_all: false,
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            local_detection: LocalDetection::None,
            node_ips: Vec::new(),
            nodeport_addresses: NodePortAddresses::Primary,
            localhost_nodeports: false,
            localhost_by: LocalhostNodePorts::KernelNat,
            localhost_gate: None,
            guard_service_ips: true,
            conntrack_tcp_be_liberal: false,
            drop_invalid_forwarded: false,
            scheduler: Scheduler::Random,
            schedulers: false,
            maglev_table_size: svcproxy_core::model::DEFAULT_MAGLEV_TABLE_SIZE,
            ipv4: true,
            ipv6: true,
        }
    }
}

/// KEP-6032's localhost NodePorts (kube-proxy 1.37, nftables mode, behind its gate):
/// NodePorts on loopback that are not served are rejected, each rejection counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalhostGate {
    /// Served ones are TCP only (upstream's proxy relays TCP alone), as when the
    /// gate and the NodePort addresses asked for them; `false` when svcproxy's own
    /// `--nodeport-localhost` did (its forwarder relays UDP too).
    pub tcp_only: bool,
}

/// How a mode serves NodePorts on loopback, when they are asked for
/// (`--nodeport-localhost`, `--iptables-localhost-nodeports`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LocalhostNodePorts {
    /// The kernel DNATs them, as upstream's iptables mode: IPv4 only, only where the
    /// IPv4 NodePort addresses include loopback, and the node needs
    /// `net.ipv4.conf.all.route_localnet=1` (guarded against CVE-2020-8558).
    #[default]
    KernelNat,
    /// The capture redirects them to the proxy's own sockets on loopback, and the
    /// proxy connects to the endpoint from the node: both families, no
    /// `route_localnet`, no martian packet ever let in.
    Proxy,
}

/// What a proxy mode does where upstream's modes differ in behaviour (not in syntax):
/// each backend declares it, and [`ModeSemantics::apply`] folds it into the
/// configuration before the intent is built, so the intent stays the one place that
/// decides and the backends only translate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeSemantics {
    /// How NodePorts on loopback are served, when they are asked for.
    pub localhost_nodeports: LocalhostNodePorts,
    /// See [`PlanConfig::guard_service_ips`].
    pub guard_service_ips: bool,
    /// See [`PlanConfig::drop_invalid_forwarded`].
    pub drop_invalid_forwarded: bool,
    /// See [`PlanConfig::schedulers`].
    pub schedulers: bool,
}

impl ModeSemantics {
    /// `cfg` as this mode runs it.
    pub fn apply(&self, mut cfg: PlanConfig) -> PlanConfig {
        cfg.localhost_by = self.localhost_nodeports;
        cfg.guard_service_ips = self.guard_service_ips;
        cfg.drop_invalid_forwarded = self.drop_invalid_forwarded;
        cfg.schedulers = self.schedulers;
        cfg
    }
}

/// Whether a NodePort address CIDR takes in loopback: it starts at a loopback
/// address, or holds 127.0.0.0 or ::1 (so `127.0.0.1/32` does, and a `/0` does).
pub fn holds_loopback(cidr: &IpNet) -> bool {
    cidr.addr().is_loopback()
        || cidr.contains(&IpAddr::from([127, 0, 0, 0]))
        || cidr.contains(&IpAddr::from(std::net::Ipv6Addr::LOCALHOST))
}

impl NodePortAddresses {
    /// Loopback is named: a CIDR other than a `/0` takes it in (the `localhost`
    /// keyword is 127.0.0.0/8 and ::1/128), as upstream's `ContainsExplicitLoopback`
    /// ([`holds_loopback`]).
    pub fn names_loopback(&self) -> bool {
        match self {
            NodePortAddresses::Primary | NodePortAddresses::AllLocal => false,
            NodePortAddresses::Cidrs(cidrs) | NodePortAddresses::PrimaryAnd(cidrs) => cidrs
                .iter()
                .any(|c| c.prefix_len() > 0 && holds_loopback(c)),
        }
    }
}

impl PlanConfig {
    /// Checks what the types cannot. The planner never fails: given an invalid
    /// masquerade bit it uses the default one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.masquerade_bit > 31 {
            return Err(ConfigError::MasqueradeBit(self.masquerade_bit));
        }
        Ok(())
    }

    /// The mark value meaning "masquerade this packet".
    pub fn masquerade_mark(&self) -> u32 {
        let bit = if self.masquerade_bit > 31 {
            DEFAULT_MASQUERADE_BIT
        } else {
            self.masquerade_bit
        };
        1u32 << bit
    }

    /// Whether the family's NodePorts also answer on loopback (127.0.0.0/8, ::1):
    /// `localhost_nodeports` asked for, and then
    /// - by kernel NAT (upstream's iptables mode, `ContainsIPv4Loopback`): IPv4
    ///   only, where the IPv4 NodePort addresses include loopback: every local
    ///   address, or a CIDR that holds 127.0.0.0 or starts at a loopback address;
    ///   never `primary`;
    /// - by the proxy: both families, unless CIDRs given for the family leave its
    ///   loopback out (`primary` serves it: the flag itself names the address).
    pub fn serves_localhost_nodeports(&self, family: IpFamily) -> bool {
        if !self.localhost_nodeports || !self.family_enabled(family) {
            return false;
        }
        let includes_loopback = |primary: bool| match &self.nodeport_addresses {
            NodePortAddresses::Primary => primary,
            NodePortAddresses::AllLocal => true,
            NodePortAddresses::Cidrs(cidrs) | NodePortAddresses::PrimaryAnd(cidrs) => {
                let with_primary =
                    matches!(self.nodeport_addresses, NodePortAddresses::PrimaryAnd(_));
                let mut own = cidrs
                    .iter()
                    .filter(|c| IpFamily::of(&c.addr()) == family)
                    .peekable();
                let none = own.peek().is_none();
                // A family without CIDRs: every address (`primary` alone names one).
                (none && (!with_primary || primary)) || own.any(holds_loopback)
            }
        };
        match self.localhost_by {
            LocalhostNodePorts::KernelNat => family == IpFamily::V4 && includes_loopback(false),
            LocalhostNodePorts::Proxy => includes_loopback(true),
        }
    }

    /// The protocols whose NodePorts are rejected on the family's loopback (with a
    /// count): none without [`PlanConfig::localhost_gate`]; with it, those not
    /// served there (every protocol when the family's loopback is not served; else
    /// SCTP, and UDP when served ones are TCP only), as upstream's nftables mode.
    pub fn rejected_localhost_nodeports(&self, family: IpFamily) -> Vec<Protocol> {
        if self.localhost_gate.is_none() {
            return Vec::new();
        }
        if !self.family_enabled(family) {
            return Vec::new();
        }
        if !self.serves_localhost_nodeports(family) {
            return vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
        }
        if self.localhost_nodeports_serve_udp() {
            vec![Protocol::Sctp]
        } else {
            vec![Protocol::Udp, Protocol::Sctp]
        }
    }

    /// Whether localhost NodePorts, where served, take UDP too: not under KEP-6032's
    /// gate unless svcproxy's own `--nodeport-localhost` asked for them (see
    /// [`LocalhostGate::tcp_only`]).
    pub fn localhost_nodeports_serve_udp(&self) -> bool {
        !self.localhost_gate.is_some_and(|g| g.tcp_only)
    }

    /// Whether the node needs `route_localnet` (localhost NodePorts by kernel NAT).
    pub fn needs_route_localnet(&self) -> bool {
        self.localhost_by == LocalhostNodePorts::KernelNat
            && self.serves_localhost_nodeports(IpFamily::V4)
    }

    pub fn family_enabled(&self, family: IpFamily) -> bool {
        match family {
            IpFamily::V4 => self.ipv4,
            IpFamily::V6 => self.ipv6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kep_6032_rejects_what_loopback_does_not_serve() {
        use Protocol::{Sctp, Tcp, Udp};
        let loopback: Vec<IpNet> = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let served = PlanConfig {
            localhost_nodeports: true,
            localhost_by: LocalhostNodePorts::Proxy,
            nodeport_addresses: NodePortAddresses::PrimaryAnd(loopback),
            localhost_gate: Some(LocalhostGate { tcp_only: true }),
            ..PlanConfig::default()
        };
        for f in IpFamily::BOTH {
            assert_eq!(served.rejected_localhost_nodeports(f), vec![Udp, Sctp]);
        }
        let udp_too = PlanConfig {
            localhost_gate: Some(LocalhostGate { tcp_only: false }),
            ..served.clone()
        };
        assert_eq!(
            udp_too.rejected_localhost_nodeports(IpFamily::V4),
            vec![Sctp]
        );
        let unserved = PlanConfig {
            localhost_nodeports: false,
            ..served.clone()
        };
        assert_eq!(
            unserved.rejected_localhost_nodeports(IpFamily::V6),
            vec![Tcp, Udp, Sctp]
        );
        let no_gate = PlanConfig {
            localhost_gate: None,
            ..unserved
        };
        assert!(no_gate
            .rejected_localhost_nodeports(IpFamily::V4)
            .is_empty());
        let no_v6 = PlanConfig {
            ipv6: false,
            ..served
        };
        assert!(no_v6.rejected_localhost_nodeports(IpFamily::V6).is_empty());
    }

    #[test]
    fn mode_semantics_fold_into_the_config() {
        let cfg = PlanConfig {
            localhost_nodeports: true,
            nodeport_addresses: NodePortAddresses::AllLocal,
            ..PlanConfig::default()
        };
        let by_proxy = ModeSemantics {
            localhost_nodeports: LocalhostNodePorts::Proxy,
            guard_service_ips: true,
            drop_invalid_forwarded: false,
            schedulers: true,
        };
        let ipt_like = ModeSemantics {
            localhost_nodeports: LocalhostNodePorts::KernelNat,
            guard_service_ips: false,
            drop_invalid_forwarded: true,
            schedulers: false,
        };
        let a = by_proxy.apply(cfg.clone());
        assert!(a.guard_service_ips && !a.needs_route_localnet() && a.schedulers);
        assert!(a.serves_localhost_nodeports(IpFamily::V4));
        assert!(a.serves_localhost_nodeports(IpFamily::V6));
        let b = ipt_like.apply(cfg.clone());
        assert!(!b.guard_service_ips && b.drop_invalid_forwarded && b.needs_route_localnet());
        assert!(!b.schedulers);
        assert!(b.serves_localhost_nodeports(IpFamily::V4));
        assert!(!b.serves_localhost_nodeports(IpFamily::V6));
        // A mode that can serve localhost NodePorts still only does when asked.
        let c = ipt_like.apply(PlanConfig::default());
        assert!(!c.serves_localhost_nodeports(IpFamily::V4) && !c.needs_route_localnet());
    }

    #[test]
    fn the_proxy_serves_localhost_nodeports_unless_the_familys_cidrs_leave_loopback_out() {
        let with = |addrs: NodePortAddresses| PlanConfig {
            localhost_nodeports: true,
            localhost_by: LocalhostNodePorts::Proxy,
            nodeport_addresses: addrs,
            ..PlanConfig::default()
        };
        let cidrs =
            |c: &[&str]| NodePortAddresses::Cidrs(c.iter().map(|c| c.parse().unwrap()).collect());
        for family in IpFamily::BOTH {
            assert!(with(NodePortAddresses::Primary).serves_localhost_nodeports(family));
            assert!(with(NodePortAddresses::AllLocal).serves_localhost_nodeports(family));
        }
        // Only IPv4 CIDRs, none holding loopback: IPv4 left out, IPv6 takes all.
        let v4_only = with(cidrs(&["10.0.0.0/8"]));
        assert!(!v4_only.serves_localhost_nodeports(IpFamily::V4));
        assert!(v4_only.serves_localhost_nodeports(IpFamily::V6));
        let both = with(cidrs(&["127.0.0.0/8", "fd00::/64"]));
        assert!(both.serves_localhost_nodeports(IpFamily::V4));
        assert!(!both.serves_localhost_nodeports(IpFamily::V6));
        assert!(with(cidrs(&["::1/128"])).serves_localhost_nodeports(IpFamily::V6));
        let off = PlanConfig {
            localhost_nodeports: false,
            ..with(NodePortAddresses::AllLocal)
        };
        assert!(!off.serves_localhost_nodeports(IpFamily::V4));
        let no_v6 = PlanConfig {
            ipv6: false,
            ..with(NodePortAddresses::AllLocal)
        };
        assert!(!no_v6.serves_localhost_nodeports(IpFamily::V6));
    }

    #[test]
    fn interface_names_are_strict() {
        assert!(InterfaceName::parse("cbr0").is_ok());
        assert!(InterfaceName::parse("veth_a.b-c").is_ok());
        for bad in ["", "a\"b", "eth0 ", "x;y", "0123456789abcdef", "a*", "a{b}"] {
            assert!(InterfaceName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn default_mark_is_upstreams() {
        assert_eq!(PlanConfig::default().masquerade_mark(), 0x4000);
        let bad = PlanConfig {
            masquerade_bit: 40,
            ..PlanConfig::default()
        };
        assert!(bad.validate().is_err());
        assert_eq!(bad.masquerade_mark(), 0x4000);
    }
}
