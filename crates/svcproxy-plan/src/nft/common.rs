//! The names the table's skeleton ([`super::base`]) and each service's objects
//! ([`super::service`]) both use: the shared verdict maps and the fixed chains and
//! set every service names.

use svcproxy_core::model::IpFamily;

use super::decl::Field;

/// Chain every rule jumps to for "masquerade this connection".
pub(crate) const MARK_MASQ_CHAIN: &str = "mark-for-masquerade";
/// Chain rejecting a packet (a verdict map cannot say `reject` itself).
pub(crate) const REJECT_CHAIN: &str = "reject-chain";
/// Named set of the local-pod CIDRs, when detection uses more than one.
pub(crate) const POD_CIDRS_SET: &str = "pod-cidrs";

/// The shared verdict maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum MapId {
    ServiceIps,
    ServiceNodePorts,
    NoEndpointServices,
    NoEndpointNodePorts,
    FirewallIps,
    /// KEP-6032: the NodePorts rejected on loopback, each to its protocol's
    /// counting reject chain. Declared only where some protocol is rejected (not in
    /// [`MapId::ALL`]).
    LocalhostNodePortRejects,
}

impl MapId {
    pub const ALL: [MapId; 5] = [
        MapId::ServiceIps,
        MapId::ServiceNodePorts,
        MapId::NoEndpointServices,
        MapId::NoEndpointNodePorts,
        MapId::FirewallIps,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MapId::ServiceIps => "service-ips",
            MapId::ServiceNodePorts => "service-nodeports",
            MapId::NoEndpointServices => "no-endpoint-services",
            MapId::NoEndpointNodePorts => "no-endpoint-nodeports",
            MapId::FirewallIps => "firewall-ips",
            MapId::LocalhostNodePortRejects => "localhost-nodeport-reject-ports",
        }
    }

    pub fn key_type(self, family: IpFamily) -> Vec<Field> {
        match self {
            MapId::ServiceNodePorts
            | MapId::NoEndpointNodePorts
            | MapId::LocalhostNodePortRejects => vec![Field::Proto, Field::Port],
            _ => vec![Field::Addr(family), Field::Proto, Field::Port],
        }
    }
}
