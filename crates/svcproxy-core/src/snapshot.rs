//! The per-node, per-family snapshot every data plane plans from.
//!
//! A [`NodeSnapshot`] is immutable and cheap to share: service port views are `Arc`s,
//! and a new snapshot reuses every view whose service did not change.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::chunked::ChunkedMap;
use crate::model::{Endpoint, IpFamily, NodeInfo, ServiceName, ServicePort, ServicePortName};
use crate::selection::Selection;

/// One service port as this node proxies it in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortView {
    /// The port narrowed to this family (its addresses and ranges only).
    pub port: Arc<ServicePort>,
    /// Every endpoint of this family the slices list for this port (deduplicated,
    /// sorted by address and port), whatever its condition. Shared with
    /// `selection`, which picks among them.
    pub endpoints: Arc<[Endpoint]>,
    /// What each kind of traffic may reach from this node.
    pub selection: Selection,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub node_name: String,
    pub family: IpFamily,
    /// This node's Node object, when known.
    pub node: Option<Arc<NodeInfo>>,
    /// This host's own addresses of this family (sorted), as the kernel lists them;
    /// empty unless a source reports them (only `--nodeport-addresses` CIDRs need
    /// them).
    pub host_ips: Arc<[std::net::IpAddr]>,
    /// The cluster's ServiceCIDRs of this family (sorted).
    pub service_cidrs: Vec<IpNet>,
    /// Every proxied service port of this family, ordered by name. Successive
    /// snapshots share what did not change (see [`ChunkedMap`]).
    pub service_ports: ChunkedMap<ServicePortName, Arc<ServicePortView>>,
}

impl NodeSnapshot {
    pub fn empty(node_name: &str, family: IpFamily) -> Self {
        NodeSnapshot {
            node_name: node_name.to_string(),
            family,
            node: None,
            host_ips: Arc::from([]),
            service_cidrs: Vec::new(),
            service_ports: ChunkedMap::new(),
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

/// What this node's healthCheckNodePort server for one service answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub node_port: u16,
    /// This node's ready endpoints of the service: distinct IPs across its ports, as
    /// upstream's `LocalReadyEndpoints` (serving-but-terminating ones do not count, so
    /// a load balancer drains a node whose pods are going away). Counted per IP family
    /// and the larger taken: upstream runs one proxier per family, each answering with
    /// its own family's count, so a dual-stack pod counts once, not twice.
    pub local_endpoints: usize,
}

/// The services that need a healthCheckNodePort server on this node (LoadBalancer,
/// `externalTrafficPolicy: Local`, a health check port), across both families.
pub fn health_checks(snaps: &[&NodeSnapshot]) -> BTreeMap<ServiceName, HealthCheck> {
    let mut checks: BTreeMap<ServiceName, HealthCheck> = BTreeMap::new();
    for snap in snaps {
        let mut local: BTreeMap<&ServiceName, BTreeSet<IpAddr>> = BTreeMap::new();
        for (name, view) in &snap.service_ports {
            let Some(port) = view.port.health_check_node_port else {
                continue;
            };
            checks.entry(name.service.clone()).or_insert(HealthCheck {
                node_port: port,
                local_endpoints: 0,
            });
            let ips = local.entry(&name.service).or_default();
            for ep in view.endpoints.iter() {
                if ep.ready && ep.node_name.as_deref() == Some(snap.node_name.as_str()) {
                    ips.insert(ep.ip);
                }
            }
        }
        for (svc, ips) in local {
            if let Some(hc) = checks.get_mut(svc) {
                hc.local_endpoints = hc.local_endpoints.max(ips.len());
            }
        }
    }
    checks
}

/// Service ports whose Local traffic policy finds no endpoint on this node although
/// the service has endpoints elsewhere: `(internal, external)`, as upstream's
/// `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}`.
pub fn no_local_endpoints(snaps: &[&NodeSnapshot]) -> (usize, usize) {
    let (mut internal, mut external) = (0, 0);
    for snap in snaps {
        for view in snap.service_ports.values() {
            let sel = &view.selection;
            let no_local = sel.local_endpoints.as_ref().is_none_or(|l| l.is_empty());
            if !sel.has_any_endpoints || !no_local {
                continue;
            }
            if view.port.internal_policy_local() {
                internal += 1;
            }
            if view.port.external_policy_local() {
                external += 1;
            }
        }
    }
    (internal, external)
}
