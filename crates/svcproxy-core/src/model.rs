//! The validated model svcproxy works from: service ports, endpoints and nodes.
//!
//! These types are what [`crate::convert`] produces from raw Kubernetes objects; once a
//! value of one of them exists, every IP, port and range in it is known to be valid,
//! so planners never re-check.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;

/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours), as upstream.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;
/// Upper bound the API server enforces on the affinity timeout (one day).
pub const MAX_AFFINITY_TIMEOUT_SECONDS: u32 = 86400;

/// Label whose value names the proxy that owns a Service.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking headless Services and their EndpointSlices.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label attaching an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Node label holding the node's zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Annotation selecting topology-aware routing (`Auto`).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// The older name of [`ANNOTATION_TOPOLOGY_MODE`].
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// svcproxy's arbitrary topology keys (the topology-aware service routing proposal).
pub const ANNOTATION_TOPOLOGY_KEYS: &str = "svcproxy.io/topology-keys";
/// svcproxy's per-Service choice of scheduler ([`Scheduler::parse`]'s names), in the
/// modes that execute schedulers (ebpf, ipvs).
pub const ANNOTATION_SCHEDULER: &str = "svcproxy.io/scheduler";
/// svcproxy's endpoint weights for the weighted schedulers: comma-separated
/// `KEY=WEIGHT`, KEY an endpoint's address or a node's name, WEIGHT 1..=255.
pub const ANNOTATION_ENDPOINT_WEIGHTS: &str = "svcproxy.io/endpoint-weights";
/// The largest endpoint weight.
pub const MAX_ENDPOINT_WEIGHT: u8 = 255;
/// svcproxy's per-Service Maglev table size (cells), one of
/// [`MAGLEV_TABLE_SIZES`]; the node's (`--maglev-table-size`) when absent.
pub const ANNOTATION_MAGLEV_TABLE_SIZE: &str = "svcproxy.io/maglev-table-size";
/// The Maglev table sizes a service may have: primes near powers of two, as
/// Cilium's (`--bpf-lb-maglev-table-size`). A table keeps its size whatever its
/// endpoints, so that an endpoint added or removed moves few flows.
pub const MAGLEV_TABLE_SIZES: [u32; 10] = [
    251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071,
];
/// The Maglev table size of a service that names none, unless the node's flag
/// says otherwise: Cilium's default.
pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 16381;

/// `raw` as a Maglev table size: one of [`MAGLEV_TABLE_SIZES`].
pub fn parse_maglev_table_size(raw: &str) -> Result<u32, String> {
    let n: u32 = raw
        .trim()
        .parse()
        .map_err(|_| format!("{raw:?} is not a number"))?;
    if MAGLEV_TABLE_SIZES.contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} is not one of the Maglev table sizes ({})",
            MAGLEV_TABLE_SIZES.map(|m| m.to_string()).join(", ")
        ))
    }
}
/// EndpointSlice annotation with the time the endpoints last changed.
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum IpFamily {
    #[serde(rename = "IPv4")]
    V4,
    #[serde(rename = "IPv6")]
    V6,
}

impl IpFamily {
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// Its position in [`IpFamily::BOTH`], for per-family arrays.
    pub fn index(self) -> usize {
        match self {
            IpFamily::V4 => 0,
            IpFamily::V6 => 1,
        }
    }

    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNet) -> IpFamily {
        match net {
            IpNet::V4(_) => IpFamily::V4,
            IpNet::V6(_) => IpFamily::V6,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// Parses the API spelling; an unset protocol means TCP, as the API server defaults it.
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s {
            None | Some("TCP") => Some(Protocol::Tcp),
            Some("UDP") => Some(Protocol::Udp),
            Some("SCTP") => Some(Protocol::Sctp),
            Some(_) => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Service's namespace and name. Cheap to clone: the strings are shared by every
/// port, slice and snapshot entry of the service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl ServiceName {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        ServiceName {
            namespace: namespace.as_ref().into(),
            name: name.as_ref().into(),
        }
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Identity of one service port: the service, the port's name and its protocol.
///
/// Printed as upstream prints it: `ns/name:portname`, or `ns/name` for an unnamed port.
/// The protocol is part of the identity (a DNS service has `dns` on both TCP and UDP
/// under different names, but nothing stops two unnamed-in-spirit ports differing only
/// by protocol) but not of the printed form.
///
/// One pointer: the parts are shared by every map that keys on the port (the model,
/// the snapshot, the intent, each data plane's state), tens of thousands of entries
/// each in a large cluster. Derefs to its [`PortNameParts`] (`name.service`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ServicePortName(Arc<PortNameParts>);

/// Names that share their parts are equal without comparing strings: the maps of
/// successive snapshots, the intent and the planners hold the same name, and their
/// merge walks compare every key on every sync.
impl Ord for ServicePortName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            std::cmp::Ordering::Equal
        } else {
            self.0.cmp(&other.0)
        }
    }
}

impl PartialOrd for ServicePortName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What a [`ServicePortName`] names.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortNameParts {
    pub service: ServiceName,
    pub port: Arc<str>,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(service: ServiceName, port: impl Into<Arc<str>>, protocol: Protocol) -> Self {
        ServicePortName(Arc::new(PortNameParts {
            service,
            port: port.into(),
            protocol,
        }))
    }
}

impl std::ops::Deref for ServicePortName {
    type Target = PortNameParts;
    fn deref(&self) -> &PortNameParts {
        &self.0
    }
}

impl fmt::Debug for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServicePortName")
            .field("service", &self.service)
            .field("port", &self.port)
            .field("protocol", &self.protocol)
            .finish()
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

impl TrafficPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

/// How the load balancer delivers traffic for an ingress IP (`status.loadBalancer.ingress[].ipMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum IpMode {
    /// Traffic arrives with the LB IP as destination: the proxy captures it.
    #[default]
    #[serde(rename = "VIP")]
    Vip,
    /// The load balancer proxies to the nodes itself; the proxy leaves the IP alone.
    Proxy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum TrafficDistribution {
    PreferSameNode,
    PreferSameZone,
    /// The older spelling of `PreferSameZone`.
    PreferClose,
}

impl TrafficDistribution {
    pub fn parse(s: &str) -> Option<TrafficDistribution> {
        match s {
            "PreferSameNode" => Some(TrafficDistribution::PreferSameNode),
            "PreferSameZone" => Some(TrafficDistribution::PreferSameZone),
            "PreferClose" => Some(TrafficDistribution::PreferClose),
            _ => None,
        }
    }
}

/// How a new connection's endpoint is chosen among a service port's usable ones:
/// IPVS's schedulers (`--ipvs-scheduler`), with IPVS's names, and the random
/// choice of the other modes. Session affinity comes first with every scheduler
/// (as IPVS's persistence does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Scheduler {
    /// Uniformly at random (kube-proxy's iptables and nftables modes).
    #[default]
    Random,
    /// `rr`: the endpoints in turn, one connection each.
    RoundRobin,
    /// `sh`: a hash of the client's address, so one client stays on one endpoint
    /// while the endpoints stay the same.
    SourceHash,
    /// `dh`: a hash of the destination (the service address).
    DestinationHash,
    /// `mh`: Maglev hashing of the client's address and port: every node with
    /// the same endpoints makes the same choice for a flow, and an endpoint's
    /// removal moves about 1/N of the flows.
    Maglev,
    /// `lc`: the endpoint with the fewest live connections (the first such).
    LeastConnection,
    /// `wrr`: in turn, each endpoint as often as its weight, interleaved as
    /// IPVS's.
    WeightedRoundRobin,
    /// `wlc`: the fewest live connections per unit of weight.
    WeightedLeastConnection,
    /// `sed`: the shortest expected delay, (connections + 1) / weight.
    ShortestExpectedDelay,
    /// `nq`: an idle endpoint if there is one, else as `sed`.
    NeverQueue,
}

impl Scheduler {
    /// IPVS's schedulers that svcproxy does not execute (yet); named so that
    /// their refusal says so rather than "unknown".
    pub const NOT_IMPLEMENTED: &'static [&'static str] = &["lblc", "lblcr", "fo", "ovf", "twos"];

    /// Every scheduler, in the order the names are listed.
    pub const ALL: [Scheduler; 10] = [
        Scheduler::Random,
        Scheduler::RoundRobin,
        Scheduler::WeightedRoundRobin,
        Scheduler::SourceHash,
        Scheduler::DestinationHash,
        Scheduler::Maglev,
        Scheduler::LeastConnection,
        Scheduler::WeightedLeastConnection,
        Scheduler::ShortestExpectedDelay,
        Scheduler::NeverQueue,
    ];

    /// A scheduler by its IPVS name (`random` is svcproxy's name for the other
    /// modes' choice).
    pub fn parse(name: &str) -> Result<Scheduler, String> {
        if let Some(s) = Scheduler::ALL.into_iter().find(|s| s.as_str() == name) {
            return Ok(s);
        }
        let names = Scheduler::ALL.map(Scheduler::as_str).join(", ");
        if Scheduler::NOT_IMPLEMENTED.contains(&name) {
            Err(format!(
                "scheduler \"{name}\" is not implemented by svcproxy; use one of {names}"
            ))
        } else {
            Err(format!(
                "unknown scheduler {}: must be one of {names}",
                crate::problem::quote(name)
            ))
        }
    }

    /// Whether it gives endpoints shares by their weights (`svcproxy.io/endpoint-weights`):
    /// as IPVS's, all but `rr`, `lc` and `dh`, which ignore weights; `random`
    /// chooses in proportion to them.
    pub fn weighted(self) -> bool {
        !matches!(
            self,
            Scheduler::RoundRobin | Scheduler::LeastConnection | Scheduler::DestinationHash
        )
    }

    /// Whether it chooses by the endpoints' live connections (which the data
    /// plane then counts).
    pub fn counts_connections(self) -> bool {
        matches!(
            self,
            Scheduler::LeastConnection
                | Scheduler::WeightedLeastConnection
                | Scheduler::ShortestExpectedDelay
                | Scheduler::NeverQueue
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheduler::Random => "random",
            Scheduler::RoundRobin => "rr",
            Scheduler::SourceHash => "sh",
            Scheduler::DestinationHash => "dh",
            Scheduler::Maglev => "mh",
            Scheduler::WeightedRoundRobin => "wrr",
            Scheduler::LeastConnection => "lc",
            Scheduler::WeightedLeastConnection => "wlc",
            Scheduler::ShortestExpectedDelay => "sed",
            Scheduler::NeverQueue => "nq",
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which endpoints an entry of `svcproxy.io/endpoint-weights` weighs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WeightKey {
    /// The endpoint with this address.
    Ip(IpAddr),
    /// Every endpoint on this node (one with its own address entry takes that).
    Node(Arc<str>),
}

/// One entry of the `svcproxy.io/topology-keys` annotation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TopologyKey {
    /// A node label key: endpoints on nodes with this node's value match.
    Label(String),
    /// `*`: every endpoint matches.
    Any,
}

impl fmt::Display for TopologyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyKey::Label(k) => f.write_str(k),
            TopologyKey::Any => f.write_str("*"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    pub ip_mode: IpMode,
}

/// Everything about one port of one Service that the data planes need, for all
/// families. [`ServicePort::for_family`] narrows it to one family.
///
/// The lists are shared (`Arc<[_]>`): every port of a service holds the same ones,
/// and a port is held for every service port of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub service_type: ServiceType,
    pub cluster_ips: Arc<[IpAddr]>,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ips: Arc<[IpAddr]>,
    pub load_balancer_ingress: Arc<[LoadBalancerIngress]>,
    /// `None`: no restriction. `Some(v)`: only sources inside `v` (possibly none).
    pub load_balancer_source_ranges: Option<Arc<[IpNet]>>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    /// `Some(timeout seconds)` when sessionAffinity is ClientIP.
    pub session_affinity_timeout: Option<u32>,
    pub health_check_node_port: Option<u16>,
    pub traffic_distribution: Option<TrafficDistribution>,
    /// `service.kubernetes.io/topology-mode` (or the older hints annotation), verbatim.
    pub topology_mode: Option<Arc<str>>,
    /// Parsed `svcproxy.io/topology-keys`; `None` when absent (or ignored).
    pub topology_keys: Option<Arc<[TopologyKey]>>,
    /// `svcproxy.io/scheduler`; `None`: the node's (`--ipvs-scheduler`,
    /// `--scheduler`).
    pub scheduler: Option<Scheduler>,
    /// `svcproxy.io/endpoint-weights`, in the annotation's order; `None`: every
    /// endpoint weighs 1.
    pub endpoint_weights: Option<Arc<[(WeightKey, u8)]>>,
    /// `svcproxy.io/maglev-table-size`; `None`: the node's.
    pub maglev_table_size: Option<u32>,
}

impl ServicePort {
    /// This port as seen by one family's proxier: only that family's addresses and
    /// ranges. `None` when the service has no cluster IP of that family, in which case
    /// that family does not proxy it at all.
    pub fn for_family(&self, family: IpFamily) -> Option<ServicePort> {
        let cluster_ips: Vec<IpAddr> = self
            .cluster_ips
            .iter()
            .copied()
            .filter(|ip| IpFamily::of(ip) == family)
            .collect();
        if cluster_ips.is_empty() {
            return None;
        }
        Some(ServicePort {
            cluster_ips: cluster_ips.into(),
            external_ips: self
                .external_ips
                .iter()
                .copied()
                .filter(|ip| IpFamily::of(ip) == family)
                .collect(),
            load_balancer_ingress: self
                .load_balancer_ingress
                .iter()
                .copied()
                .filter(|i| IpFamily::of(&i.ip) == family)
                .collect(),
            // A restriction given only for the other family still restricts this one
            // (to nobody): failing open would expose an LB the owner meant to fence.
            load_balancer_source_ranges: self.load_balancer_source_ranges.as_ref().map(|r| {
                r.iter()
                    .copied()
                    .filter(|n| IpFamily::of_net(n) == family)
                    .collect()
            }),
            ..self.clone()
        })
    }

    /// [`ServicePort::for_family`], sharing `port` itself when it has addresses and
    /// ranges of `family` only (a single-stack service, the common case).
    pub fn shared_for_family(
        port: &Arc<ServicePort>,
        family: IpFamily,
    ) -> Option<Arc<ServicePort>> {
        let of_family = |ip: &IpAddr| IpFamily::of(ip) == family;
        let only_family = port.cluster_ips.iter().all(of_family)
            && port.external_ips.iter().all(of_family)
            && port.load_balancer_ingress.iter().all(|i| of_family(&i.ip))
            && port
                .load_balancer_source_ranges
                .iter()
                .flat_map(|r| r.iter())
                .all(|n| IpFamily::of_net(n) == family);
        if only_family && !port.cluster_ips.is_empty() {
            return Some(port.clone());
        }
        port.for_family(family).map(Arc::new)
    }

    /// Load-balancer IPs the proxy captures (ipMode VIP).
    pub fn load_balancer_vips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.load_balancer_ingress
            .iter()
            .filter(|i| i.ip_mode == IpMode::Vip)
            .map(|i| i.ip)
    }

    /// Reachable from outside the cluster: by NodePort, external IP or LB IP.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ingress.is_empty()
    }

    /// External traffic uses only this node's endpoints.
    pub fn external_policy_local(&self) -> bool {
        self.external_traffic_policy == TrafficPolicy::Local && self.externally_accessible()
    }

    pub fn internal_policy_local(&self) -> bool {
        self.internal_traffic_policy == TrafficPolicy::Local
    }

    /// Some traffic to this port goes to cluster-wide endpoints: internal traffic with
    /// iTP Cluster, or any external traffic (even with eTP Local, pods reaching the
    /// LB/external IP are short-circuited to the cluster endpoints).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local() || self.externally_accessible()
    }

    /// Some traffic to this port is restricted to this node's endpoints.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local() || self.external_policy_local()
    }
}

/// A converted Service: its ports, each carrying the service-wide fields, and what
/// the cluster DNS names it by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub name: ServiceName,
    /// Possibly none: a headless service may have no port.
    pub ports: Vec<Arc<ServicePort>>,
    pub kind: ServiceKind,
    /// `spec.publishNotReadyAddresses`: the DNS names every endpoint of a headless
    /// service, ready or not.
    pub publish_not_ready_addresses: bool,
    /// Why the proxy leaves the service alone; `None`: it proxies it. Services
    /// that are not proxied are kept only for the cluster DNS
    /// ([`crate::convert::ConvertOptions::keep_unproxied`]).
    pub not_proxied: Option<NotProxied>,
}

impl Service {
    pub fn proxied(&self) -> bool {
        self.not_proxied.is_none()
    }

    /// Its cluster IPs (at most one per family; none unless [`ServiceKind::ClusterIp`]).
    pub fn cluster_ips(&self) -> &[IpAddr] {
        match &self.kind {
            ServiceKind::ClusterIp(ips) => ips,
            _ => &[],
        }
    }
}

/// How a Service is reached, which is what its DNS name answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// By its cluster IPs (shared with every port's `cluster_ips`).
    ClusterIp(Arc<[IpAddr]>),
    /// `clusterIP: None`: by its endpoints' addresses.
    Headless,
    /// `type: ExternalName`: an alias of this domain name (lowercase, no final dot).
    ExternalName(Arc<str>),
}

/// Why a Service is not proxied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotProxied {
    /// `clusterIP: None`.
    Headless,
    /// Labelled `service.kubernetes.io/headless`.
    HeadlessLabel,
    /// `type: ExternalName`.
    ExternalName,
    /// Its `service.kubernetes.io/service-proxy-name` label is not this proxy's.
    OtherProxy,
}

impl fmt::Display for NotProxied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotProxied::Headless => "headless (clusterIP: None)",
            NotProxied::HeadlessLabel => "labelled service.kubernetes.io/headless",
            NotProxied::ExternalName => "type ExternalName",
            NotProxied::OtherProxy => "another proxy's (service.kubernetes.io/service-proxy-name)",
        })
    }
}

/// What the cluster DNS needs of a Pod: where it runs and its addresses, to find
/// a client's node from its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub node_name: Arc<str>,
    pub ips: Box<[IpAddr]>,
}

/// What an EndpointSlice says about one endpoint address, whatever the port: shared
/// (behind an `Arc`) by the slice and by the endpoint list of every service port
/// that includes the address, so 100k endpoints on two ports are stored once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointInfo {
    /// Interned: one allocation per distinct node name, however many endpoints.
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// `hints.forZones`; empty when unset.
    pub zone_hints: Box<[Arc<str>]>,
    /// `hints.forNodes`; empty when unset.
    pub node_hints: Box<[Arc<str>]>,
}

/// One endpoint of one service port, after port resolution and condition defaulting.
///
/// Derefs to its [`EndpointInfo`] (`ep.ready`, `ep.node_name`); the info is shared,
/// so changing it goes through `Arc::make_mut(&mut ep.info)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub info: Arc<EndpointInfo>,
}

impl std::ops::Deref for Endpoint {
    type Target = EndpointInfo;
    fn deref(&self) -> &EndpointInfo {
        &self.info
    }
}

impl Endpoint {
    /// Usable only as a fallback: still serving, but on its way out.
    pub fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{}:{}", ip, self.port),
            IpAddr::V6(ip) => write!(f, "[{}]:{}", ip, self.port),
        }
    }
}

/// A Node's labels. Keys and values are interned by the state: 5k Nodes with a
/// dozen labels each share a few dozen distinct strings besides their hostnames.
pub type Labels = BTreeMap<Arc<str>, Arc<str>>;

/// What svcproxy needs to know about a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: Labels,
    /// status.addresses of type InternalIP and ExternalIP, in the API's order.
    pub addresses: Vec<IpAddr>,
    /// spec.podCIDRs (for `--detect-local-mode NodeCIDR`).
    pub pod_cidrs: Vec<IpNet>,
    /// The Node has a deletionTimestamp.
    pub deleting: bool,
    /// Tainted for removal by the cluster autoscaler (`ToBeDeletedByClusterAutoscaler`).
    pub to_be_deleted: bool,
}

impl NodeInfo {
    /// The node's primary address of a family: the first InternalIP (or else
    /// ExternalIP) of that family, as upstream's `GetNodeHostIPs`.
    pub fn primary_ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.addresses
            .iter()
            .copied()
            .find(|ip| IpFamily::of(ip) == family)
    }
}

/// A plain ClusterIP port on port 80, for the crate's unit tests.
#[cfg(test)]
pub(crate) fn test_port(
    ns: &str,
    name: &str,
    port: &str,
    protocol: Protocol,
    cluster_ips: &[&str],
) -> ServicePort {
    ServicePort {
        name: ServicePortName::new(ServiceName::new(ns, name), port, protocol),
        service_type: ServiceType::ClusterIP,
        cluster_ips: cluster_ips.iter().map(|ip| ip.parse().unwrap()).collect(),
        port: 80,
        node_port: None,
        external_ips: Vec::new().into(),
        load_balancer_ingress: Vec::new().into(),
        load_balancer_source_ranges: None,
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout: None,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
        topology_keys: None,
        scheduler: None,
        endpoint_weights: None,
        maglev_table_size: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(cluster_ips: &[&str], source_ranges: Option<&[&str]>) -> Arc<ServicePort> {
        Arc::new(ServicePort {
            service_type: ServiceType::LoadBalancer,
            node_port: Some(30080),
            load_balancer_source_ranges: source_ranges
                .map(|r| r.iter().map(|n| n.parse().unwrap()).collect()),
            ..test_port("ns", "svc", "http", Protocol::Tcp, cluster_ips)
        })
    }

    #[test]
    fn a_single_stack_port_is_shared_and_a_dual_stack_one_narrowed() {
        let v4 = port(&["10.96.0.10"], Some(&["192.0.2.0/24"]));
        let shared = ServicePort::shared_for_family(&v4, IpFamily::V4).unwrap();
        assert!(Arc::ptr_eq(&shared, &v4));
        assert_eq!(ServicePort::shared_for_family(&v4, IpFamily::V6), None);

        let dual = port(&["10.96.0.10", "fd00::10"], Some(&["192.0.2.0/24"]));
        for family in IpFamily::BOTH {
            let narrowed = ServicePort::shared_for_family(&dual, family).unwrap();
            assert!(!Arc::ptr_eq(&narrowed, &dual));
            assert_eq!(*narrowed, dual.for_family(family).unwrap());
        }
        // A v4-only source range on a v6-only port still fences it (to nobody): the
        // port is narrowed, not shared.
        let v6 = port(&["fd00::10"], Some(&["192.0.2.0/24"]));
        let narrowed = ServicePort::shared_for_family(&v6, IpFamily::V6).unwrap();
        assert_eq!(
            narrowed.load_balancer_source_ranges,
            Some(Vec::new().into())
        );
    }
}
