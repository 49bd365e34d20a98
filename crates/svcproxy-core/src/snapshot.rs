//! The per-node, per-family snapshot every data plane plans from.
//!
//! A [`NodeSnapshot`] is immutable and cheap to share: service port views are `Arc`s,
//! and a new snapshot reuses every view whose service did not change.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;

use crate::model::{Endpoint, IpFamily, NodeInfo, ServicePort, ServicePortName};
use crate::selection::Selection;

/// One service port as this node proxies it in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortView {
    /// The port narrowed to this family (its addresses and ranges only).
    pub port: Arc<ServicePort>,
    /// Every endpoint of this family the slices list for this port (deduplicated,
    /// sorted by address and port), whatever its condition.
    pub endpoints: Vec<Endpoint>,
    /// What each kind of traffic may reach from this node.
    pub selection: Selection,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub node_name: String,
    pub family: IpFamily,
    /// This node's Node object, when known.
    pub node: Option<Arc<NodeInfo>>,
    /// The cluster's ServiceCIDRs of this family (sorted).
    pub service_cidrs: Vec<IpNet>,
    /// Every proxied service port of this family, ordered by name.
    pub service_ports: BTreeMap<ServicePortName, Arc<ServicePortView>>,
}

impl NodeSnapshot {
    pub fn empty(node_name: &str, family: IpFamily) -> Self {
        NodeSnapshot {
            node_name: node_name.to_string(),
            family,
            node: None,
            service_cidrs: Vec::new(),
            service_ports: BTreeMap::new(),
        }
    }

    /// The node's addresses of this family (InternalIPs first).
    pub fn node_ips(&self) -> Vec<std::net::IpAddr> {
        self.node
            .iter()
            .flat_map(|n| n.addresses.iter().copied())
            .filter(|ip| IpFamily::of(ip) == self.family)
            .collect()
    }
}
