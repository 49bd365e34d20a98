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
    health_checks_of(snaps.iter().map(|snap| {
        (
            snap.node_name.as_str(),
            snap.service_ports
                .iter()
                .filter(|(_, v)| v.port.health_check_node_port.is_some()),
        )
    }))
}

/// [`health_checks`] from each family's node name and ports with a health check.
fn health_checks_of<'a, P>(
    families: impl Iterator<Item = (&'a str, P)>,
) -> BTreeMap<ServiceName, HealthCheck>
where
    P: Iterator<Item = (&'a ServicePortName, &'a Arc<ServicePortView>)>,
{
    let mut checks: BTreeMap<ServiceName, HealthCheck> = BTreeMap::new();
    for (node_name, ports) in families {
        let mut local: BTreeMap<&ServiceName, BTreeSet<IpAddr>> = BTreeMap::new();
        for (name, view) in ports {
            let Some(port) = view.port.health_check_node_port else {
                continue;
            };
            checks.entry(name.service.clone()).or_insert(HealthCheck {
                node_port: port,
                local_endpoints: 0,
            });
            let ips = local.entry(&name.service).or_default();
            for ep in view.endpoints.iter() {
                if ep.ready && ep.node_name.as_deref() == Some(node_name) {
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
            let (i, e) = no_local_of(view);
            internal += i;
            external += e;
        }
    }
    (internal, external)
}

/// One port's part of [`no_local_endpoints`].
fn no_local_of(view: &ServicePortView) -> (usize, usize) {
    let sel = &view.selection;
    let no_local = sel.local_endpoints.as_ref().is_none_or(|l| l.is_empty());
    if !sel.has_any_endpoints || !no_local {
        return (0, 0);
    }
    (
        usize::from(view.port.internal_policy_local()),
        usize::from(view.port.external_policy_local()),
    )
}

/// [`no_local_endpoints`] and [`health_checks`] kept up to date from one snapshot to
/// the next, at the cost of what changed: each new snapshot is compared with the
/// last one seen, skipping the chunks of ports they share (see
/// [`ChunkedMap::diff`]), so a sync at 30k services does not walk every port.
#[derive(Debug, Default)]
pub struct SnapshotTallies {
    /// Per family (v4, v6): the last snapshot seen, its no-local counts, and its
    /// ports with a health check node port.
    families: [FamilyTally; 2],
}

#[derive(Debug, Default)]
struct FamilyTally {
    last: Option<Arc<NodeSnapshot>>,
    no_local: (usize, usize),
    health: BTreeMap<ServicePortName, Arc<ServicePortView>>,
}

impl SnapshotTallies {
    /// Brings the tallies to `snaps` (v4, v6).
    pub fn update(&mut self, snaps: [&Arc<NodeSnapshot>; 2]) {
        let none = ChunkedMap::new();
        for (tally, snap) in self.families.iter_mut().zip(snaps) {
            let before = tally.last.as_ref().map_or(&none, |s| &s.service_ports);
            let diff = snap
                .service_ports
                .diff(before, |a, b| !Arc::ptr_eq(a, b) && a != b);
            for (name, old, new) in diff {
                if let Some(old) = old {
                    let (i, e) = no_local_of(old);
                    tally.no_local.0 -= i;
                    tally.no_local.1 -= e;
                    tally.health.remove(name);
                }
                if let Some(new) = new {
                    let (i, e) = no_local_of(new);
                    tally.no_local.0 += i;
                    tally.no_local.1 += e;
                    if new.port.health_check_node_port.is_some() {
                        tally.health.insert(name.clone(), new.clone());
                    }
                }
            }
            tally.last = Some(snap.clone());
        }
    }

    /// [`no_local_endpoints`] of the family's last snapshot.
    pub fn no_local_endpoints(&self, family: IpFamily) -> (usize, usize) {
        self.families[family.index()].no_local
    }

    /// [`health_checks`] of the last snapshots.
    pub fn health_checks(&self) -> BTreeMap<ServiceName, HealthCheck> {
        health_checks_of(self.families.iter().filter_map(|t| {
            let snap = t.last.as_ref()?;
            Some((snap.node_name.as_str(), t.health.iter()))
        }))
    }
}
