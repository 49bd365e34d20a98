//! One service port's nftables objects, translated from its [`ServiceIntent`]:
//! chains, affinity sets, and the elements its frontends put in the shared maps.
//!
//! Entry point: [`Fragment::new`]. A fragment holds the intent and the hashed
//! names of its objects (computed once), and prints its chains on demand
//! ([`Fragment::objects`]), which keeps the planner's cache small at hundreds of
//! thousands of endpoints. Nothing here decides: which set, drop or reject, what
//! is masqueraded come from the intent.
//!
//! A cluster IP port that needs no more than the choice of endpoint and its
//! masquerade ([`cluster_layout`]: no external route, no affinity, no capture)
//! has none of these objects: its frontends are elements of the skeleton's
//! cluster IP sets and map ([`cluster_elems`], see `base::clusterip_set`), so
//! linking, moving or unlinking it adds no `goto` the kernel validates
//! table-wide.
//!
//! What each object does (upstream nftables mode, adapted):
//! - `service-H`: the cluster set: masquerade mark for cluster-IP traffic that
//!   needs it, then the choice of endpoint. Without affinity that is one rule,
//!   whatever the endpoint count: `dnat to numgen random mod N offset B map
//!   @endpoint-dnat-PROTO-SS`, the set's endpoints being that map's elements
//!   `B..B+N` (the planner hands out `B`, see [`Fragment::dispatch_sizes`]; the
//!   map, one of 256 per protocol, is chosen by the port's hash). With affinity:
//!   the affinity lookups, then a `numgen random` cascade to the endpoint chains.
//! - `local-H`: the same over the local set.
//! - `external-H`: the external route: masquerade, or the short circuits for pods
//!   and the host, then the set for the rest.
//! - `firewall-H`: loadBalancerSourceRanges.
//! - `endpoint-E`: affinity update, DNAT; only for the endpoints of a service
//!   with affinity (the state is per endpoint). Every other endpoint is an element
//!   of an endpoint map: a chain per endpoint is what makes the table large (the
//!   kernel validates every reachable chain at each commit, and `nft` lists them
//!   all for its cache).
//! - `affinity-E`: the endpoint's client set (ClientIP affinity), with a timeout.
//!
//! The hairpin masquerade is not per endpoint either: each endpoint that may be
//! this node's own ([`ServiceIntent::hairpin`]) puts `A . A` in the shared
//! `hairpin-endpoints` set ([`Fragment::hairpin_ips`]), which one rule of the
//! skeleton checks after DNAT.
//!
//! With a [`CapturePorts`] (the userspace mode), a set chain redirects the
//! connection to the proxy's own listener for that set instead: no masquerade
//! mark, no affinity set, no endpoint chain (the proxy chooses the endpoint).
//! Every other object is the same, so drops, rejects, the firewall and the short
//! circuits are decided and enforced exactly as in the nftables mode. A capture
//! that is [`CapturePorts::loopback_only`] (the nftables mode's localhost
//! NodePorts) redirects only connections to loopback, ahead of the set chain's
//! own rules, which serve everything else as usual.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use std::sync::Arc;

use svcproxy_core::model::Protocol;

use crate::intent::{
    Action, Disposition, EndpointSetId, ExternalRoute, Firewall, FrontendKey, FrontendKind,
    LocalTraffic, Masquerade, NodeIntent, ServiceIntent,
};
use crate::names::{
    protocol_keyword, service_port_comment, service_port_hash, EndpointHasher, ObjName, Prefix,
};

use super::base::endpoint_map;
use super::base::{
    clusterip_dnat_map, clusterip_set, localhost_reject_chain, loopback,
    CLUSTERIP_MASQ_NONLOCAL_SET, CLUSTERIP_MASQ_SET,
};
pub(crate) use super::common::{MapId, MARK_MASQ_CHAIN, POD_CIDRS_SET, REJECT_CHAIN};
use super::elements::{Atom, ElemVerdict};
use super::ruleset::{Chain, Field, Ruleset, Set};
use super::slots::Run;
use super::typed::{Action as RuleAction, Addr, Match, TypedRule};

/// Where the userspace mode's capture sends each endpoint set's connections: a
/// port of the proxy's own sockets on this node (`redirect to :PORT`).
pub trait CapturePorts: Send + Sync {
    /// The local port serving `set` of `svc`; `None` when the proxy does not serve
    /// it (SCTP), and then no rule captures it.
    fn port(&self, svc: &ServiceIntent, set: EndpointSetId) -> Option<u16>;

    /// Only connections to loopback (localhost NodePorts) are captured; the set
    /// chains DNAT the rest to the endpoints themselves.
    fn loopback_only(&self) -> bool {
        false
    }
}

/// How this node's pods are recognised in one family, as rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Detect {
    pub if_local: Match,
    pub if_not_local: Match,
}

impl Detect {
    pub fn new(node: &NodeIntent) -> Option<Detect> {
        let traffic = node.local_traffic.as_ref()?;
        let by = |negate: bool| -> Match {
            match traffic {
                // Several CIDRs live in one named set of the skeleton: an
                // anonymous set per rule would cost the kernel a scan of every
                // set per loop check.
                LocalTraffic::Cidrs(nets) if nets.len() == 1 => Match::Prefix {
                    addr: Addr::Saddr,
                    net: nets[0],
                    negate,
                },
                LocalTraffic::Cidrs(_) => Match::InSet {
                    addr: Addr::Saddr,
                    set: POD_CIDRS_SET.to_string(),
                    negate,
                },
                // InterfaceName admits only [A-Za-z0-9_.-], so quoting it is safe.
                LocalTraffic::Interface(name) => Match::Iifname {
                    name: name.to_string(),
                    negate,
                },
                LocalTraffic::InterfacePrefix(prefix) => Match::Iifname {
                    name: format!("{prefix}*"),
                    negate,
                },
            }
        };
        Some(Detect {
            if_local: by(false),
            if_not_local: by(true),
        })
    }
}

/// A frontend's element key in its map.
pub(crate) fn key_text(key: &FrontendKey) -> String {
    match key {
        FrontendKey::Vip { ip, protocol, port } => {
            format!("{ip} . {} . {port}", protocol_keyword(*protocol))
        }
        FrontendKey::NodePort { protocol, port } => {
            format!("{} . {port}", protocol_keyword(*protocol))
        }
    }
}

/// A frontend's element key in its map, typed.
pub(crate) fn key_atoms(key: &FrontendKey) -> Vec<Atom> {
    match key {
        FrontendKey::Vip { ip, protocol, port } => {
            vec![Atom::Ip(*ip), Atom::Proto(*protocol), Atom::Port(*port)]
        }
        FrontendKey::NodePort { protocol, port } => vec![Atom::Proto(*protocol), Atom::Port(*port)],
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Goto(ObjName),
    Drop,
    Reject,
    /// To the protocol's counting reject chain of localhost NodePorts.
    LocalhostReject(Protocol),
}

impl Verdict {
    pub fn text(&self) -> String {
        match self {
            Verdict::Goto(name) => format!("goto {name}"),
            Verdict::Drop => "drop".to_string(),
            Verdict::Reject => format!("goto {REJECT_CHAIN}"),
            Verdict::LocalhostReject(p) => format!("goto {}", localhost_reject_chain(*p)),
        }
    }

    pub fn elem(&self) -> ElemVerdict {
        match self {
            Verdict::Goto(name) => ElemVerdict::Goto(name.to_string()),
            Verdict::Drop => ElemVerdict::Drop,
            Verdict::Reject => ElemVerdict::Goto(REJECT_CHAIN.to_string()),
            Verdict::LocalhostReject(p) => ElemVerdict::Goto(localhost_reject_chain(*p)),
        }
    }
}

/// The endpoint count of a service port served without a chain of its own
/// (see the module), `None` when it needs its chains: it has an external route,
/// a firewall or session affinity, its internal set has no endpoint, or a
/// userspace capture takes its connections (`chainless`: the planner has no
/// such capture).
pub(crate) fn cluster_layout(svc: &ServiceIntent, chainless: bool) -> Option<u32> {
    let plain = chainless
        && svc.external.is_none()
        && svc.firewall.is_none()
        && svc.affinity_timeout.is_none()
        && svc
            .frontends
            .iter()
            .all(|f| f.kind == FrontendKind::ClusterIp);
    let n = svc.set_len(svc.internal.set);
    (plain && n > 0).then_some(n as u32)
}

/// An element of a set or data map of the skeleton.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DataElem {
    pub set: String,
    pub key: Vec<Atom>,
    pub value: Option<Vec<Atom>>,
}

/// What a frontend served without a chain puts in the skeleton's cluster IP
/// sets ([`cluster_layout`]; nothing for any other frontend): its destination in
/// the set of its endpoint count and, when masqueraded, in a masquerade set
/// (`links`, which make it live), and its endpoints in its protocol's map
/// (`dnats`: `VIP . PROTO . PORT . k` for the k-th endpoint).
pub(crate) fn cluster_elems(
    svc: &ServiceIntent,
    key: &FrontendKey,
    chainless: bool,
    links: &mut dyn FnMut(DataElem),
    dnats: &mut dyn FnMut(DataElem),
) {
    let Some(n) = cluster_layout(svc, chainless) else {
        return;
    };
    let Some(f) = svc.frontend(key) else {
        return;
    };
    if f.action != Action::Forward || f.kind != FrontendKind::ClusterIp {
        return;
    }
    let atoms = key_atoms(key);
    links(DataElem {
        set: clusterip_set(svc.protocol, n),
        key: atoms.clone(),
        value: None,
    });
    let masq = match svc.internal.masquerade {
        Masquerade::Always => Some(CLUSTERIP_MASQ_SET),
        Masquerade::UnlessFromLocalPod => Some(CLUSTERIP_MASQ_NONLOCAL_SET),
        Masquerade::Never => None,
    };
    if let Some(set) = masq {
        links(DataElem {
            set: set.to_string(),
            key: atoms.clone(),
            value: None,
        });
    }
    let map = clusterip_dnat_map(svc.protocol);
    let eps = &svc.endpoints;
    for (k, i) in eps.members(svc.internal.set).enumerate() {
        let mut key = atoms.clone();
        key.push(Atom::Num(k as u32));
        let ep = eps.get(i as usize);
        dnats(DataElem {
            set: map.clone(),
            key,
            value: Some(vec![Atom::Ip(ep.ip()), Atom::Port(ep.port())]),
        });
    }
}

/// One element a claim puts in one map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Elem {
    pub map: MapId,
    pub verdict: Verdict,
}

/// The elements the frontend at `key` of `svc` puts in the shared verdict maps
/// (`hash`: the port's [`service_port_hash`]; `localhost_rejects`: the node's
/// [`NodeIntent::localhost_rejects`](crate::intent::NodeIntent::localhost_rejects);
/// `chainless`: see [`cluster_layout`], whose frontends are in no verdict map).
pub(crate) fn elems(
    svc: &ServiceIntent,
    hash: u64,
    key: &FrontendKey,
    localhost_rejects: &[Protocol],
    chainless: bool,
) -> Vec<Elem> {
    let Some(f) = svc.frontend(key) else {
        return Vec::new();
    };
    let name_of = |prefix| Verdict::Goto(ObjName::new(prefix, hash));
    let refuse = |action| match action {
        Action::Drop => Verdict::Drop,
        _ => Verdict::Reject,
    };
    let (map_ok, map_fail) = match f.kind {
        FrontendKind::NodePort => (MapId::ServiceNodePorts, MapId::NoEndpointNodePorts),
        _ => (MapId::ServiceIps, MapId::NoEndpointServices),
    };
    let mut out = Vec::new();
    match (f.action, f.kind.is_external()) {
        (Action::Forward, false) if cluster_layout(svc, chainless).is_some() => {}
        (Action::Forward, false) => out.push(Elem {
            map: map_ok,
            verdict: name_of(set_prefix(svc.internal.set)),
        }),
        (Action::Forward, true) => {
            out.push(Elem {
                map: map_ok,
                verdict: name_of(Prefix::External),
            });
            // What the external chain's short circuits do not take is refused in
            // the filter chains, after DNAT, where it still has this destination.
            if svc.external.is_some_and(|r| r.rest == Disposition::Drop) {
                out.push(Elem {
                    map: map_fail,
                    verdict: Verdict::Drop,
                });
            }
        }
        (action, _) => out.push(Elem {
            map: map_fail,
            verdict: refuse(action),
        }),
    }
    if f.firewall {
        out.push(Elem {
            map: MapId::FirewallIps,
            verdict: name_of(Prefix::Firewall),
        });
    }
    if f.kind == FrontendKind::NodePort && localhost_rejects.contains(&svc.protocol) {
        out.push(Elem {
            map: MapId::LocalhostNodePortRejects,
            verdict: Verdict::LocalhostReject(svc.protocol),
        });
    }
    out
}

fn set_prefix(set: EndpointSetId) -> Prefix {
    match set {
        EndpointSetId::Cluster => Prefix::Service,
        EndpointSetId::Local => Prefix::Local,
    }
}

/// The hashed names of one endpoint's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EpNames {
    chain: u64,
    affinity: u64,
}

/// One service port's nftables objects: its intent and their names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fragment {
    pub intent: Arc<ServiceIntent>,
    pub hash: u64,
    /// Per endpoint of the intent, the names of its own objects (see the
    /// module's `endpoint-E`): only with affinity, and not under a full userspace
    /// capture; empty otherwise.
    endpoints: Vec<EpNames>,
    /// Per set (cluster, local), the first key of its endpoints in the shared
    /// `endpoint-dnat-*` maps, once the planner gave it one ([`Fragment::dispatch_sizes`]).
    pub blocks: [Option<Run>; 2],
    /// Userspace capture: the port of each set (cluster, local), resolved once.
    capture: Option<[Option<u16>; 2]>,
    /// The capture takes only connections to loopback.
    capture_loopback_only: bool,
    /// Served without a chain of its own: its endpoint count ([`cluster_layout`]).
    pub chainless: Option<u32>,
}

fn set_slot(set: EndpointSetId) -> usize {
    match set {
        EndpointSetId::Cluster => 0,
        EndpointSetId::Local => 1,
    }
}

impl Fragment {
    /// `capture`: the userspace mode's ports, asked once per set here.
    pub fn new(intent: Arc<ServiceIntent>, capture_ports: Option<&dyn CapturePorts>) -> Fragment {
        let family = intent.family;
        let hash = service_port_hash(family, &intent.name);
        let capture = capture_ports.map(|c| {
            [EndpointSetId::Cluster, EndpointSetId::Local]
                .map(|set| intent.set_indices(set).and_then(|_| c.port(&intent, set)))
        });
        let capture_loopback_only = capture_ports.is_some_and(|c| c.loopback_only());
        let chainless = cluster_layout(&intent, capture.is_none() || capture_loopback_only);
        let hasher = EndpointHasher::new(family, &intent.name);
        // Affinity is the only per-endpoint state (the hairpin is one shared
        // rule, see the module); the userspace capture has no per-endpoint object.
        let endpoints = match intent.affinity_timeout {
            _ if chainless.is_some() => Vec::new(),
            Some(t) if capture.is_none() || capture_loopback_only => intent
                .endpoints
                .iter()
                .map(|ep| EpNames {
                    chain: hasher.endpoint(ep.ip(), ep.port()),
                    affinity: hasher.affinity(ep.ip(), ep.port(), t),
                })
                .collect(),
            _ => Vec::new(),
        };
        Fragment {
            intent,
            hash,
            endpoints,
            blocks: [None, None],
            capture,
            capture_loopback_only,
            chainless,
        }
    }

    /// Per set (cluster, local), how many keys of the shared `endpoint-dnat-*` maps
    /// its dispatch needs: its endpoint count, or 0 when it chooses otherwise
    /// (affinity, a userspace capture, a single endpoint DNATed directly).
    pub fn dispatch_sizes(&self) -> [usize; 2] {
        let full_capture = self.capture.is_some() && !self.capture_loopback_only;
        if full_capture || self.intent.affinity_timeout.is_some() || self.chainless.is_some() {
            return [0, 0];
        }
        [EndpointSetId::Cluster, EndpointSetId::Local].map(|set| match self.intent.set_len(set) {
            n if n > 1 => n,
            _ => 0,
        })
    }

    /// The endpoint map its sets use (see [`Fragment::dispatch_sizes`]).
    pub fn endpoint_map(&self) -> String {
        endpoint_map(self.intent.protocol, self.hash)
    }

    /// Whether a set of it uses its endpoint map.
    pub fn uses_endpoint_map(&self) -> bool {
        self.blocks.iter().any(Option::is_some)
    }

    /// The fragment's elements of its endpoint map: key, and the
    /// endpoint as `address . port`.
    pub fn dnat_elements(&self, mut f: impl FnMut(u32, &SocketAddr)) {
        let eps = &self.intent.endpoints;
        for set in [EndpointSetId::Cluster, EndpointSetId::Local] {
            let Some(run) = self.blocks[set_slot(set)] else {
                continue;
            };
            // A set with a block has members (its size was their count).
            for (k, i) in eps.members(set).enumerate() {
                f(run.first + k as u32, &eps.get(i as usize));
            }
        }
    }

    /// The endpoint addresses whose `A . A` this fragment puts in the shared
    /// `hairpin-endpoints` set (none under a full userspace capture, where the
    /// proxy itself connects to the endpoints).
    pub fn hairpin_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let full_capture = self.capture.is_some() && !self.capture_loopback_only;
        let svc = &*self.intent;
        let eps = &svc.endpoints;
        (0..eps.len())
            .filter(move |&i| !full_capture && eps.hairpin(i))
            .map(|i| eps.get(i).ip())
    }

    fn name(&self, prefix: Prefix) -> ObjName {
        ObjName::new(prefix, self.hash)
    }

    /// The fragment's chains and sets (no map elements: those are shared and
    /// resolved by the planner). `detect` is the family's [`Detect`].
    pub fn objects(&self, detect: Option<&Detect>) -> Ruleset {
        let svc = &*self.intent;
        let mut rs = Ruleset::new(svc.family);
        if self.chainless.is_some() {
            return rs;
        }
        for set in [EndpointSetId::Cluster, EndpointSetId::Local] {
            if let Some(list) = svc.set_indices(set) {
                rs.chains.insert(
                    self.name(set_prefix(set)).to_string(),
                    self.set_chain(set, &list, detect),
                );
            }
        }
        if let Some(ext) = &svc.external {
            rs.chains.insert(
                self.name(Prefix::External).to_string(),
                self.external_chain(ext, detect),
            );
        }
        if let Some(fw) = &svc.firewall {
            rs.chains.insert(
                self.name(Prefix::Firewall).to_string(),
                self.firewall_chain(fw),
            );
        }
        self.endpoint_objects(&mut rs);
        rs
    }

    /// A rule of the fragment's family.
    fn rule(&self, matches: Vec<Match>, action: RuleAction) -> TypedRule {
        TypedRule::new(self.intent.family, matches, action)
    }

    /// A regular chain of the fragment, commented with its service port.
    fn chain(&self, rules: Vec<TypedRule>) -> Chain {
        Chain {
            base: None,
            comment: Some(service_port_comment(&self.intent.name)),
            rules,
        }
    }

    /// The match on the service port's protocol.
    fn l4proto(&self) -> Vec<Match> {
        vec![Match::L4Proto(self.intent.protocol)]
    }

    /// Where the choice of endpoint `i` goes, after `matches`: its chain, or
    /// straight to it.
    fn to_endpoint(&self, i: u32, mut matches: Vec<Match>) -> TypedRule {
        let svc = &*self.intent;
        match self.endpoints.get(i as usize) {
            Some(names) => self.rule(
                matches,
                RuleAction::Goto(ObjName::new(Prefix::Endpoint, names.chain).to_string()),
            ),
            None => {
                matches.push(Match::L4Proto(svc.protocol));
                self.rule(matches, RuleAction::Dnat(svc.endpoints.get(i as usize)))
            }
        }
    }

    /// An endpoint set's chain: the userspace capture (if any), the cluster IP's
    /// masquerade, affinity, then the choice of endpoint.
    fn set_chain(&self, set: EndpointSetId, list: &[u32], detect: Option<&Detect>) -> Chain {
        let svc = &*self.intent;
        let family = svc.family;
        let mut rules = Vec::new();
        if let Some(ports) = &self.capture {
            let port = ports[set_slot(set)];
            if self.capture_loopback_only {
                // Localhost NodePorts: only the proxy on loopback can serve
                // them without route_localnet; every other destination goes on
                // to the rules below.
                if let Some(port) = port {
                    rules.push(self.rule(
                        vec![
                            Match::Prefix {
                                addr: Addr::Daddr,
                                net: loopback(family),
                                negate: false,
                            },
                            Match::L4Proto(svc.protocol),
                        ],
                        RuleAction::Redirect(port),
                    ));
                }
            } else {
                // The proxy connects from the node itself: nothing to
                // masquerade, and it keeps the affinity and chooses the endpoint.
                if let Some(port) = port {
                    rules.push(self.rule(self.l4proto(), RuleAction::Redirect(port)));
                }
                return self.chain(rules);
            }
        }
        if svc.internal.set == set {
            // Only traffic that came for the cluster IP: the same chain also
            // serves external traffic, which the external chain handles.
            for ip in svc.cluster_ips() {
                let mut matches = vec![
                    Match::Prefix {
                        addr: Addr::Daddr,
                        net: IpNet::from(ip),
                        negate: false,
                    },
                    Match::Dport(svc.protocol, svc.port),
                ];
                match (svc.internal.masquerade, detect) {
                    (Masquerade::Always, _) => {}
                    (Masquerade::UnlessFromLocalPod, Some(d)) => {
                        matches.push(d.if_not_local.clone())
                    }
                    _ => continue,
                }
                rules.push(self.rule(matches, RuleAction::Jump(MARK_MASQ_CHAIN.to_string())));
            }
        }
        if svc.affinity_timeout.is_some() {
            // (With affinity every endpoint has its objects.)
            for names in list.iter().filter_map(|&i| self.endpoints.get(i as usize)) {
                rules.push(self.rule(
                    vec![Match::InSet {
                        addr: Addr::Saddr,
                        set: ObjName::new(Prefix::Affinity, names.affinity).to_string(),
                        negate: false,
                    }],
                    RuleAction::Goto(ObjName::new(Prefix::Endpoint, names.chain).to_string()),
                ));
            }
        }
        let n = list.len();
        if let Some(base) = self.blocks[set_slot(set)].map(|r| r.first) {
            // Uniform choice in one lookup: the set's endpoints are the map's
            // elements base..base+n.
            rules.push(self.rule(
                self.l4proto(),
                RuleAction::MapDnat {
                    n: n as u32,
                    offset: base,
                    map: self.endpoint_map(),
                },
            ));
            return self.chain(rules);
        }
        // Otherwise (affinity; one endpoint) a cascade: endpoint i is taken with
        // probability 1/(n-i) among those left, i.e. 1/n overall. (An anonymous
        // verdict map per service instead would cost the kernel's loop check a
        // scan of every set of the table for every chain it visits.)
        for (k, &i) in list.iter().enumerate() {
            let matches = if k + 1 == n {
                Vec::new()
            } else {
                vec![Match::NumgenZero((n - k) as u32)]
            };
            rules.push(self.to_endpoint(i, matches));
        }
        self.chain(rules)
    }

    /// The external route's chain: masquerade, the shortcuts for this node's pods
    /// and host, then the set the rest goes to.
    fn external_chain(&self, ext: &ExternalRoute, detect: Option<&Detect>) -> Chain {
        let mark = || RuleAction::Jump(MARK_MASQ_CHAIN.to_string());
        let service = || RuleAction::Goto(self.name(Prefix::Service).to_string());
        let from_host = || vec![Match::FibLocal(Addr::Saddr)];
        let mut rules = Vec::new();
        if ext.masquerade {
            rules.push(self.rule(Vec::new(), mark()));
        }
        if ext.pods_to_cluster {
            if let Some(d) = detect {
                rules.push(self.rule(vec![d.if_local.clone()], service()));
            }
        }
        if ext.host_masquerade {
            rules.push(self.rule(from_host(), mark()));
        }
        if ext.host_to_cluster {
            rules.push(self.rule(from_host(), service()));
        }
        if let Disposition::Forward(set) = ext.rest {
            rules.push(self.rule(
                Vec::new(),
                RuleAction::Goto(self.name(set_prefix(set)).to_string()),
            ));
        }
        self.chain(rules)
    }

    /// loadBalancerSourceRanges' chain: admitted sources return, the rest drops.
    fn firewall_chain(&self, fw: &Firewall) -> Chain {
        let mut rules = Vec::new();
        // One rule per range rather than an anonymous set (see the dispatch
        // cascade in set_chain for why); only new connections to the LB walk them.
        // The LB IPs as sources (upstream's allowFromNode) are host ranges.
        let lb_sources = fw.lb_sources.iter().map(|ip| IpNet::from(*ip));
        for range in fw.ranges.iter().copied().chain(lb_sources) {
            rules.push(self.rule(
                vec![Match::Prefix {
                    addr: Addr::Saddr,
                    net: range,
                    negate: false,
                }],
                RuleAction::Return,
            ));
        }
        rules.push(self.rule(Vec::new(), RuleAction::Drop));
        self.chain(rules)
    }

    /// Each endpoint's chain (with affinity, noting the client in its set) and
    /// affinity set.
    fn endpoint_objects(&self, rs: &mut Ruleset) {
        let svc = &*self.intent;
        for (ep, names) in svc.endpoints.iter().zip(&self.endpoints) {
            let mut rules = Vec::new();
            if let Some(t) = svc.affinity_timeout {
                let set = ObjName::new(Prefix::Affinity, names.affinity).to_string();
                rules.push(self.rule(Vec::new(), RuleAction::UpdateSaddr(set.clone())));
                rs.sets.insert(
                    set,
                    Set {
                        key: vec![Field::Addr(svc.family)],
                        timeout: Some(t),
                        interval: false,
                        elements: Vec::new(),
                    },
                );
            }
            rules.push(self.rule(self.l4proto(), RuleAction::Dnat(ep)));
            rs.chains.insert(
                ObjName::new(Prefix::Endpoint, names.chain).to_string(),
                Chain {
                    base: None,
                    comment: None,
                    rules,
                },
            );
        }
    }

    /// Names of the chains and sets this fragment owns, without printing any rule.
    pub fn object_names(&self) -> (Vec<String>, Vec<String>) {
        let svc = &*self.intent;
        let mut chains = Vec::with_capacity(self.chain_count());
        if self.chainless.is_some() {
            return (chains, Vec::new());
        }
        for (present, prefix) in [
            (svc.has_set(EndpointSetId::Cluster), Prefix::Service),
            (svc.has_set(EndpointSetId::Local), Prefix::Local),
            (svc.external.is_some(), Prefix::External),
            (svc.firewall.is_some(), Prefix::Firewall),
        ] {
            if present {
                chains.push(self.name(prefix).to_string());
            }
        }
        let mut sets = Vec::new();
        for names in &self.endpoints {
            chains.push(ObjName::new(Prefix::Endpoint, names.chain).to_string());
            if svc.affinity_timeout.is_some() {
                sets.push(ObjName::new(Prefix::Affinity, names.affinity).to_string());
            }
        }
        (chains, sets)
    }

    /// Number of chains this fragment owns (for statistics).
    pub fn chain_count(&self) -> usize {
        let svc = &*self.intent;
        if self.chainless.is_some() {
            return 0;
        }
        svc.has_set(EndpointSetId::Cluster) as usize
            + svc.has_set(EndpointSetId::Local) as usize
            + svc.external.is_some() as usize
            + svc.firewall.is_some() as usize
            + self.endpoints.len()
    }
}
