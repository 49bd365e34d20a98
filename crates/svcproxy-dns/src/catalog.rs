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
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcproxy_core::convert::{self, ConvertOptions, Slice};
use svcproxy_core::model::{Endpoint, IpFamily, Labels, NodeInfo, ServicePort, LABEL_SERVICE_NAME};
use svcproxy_core::objects::{Kind, KubeObject, ObjectKey, SourceUpdate};
use svcproxy_core::selection::{select_endpoints, NodeContext};

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

/// A named port: SRV records exist for these only.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct NamedPort {
    name: String,
    /// `tcp`, `udp`, `sctp`.
    protocol: String,
    port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ServiceKind {
    ClusterIp(Vec<IpAddr>),
    Headless,
    ExternalName(Name),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ServiceSpec {
    kind: ServiceKind,
    ports: Vec<NamedPort>,
    publish_not_ready: bool,
    /// A headless service's port as the proxy's model has it (its topology keys,
    /// `trafficDistribution`, policies), for endpoint selection; `None` when the
    /// service has no port or the model refuses it (then nothing is filtered).
    selection: Option<ServicePort>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct EndpointSpec {
    ips: Vec<IpAddr>,
    hostname: Option<String>,
    ready: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct SliceSpec {
    service: String,
    endpoints: Vec<EndpointSpec>,
    ports: Vec<NamedPort>,
    /// The slice as the proxy's model has it (zones, nodes, hints, conditions),
    /// for endpoint selection.
    model: Option<Slice>,
}

/// What the DNS answers for one service, derived from its spec and its slices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct View {
    /// A/AAAA at the service's name: its cluster IPs, or a headless service's
    /// ready endpoints (those selection chose for the clients' node).
    addrs: Vec<IpAddr>,
    /// A headless service whose answers depend on the client's node (it has a
    /// port the proxy's model accepts, for endpoint selection).
    selective: bool,
    /// With every client on one node (`clients_node`): what selection chooses
    /// there, decided when the view is built rather than at every query.
    chosen_here: Option<BTreeSet<IpAddr>>,
    cname: Option<Name>,
    headless: bool,
    /// A headless service's endpoints by hostname.
    hosts: BTreeMap<String, Vec<IpAddr>>,
    /// `(port name, protocol)` → the SRV targets: port and hostname (`None`: the
    /// service's own name).
    srv: BTreeMap<(String, String), Vec<SrvTarget>>,
}

/// An SRV record's port and target hostname (`None`: the service's own name).
type SrvTarget = (u16, Option<String>);

type Key = (String, String);

/// Everything the DNS answers from, kept up to date by [`Catalog::apply`].
#[derive(Debug)]
pub struct Catalog {
    zone: Name,
    ttl: u32,
    /// Bumped at every change: the SOA's serial.
    serial: u32,
    /// Bumped at every change of a service, its slices or the Nodes (never
    /// wrapping): see [`Catalog::generation`].
    generation: u64,
    services: HashMap<Key, ServiceSpec>,
    /// By namespace and slice name.
    slices: HashMap<Key, SliceSpec>,
    /// By namespace and service name: the names of its slices.
    slices_of: HashMap<Key, BTreeSet<String>>,
    views: HashMap<Key, View>,
    /// Services per namespace (`<ns>.svc.<zone>` exists while it has one).
    namespaces: HashMap<String, usize>,
    ptr: HashMap<IpAddr, BTreeSet<Name>>,
    /// `DnsConfig::clients_node`.
    clients_node: Option<String>,
    /// Nodes by name: labels for endpoint selection, `podCIDRs` and addresses to
    /// place a client.
    nodes: HashMap<String, NodeInfo>,
    /// Pods by namespace and name: their IPs and node.
    pods: HashMap<Key, (Vec<IpAddr>, String)>,
    /// A pod IP's node.
    pod_nodes: HashMap<IpAddr, String>,
    /// Nodes by their `podCIDRs`: per prefix length, longest first, the networks.
    /// An IPv4 and an IPv6 network never compare equal, so one map holds both.
    node_cidrs: BTreeMap<std::cmp::Reverse<u8>, HashMap<IpAddr, String>>,
    /// Nodes by their own addresses (host-network clients).
    node_addresses: HashMap<IpAddr, String>,
    /// The sources' first complete list has been applied: until then the server
    /// answers SERVFAIL (retried, never cached) rather than NXDOMAIN (cached).
    ready: bool,
}

impl Catalog {
    /// An empty catalog for `cfg`'s zone; `Err` when the zone is not a domain name.
    pub fn new(cfg: &DnsConfig) -> Result<Self, String> {
        let zone = cfg.zone.trim_end_matches('.').to_ascii_lowercase();
        if zone.is_empty() || zone.len() > 200 || !zone.split('.').all(is_label) {
            return Err(format!(
                "--cluster-domain {:?}: not a domain name (lowercase labels of letters, digits and '-')",
                cfg.zone
            ));
        }
        Ok(Catalog {
            zone: fqdn(&zone),
            ttl: cfg.ttl,
            serial: 1,
            generation: 0,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            views: HashMap::new(),
            namespaces: HashMap::new(),
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
        self.services.len()
    }

    /// Takes one update from a source; returns the errors about the objects in it
    /// (each named). An object that cannot be read keeps its previous version, if
    /// any: nothing that answered is lost to a bad edit.
    pub fn apply(&mut self, update: &SourceUpdate) -> Vec<String> {
        let mut errors = Vec::new();
        match update {
            SourceUpdate::Upsert { object, origin } => {
                if let Err(e) = self.upsert(object) {
                    errors.push(format!("{} (from {origin}): {e}", object.key()));
                }
            }
            SourceUpdate::Delete(key) => self.delete(key),
            SourceUpdate::Replace { kinds, objects } => {
                let mut keep: BTreeSet<ObjectKey> = BTreeSet::new();
                for (object, origin) in objects {
                    keep.insert(object.key());
                    if let Err(e) = self.upsert(object) {
                        errors.push(format!("{} (from {origin}): {e}", object.key()));
                    }
                }
                let stale: Vec<ObjectKey> = self
                    .keys()
                    .filter(|k| kinds.contains(&k.kind) && !keep.contains(k))
                    .collect();
                for key in stale {
                    self.delete(&key);
                }
            }
            SourceUpdate::HostAddresses(_) | SourceUpdate::InputProblems(_) => {}
        }
        errors
    }

    fn keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        let services = self
            .services
            .keys()
            .map(|(ns, n)| ObjectKey::new(Kind::Service, ns, n));
        let slices = self
            .slices
            .keys()
            .map(|(ns, n)| ObjectKey::new(Kind::EndpointSlice, ns, n));
        let nodes = self.nodes.keys().map(|n| ObjectKey::new(Kind::Node, "", n));
        let pods = self
            .pods
            .keys()
            .map(|(ns, n)| ObjectKey::new(Kind::Pod, ns, n));
        services.chain(slices).chain(nodes).chain(pods)
    }

    fn upsert(&mut self, object: &KubeObject) -> Result<(), String> {
        let key = object.key();
        let id = (key.namespace.clone(), key.name.clone());
        match object {
            KubeObject::Service(svc) => {
                check_names(&key)?;
                let spec = service_spec(svc)?;
                if self.services.get(&id) == Some(&spec) {
                    return Ok(());
                }
                if self.services.insert(id.clone(), spec).is_none() {
                    *self.namespaces.entry(id.0.clone()).or_default() += 1;
                }
                self.refresh(&id);
            }
            KubeObject::EndpointSlice(slice) => {
                let spec = slice_spec(slice)?;
                if self.slices.get(&id) == Some(&spec) {
                    return Ok(());
                }
                let service = spec.service.clone();
                if let Some(old) = self.slices.insert(id.clone(), spec) {
                    if old.service != service {
                        self.unlink_slice(&id, &old.service);
                    }
                }
                let svc = (id.0.clone(), service);
                self.slices_of
                    .entry(svc.clone())
                    .or_default()
                    .insert(id.1.clone());
                self.refresh(&svc);
            }
            KubeObject::Node(node) => {
                let mut problems = Vec::new();
                let info = convert::convert_node(node, &mut problems)
                    .ok_or_else(|| "not a usable Node".to_string())?;
                let old = self.nodes.insert(info.name.clone(), info.clone());
                if old.as_ref().map(|o| &o.labels) != Some(&info.labels) {
                    self.nodes_changed();
                }
                if old.map(|o| (o.pod_cidrs, o.addresses)) != Some((info.pod_cidrs, info.addresses))
                {
                    self.index_nodes();
                }
            }
            KubeObject::Pod(pod) => {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty());
                let ips: Vec<IpAddr> = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ips.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|p| svcproxy_core::addr::parse_ip_sloppy(&p.ip))
                    .map(|p| p.value)
                    .collect();
                self.remove_pod(&id);
                // A pod not yet scheduled, or without an address, places nobody.
                if let Some(node) = node.filter(|_| !ips.is_empty()) {
                    for ip in &ips {
                        self.pod_nodes.insert(*ip, node.clone());
                    }
                    self.pods.insert(id, (ips, node));
                }
            }
            // ServiceCIDRs and legacy Endpoints say nothing DNS answers.
            _ => {}
        }
        Ok(())
    }

    /// Node labels changed: with every client on one node, the selections decided
    /// at build time are decided again.
    /// A Node's labels changed, or a Node went: the endpoints chosen for any node
    /// may differ now.
    fn nodes_changed(&mut self) {
        self.generation += 1;
        self.refresh_chosen_here();
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
        let mut nodes: Vec<&NodeInfo> = self.nodes.values().collect();
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

    fn refresh_chosen_here(&mut self) {
        // Before the first complete list (nobody is answered yet), once, at
        // `set_ready`, rather than once per Node of the list.
        if self.clients_node.is_none() || !self.ready {
            return;
        }
        let selective: Vec<Key> = self
            .views
            .iter()
            .filter(|(_, v)| v.selective)
            .map(|(k, _)| k.clone())
            .collect();
        for id in selective {
            self.refresh(&id);
        }
    }

    fn remove_pod(&mut self, id: &Key) {
        if let Some((ips, node)) = self.pods.remove(id) {
            for ip in ips {
                if self.pod_nodes.get(&ip) == Some(&node) {
                    self.pod_nodes.remove(&ip);
                }
            }
        }
    }

    fn delete(&mut self, key: &ObjectKey) {
        let id = (key.namespace.clone(), key.name.clone());
        match key.kind {
            Kind::Service if self.services.remove(&id).is_some() => {
                if let Some(n) = self.namespaces.get_mut(&id.0) {
                    *n -= 1;
                    if *n == 0 {
                        self.namespaces.remove(&id.0);
                    }
                }
                self.refresh(&id);
            }
            Kind::EndpointSlice => {
                if let Some(old) = self.slices.remove(&id) {
                    self.unlink_slice(&id, &old.service);
                }
            }
            Kind::Node if self.nodes.remove(&key.name).is_some() => {
                self.nodes_changed();
                self.index_nodes();
            }
            Kind::Pod => self.remove_pod(&id),
            _ => {}
        }
    }

    /// Forgets that slice `id` belonged to `service`, and refreshes that service.
    fn unlink_slice(&mut self, id: &Key, service: &str) {
        let svc = (id.0.clone(), service.to_string());
        if let Some(set) = self.slices_of.get_mut(&svc) {
            set.remove(&id.1);
            if set.is_empty() {
                self.slices_of.remove(&svc);
            }
        }
        self.refresh(&svc);
    }

    /// Rebuilds service `id`'s view and its PTR records.
    fn refresh(&mut self, id: &Key) {
        // Whether or not the view changes: what endpoint selection chooses for a
        // client's node may (a zone or a hint changed, not an address).
        self.generation += 1;
        let new = self.services.get(id).map(|spec| self.build_view(id, spec));
        let old = match &new {
            Some(v) => self.views.insert(id.clone(), v.clone()),
            None => self.views.remove(id),
        };
        if old == new {
            return;
        }
        self.serial = self.serial.wrapping_add(1).max(1);
        if let Some(old) = old {
            for (ip, name) in self.ptrs(id, &old) {
                if let Some(set) = self.ptr.get_mut(&ip) {
                    set.remove(&name);
                    if set.is_empty() {
                        self.ptr.remove(&ip);
                    }
                }
            }
        }
        if let Some(new) = new {
            for (ip, name) in self.ptrs(id, &new) {
                self.ptr.entry(ip).or_default().insert(name);
            }
        }
    }

    fn build_view(&self, id: &Key, spec: &ServiceSpec) -> View {
        let mut view = View::default();
        match &spec.kind {
            ServiceKind::ExternalName(target) => view.cname = Some(target.clone()),
            ServiceKind::ClusterIp(ips) => {
                view.addrs = ips.clone();
                for p in &spec.ports {
                    view.srv
                        .entry((p.name.clone(), p.protocol.clone()))
                        .or_default()
                        .push((p.port, None));
                }
            }
            ServiceKind::Headless => {
                view.headless = true;
                view.selective = spec.selection.is_some();
                if view.selective {
                    if let Some(node) = &self.clients_node {
                        view.chosen_here = self.chosen(id, spec, node);
                    }
                }
                let slices = self.slices_of.get(id).into_iter().flatten();
                for slice in slices.filter_map(|n| self.slices.get(&(id.0.clone(), n.clone()))) {
                    for ep in &slice.endpoints {
                        if !(ep.ready || spec.publish_not_ready) {
                            continue;
                        }
                        for ip in &ep.ips {
                            let host = ep.hostname.clone().unwrap_or_else(|| dashed(*ip));
                            let ips = view.hosts.entry(host.clone()).or_default();
                            if !ips.contains(ip) {
                                ips.push(*ip);
                            }
                            if !view.addrs.contains(ip) {
                                view.addrs.push(*ip);
                            }
                            for p in &slice.ports {
                                let targets = view
                                    .srv
                                    .entry((p.name.clone(), p.protocol.clone()))
                                    .or_default();
                                let target = (p.port, Some(host.clone()));
                                if !targets.contains(&target) {
                                    targets.push(target);
                                }
                            }
                        }
                    }
                }
                view.addrs.sort();
                for targets in view.srv.values_mut() {
                    targets.sort();
                }
            }
        }
        view
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

    /// The addresses endpoint selection chooses for `node` among service `id`'s
    /// endpoints: the proxy's own function, on the proxy's own model of the service
    /// and its slices, per family. `None`: the service has no port the model
    /// accepts (nothing is filtered).
    fn chosen(&self, id: &Key, spec: &ServiceSpec, node: &str) -> Option<BTreeSet<IpAddr>> {
        let port = spec.selection.as_ref()?;
        let no_labels = Labels::new();
        let node_labels = |n: &str| self.nodes.get(n).map(|i| &i.labels);
        let ctx = NodeContext {
            node_name: node,
            labels: self.nodes.get(node).map_or(&no_labels, |i| &i.labels),
            node_labels: &node_labels,
        };
        let slices: Vec<&Slice> = self
            .slices_of
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|n| self.slices.get(&(id.0.clone(), n.clone())))
            .filter_map(|s| s.model.as_ref())
            .collect();
        let mut chosen = BTreeSet::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let mut endpoints: Vec<Endpoint> = slices
                .iter()
                .filter(|s| s.family == family)
                .flat_map(|s| {
                    let port = s.ports.first().map_or(0, |p| p.port);
                    s.endpoints.iter().map(move |e| {
                        let mut info = e.info.clone();
                        if spec.publish_not_ready && !info.ready {
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
        Some(chosen)
    }

    /// The PTR records a view makes: cluster IPs to the service's name, headless
    /// endpoints to their hostname's.
    fn ptrs(&self, id: &Key, view: &View) -> Vec<(IpAddr, Name)> {
        let service = self.service_name(id);
        if view.headless {
            view.hosts
                .iter()
                .flat_map(|(host, ips)| {
                    let name = prefixed(host, &service);
                    ips.iter().map(move |ip| (*ip, name.clone()))
                })
                .collect()
        } else {
            view.addrs.iter().map(|ip| (*ip, service.clone())).collect()
        }
    }

    /// `<service>.<ns>.svc.<zone>.`
    fn service_name(&self, (ns, name): &Key) -> Name {
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
        let names = self.ptr.get(&ip.addr())?;
        if !matches!(qtype, RecordType::PTR | RecordType::ANY) {
            return Some(Answer::default());
        }
        Some(Answer {
            answers: names
                .iter()
                .map(|n| self.record(qname, RData::PTR(PTR(n.clone()))))
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
            ["svc", ns] if self.namespaces.contains_key(*ns) => self.nodata(),
            ["svc", ns, svc] => {
                let id = (ns.to_string(), svc.to_string());
                match self.views.get(&id) {
                    None => self.nxdomain(),
                    Some(view) => self.service_answer(qname, &id, view, qtype, client),
                }
            }
            ["svc", ns, svc, proto] if proto.starts_with('_') => {
                match self.views.get(&(ns.to_string(), svc.to_string())) {
                    Some(view) if view.srv.keys().any(|(_, p)| *p == proto[1..]) => self.nodata(),
                    _ => self.nxdomain(),
                }
            }
            ["svc", ns, svc, host] => match self
                .views
                .get(&(ns.to_string(), svc.to_string()))
                .and_then(|v| v.hosts.get(*host))
            {
                None => self.nxdomain(),
                Some(ips) => self.address_answer(qname, ips, qtype),
            },
            ["svc", ns, svc, proto, port] if proto.starts_with('_') && port.starts_with('_') => {
                let id = (ns.to_string(), svc.to_string());
                let targets = self
                    .views
                    .get(&id)
                    .and_then(|v| v.srv.get(&(port[1..].to_string(), proto[1..].to_string())));
                match targets {
                    None => self.nxdomain(),
                    Some(_) if !matches!(qtype, RecordType::SRV | RecordType::ANY) => self.nodata(),
                    Some(targets) => self.srv_answer(qname, &id, targets, client),
                }
            }
            ["pod", _, ip] => match undashed(ip) {
                None => self.nxdomain(),
                Some(ip) => self.address_answer(qname, &[ip], qtype),
            },
            _ => self.nxdomain(),
        }
    }

    /// The addresses endpoint selection chose for `client`'s node, when `view`'s
    /// answers depend on it and the node is known; `None`: every one.
    fn chosen_for<'a>(
        &self,
        id: &Key,
        view: &'a View,
        client: Option<IpAddr>,
    ) -> Option<std::borrow::Cow<'a, BTreeSet<IpAddr>>> {
        if !view.selective {
            return None;
        }
        if self.clients_node.is_some() {
            return view.chosen_here.as_ref().map(std::borrow::Cow::Borrowed);
        }
        let spec = self.services.get(id)?;
        self.chosen(id, spec, self.client_node(client)?)
            .map(std::borrow::Cow::Owned)
    }

    fn service_answer(
        &self,
        qname: &Name,
        id: &Key,
        view: &View,
        qtype: RecordType,
        client: Option<IpAddr>,
    ) -> Answer {
        if let Some(target) = &view.cname {
            // Whatever the type: the resolver follows the alias.
            return Answer {
                answers: vec![self.record(qname, RData::CNAME(CNAME(target.clone())))],
                ..Answer::default()
            };
        }
        if view.headless && view.addrs.is_empty() {
            // The specification: a headless service without ready endpoints. With
            // some, but none chosen for the client's node: NODATA, below.
            return self.nxdomain();
        }
        let answer = match self.chosen_for(id, view, client) {
            None => self.address_answer(qname, &view.addrs, qtype),
            Some(chosen) => {
                let ips: Vec<IpAddr> = view
                    .addrs
                    .iter()
                    .copied()
                    .filter(|ip| chosen.contains(ip))
                    .collect();
                self.address_answer(qname, &ips, qtype)
            }
        };
        Answer {
            per_client: self.varies_by_client(view),
            ..answer
        }
    }

    /// Whether `view`'s answers depend on the client asking.
    fn varies_by_client(&self, view: &View) -> bool {
        view.selective && self.clients_node.is_none()
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
        id: &Key,
        targets: &[SrvTarget],
        client: Option<IpAddr>,
    ) -> Answer {
        let service = self.service_name(id);
        let view = &self.views[id];
        // A headless service's endpoints chosen for the client's node only.
        let targets: Vec<&SrvTarget> = match self.chosen_for(id, view, client) {
            None => targets.iter().collect(),
            Some(chosen) => targets
                .iter()
                .filter(|(_, host)| {
                    host.as_ref()
                        .and_then(|h| view.hosts.get(h))
                        .is_some_and(|ips| ips.iter().any(|ip| chosen.contains(ip)))
                })
                .collect(),
        };
        let per_client = self.varies_by_client(view);
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
        for &(port, host) in &targets {
            let target = match host {
                Some(h) => prefixed(h, &service),
                None => service.clone(),
            };
            answers.push(self.record(
                qname,
                RData::SRV(SRV::new(0, weight, *port, target.clone())),
            ));
            let key = host.as_deref().unwrap_or("");
            if !added.insert(key) {
                continue;
            }
            let ips = match host {
                Some(h) => view.hosts.get(h).map(Vec::as_slice).unwrap_or_default(),
                None => view.addrs.as_slice(),
            };
            additionals.extend(ips.iter().map(|ip| match ip {
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

/// A DNS label as Kubernetes names are (RFC 1123): 1 to 63 lowercase letters,
/// digits and '-', not starting or ending with '-'.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A port name as Kubernetes allows (IANA_SVC_NAME): a label of at most 15
/// characters with a letter, no `--`.
fn is_port_name(s: &str) -> bool {
    is_label(s) && s.len() <= 15 && s.bytes().any(|b| b.is_ascii_lowercase()) && !s.contains("--")
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

fn check_names(key: &ObjectKey) -> Result<(), String> {
    for (what, v) in [("namespace", &key.namespace), ("name", &key.name)] {
        if !is_label(v) {
            return Err(format!(
                "its {what} is not a DNS label (1 to 63 lowercase letters, digits and '-'): no records"
            ));
        }
    }
    Ok(())
}

fn protocol(p: Option<&str>) -> Result<String, String> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok("tcp".into()),
        "UDP" => Ok("udp".into()),
        "SCTP" => Ok("sctp".into()),
        other => Err(format!("unknown protocol {other:?}")),
    }
}

fn service_spec(svc: &Service) -> Result<ServiceSpec, String> {
    let spec = svc.spec.as_ref().ok_or("no spec")?;
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let target = spec
            .external_name
            .as_deref()
            .ok_or("type ExternalName without externalName")?
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if target.is_empty() || target.len() > 253 || !target.split('.').all(is_label) {
            return Err(format!(
                "externalName {target:?} is not a domain name: no CNAME record"
            ));
        }
        ServiceKind::ExternalName(fqdn(&target))
    } else {
        let ips: Vec<&String> = match (&spec.cluster_ips, &spec.cluster_ip) {
            (Some(ips), _) if !ips.is_empty() => ips.iter().collect(),
            (_, Some(ip)) => vec![ip],
            _ => Vec::new(),
        };
        if ips.first().is_some_and(|ip| ip.as_str() == "None") {
            ServiceKind::Headless
        } else {
            let mut parsed = Vec::new();
            for ip in ips.iter().filter(|ip| !ip.is_empty()) {
                let p = svcproxy_core::addr::parse_ip_sloppy(ip)
                    .ok_or_else(|| format!("cluster IP {ip:?} is not an IP address"))?;
                if !parsed.contains(&p.value) {
                    parsed.push(p.value);
                }
            }
            ServiceKind::ClusterIp(parsed)
        }
    };
    let mut ports = Vec::new();
    for p in spec.ports.iter().flatten() {
        let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        if !is_port_name(name) {
            return Err(format!("port name {name:?} is not a valid port name"));
        }
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {name}: {} is not a port number", p.port))?;
        ports.push(NamedPort {
            name: name.to_string(),
            protocol: protocol(p.protocol.as_deref())?,
            port,
        });
    }
    let selection = match kind {
        ServiceKind::Headless => {
            let opts = ConvertOptions {
                for_dns: true,
                ..ConvertOptions::default()
            };
            convert::convert_service(svc, &opts, &mut Vec::new())
                .and_then(|s| s.ports.first().map(|p| (**p).clone()))
        }
        _ => None,
    };
    Ok(ServiceSpec {
        kind,
        ports,
        publish_not_ready: spec.publish_not_ready_addresses == Some(true),
        selection,
    })
}

fn slice_spec(slice: &EndpointSlice) -> Result<SliceSpec, String> {
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .ok_or_else(|| format!("no {LABEL_SERVICE_NAME} label"))?;
    if !is_label(service) {
        return Err(format!(
            "its {LABEL_SERVICE_NAME} label {service:?} is not a service name"
        ));
    }
    let family = match slice.address_type.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        // FQDN slices name no address DNS could answer with.
        _ => None,
    };
    let mut endpoints = Vec::new();
    for ep in slice
        .endpoints
        .iter()
        .flatten()
        .filter(|_| family.is_some())
    {
        let mut ips = Vec::new();
        for a in &ep.addresses {
            let ip = svcproxy_core::addr::parse_ip_sloppy(a)
                .ok_or_else(|| format!("endpoint address {a:?} is not an IP address"))?
                .value;
            if Some(ip.is_ipv6()) != family {
                return Err(format!(
                    "endpoint address {a:?} is not of the slice's addressType"
                ));
            }
            ips.push(ip);
        }
        let hostname = match ep.hostname.as_deref() {
            Some(h) if !is_label(h) => {
                return Err(format!("endpoint hostname {h:?} is not a DNS label"));
            }
            h => h.map(String::from),
        };
        let conditions = ep.conditions.as_ref();
        endpoints.push(EndpointSpec {
            ips,
            hostname,
            // Unset means ready (the API's documented default).
            ready: conditions.and_then(|c| c.ready).unwrap_or(true),
        });
    }
    let mut ports = Vec::new();
    for p in slice.ports.iter().flatten() {
        let (Some(name), Some(port)) = (p.name.as_deref().filter(|n| !n.is_empty()), p.port) else {
            continue;
        };
        if !is_port_name(name) {
            return Err(format!("port name {name:?} is not a valid port name"));
        }
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {name}: {port} is not a port number"))?;
        ports.push(NamedPort {
            name: name.to_string(),
            protocol: protocol(p.protocol.as_deref())?,
            port,
        });
    }
    let opts = ConvertOptions {
        for_dns: true,
        ..ConvertOptions::default()
    };
    Ok(SliceSpec {
        service: service.clone(),
        endpoints,
        ports,
        model: convert::convert_slice_with(slice, &opts, &mut Vec::new()),
    })
}

#[cfg(test)]
mod tests;
