//! One service port in one family, decided: its frontends and what happens to a
//! connection to each (forward to an endpoint set, drop, reject), when the
//! connection is masqueraded, the short circuits of external traffic, the
//! loadBalancerSourceRanges firewall and session affinity.
//!
//! Entry point: [`ServiceIntent::build`]. It depends only on the port's view in the
//! snapshot (its addresses, policies and endpoint selection) and the family's
//! [`NodeIntent`], and it is the one place where traffic policies turn into
//! actions; data planes read the result and decide nothing. The rules follow the
//! service proxy implementation notes and upstream kube-proxy:
//!
//! - A cluster IP forwards to the endpoints its internal traffic policy selects
//!   (cluster-wide, or this node's for `internalTrafficPolicy: Local`). With none:
//!   REJECT, except a Local policy while endpoints exist elsewhere, which DROPs.
//! - An external IP, load-balancer IP or NodePort forwards along the port's
//!   [`ExternalRoute`]: `externalTrafficPolicy: Cluster` masquerades everything
//!   (the reply could leave through another node), `Local` keeps the client's
//!   address and uses this node's endpoints only, yet sends this node's pods and
//!   the host itself to the cluster-wide endpoints (they must not be dropped just
//!   because this node has no endpoint). Traffic with no endpoint to go to is
//!   rejected, or dropped under a Local policy while endpoints exist elsewhere.
//! - loadBalancerSourceRanges admit only those sources to load-balancer IPs; when
//!   one of the node's addresses is in them, also the load-balancer IPs themselves
//!   as sources (upstream's `allowFromNode`: a VIP-style load balancer loops the
//!   node's own request back from the VIP).
//! - Connections to a cluster IP are masqueraded with `--masquerade-all`, or when
//!   they do not come from this node's pods (when local traffic can be told);
//!   a connection from an endpoint to itself (hairpin) always is.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use svcproxy_core::model::{
    Endpoint, IpFamily, Protocol, Scheduler, ServicePort, ServicePortName, WeightKey,
};
use svcproxy_core::snapshot::ServicePortView;

use super::endpoints::{EndpointEntry, Endpoints};
use super::node::{family_nets, NodeIntent};

/// A destination a service port claims. Two ports claiming the same one conflict: a
/// cluster IP claim wins, then the first port by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKey {
    /// A service IP (cluster, external or load-balancer) with protocol and port.
    Vip {
        ip: IpAddr,
        protocol: Protocol,
        port: u16,
    },
    /// A NodePort, on every NodePort destination of the node.
    NodePort { protocol: Protocol, port: u16 },
}

impl std::fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrontendKey::Vip { ip, protocol, port } => match ip {
                IpAddr::V4(a) => write!(f, "{a}:{port}/{protocol}"),
                IpAddr::V6(a) => write!(f, "[{a}]:{port}/{protocol}"),
            },
            FrontendKey::NodePort { protocol, port } => write!(f, "nodePort {port}/{protocol}"),
        }
    }
}

/// What kind of address a frontend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    ClusterIp,
    ExternalIp,
    LoadBalancerIp,
    NodePort,
}

impl FrontendKind {
    /// Traffic to it is external traffic (`externalTrafficPolicy` applies).
    pub fn is_external(self) -> bool {
        self != FrontendKind::ClusterIp
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "ClusterIP",
            FrontendKind::ExternalIp => "ExternalIP",
            FrontendKind::LoadBalancerIp => "LoadBalancerIP",
            FrontendKind::NodePort => "NodePort",
        }
    }
}

/// What happens to a new connection to a frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Forwarded: along [`ServiceIntent::internal`] for a cluster IP, along
    /// [`ServiceIntent::external`] for the other kinds.
    Forward,
    /// Dropped silently: a Local policy with no endpoint on this node while some
    /// exist elsewhere (a load balancer or client should try another node).
    Drop,
    /// Refused (TCP reset / ICMP unreachable): no endpoint may take it.
    Reject,
}

/// The two endpoint sets a service port can have on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndpointSetId {
    /// Endpoints cluster-policy traffic may reach (after topology).
    Cluster,
    /// This node's endpoints (Local policies).
    Local,
}

/// When a connection to a cluster IP is masqueraded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Masquerade {
    Never,
    /// `--masquerade-all`.
    Always,
    /// When it does not come from this node's pods (so its reply, coming back
    /// through this node, can be un-DNATed).
    UnlessFromLocalPod,
}

/// How traffic to the cluster IPs is forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InternalRoute {
    /// The set the internal traffic policy selects.
    pub set: EndpointSetId,
    pub masquerade: Masquerade,
}

/// Where external traffic that no short circuit took goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    Forward(EndpointSetId),
    /// Local policy, no endpoint on this node, some elsewhere.
    Drop,
}

/// How traffic to the external frontends (external IPs, load-balancer IPs,
/// NodePorts) is forwarded, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExternalRoute {
    /// Every connection is masqueraded (`externalTrafficPolicy: Cluster`).
    pub masquerade: bool,
    /// Connections from this node's pods go to the cluster set, unmasqueraded
    /// (`Local` policy: the pod→LB short circuit).
    pub pods_to_cluster: bool,
    /// Connections from the node itself are masqueraded (`Local` policy: their
    /// source is often the external address itself, which an endpoint could not
    /// answer).
    pub host_masquerade: bool,
    /// ... and go to the cluster set.
    pub host_to_cluster: bool,
    /// Everything else.
    pub rest: Disposition,
}

/// Where a connection translated at the socket comes from
/// ([`ServiceIntent::socket_verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A process in a pod's network namespace.
    Pod,
    /// A process in the host's network namespace.
    Host,
}

/// What a connection translated at the socket meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SocketVerdict {
    /// Connected to an endpoint of this set, chosen at random.
    Forward(EndpointSetId),
    /// Dropped: the connection gets no answer.
    Drop,
    /// Refused.
    Reject,
    /// Not translated at the socket: its packets meet the packet path.
    Untranslated,
}

/// Where a packet that no socket translated comes from (the eBPF mode's packet
/// path, [`ServiceIntent::packet_verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PacketOrigin {
    /// One of this node's pods, as the node intent's `local_traffic` tells them.
    LocalPod,
    /// Anywhere else: another node, a client outside the cluster.
    Elsewhere,
}

/// What a new connection's first packet meets on the packet path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PacketVerdict {
    /// Forward (to a set), drop or reject; never `Untranslated`.
    pub verdict: SocketVerdict,
    /// The forwarded connection is masqueraded. A connection from an endpoint to
    /// itself (hairpin) always is, whatever this says.
    pub masquerade: bool,
}

/// loadBalancerSourceRanges of a port, for its load-balancer IPs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Firewall {
    /// One of the node's addresses is in the ranges (upstream's `allowFromNode`):
    /// its own connections pass, from that address.
    pub allow_from_node: bool,
    /// Sources allowed (merged, sorted; may be empty: nobody).
    pub ranges: Vec<IpNet>,
    /// Sources allowed besides the ranges: with `allow_from_node`, the port's
    /// load-balancer IPs of this family (sorted), as upstream: a VIP-style load
    /// balancer loops the node's own request to it back with the VIP as source.
    pub lb_sources: Vec<IpAddr>,
}

/// One frontend of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frontend {
    pub key: FrontendKey,
    pub kind: FrontendKind,
    pub action: Action,
    /// Sources are checked against [`ServiceIntent::firewall`] first (before DNAT,
    /// on the original destination).
    pub firewall: bool,
}

/// Everything this node does for one service port in one family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceIntent {
    pub name: ServicePortName,
    pub family: IpFamily,
    pub protocol: Protocol,
    pub port: u16,
    /// Every endpoint some traffic may reach (the union of the sets), in address
    /// order, with the sets each is in and whether it needs the hairpin
    /// masquerade: an endpoint that may be one of this node's own (its
    /// `nodeName` is this node's or unset, or its address is one of the node's),
    /// so its own connections through the service can be sent back to it. An
    /// endpoint on another node never needs it here: its connections to the
    /// service are translated by its own node's proxy, so none reaches this node
    /// with its address as source and a service as destination.
    ///
    /// The cluster set (endpoints cluster-policy traffic may reach) and the local
    /// set (this node's, for Local policies) are its members flagged so, in
    /// address order, which is the selection's order.
    pub endpoints: Endpoints,
    /// ClientIP session affinity: seconds a client sticks to its endpoint (≥ 1).
    pub affinity_timeout: Option<u32>,
    /// How a new connection's endpoint is chosen (after affinity): the
    /// Service's `svcproxy.io/scheduler`, else the node's, where the mode
    /// executes schedulers; random where it does not.
    pub scheduler: Scheduler,
    /// Maglev's table size (cells) when `scheduler` is Maglev: the Service's
    /// `svcproxy.io/maglev-table-size`, else the node's. One size whatever the
    /// endpoints, so that one endpoint more or less moves few flows.
    pub maglev_table_size: Option<u32>,
    /// Each endpoint's weight (`svcproxy.io/endpoint-weights`), by index into
    /// `endpoints`, where the scheduler weighs endpoints; empty: every one
    /// weighs 1.
    pub weights: Box<[u8]>,
    pub internal: InternalRoute,
    /// `None` when no external traffic is forwarded (no external frontend, or
    /// every one rejects).
    pub external: Option<ExternalRoute>,
    /// Boxed: few ports have one.
    pub firewall: Option<Box<Firewall>>,
    /// The service's healthCheckNodePort (LoadBalancer with a Local policy).
    pub health_check_node_port: Option<u16>,
    /// Sorted by key, one per key. The port's cluster IPs of this family are the
    /// keys of its `ClusterIp` frontends ([`ServiceIntent::cluster_ips`]).
    pub frontends: Box<[Frontend]>,
    /// Usable endpoints exist somewhere in the cluster.
    pub has_any_endpoints: bool,
    /// The view it was decided from.
    pub(super) source: Source,
}

/// The snapshot view an intent was decided from, kept so that the next update can
/// tell by pointer whether the view changed (the intent builder keeps no map of
/// views beside the intents). Not part of the intent's value: intents decided
/// alike from two views are equal.
#[derive(Clone)]
pub(super) struct Source(pub(super) Arc<ServicePortView>);

impl PartialEq for Source {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Source {}

impl std::hash::Hash for Source {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Source")
    }
}

impl ServiceIntent {
    /// The decisions for one service port of `node`'s family, from its view:
    /// its endpoints, the routes of internal and external traffic, the firewall,
    /// and the frontends with what each does.
    pub fn build(name: &ServicePortName, view: &Arc<ServicePortView>, node: &NodeIntent) -> Self {
        let p = &view.port;
        let endpoints = endpoint_union(view, node);
        let has_any = view.selection.has_any_endpoints;
        let routes = Routes::decide(p, node, &endpoints, has_any);
        let vips: Vec<IpAddr> = p
            .load_balancer_vips()
            .filter(|ip| IpFamily::of(ip) == node.family)
            .collect();
        let firewall = firewall(p, node, &vips);
        let frontends = frontends(
            p,
            name.protocol,
            node.family,
            &vips,
            &routes,
            firewall.is_some(),
        );
        let scheduler = node
            .scheduler
            .map_or(Scheduler::Random, |default| p.scheduler.unwrap_or(default));
        let maglev_table_size = (scheduler == Scheduler::Maglev)
            .then(|| p.maglev_table_size.unwrap_or(node.maglev_table_size));
        let weights = if node.scheduler.is_some() && scheduler.weighted() {
            weights(view, &endpoints)
        } else {
            Box::default()
        };
        ServiceIntent {
            name: name.clone(),
            family: node.family,
            protocol: name.protocol,
            port: p.port,
            endpoints,
            affinity_timeout: p.session_affinity_timeout.map(|t| t.max(1)),
            scheduler,
            maglev_table_size,
            weights,
            internal: routes.internal,
            external: routes.external,
            firewall,
            health_check_node_port: p.health_check_node_port,
            frontends,
            has_any_endpoints: has_any,
            source: Source(view.clone()),
        }
    }

    /// The endpoints of one set, in selection (address) order; `None` when the set
    /// is empty or unused.
    pub fn set(&self, id: EndpointSetId) -> Option<Vec<SocketAddr>> {
        self.set_indices(id).map(|list| {
            list.iter()
                .map(|&i| self.endpoints.get(i as usize))
                .collect()
        })
    }

    /// The weights of set `id`'s endpoints, in [`ServiceIntent::set`]'s order;
    /// empty when every one weighs 1.
    pub fn set_weights(&self, id: EndpointSetId) -> Vec<u8> {
        if self.weights.is_empty() {
            return Vec::new();
        }
        self.set_indices(id)
            .unwrap_or_default()
            .iter()
            .map(|&i| self.weights.get(i as usize).copied().unwrap_or(1))
            .collect()
    }

    /// Whether endpoint `i` (an index into `endpoints`) needs state of its own in a
    /// data plane, besides being DNATed to: the hairpin masquerade (see `endpoints`)
    /// or its session affinity. The others can be DNATed straight from their set.
    pub fn endpoint_needs_own_state(&self, i: usize) -> bool {
        self.affinity_timeout.is_some() || i >= self.endpoints.len() || self.endpoints.hairpin(i)
    }

    /// The set's indices into `endpoints`, in order, collected; `None` when the
    /// set is empty or unused.
    pub fn set_indices(&self, id: EndpointSetId) -> Option<Vec<u32>> {
        let list: Vec<u32> = self.endpoints.members(id).collect();
        (!list.is_empty()).then_some(list)
    }

    /// Whether set `id` is used and has an endpoint.
    pub fn has_set(&self, id: EndpointSetId) -> bool {
        self.endpoints.has_members(id)
    }

    /// How many endpoints set `id` has.
    pub fn set_len(&self, id: EndpointSetId) -> usize {
        self.endpoints.members(id).count()
    }

    /// The port's cluster IPs of this family, in address order.
    pub fn cluster_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.frontends.iter().filter_map(|f| match f.key {
            FrontendKey::Vip { ip, .. } if f.kind == FrontendKind::ClusterIp => Some(ip),
            _ => None,
        })
    }

    /// What a connection made on this node to `frontend` meets when a data plane
    /// translates it at the socket, before any packet exists (the eBPF mode's
    /// connect()): by a process of a pod (`Origin::Pod`) or of the host. The same
    /// rules as for its packets, read for a source that is this node's own:
    ///
    /// - a cluster IP forwards along the internal route; with `--masquerade-all`
    ///   a pod's connection is left to the packet path, which masquerades it (a
    ///   socket translated at connect() keeps the pod's address, where upstream
    ///   gives the endpoint the node's; the host's connections have a node
    ///   address already);
    /// - an external frontend takes the Local policy's short circuits (pods and the
    ///   host to the cluster set) where the intent has them, else the route's rest;
    /// - a load-balancer IP with loadBalancerSourceRanges admits the host only when
    ///   one of its addresses is in them ([`Firewall::allow_from_node`]); a pod's
    ///   source is not known at connect(), so its connection is left to the
    ///   packet path ([`SocketVerdict::Untranslated`]).
    pub fn socket_verdict(&self, frontend: &Frontend, origin: Origin) -> SocketVerdict {
        match frontend.action {
            Action::Reject => return SocketVerdict::Reject,
            Action::Drop => return SocketVerdict::Drop,
            Action::Forward => {}
        }
        if frontend.kind == FrontendKind::ClusterIp {
            if origin == Origin::Pod && self.internal.masquerade == Masquerade::Always {
                return SocketVerdict::Untranslated;
            }
            return SocketVerdict::Forward(self.internal.set);
        }
        if frontend.firewall {
            match (origin, self.firewall.as_deref()) {
                (Origin::Pod, _) => return SocketVerdict::Untranslated,
                (Origin::Host, Some(fw)) if !fw.allow_from_node => return SocketVerdict::Drop,
                (Origin::Host, _) => {}
            }
        }
        let Some(ext) = self.external else {
            // Not reached: an external frontend forwards only with a route.
            return SocketVerdict::Reject;
        };
        let short_circuit = match origin {
            Origin::Pod => ext.pods_to_cluster,
            Origin::Host => ext.host_to_cluster,
        };
        if short_circuit {
            return SocketVerdict::Forward(EndpointSetId::Cluster);
        }
        match ext.rest {
            Disposition::Forward(set) => SocketVerdict::Forward(set),
            Disposition::Drop => SocketVerdict::Drop,
        }
    }

    /// Whether a connection of the host's own to `frontend` from a socket bound
    /// to a source address is masqueraded, as the packet modes masquerade the
    /// node's packets: a cluster IP as its internal route says for a source that
    /// may or may not be a pod's (`UnlessFromLocalPod`: unless the bound source
    /// is among the pods' CIDRs); an external frontend always where its route
    /// masquerades, or the Local policy's host short circuit does. (An unbound
    /// socket's source is the node's own, the kernel's choice: a masquerade
    /// would give it the same.)
    pub fn host_masquerade(&self, frontend: &Frontend) -> Masquerade {
        if frontend.action != Action::Forward {
            return Masquerade::Never;
        }
        if frontend.kind == FrontendKind::ClusterIp {
            return self.internal.masquerade;
        }
        let masquerade = self.external.is_some_and(|ext| {
            if ext.host_to_cluster {
                ext.host_masquerade
            } else {
                ext.masquerade
            }
        });
        if masquerade {
            Masquerade::Always
        } else {
            Masquerade::Never
        }
    }

    /// What a new connection's first packet to `frontend` meets when it was not
    /// translated at a socket (it comes from another host, or from a pod whose
    /// sockets are left to the packet path), read from the same routes as the
    /// packet modes' rules:
    ///
    /// - a cluster IP forwards along the internal route, masqueraded as
    ///   [`InternalRoute::masquerade`] says for the origin;
    /// - an external frontend takes the pod→cluster short circuit for this node's
    ///   pods where the Local policy has it (unmasqueraded), else the route's rest,
    ///   masqueraded under the Cluster policy;
    /// - loadBalancerSourceRanges are checked before this, on the original
    ///   destination ([`Frontend::firewall`]).
    pub fn packet_verdict(&self, frontend: &Frontend, origin: PacketOrigin) -> PacketVerdict {
        let plain = |verdict| PacketVerdict {
            verdict,
            masquerade: false,
        };
        match frontend.action {
            Action::Reject => return plain(SocketVerdict::Reject),
            Action::Drop => return plain(SocketVerdict::Drop),
            Action::Forward => {}
        }
        if frontend.kind == FrontendKind::ClusterIp {
            return PacketVerdict {
                verdict: SocketVerdict::Forward(self.internal.set),
                masquerade: match self.internal.masquerade {
                    Masquerade::Never => false,
                    Masquerade::Always => true,
                    Masquerade::UnlessFromLocalPod => origin != PacketOrigin::LocalPod,
                },
            };
        }
        let Some(ext) = self.external else {
            // Not reached: an external frontend forwards only with a route.
            return plain(SocketVerdict::Reject);
        };
        if origin == PacketOrigin::LocalPod && ext.pods_to_cluster {
            return plain(SocketVerdict::Forward(EndpointSetId::Cluster));
        }
        match ext.rest {
            Disposition::Forward(set) => PacketVerdict {
                verdict: SocketVerdict::Forward(set),
                masquerade: ext.masquerade,
            },
            Disposition::Drop => plain(SocketVerdict::Drop),
        }
    }

    pub fn frontend(&self, key: &FrontendKey) -> Option<&Frontend> {
        self.frontends
            .binary_search_by(|f| f.key.cmp(key))
            .ok()
            .map(|i| &self.frontends[i])
    }
}

/// The union of the selection's sets, in address order, merged with each
/// endpoint's flags. Both lists come sorted from the selection (subsequences of
/// the port's sorted list); sorted again here, at no cost when they are, so no
/// selection can make the merge wrong.
/// Each endpoint's weight from the port's `svcproxy.io/endpoint-weights`: its
/// address's entry, else its node's, else 1; empty when every one weighs 1.
fn weights(view: &ServicePortView, endpoints: &Endpoints) -> Box<[u8]> {
    let Some(entries) = view.port.endpoint_weights.as_deref() else {
        return Box::default();
    };
    let sel = &view.selection;
    let nodes: BTreeMap<SocketAddr, Option<&str>> = [&sel.cluster_endpoints, &sel.local_endpoints]
        .into_iter()
        .flat_map(|l| l.iter().flat_map(|l| l.iter()))
        .map(|e| (SocketAddr::new(e.ip, e.port), e.node_name.as_deref()))
        .collect();
    let weight = |addr: SocketAddr| {
        let by_ip = entries.iter().find_map(|(k, w)| match k {
            WeightKey::Ip(ip) if *ip == addr.ip() => Some(*w),
            _ => None,
        });
        let node = nodes.get(&addr).copied().flatten();
        by_ip
            .or_else(|| {
                entries.iter().find_map(|(k, w)| match k {
                    WeightKey::Node(n) if Some(&**n) == node => Some(*w),
                    _ => None,
                })
            })
            .unwrap_or(1)
    };
    let w: Vec<u8> = (0..endpoints.len())
        .map(|i| weight(endpoints.get(i)))
        .collect();
    if w.iter().all(|w| *w == 1) {
        Box::default()
    } else {
        w.into()
    }
}

fn endpoint_union(view: &ServicePortView, node: &NodeIntent) -> Endpoints {
    let family = node.family;
    let sel = &view.selection;
    let of_family = |eps: &Option<Arc<[Endpoint]>>| -> Vec<(SocketAddr, bool)> {
        let mut v: Vec<(SocketAddr, bool)> = eps
            .iter()
            .flat_map(|l| l.iter())
            .filter(|e| IpFamily::of(&e.ip) == family)
            .map(|e| {
                let hairpin = match e.node_name.as_deref() {
                    None => true,
                    Some(n) => n == node.node_name || node.node_ips.contains(&e.ip),
                };
                (SocketAddr::new(e.ip, e.port), hairpin)
            })
            .collect();
        v.sort_by_key(|(addr, _)| *addr);
        v
    };
    let (cluster_list, local_list) = (
        of_family(&sel.cluster_endpoints),
        of_family(&sel.local_endpoints),
    );
    let mut entries: Vec<EndpointEntry> =
        Vec::with_capacity(cluster_list.len().max(local_list.len()));
    let (mut c, mut l) = (cluster_list.iter().peekable(), local_list.iter().peekable());
    loop {
        let (cluster, local) = match (c.peek(), l.peek()) {
            (None, None) => break,
            (Some(x), Some(y)) if x.0 == y.0 => (c.next(), l.next()),
            (Some(x), Some(y)) if x.0 < y.0 => (c.next(), None),
            (Some(_), None) => (c.next(), None),
            _ => (None, l.next()),
        };
        let (addr, hairpin) = *cluster.or(local).expect("one of the lists has a next");
        match entries.last_mut() {
            // A set listing one address twice counts it once.
            Some(last) if last.addr == addr => {
                last.cluster |= cluster.is_some();
                last.local |= local.is_some();
                last.hairpin |= hairpin;
            }
            _ => entries.push(EndpointEntry {
                addr,
                cluster: cluster.is_some(),
                local: local.is_some(),
                hairpin: hairpin || local.is_some_and(|l| l.1),
            }),
        }
    }
    Endpoints::new(&entries)
}

/// Where internal and external traffic go, and what their frontends do.
struct Routes {
    internal: InternalRoute,
    internal_action: Action,
    external: Option<ExternalRoute>,
    external_action: Action,
}

impl Routes {
    fn decide(p: &ServicePort, node: &NodeIntent, endpoints: &Endpoints, has_any: bool) -> Self {
        // With no endpoint anywhere everything is refused; when endpoints exist but
        // none may take this traffic, a Local policy drops (the client should try
        // another node) and a cluster policy (hard topology keys) refuses.
        let fail = |policy_local: bool| {
            if policy_local && has_any {
                Action::Drop
            } else {
                Action::Reject
            }
        };
        let set_of = |local_policy: bool| {
            if local_policy {
                EndpointSetId::Local
            } else {
                EndpointSetId::Cluster
            }
        };
        let usable = |set: EndpointSetId| endpoints.has_members(set);
        let (cluster_usable, local_usable) =
            (usable(EndpointSetId::Cluster), usable(EndpointSetId::Local));

        let internal_local = p.internal_policy_local();
        let internal = InternalRoute {
            set: set_of(internal_local),
            masquerade: if node.masquerade_all {
                Masquerade::Always
            } else if node.local_traffic.is_some() {
                Masquerade::UnlessFromLocalPod
            } else {
                Masquerade::Never
            },
        };
        let internal_action = if usable(internal.set) {
            Action::Forward
        } else {
            fail(internal_local)
        };

        let ext_local = p.external_policy_local();
        let ext_ok = usable(set_of(ext_local));
        // A Local-policy port keeps its route even without local endpoints: pods
        // and the host reaching its external addresses are short-circuited.
        let external =
            (p.externally_accessible() && (ext_ok || (ext_local && has_any))).then(|| {
                if ext_local {
                    ExternalRoute {
                        masquerade: false,
                        pods_to_cluster: node.local_traffic.is_some() && cluster_usable,
                        host_masquerade: true,
                        host_to_cluster: cluster_usable,
                        rest: if local_usable {
                            Disposition::Forward(EndpointSetId::Local)
                        } else {
                            Disposition::Drop
                        },
                    }
                } else {
                    ExternalRoute {
                        masquerade: true,
                        pods_to_cluster: false,
                        host_masquerade: false,
                        host_to_cluster: false,
                        rest: Disposition::Forward(EndpointSetId::Cluster),
                    }
                }
            });
        let external_action = if external.is_some() {
            Action::Forward
        } else {
            fail(ext_local)
        };
        Routes {
            internal,
            internal_action,
            external,
            external_action,
        }
    }
}

/// The loadBalancerSourceRanges of a port with load-balancer addresses (`vips`)
/// of this family.
fn firewall(p: &ServicePort, node: &NodeIntent, vips: &[IpAddr]) -> Option<Box<Firewall>> {
    match &p.load_balancer_source_ranges {
        Some(ranges) if !vips.is_empty() => {
            let ranges = family_nets(ranges, node.family);
            let allow_from_node = node
                .node_ips
                .iter()
                .any(|ip| ranges.iter().any(|r| r.contains(ip)));
            let mut lb_sources = if allow_from_node {
                vips.to_vec()
            } else {
                Vec::new()
            };
            lb_sources.sort();
            lb_sources.dedup();
            Some(Box::new(Firewall {
                allow_from_node,
                ranges,
                lb_sources,
            }))
        }
        _ => None,
    }
}

/// The port's frontends of this family, sorted by key, one per key: the first
/// claim of a key wins (a cluster IP that is also listed as an external IP
/// stays a cluster IP; an address both an external IP and an LB IP is an LB IP,
/// which the firewall applies to).
fn frontends(
    p: &ServicePort,
    protocol: Protocol,
    family: IpFamily,
    vips: &[IpAddr],
    routes: &Routes,
    firewalled: bool,
) -> Box<[Frontend]> {
    let mut frontends: BTreeMap<FrontendKey, Frontend> = BTreeMap::new();
    let mut claim = |key: FrontendKey, kind: FrontendKind| {
        let action = if kind.is_external() {
            routes.external_action
        } else {
            routes.internal_action
        };
        frontends.entry(key).or_insert(Frontend {
            key,
            kind,
            action,
            firewall: kind == FrontendKind::LoadBalancerIp && firewalled,
        });
    };
    let vip = |ip| FrontendKey::Vip {
        ip,
        protocol,
        port: p.port,
    };
    for &ip in p.cluster_ips.iter().filter(|ip| IpFamily::of(ip) == family) {
        claim(vip(ip), FrontendKind::ClusterIp);
    }
    let mut external_ips: Vec<(IpAddr, FrontendKind)> = p
        .external_ips
        .iter()
        .filter(|ip| IpFamily::of(ip) == family)
        .map(|&ip| (ip, FrontendKind::ExternalIp))
        .collect();
    external_ips.extend(vips.iter().map(|&ip| (ip, FrontendKind::LoadBalancerIp)));
    external_ips.sort_by_key(|&(ip, kind)| (ip, std::cmp::Reverse(kind)));
    external_ips.dedup_by_key(|(ip, _)| *ip);
    for (ip, kind) in external_ips {
        claim(vip(ip), kind);
    }
    if let Some(node_port) = p.node_port {
        claim(
            FrontendKey::NodePort {
                protocol,
                port: node_port,
            },
            FrontendKind::NodePort,
        );
    }
    frontends.into_values().collect()
}
