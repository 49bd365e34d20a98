//! The node-wide part of one family's intent: what applies to every service
//! rather than to one (how local traffic is recognised, which destinations take
//! NodePorts, the ServiceCIDRs whose unallocated addresses are dropped, the mark
//! that asks for masquerade).
//!
//! Entry point: [`NodeIntent::new`]. It depends on the configuration and on this
//! node's Node object and the ServiceCIDRs, never on individual services; when it
//! changes, every service intent of the family is decided again and data planes do
//! a full sync.

use std::net::IpAddr;

use ipnet::IpNet;
use svcproxy_core::model::{IpFamily, Protocol, Scheduler};
use svcproxy_core::snapshot::NodeSnapshot;

use crate::config::{InterfaceName, LocalDetection, NodePortAddresses, PlanConfig};

/// How packets from this node's pods are recognised in one family
/// (`--detect-local-mode`). Absent when the mode gives nothing for the family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LocalTraffic {
    /// Sources inside these CIDRs (merged, sorted, never empty).
    Cidrs(Vec<IpNet>),
    /// Packets arriving on this interface.
    Interface(InterfaceName),
    /// Packets arriving on an interface whose name starts with this.
    InterfacePrefix(InterfaceName),
}

/// Which destination addresses accept NodePort traffic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodePortDestinations {
    /// These addresses of this node (sorted; loopback never included: see
    /// [`NodeIntent::localhost_nodeports`]). May be empty: no NodePort answers.
    Ips(Vec<IpAddr>),
    /// Every local address of the node except loopback.
    AllLocal,
}

/// Everything in one family's intent that is not about one service.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeIntent {
    pub family: IpFamily,
    /// This node's name (which endpoints are its own).
    pub node_name: String,
    /// The packet mark meaning "masquerade this connection".
    pub masquerade_mark: u32,
    /// `--masquerade-all`: every connection to a cluster IP is masqueraded.
    pub masquerade_all: bool,
    pub local_traffic: Option<LocalTraffic>,
    /// This node's addresses of the family (the configured bind address, else the
    /// Node object's), used to let the node through loadBalancerSourceRanges.
    pub node_ips: Vec<IpAddr>,
    pub nodeports: NodePortDestinations,
    /// NodePorts also answer on the family's loopback (127.0.0.0/8, ::1): see
    /// [`PlanConfig::serves_localhost_nodeports`] for when, and how by mode.
    pub localhost_nodeports: bool,
    /// Protocols whose NodePorts are rejected on the family's loopback, each
    /// rejection counted (kube-proxy 1.37's KEP-6032: see
    /// [`PlanConfig::rejected_localhost_nodeports`]); empty without its gate.
    pub localhost_rejects: Vec<Protocol>,
    /// The family's ServiceCIDRs (merged, sorted): a packet to an address inside
    /// them that is no service's cluster IP is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// ServiceCIDRs left out of `service_cidrs`, each with the node address inside
    /// it: dropping their unallocated addresses would black out the node's own
    /// traffic (a `0.0.0.0/0` ServiceCIDR would drop every connection it makes).
    pub refused_service_cidrs: Vec<(IpNet, IpAddr)>,
    /// Reject a cluster IP's unexposed ports and drop unallocated addresses of
    /// `service_cidrs` ([`PlanConfig::guard_service_ips`]).
    pub guard_service_ips: bool,
    /// Drop forwarded packets conntrack marks INVALID.
    pub drop_invalid_forwarded: bool,
    /// The scheduler of a service port that names none, when the mode executes
    /// schedulers ([`PlanConfig::schedulers`]); `None`: every choice is random.
    pub scheduler: Option<Scheduler>,
    /// The Maglev table size of a service port that names none
    /// ([`PlanConfig::maglev_table_size`]).
    pub maglev_table_size: u32,
}

impl NodeIntent {
    pub fn new(family: IpFamily, cfg: &PlanConfig, snap: &NodeSnapshot) -> Self {
        let mut node_ips: Vec<IpAddr> = cfg
            .node_ips
            .iter()
            .copied()
            .filter(|ip| IpFamily::of(ip) == family)
            .collect();
        if node_ips.is_empty() {
            node_ips = snap.node_ips();
        }
        let local_traffic = match &cfg.local_detection {
            LocalDetection::None => None,
            LocalDetection::ClusterCidr(_) | LocalDetection::NodeCidr(_) => {
                let cidrs = detection_cidrs(family, cfg, snap);
                (!cidrs.is_empty()).then_some(LocalTraffic::Cidrs(cidrs))
            }
            LocalDetection::BridgeInterface(name) => Some(LocalTraffic::Interface(name.clone())),
            LocalDetection::InterfaceNamePrefix(prefix) => {
                Some(LocalTraffic::InterfacePrefix(prefix.clone()))
            }
        };
        let nodeports = nodeport_destinations(family, cfg, snap);
        let (service_cidrs, refused_service_cidrs) = guarded_service_cidrs(family, snap, &node_ips);
        NodeIntent {
            family,
            node_name: snap.node_name.clone(),
            masquerade_mark: cfg.masquerade_mark(),
            masquerade_all: cfg.masquerade_all,
            local_traffic,
            node_ips,
            nodeports,
            localhost_nodeports: cfg.serves_localhost_nodeports(family),
            localhost_rejects: cfg.rejected_localhost_nodeports(family),
            service_cidrs,
            refused_service_cidrs,
            guard_service_ips: cfg.guard_service_ips,
            drop_invalid_forwarded: cfg.drop_invalid_forwarded && !cfg.conntrack_tcp_be_liberal,
            scheduler: cfg.schedulers.then_some(cfg.scheduler),
            maglev_table_size: cfg.maglev_table_size,
        }
    }
}

/// The family's ServiceCIDRs whose unallocated addresses may be dropped, and those
/// refused with the node address each holds: the family's loopback address, the
/// node's IPs (`node_ips`, the Node object's, the host's own) are never inside a
/// dropped range, whatever a ServiceCIDR object says.
fn guarded_service_cidrs(
    family: IpFamily,
    snap: &NodeSnapshot,
    node_ips: &[IpAddr],
) -> (Vec<IpNet>, Vec<(IpNet, IpAddr)>) {
    let loopback = match family {
        IpFamily::V4 => IpAddr::from([127, 0, 0, 1]),
        IpFamily::V6 => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    };
    let own: Vec<IpAddr> = std::iter::once(loopback)
        .chain(node_ips.iter().copied())
        .chain(snap.node_ips())
        .chain(snap.host_ips.iter().copied())
        .collect();
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    for cidr in snap.service_cidrs.iter().map(IpNet::trunc) {
        if IpFamily::of_net(&cidr) != family {
            continue;
        }
        match own.iter().find(|ip| cidr.contains(*ip)) {
            Some(ip) => refused.push((cidr, *ip)),
            None => kept.push(cidr),
        }
    }
    refused.sort();
    refused.dedup();
    (family_nets(&kept, family), refused)
}

/// The destinations that take NodePorts in one family under
/// `--nodeport-addresses`, as upstream's `NodePortAddresses`: `primary` is the
/// family's node IP (the bind address, else the Node's), CIDRs select the host's own
/// addresses inside them (so they follow the host's addresses as they change), and a
/// family left without a choice (no primary IP, no CIDR of the family, or a `/0`)
/// takes every local address. Loopback is never listed (localhost NodePorts need
/// masquerade and a sysctl, so they have their own flag).
pub fn nodeport_destinations(
    family: IpFamily,
    cfg: &PlanConfig,
    snap: &NodeSnapshot,
) -> NodePortDestinations {
    let primary = || {
        cfg.node_ips
            .iter()
            .copied()
            .find(|ip| IpFamily::of(ip) == family)
            .or_else(|| snap.node.as_ref().and_then(|n| n.primary_ip(family)))
            .filter(|ip| !ip.is_loopback())
    };
    // The host's own addresses inside `cidrs` (of this family), or every local
    // address when one of them is a /0; `None` when the family has no CIDR.
    let within = |cidrs: &[IpNet]| -> Option<NodePortDestinations> {
        let cidrs: Vec<&IpNet> = cidrs
            .iter()
            .filter(|c| IpFamily::of_net(c) == family)
            .collect();
        if cidrs.is_empty() {
            return None;
        }
        if cidrs.iter().any(|c| c.prefix_len() == 0) {
            return Some(NodePortDestinations::AllLocal);
        }
        // `host_ips` is sorted and deduplicated.
        Some(NodePortDestinations::Ips(
            snap.host_ips
                .iter()
                .copied()
                .filter(|ip| !ip.is_loopback() && cidrs.iter().any(|c| c.contains(ip)))
                .collect(),
        ))
    };
    match &cfg.nodeport_addresses {
        NodePortAddresses::AllLocal => NodePortDestinations::AllLocal,
        NodePortAddresses::Primary => match primary() {
            Some(ip) => NodePortDestinations::Ips(vec![ip]),
            None => NodePortDestinations::AllLocal,
        },
        NodePortAddresses::Cidrs(cidrs) => within(cidrs).unwrap_or(NodePortDestinations::AllLocal),
        NodePortAddresses::PrimaryAnd(cidrs) => match (within(cidrs), primary()) {
            (Some(NodePortDestinations::AllLocal), _) | (None, None) => {
                NodePortDestinations::AllLocal
            }
            (Some(NodePortDestinations::Ips(mut ips)), p) => {
                ips.extend(p);
                ips.sort();
                ips.dedup();
                NodePortDestinations::Ips(ips)
            }
            (None, Some(ip)) => NodePortDestinations::Ips(vec![ip]),
        },
    }
}

/// The CIDRs recognising local pods in one family (CIDR detection modes only;
/// empty otherwise).
fn detection_cidrs(family: IpFamily, cfg: &PlanConfig, snap: &NodeSnapshot) -> Vec<IpNet> {
    match &cfg.local_detection {
        LocalDetection::ClusterCidr(cidrs) => family_nets(cidrs, family),
        LocalDetection::NodeCidr(cidrs) if cidrs.is_empty() => {
            let from_node: Vec<IpNet> = snap
                .node
                .iter()
                .flat_map(|n| n.pod_cidrs.iter().copied())
                .collect();
            family_nets(&from_node, family)
        }
        LocalDetection::NodeCidr(cidrs) => family_nets(cidrs, family),
        _ => Vec::new(),
    }
}

/// The CIDRs of one family, merged and sorted (so overlapping input cannot make a
/// set of ranges ambiguous, and the output is stable).
pub fn family_nets(nets: &[IpNet], family: IpFamily) -> Vec<IpNet> {
    let of_family: Vec<IpNet> = nets
        .iter()
        .map(IpNet::trunc)
        .filter(|n| IpFamily::of_net(n) == family)
        .collect();
    IpNet::aggregate(&of_family)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use svcproxy_core::model::NodeInfo;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// A snapshot of `family` whose Node lists `node_ips` and whose host has
    /// `host_ips` (loopback included, as the kernel lists it).
    fn snap(family: IpFamily, node_ips: &[&str], host_ips: &[&str]) -> NodeSnapshot {
        let mut s = NodeSnapshot::empty("node-a", family);
        s.node = Some(Arc::new(NodeInfo {
            name: "node-a".into(),
            labels: BTreeMap::new(),
            addresses: node_ips.iter().map(|s| ip(s)).collect(),
            pod_cidrs: Vec::new(),
            deleting: false,
            to_be_deleted: false,
        }));
        let mut hosts: Vec<IpAddr> = host_ips
            .iter()
            .map(|s| ip(s))
            .filter(|ip| IpFamily::of(ip) == family)
            .collect();
        hosts.sort();
        s.host_ips = Arc::from(hosts);
        s
    }

    fn cfg(addresses: NodePortAddresses) -> PlanConfig {
        PlanConfig {
            nodeport_addresses: addresses,
            ..PlanConfig::default()
        }
    }

    fn ips(v: &[&str]) -> NodePortDestinations {
        NodePortDestinations::Ips(v.iter().map(|s| ip(s)).collect())
    }

    const HOST: &[&str] = &[
        "127.0.0.1",
        "10.0.0.1",
        "10.0.0.7",
        "192.0.2.1",
        "::1",
        "fd00::1",
    ];

    #[test]
    fn cidrs_select_the_host_addresses_inside_them_never_loopback() {
        let c = cfg(NodePortAddresses::Cidrs(vec![
            net("10.0.0.0/8"),
            net("127.0.0.0/8"),
            net("fd00::/64"),
        ]));
        let v4 = snap(IpFamily::V4, &["192.0.2.1"], HOST);
        let v6 = snap(IpFamily::V6, &[], HOST);
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &c, &v4),
            ips(&["10.0.0.1", "10.0.0.7"])
        );
        assert_eq!(
            nodeport_destinations(IpFamily::V6, &c, &v6),
            ips(&["fd00::1"])
        );
        // The host's addresses change: so do the destinations.
        let v4 = snap(IpFamily::V4, &["192.0.2.1"], &["10.9.9.9"]);
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &c, &v4),
            ips(&["10.9.9.9"])
        );
        let v4 = snap(IpFamily::V4, &["192.0.2.1"], &["192.0.2.1"]);
        assert_eq!(nodeport_destinations(IpFamily::V4, &c, &v4), ips(&[]));
    }

    #[test]
    fn a_family_without_a_cidr_or_with_a_zero_cidr_takes_every_local_address() {
        // As upstream's NewNodePortAddresses: no IPv6 CIDR means ::/0 for IPv6.
        let c = cfg(NodePortAddresses::Cidrs(vec![net("10.0.0.0/8")]));
        let v6 = snap(IpFamily::V6, &[], HOST);
        assert_eq!(
            nodeport_destinations(IpFamily::V6, &c, &v6),
            NodePortDestinations::AllLocal
        );
        let c = cfg(NodePortAddresses::Cidrs(vec![
            net("10.0.0.0/8"),
            net("0.0.0.0/0"),
        ]));
        let v4 = snap(IpFamily::V4, &[], HOST);
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &c, &v4),
            NodePortDestinations::AllLocal
        );
    }

    #[test]
    fn primary_with_cidrs_takes_both_and_a_zero_cidr_takes_everything() {
        // kube-proxy 1.37's `primary,10.0.0.0/8` (and `primary,localhost`: loopback
        // is never a destination here; it is served as localhost NodePorts).
        let c = cfg(NodePortAddresses::PrimaryAnd(vec![
            net("10.0.0.0/8"),
            net("127.0.0.0/8"),
            net("::1/128"),
        ]));
        let v4 = snap(IpFamily::V4, &["192.0.2.1"], HOST);
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &c, &v4),
            ips(&["10.0.0.1", "10.0.0.7", "192.0.2.1"])
        );
        // IPv6: only ::1 listed, and no primary IPv6 address: nothing but loopback.
        let v6 = snap(IpFamily::V6, &[], HOST);
        assert_eq!(nodeport_destinations(IpFamily::V6, &c, &v6), ips(&[]));
        // A family with neither a CIDR nor a primary IP takes every address.
        let c = cfg(NodePortAddresses::PrimaryAnd(vec![net("10.0.0.0/8")]));
        assert_eq!(
            nodeport_destinations(IpFamily::V6, &c, &v6),
            NodePortDestinations::AllLocal
        );
        let v6 = snap(IpFamily::V6, &["fd00::1"], HOST);
        assert_eq!(
            nodeport_destinations(IpFamily::V6, &c, &v6),
            ips(&["fd00::1"])
        );
        // `primary,all`: every address.
        let c = cfg(NodePortAddresses::PrimaryAnd(vec![
            net("0.0.0.0/0"),
            net("::/0"),
        ]));
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &c, &v4),
            NodePortDestinations::AllLocal
        );
        // Loopback served as localhost NodePorts where the list names it.
        let with_lo = |a: NodePortAddresses| PlanConfig {
            localhost_nodeports: true,
            localhost_by: crate::config::LocalhostNodePorts::Proxy,
            ..cfg(a)
        };
        let lo = with_lo(NodePortAddresses::PrimaryAnd(vec![
            net("127.0.0.0/8"),
            net("::1/128"),
        ]));
        assert!(lo.serves_localhost_nodeports(IpFamily::V4));
        assert!(lo.serves_localhost_nodeports(IpFamily::V6));
        let no_lo = with_lo(NodePortAddresses::PrimaryAnd(vec![net("10.0.0.0/8")]));
        assert!(!no_lo.serves_localhost_nodeports(IpFamily::V4));
    }

    #[test]
    fn primary_is_the_bind_address_else_the_nodes_first_address_else_everything() {
        let v4 = snap(IpFamily::V4, &["192.0.2.1", "10.0.0.1"], HOST);
        let c = cfg(NodePortAddresses::Primary);
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &c, &v4),
            ips(&["192.0.2.1"])
        );
        let bound = PlanConfig {
            node_ips: vec![ip("10.0.0.7")],
            ..c.clone()
        };
        assert_eq!(
            nodeport_destinations(IpFamily::V4, &bound, &v4),
            ips(&["10.0.0.7"])
        );
        // No IPv6 node IP: upstream's `primary` names no IPv6 CIDR, so all of them.
        let v6 = snap(IpFamily::V6, &["192.0.2.1"], HOST);
        assert_eq!(
            nodeport_destinations(IpFamily::V6, &c, &v6),
            NodePortDestinations::AllLocal
        );
    }

    #[test]
    fn a_service_cidr_holding_a_node_address_is_refused_not_dropped() {
        let mut v4 = snap(IpFamily::V4, &["192.0.2.1"], &["10.9.0.7", "127.0.0.1"]);
        v4.service_cidrs = ["10.96.0.0/16", "192.0.2.0/24", "10.9.0.0/16", "127.0.0.0/8"]
            .iter()
            .map(|s| net(s))
            .collect();
        let n = NodeIntent::new(IpFamily::V4, &cfg(NodePortAddresses::Primary), &v4);
        assert_eq!(n.service_cidrs, vec![net("10.96.0.0/16")]);
        assert_eq!(
            n.refused_service_cidrs,
            vec![
                (net("10.9.0.0/16"), ip("10.9.0.7")),
                (net("127.0.0.0/8"), ip("127.0.0.1")),
                (net("192.0.2.0/24"), ip("192.0.2.1")),
            ]
        );
        // The bind address counts as the node's too.
        let bound = PlanConfig {
            node_ips: vec![ip("10.96.3.3")],
            ..cfg(NodePortAddresses::Primary)
        };
        let n = NodeIntent::new(IpFamily::V4, &bound, &v4);
        assert!(n.service_cidrs.is_empty());
        assert!(n
            .refused_service_cidrs
            .contains(&(net("10.96.0.0/16"), ip("10.96.3.3"))));
    }

    #[test]
    fn localhost_nodeports_need_loopback_among_the_ipv4_nodeport_addresses() {
        let with = |a: NodePortAddresses| PlanConfig {
            localhost_nodeports: true,
            ..cfg(a)
        };
        assert!(with(NodePortAddresses::AllLocal).serves_localhost_nodeports(IpFamily::V4));
        assert!(!with(NodePortAddresses::Primary).serves_localhost_nodeports(IpFamily::V4));
        let cidrs = |v: &[&str]| NodePortAddresses::Cidrs(v.iter().map(|s| net(s)).collect());
        assert!(with(cidrs(&["127.0.0.1/32"])).serves_localhost_nodeports(IpFamily::V4));
        assert!(with(cidrs(&["10.0.0.0/8", "0.0.0.0/0"])).serves_localhost_nodeports(IpFamily::V4));
        assert!(
            with(cidrs(&["fd00::/64"])).serves_localhost_nodeports(IpFamily::V4),
            "no IPv4 CIDR: all"
        );
        assert!(!with(cidrs(&["10.0.0.0/8"])).serves_localhost_nodeports(IpFamily::V4));
        let off = PlanConfig {
            localhost_nodeports: false,
            ..cfg(NodePortAddresses::AllLocal)
        };
        assert!(!off.serves_localhost_nodeports(IpFamily::V4));
    }
}
