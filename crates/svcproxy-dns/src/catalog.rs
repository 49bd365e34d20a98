//! What the cluster DNS knows, and its answers: Kubernetes' DNS-based service
//! discovery specification (schema 1.1.0) for one cluster domain, built from the
//! same source updates the proxy reads, kept up to date one service at a time.
//!
//! Pure: [`Catalog::apply`] takes a [`SourceUpdate`], [`Catalog::answer`] a query
//! name and type; the server ([`crate::server`]) only moves bytes.
//!
//! Names: `<service>.<ns>.svc.<zone>` (A/AAAA of the cluster IPs, or of a headless
//! service's ready endpoints; CNAME of an ExternalName service),
//! `<hostname>.<service>.<ns>.svc.<zone>` (a headless service's endpoint: its
//! `hostname`, else its address with dashes, `10-244-1-5`, as CoreDNS names it),
//! `_<port>._<proto>.<service>.<ns>.svc.<zone>` (SRV per named port; a headless
//! service's point at each endpoint), PTR for cluster IPs and headless endpoints,
//! `<a-b-c-d>.<ns>.pod.<zone>` (the specification's deprecated pod records), and
//! `dns-version.<zone>` (TXT). A name that exists without records of the asked type
//! is answered NODATA (NOERROR, no records, the zone's SOA), one that does not
//! NXDOMAIN; a headless service without ready endpoints is NXDOMAIN, as the
//! specification says.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use smallvec::SmallVec;
use svcproxy_core::convert::{is_dns1123_label, Slice, SliceEndpoint};
use svcproxy_core::model::{
    Endpoint, IpFamily, Labels, NodeInfo, PodInfo, Protocol, Service, ServiceKind, ServiceName,
};
use svcproxy_core::selection::{select_endpoints, NodeContext};
use svcproxy_core::state::{ClusterState, ModelChanges};

/// The schema version `dns-version.<zone>` answers.
pub const SCHEMA_VERSION: &str = "1.1.0";

/// The cluster domain, the records' time to live, and where the clients are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsConfig {
    /// e.g. `cluster.local` (a trailing dot is allowed).
    pub zone: String,
    pub ttl: u32,
    /// The node every client runs on (the node-local deployment). `None`: clients
    /// may be anywhere, and each one's node is found from its address (its Pod's
    /// IPs, else a Node's `podCIDRs` or addresses). A headless service that opts
    /// into topology is answered with the endpoints the proxy's endpoint selection
    /// chooses for the client's node; an unknown client gets every ready endpoint.
    pub clients_node: Option<String>,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            zone: "cluster.local".into(),
            ttl: 30,
            clients_node: None,
        }
    }
}

/// An answer: the response code and the records of each section.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub code: ResponseCode,
    pub answers: Vec<Record>,
    /// The zone's SOA on a negative answer (RFC 2308), for negative caching.
    pub authority: Vec<Record>,
    /// The A/AAAA records of SRV targets.
    pub additionals: Vec<Record>,
    /// The answer depends on the client: on its node ([`Catalog::client_node`])
    /// and nothing else of it (topology chosen for its node, by a server that
    /// serves clients of several nodes).
    pub per_client: bool,
}

/// An SRV record's port and target hostname (`None`: the service's own name).
type SrvTarget = (u16, Option<String>);

/// One service as the DNS answers it: the proxy's model of the Service and of its
/// slices (shared with the cluster state, not copied), and what endpoint selection
/// chose for the clients' node when they all run on one.
#[derive(Clone, Debug)]
struct Entry {
    service: Arc<Service>,
    /// Its slices, in name order.
    slices: Box<[Arc<Slice>]>,
    /// With every client on one node (`clients_node`), a selective headless
    /// service's endpoints chosen there: decided when the entry is built rather
    /// than at every query.
    chosen_here: Option<Box<[IpAddr]>>,
}

impl Entry {
    /// The same service, slices and choice (the model's values are shared, so
    /// pointers compare them).
    fn same(&self, other: &Entry) -> bool {
        Arc::ptr_eq(&self.service, &other.service)
            && self.slices.len() == other.slices.len()
            && self
                .slices
                .iter()
                .zip(other.slices.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b))
            && self.chosen_here == other.chosen_here
    }

    fn headless(&self) -> bool {
        self.service.kind == ServiceKind::Headless
    }

    /// A headless service whose answers depend on the client's node: it has a
    /// port, which endpoint selection reads (its topology keys,
    /// `trafficDistribution`, policies).
    fn selective(&self) -> bool {
        self.headless() && !self.service.ports.is_empty()
    }

    /// A headless service's endpoints the DNS names: the ready ones, or all with
    /// `publishNotReadyAddresses`.
    fn published(&self) -> impl Iterator<Item = &SliceEndpoint> {
        let all = self.service.publish_not_ready_addresses;
        self.slices
            .iter()
            .filter(|_| self.headless())
            .flat_map(|s| s.endpoints.iter())
            .filter(move |e| e.ready || all)
    }

    /// A/AAAA at the service's name: its cluster IPs, or a headless service's
    /// published endpoints (sorted).
    fn addrs(&self) -> Vec<IpAddr> {
        if !self.headless() {
            return self.service.cluster_ips().to_vec();
        }
        let mut ips: Vec<IpAddr> = self.published().map(|e| e.ip).collect();
        ips.sort();
        ips.dedup();
        ips
    }

    /// The addresses of a headless service's endpoints named `host`.
    fn host_ips(&self, host: &str) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .published()
            .filter(|e| host_of(e) == host)
            .map(|e| e.ip)
            .collect();
        ips.sort();
        ips.dedup();
        ips
    }

    /// The SRV targets of the named port `name` over `protocol` (lowercase):
    /// the service itself, or each of a headless service's published endpoints
    /// whose slice has that port. `None`: no such record.
    fn srv_targets(&self, name: &str, protocol: &str) -> Option<Vec<SrvTarget>> {
        let is = |port: &str, p: Protocol| !port.is_empty() && port == name && lower(p) == protocol;
        let mut targets: Vec<SrvTarget> = Vec::new();
        if self.headless() {
            let all = self.service.publish_not_ready_addresses;
            for slice in self.slices.iter() {
                for p in slice.ports.iter().filter(|p| is(&p.name, p.protocol)) {
                    let published = slice.endpoints.iter().filter(|e| e.ready || all);
                    targets.extend(published.map(|e| (p.port, Some(host_of(e).into_owned()))));
                }
            }
        } else if matches!(self.service.kind, ServiceKind::ClusterIp(_)) {
            targets.extend(
                self.service
                    .ports
                    .iter()
                    .filter(|p| is(&p.name.port, p.name.protocol))
                    .map(|p| (p.port, None)),
            );
        }
        targets.sort();
        targets.dedup();
        (!targets.is_empty()).then_some(targets)
    }

    /// Whether some SRV record of the service is over `protocol` (lowercase).
    fn has_protocol(&self, protocol: &str) -> bool {
        if self.headless() {
            // A slice with such a named port and an endpoint the DNS names.
            let all = self.service.publish_not_ready_addresses;
            self.slices.iter().any(|s| {
                s.ports
                    .iter()
                    .any(|p| !p.name.is_empty() && lower(p.protocol) == protocol)
                    && s.endpoints.iter().any(|e| e.ready || all)
            })
        } else {
            self.service
                .ports
                .iter()
                .any(|p| !p.name.port.is_empty() && lower(p.name.protocol) == protocol)
        }
    }

    /// The addresses with PTR records to this service's names: its cluster IPs,
    /// or a headless service's published endpoints.
    fn ptr_ips(&self) -> Vec<IpAddr> {
        self.addrs()
    }
}

/// An endpoint's hostname: its own, else its address with dashes.
fn host_of(e: &SliceEndpoint) -> std::borrow::Cow<'_, str> {
    match &e.hostname {
        Some(h) => std::borrow::Cow::Borrowed(h),
        None => std::borrow::Cow::Owned(dashed(e.ip)),
    }
}

fn lower(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// What the DNS answers from: an index over the cluster state's model
/// ([`ClusterState`]), kept up to date by [`Catalog::follow`]. Every object is
/// converted and validated once, by the state, for the proxy and the DNS alike:
/// the catalog keeps only what is its own (names to services, addresses to names,
/// clients to nodes).
#[derive(Debug)]
pub struct Catalog {
    zone: Name,
    ttl: u32,
    /// Bumped at every change: the SOA's serial.
    serial: u32,
    /// Bumped at every change of a service, its slices or the Nodes (never
    /// wrapping): see [`Catalog::generation`].
    generation: u64,
    /// Services by namespace, then name (`<ns>.svc.<zone>` exists while it has one).
    services: HashMap<Arc<str>, HashMap<Arc<str>, Entry>>,
    /// Services with names for each address (PTR).
    ptr: HashMap<IpAddr, SmallVec<[ServiceName; 1]>>,
    /// `DnsConfig::clients_node`.
    clients_node: Option<String>,
    /// Nodes by name: labels for endpoint selection, `podCIDRs` and addresses to
    /// place a client.
    nodes: HashMap<String, Arc<NodeInfo>>,
    /// Pods by namespace and name: their IPs and node.
    pods: HashMap<(Arc<str>, Arc<str>), Arc<PodInfo>>,
    /// A pod IP's node.
    pod_nodes: HashMap<IpAddr, Arc<str>>,
    /// Nodes by their `podCIDRs`: per prefix length, longest first, the networks.
    /// An IPv4 and an IPv6 network never compare equal, so one map holds both.
    node_cidrs: BTreeMap<std::cmp::Reverse<u8>, HashMap<IpAddr, String>>,
    /// Nodes by their own addresses (host-network clients).
    node_addresses: HashMap<IpAddr, String>,
    /// The sources' first complete list has been applied: until then the server
    /// answers SERVFAIL (retried, never cached) rather than NXDOMAIN (cached).
    ready: bool,
}

/// `cfg.zone`, not a domain name.
#[derive(Debug, thiserror::Error)]
#[error("--cluster-domain {0:?}: not a domain name (lowercase labels of letters, digits and '-')")]
pub struct BadZone(pub String);

impl Catalog {
    /// An empty catalog for `cfg`'s zone.
    pub fn new(cfg: &DnsConfig) -> Result<Self, BadZone> {
        let zone = cfg.zone.trim_end_matches('.').to_ascii_lowercase();
        if zone.is_empty() || zone.len() > 200 || !zone.split('.').all(is_dns1123_label) {
            return Err(BadZone(cfg.zone.clone()));
        }
        Ok(Catalog {
            zone: fqdn(&zone),
            ttl: cfg.ttl,
            serial: 1,
            generation: 0,
            services: HashMap::new(),
            ptr: HashMap::new(),
            clients_node: cfg.clients_node.clone(),
            nodes: HashMap::new(),
            pods: HashMap::new(),
            pod_nodes: HashMap::new(),
            node_cidrs: BTreeMap::new(),
            node_addresses: HashMap::new(),
            ready: false,
        })
    }

    /// Says the sources' first complete list is in.
    pub fn set_ready(&mut self) {
        if !self.ready {
            self.ready = true;
            // Node labels and addresses that arrived during the first list were not
            // acted on.
            self.index_nodes();
            self.refresh_chosen_here();
        }
    }

    /// Whether [`Catalog::set_ready`] was called.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Changes whenever an answer may change: for a given query, and for those
    /// marked [`Answer::per_client`] a given client node ([`Catalog::client_node`]),
    /// the answer stays the same while this does, so a server may keep it encoded.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The zone served, as an absolute name.
    pub fn zone(&self) -> &Name {
        &self.zone
    }

    /// Services known.
    pub fn services(&self) -> usize {
        self.services.values().map(HashMap::len).sum()
    }

    /// Reads again what changed in `model` since the last call (the state must
    /// have been made with [`svcproxy_core::state::StateConfig::dns`]).
    pub fn follow(&mut self, model: &mut ClusterState) {
        let changes = model.take_model_changes();
        if !changes.is_empty() {
            self.update(model, &changes);
        }
    }

    /// Reads again the objects `changes` names from `model`.
    pub fn update(&mut self, model: &ClusterState, changes: &ModelChanges) {
        let (mut labels_moved, mut places_moved) = (false, false);
        for name in &changes.nodes {
            let new = model.node(name).cloned();
            let old = match &new {
                Some(n) => self.nodes.insert(name.clone(), n.clone()),
                None => self.nodes.remove(name),
            };
            labels_moved |= old.as_ref().map(|o| &o.labels) != new.as_ref().map(|n| &n.labels);
            places_moved |= old.as_ref().map(|o| (&o.pod_cidrs, &o.addresses))
                != new.as_ref().map(|n| (&n.pod_cidrs, &n.addresses));
        }
        for key in &changes.pods {
            self.place_pod(key.clone(), model.pod(key).cloned());
        }
        for name in &changes.services {
            self.refresh(name, model);
        }
        if places_moved {
            self.index_nodes();
        }
        if labels_moved {
            // The endpoints chosen for any node may differ now.
            self.generation += 1;
            self.refresh_chosen_here();
        }
    }

    fn place_pod(&mut self, id: (Arc<str>, Arc<str>), pod: Option<Arc<PodInfo>>) {
        if let Some(old) = self.pods.remove(&id) {
            for ip in old.ips.iter() {
                if self.pod_nodes.get(ip) == Some(&old.node_name) {
                    self.pod_nodes.remove(ip);
                }
            }
        }
        if let Some(pod) = pod {
            for ip in pod.ips.iter() {
                self.pod_nodes.insert(*ip, pod.node_name.clone());
            }
            self.pods.insert(id, pod);
        }
    }

    /// Rebuilds the index of Nodes by `podCIDRs` and by address: once at
    /// `set_ready` for the whole first list (not once per Node of it, which would be
    /// quadratic in the Nodes), then at each change of a Node's ranges or addresses.
    fn index_nodes(&mut self) {
        if !self.ready {
            return;
        }
        self.node_addresses.clear();
        self.node_cidrs.clear();
        // Sorted by name: where two Nodes claim the same address or range (a
        // misconfiguration), the answer does not depend on hash order.
        let mut nodes: Vec<&NodeInfo> = self.nodes.values().map(|n| &**n).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        for n in nodes {
            for ip in &n.addresses {
                self.node_addresses
                    .entry(*ip)
                    .or_insert_with(|| n.name.clone());
            }
            for cidr in &n.pod_cidrs {
                let cidr = cidr.trunc();
                self.node_cidrs
                    .entry(std::cmp::Reverse(cidr.prefix_len()))
                    .or_default()
                    .entry(cidr.network())
                    .or_insert_with(|| n.name.clone());
            }
        }
    }

    /// Node labels changed: with every client on one node, the endpoints chosen
    /// there are chosen again.
    fn refresh_chosen_here(&mut self) {
        // Before the first complete list (nobody is answered yet), once, at
        // `set_ready`, rather than once per Node of the list.
        let Some(node) = self.clients_node.clone().filter(|_| self.ready) else {
            return;
        };
        let mut moved = false;
        let mut updates = Vec::new();
        for (ns, names) in &self.services {
            for (name, entry) in names.iter().filter(|(_, e)| e.selective()) {
                let chosen = self.chosen(entry, &node);
                if chosen != entry.chosen_here {
                    updates.push((ns.clone(), name.clone(), chosen));
                }
            }
        }
        for (ns, name, chosen) in updates {
            if let Some(entry) = self.services.get_mut(&ns).and_then(|m| m.get_mut(&name)) {
                entry.chosen_here = chosen;
                moved = true;
            }
        }
        if moved {
            self.generation += 1;
            self.serial = self.serial.wrapping_add(1).max(1);
        }
    }

    /// Reads service `name` (its Service and slices) again from `model`, and its
    /// PTR records.
    fn refresh(&mut self, name: &ServiceName, model: &ClusterState) {
        // Whether or not the entry changes: what endpoint selection chooses for a
        // client's node may (a zone or a hint changed, not an address).
        self.generation += 1;
        let new = model.service(name).map(|service| {
            let mut entry = Entry {
                service: service.clone(),
                slices: model.slices_of(name).cloned().collect(),
                chosen_here: None,
            };
            if entry.selective() && self.ready {
                if let Some(node) = &self.clients_node {
                    entry.chosen_here = self.chosen(&entry, node);
                }
            }
            entry
        });
        let old = match &new {
            Some(entry) => self
                .services
                .entry(name.namespace.clone())
                .or_default()
                .insert(name.name.clone(), entry.clone()),
            None => {
                let names = self.services.get_mut(&*name.namespace);
                let old = names.and_then(|m| m.remove(&*name.name));
                if self
                    .services
                    .get(&*name.namespace)
                    .is_some_and(HashMap::is_empty)
                {
                    self.services.remove(&*name.namespace);
                }
                old
            }
        };
        match (&old, &new) {
            (None, None) => return,
            (Some(a), Some(b)) if a.same(b) => return,
            _ => {}
        }
        self.serial = self.serial.wrapping_add(1).max(1);
        for ip in old.iter().flat_map(Entry::ptr_ips) {
            if let Some(names) = self.ptr.get_mut(&ip) {
                names.retain(|n| n != name);
                if names.is_empty() {
                    self.ptr.remove(&ip);
                }
            }
        }
        for ip in new.iter().flat_map(Entry::ptr_ips) {
            let names = self.ptr.entry(ip).or_default();
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }

    fn entry(&self, ns: &str, name: &str) -> Option<&Entry> {
        self.services.get(ns)?.get(name)
    }

    /// The node of the client at `client`: the one all clients are on, else its
    /// Pod's, else the Node whose `podCIDRs` or addresses hold it.
    pub fn client_node(&self, client: Option<IpAddr>) -> Option<&str> {
        if let Some(node) = &self.clients_node {
            return Some(node);
        }
        let ip = client?;
        if let Some(node) = self.pod_nodes.get(&ip) {
            return Some(node);
        }
        // The most specific pod CIDR holding the address: one lookup per prefix
        // length in use (usually one), whatever the number of Nodes.
        let by_cidr = self.node_cidrs.iter().find_map(|(len, nets)| {
            let net = ipnet::IpNet::new(ip, len.0).ok()?.trunc();
            nets.get(&net.network())
        });
        by_cidr
            .or_else(|| self.node_addresses.get(&ip))
            .map(String::as_str)
    }

    /// The addresses endpoint selection chooses for `node` among a selective
    /// headless service's endpoints: the proxy's own function, on the proxy's own
    /// model of the service and its slices, per family (sorted). `None`: the
    /// service is not selective (nothing is filtered).
    fn chosen(&self, entry: &Entry, node: &str) -> Option<Box<[IpAddr]>> {
        if !entry.selective() {
            return None;
        }
        let port = &entry.service.ports[0];
        let no_labels = Labels::new();
        let node_labels = |n: &str| self.nodes.get(n).map(|i| &i.labels);
        let ctx = NodeContext {
            node_name: node,
            labels: self.nodes.get(node).map_or(&no_labels, |i| &i.labels),
            node_labels: &node_labels,
        };
        let all = entry.service.publish_not_ready_addresses;
        let mut chosen = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let mut endpoints: Vec<Endpoint> = entry
                .slices
                .iter()
                .filter(|s| s.family == family)
                .flat_map(|s| {
                    let port = s.ports.first().map_or(0, |p| p.port);
                    s.endpoints.iter().map(move |e| {
                        let mut info = e.info.clone();
                        if all && !info.ready {
                            Arc::make_mut(&mut info).ready = true;
                        }
                        Endpoint {
                            ip: e.ip,
                            port,
                            info,
                        }
                    })
                })
                .collect();
            endpoints.sort_by_key(|e| (e.ip, e.port));
            endpoints.dedup_by_key(|e| (e.ip, e.port));
            let endpoints: Arc<[Endpoint]> = endpoints.into();
            let selection = select_endpoints(port, &endpoints, &ctx);
            let picked = selection.cluster_endpoints.or(selection.local_endpoints);
            chosen.extend(picked.iter().flat_map(|l| l.iter()).map(|e| e.ip));
        }
        chosen.sort();
        chosen.dedup();
        Some(chosen.into())
    }

    /// `<service>.<ns>.svc.<zone>.`
    fn service_name(&self, name: &ServiceName) -> Name {
        self.service_name_of(&name.namespace, &name.name)
    }

    fn service_name_of(&self, ns: &str, name: &str) -> Name {
        let svc = prefixed("svc", &self.zone);
        prefixed(name, &prefixed(ns, &svc))
    }

    /// The answer to `qname`/`qtype` for the client at `client` (its node decides
    /// topology-aware answers), or `None` for a name this catalog is not the
    /// authority for (outside the zone, or the reverse name of an address it does
    /// not know): those are forwarded or refused by the server.
    pub fn answer(
        &self,
        qname: &Name,
        qtype: RecordType,
        client: Option<IpAddr>,
    ) -> Option<Answer> {
        let lower = qname.to_lowercase();
        if self.zone.zone_of(&lower) {
            return Some(self.in_zone(qname, &lower, qtype, client));
        }
        let ip = lower.parse_arpa_name().ok()?;
        // Only a whole address (a /32 or /128 name) has PTR records.
        if ip.prefix_len() != ip.max_prefix_len() {
            return None;
        }
        let ip = ip.addr();
        let services = self.ptr.get(&ip)?;
        if !matches!(qtype, RecordType::PTR | RecordType::ANY) {
            return Some(Answer::default());
        }
        // Cluster IPs name their service; a headless service's endpoint, its
        // hostname under the service.
        let mut names: BTreeSet<Name> = BTreeSet::new();
        for svc in services {
            let Some(entry) = self.entry(&svc.namespace, &svc.name) else {
                continue;
            };
            let service = self.service_name(svc);
            if entry.headless() {
                names.extend(
                    entry
                        .published()
                        .filter(|e| e.ip == ip)
                        .map(|e| prefixed(&host_of(e), &service)),
                );
            } else {
                names.insert(service);
            }
        }
        Some(Answer {
            answers: names
                .into_iter()
                .map(|n| self.record(qname, RData::PTR(PTR(n))))
                .collect(),
            ..Answer::default()
        })
    }

    fn in_zone(
        &self,
        qname: &Name,
        lower: &Name,
        qtype: RecordType,
        client: Option<IpAddr>,
    ) -> Answer {
        // The labels below the zone, from the top: `web.demo.svc` is
        // ["svc", "demo", "web"].
        let depth = usize::from(lower.num_labels() - self.zone.num_labels());
        let labels: Vec<String> = lower
            .iter()
            .take(depth)
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .rev()
            .collect();
        let rel: Vec<&str> = labels.iter().map(String::as_str).collect();
        match rel.as_slice() {
            [] if qtype == RecordType::SOA => Answer {
                answers: vec![self.soa()],
                ..Answer::default()
            },
            [] | ["svc"] | ["pod"] | ["pod", _] => self.nodata(),
            ["dns-version"] => match qtype {
                RecordType::TXT | RecordType::ANY => Answer {
                    answers: vec![self.record(
                        qname,
                        RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])),
                    )],
                    ..Answer::default()
                },
                _ => self.nodata(),
            },
            ["svc", ns] if self.services.contains_key(*ns) => self.nodata(),
            ["svc", ns, svc] => match self.entry(ns, svc) {
                None => self.nxdomain(),
                Some(entry) => self.service_answer(qname, entry, qtype, client),
            },
            ["svc", ns, svc, proto] if proto.starts_with('_') => match self.entry(ns, svc) {
                Some(entry) if entry.has_protocol(&proto[1..]) => self.nodata(),
                _ => self.nxdomain(),
            },
            ["svc", ns, svc, host] => {
                let ips = self
                    .entry(ns, svc)
                    .map(|e| e.host_ips(host))
                    .unwrap_or_default();
                if ips.is_empty() {
                    self.nxdomain()
                } else {
                    self.address_answer(qname, &ips, qtype)
                }
            }
            ["svc", ns, svc, proto, port] if proto.starts_with('_') && port.starts_with('_') => {
                let found = self.entry(ns, svc).and_then(|entry| {
                    let targets = entry.srv_targets(&port[1..], &proto[1..])?;
                    Some((entry, targets))
                });
                match found {
                    None => self.nxdomain(),
                    Some(_) if !matches!(qtype, RecordType::SRV | RecordType::ANY) => self.nodata(),
                    Some((entry, targets)) => {
                        self.srv_answer(qname, ns, svc, entry, &targets, client)
                    }
                }
            }
            ["pod", _, ip] => match undashed(ip) {
                None => self.nxdomain(),
                Some(ip) => self.address_answer(qname, &[ip], qtype),
            },
            _ => self.nxdomain(),
        }
    }

    /// The addresses endpoint selection chose for `client`'s node, when `entry`'s
    /// answers depend on it and the node is known; `None`: every one.
    fn chosen_for<'a>(
        &self,
        entry: &'a Entry,
        client: Option<IpAddr>,
    ) -> Option<std::borrow::Cow<'a, [IpAddr]>> {
        if !entry.selective() {
            return None;
        }
        if self.clients_node.is_some() {
            return entry.chosen_here.as_deref().map(std::borrow::Cow::Borrowed);
        }
        self.chosen(entry, self.client_node(client)?)
            .map(|c| std::borrow::Cow::Owned(c.into_vec()))
    }

    fn service_answer(
        &self,
        qname: &Name,
        entry: &Entry,
        qtype: RecordType,
        client: Option<IpAddr>,
    ) -> Answer {
        if let ServiceKind::ExternalName(target) = &entry.service.kind {
            // Whatever the type: the resolver follows the alias.
            return Answer {
                answers: vec![self.record(qname, RData::CNAME(CNAME(fqdn(target))))],
                ..Answer::default()
            };
        }
        let addrs = entry.addrs();
        if entry.headless() && addrs.is_empty() {
            // The specification: a headless service without ready endpoints. With
            // some, but none chosen for the client's node: NODATA, below.
            return self.nxdomain();
        }
        let answer = match self.chosen_for(entry, client) {
            None => self.address_answer(qname, &addrs, qtype),
            Some(chosen) => {
                let ips: Vec<IpAddr> = addrs
                    .iter()
                    .copied()
                    .filter(|ip| chosen.binary_search(ip).is_ok())
                    .collect();
                self.address_answer(qname, &ips, qtype)
            }
        };
        Answer {
            per_client: self.varies_by_client(entry),
            ..answer
        }
    }

    /// Whether `entry`'s answers depend on the client asking.
    fn varies_by_client(&self, entry: &Entry) -> bool {
        entry.selective() && self.clients_node.is_none()
    }

    /// A/AAAA of `ips` at `qname`, as `qtype` asks; NODATA for other types.
    fn address_answer(&self, qname: &Name, ips: &[IpAddr], qtype: RecordType) -> Answer {
        let answers: Vec<Record> = ips
            .iter()
            .filter_map(|ip| match (ip, qtype) {
                (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => {
                    Some(self.record(qname, RData::A(A(*v4))))
                }
                (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => {
                    Some(self.record(qname, RData::AAAA(AAAA(*v6))))
                }
                _ => None,
            })
            .collect();
        if answers.is_empty() {
            return self.nodata();
        }
        Answer {
            answers,
            ..Answer::default()
        }
    }

    fn srv_answer(
        &self,
        qname: &Name,
        ns: &str,
        svc: &str,
        entry: &Entry,
        targets: &[SrvTarget],
        client: Option<IpAddr>,
    ) -> Answer {
        let service = self.service_name_of(ns, svc);
        let chosen = self.chosen_for(entry, client);
        let ips_of = |host: &Option<String>| match host {
            Some(h) => entry.host_ips(h),
            None => entry.addrs(),
        };
        // A headless service's endpoints chosen for the client's node only.
        let targets: Vec<&SrvTarget> = match &chosen {
            None => targets.iter().collect(),
            Some(chosen) => targets
                .iter()
                .filter(|(_, host)| {
                    host.is_some()
                        && ips_of(host)
                            .iter()
                            .any(|ip| chosen.binary_search(ip).is_ok())
                })
                .collect(),
        };
        let per_client = self.varies_by_client(entry);
        if targets.is_empty() {
            return Answer {
                per_client,
                ..self.nodata()
            };
        }
        // RFC 2782: equal priority, the weight shared out.
        let weight = u16::try_from((100 / targets.len()).max(1)).unwrap_or(1);
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        let mut added: BTreeSet<&str> = BTreeSet::new();
        for (port, host) in targets {
            let target = match host {
                Some(h) => prefixed(h, &service),
                None => service.clone(),
            };
            answers.push(self.record(
                qname,
                RData::SRV(SRV::new(0, weight, *port, target.clone())),
            ));
            if !added.insert(host.as_deref().unwrap_or("")) {
                continue;
            }
            additionals.extend(ips_of(host).iter().map(|ip| match ip {
                IpAddr::V4(v4) => self.record(&target, RData::A(A(*v4))),
                IpAddr::V6(v6) => self.record(&target, RData::AAAA(AAAA(*v6))),
            }));
        }
        Answer {
            answers,
            additionals,
            per_client,
            ..Answer::default()
        }
    }

    fn record(&self, name: &Name, rdata: RData) -> Record {
        Record::from_rdata(name.clone(), self.ttl, rdata)
    }

    fn soa(&self) -> Record {
        let soa = SOA::new(
            prefixed("ns", &prefixed("dns", &self.zone)),
            prefixed("hostmaster", &self.zone),
            self.serial,
            7200,
            1800,
            86400,
            self.ttl,
        );
        self.record(&self.zone, RData::SOA(soa))
    }

    fn nodata(&self) -> Answer {
        Answer {
            authority: vec![self.soa()],
            ..Answer::default()
        }
    }

    fn nxdomain(&self) -> Answer {
        Answer {
            code: ResponseCode::NXDomain,
            authority: vec![self.soa()],
            ..Answer::default()
        }
    }
}

/// A name made of checked labels; `name` is absolute (ends with `.`).
fn fqdn(name: &str) -> Name {
    Name::from_ascii(format!("{name}.")).expect("checked labels make a name")
}

/// `label.` + `parent` (`label` checked by the caller).
fn prefixed(label: &str, parent: &Name) -> Name {
    Name::from_ascii(label)
        .and_then(|l| l.append_domain(parent))
        .expect("checked labels make a name")
}

/// An address as a hostname label: `10-244-1-5`, `fd00-10--5`.
fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// The reverse of [`dashed`]: `10-244-1-5` → 10.244.1.5; IPv6 with ':' for '-'.
fn undashed(label: &str) -> Option<IpAddr> {
    if let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    label
        .replace('-', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

#[cfg(test)]
mod tests;
