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
use svcproxy_core::model::IpFamily;
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
    /// The packet mark meaning "masquerade this connection".
    pub masquerade_mark: u32,
    /// `--masquerade-all`: every connection to a cluster IP is masqueraded.
    pub masquerade_all: bool,
    pub local_traffic: Option<LocalTraffic>,
    /// This node's addresses of the family (the configured bind address, else the
    /// Node object's), used to let the node through loadBalancerSourceRanges.
    pub node_ips: Vec<IpAddr>,
    pub nodeports: NodePortDestinations,
    /// NodePorts also answer on 127.0.0.0/8 (IPv4 only; the connection is
    /// masqueraded, and the node needs `route_localnet`).
    pub localhost_nodeports: bool,
    /// The family's ServiceCIDRs (merged, sorted): a packet to an address inside
    /// them that is no service's cluster IP is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// Reject a cluster IP's unexposed ports and drop unallocated addresses of
    /// `service_cidrs` ([`PlanConfig::guard_service_ips`]).
    pub guard_service_ips: bool,
    /// Drop forwarded packets conntrack marks INVALID.
    pub drop_invalid_forwarded: bool,
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
        let nodeports = match &cfg.nodeport_addresses {
            NodePortAddresses::AllLocal => NodePortDestinations::AllLocal,
            NodePortAddresses::Primary => NodePortDestinations::Ips(
                snap.node
                    .as_ref()
                    .and_then(|n| n.primary_ip(family))
                    .into_iter()
                    .filter(|ip| !ip.is_loopback())
                    .collect(),
            ),
            NodePortAddresses::Ips(ips) => {
                // Loopback is never a NodePort address by this route: localhost
                // NodePorts need masquerade and a sysctl, so they have their own flag.
                let mut v: Vec<IpAddr> = ips
                    .iter()
                    .copied()
                    .filter(|ip| IpFamily::of(ip) == family && !ip.is_loopback())
                    .collect();
                v.sort();
                v.dedup();
                NodePortDestinations::Ips(v)
            }
        };
        NodeIntent {
            family,
            masquerade_mark: cfg.masquerade_mark(),
            masquerade_all: cfg.masquerade_all,
            local_traffic,
            node_ips,
            nodeports,
            localhost_nodeports: cfg.localhost_nodeports && family == IpFamily::V4,
            service_cidrs: family_nets(&snap.service_cidrs, family),
            guard_service_ips: cfg.guard_service_ips,
            drop_invalid_forwarded: cfg.drop_invalid_forwarded && !cfg.conntrack_tcp_be_liberal,
        }
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
