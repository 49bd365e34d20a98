//! The translation itself: the node-wide chains from the [`NodeIntent`], then each
//! service port's chains and dispatch rules from its [`ServiceIntent`]. Which rule
//! implements which behaviour is said where it is written; what to do always comes
//! from the intent.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use svcproxy_core::model::{IpFamily, Protocol};

use crate::intent::{
    Action, Disposition, EndpointSetId, FamilyIntent, Frontend, FrontendKey, Intent, LocalTraffic,
    Masquerade, NodeIntent, NodePortDestinations, ServiceIntent,
};
use crate::names::{protocol_keyword, service_port_comment, service_port_hash, EndpointHasher};

use super::*;

/// Matches for "from this node's pods" / "not from them", as rule arguments.
struct Detect {
    /// One rule's worth per alternative (several CIDRs: several rules).
    if_local: Vec<String>,
    /// A single negated match, or `None` when a helper chain must do it
    /// ([`NOT_LOCAL`]: several CIDRs cannot be negated in one rule).
    if_not_local: Option<String>,
}

impl Detect {
    fn new(node: &NodeIntent) -> Option<Detect> {
        Some(match node.local_traffic.as_ref()? {
            LocalTraffic::Cidrs(nets) => Detect {
                if_local: nets.iter().map(|n| format!("-s {n}")).collect(),
                if_not_local: (nets.len() == 1).then(|| format!("! -s {}", nets[0])),
            },
            // InterfaceName admits only [A-Za-z0-9_.-]: nothing to quote.
            LocalTraffic::Interface(name) => Detect {
                if_local: vec![format!("-i {name}")],
                if_not_local: Some(format!("! -i {name}")),
            },
            LocalTraffic::InterfacePrefix(prefix) => Detect {
                if_local: vec![format!("-i {prefix}+")],
                if_not_local: Some(format!("! -i {prefix}+")),
            },
        })
    }
}

fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

fn proto_match(protocol: Protocol, port: u16) -> String {
    let p = protocol_keyword(protocol);
    format!("-p {p} -m {p} --dport {port}")
}

fn dest(ip: IpAddr, protocol: Protocol, port: u16) -> String {
    format!("-d {} {}", host(ip), proto_match(protocol, port))
}

fn comment(text: &str) -> String {
    // Sanitized text ([a-z0-9-./:] only) cannot leave the quotes.
    format!("-m comment --comment \"{text}\"")
}

/// The refusal target for `protocol`.
fn reject(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "-j REJECT --reject-with tcp-reset",
        _ => "-j REJECT",
    }
}

fn verdict(action: Action, protocol: Protocol) -> &'static str {
    match action {
        Action::Drop => "-j DROP",
        _ => reject(protocol),
    }
}

fn loopback(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    }
}

/// One family's chains, or `None` when the intent does not program the family:
/// everything translated.
pub fn rules(intent: &Intent, family: IpFamily) -> Option<FamilyRules> {
    TranslationCache::default().rules(intent, family)
}

/// What one service port's translation left outside its own chains, kept to replay
/// it while its intent (the same `Arc`) and the frontends it owns stay the same.
#[derive(Clone, Debug)]
struct Cached {
    svc: Arc<ServiceIntent>,
    owned: Vec<FrontendKey>,
    /// Its place in the order: the 48 bits of its hash its chain names carry.
    order: u64,
    /// Its own chains.
    chains: Vec<(TableId, String)>,
    /// Its rules in the fixed chains.
    dispatch: Vec<(TableId, String, String)>,
    /// Rules in its own chains, per table (filter, nat).
    rules: [usize; 2],
}

/// Translations of one family's service ports, kept between syncs: a partial sync
/// translates only the ports whose intent or owned frontends changed (at 10k
/// services, translating everything took about 280 ms of a one-service change).
/// What it holds per service port: the intent's `Arc`, the owned frontend keys, the
/// chain names and the few dispatch rules; not the rules of its own chains.
#[derive(Clone, Debug, Default)]
pub struct TranslationCache {
    family: Option<IpFamily>,
    node: Option<Arc<NodeIntent>>,
    groups: HashMap<ServicePortName, Arc<Cached>>,
}

/// A service port to translate or replay: its order, its intent, its cached
/// translation when that still holds.
type Port<'a> = (u64, &'a Arc<ServiceIntent>, Option<Arc<Cached>>);

/// The keys of the frontends of `svc` it owns (another port may hold a contested
/// one).
fn owned_keys<'a>(
    fam: &'a FamilyIntent,
    svc: &'a ServiceIntent,
) -> impl Iterator<Item = FrontendKey> + 'a {
    svc.frontends
        .iter()
        .map(|f| f.key)
        .filter(|k| fam.owner(k).is_some_and(|o| o.name == svc.name))
}

impl TranslationCache {
    /// Forgets every translation: the next [`TranslationCache::rules`] translates
    /// everything (a full sync).
    pub fn clear(&mut self) {
        *self = TranslationCache::default();
    }

    /// One family's chains. The service ports that translate as last time are
    /// replayed (their fixed-chain rules only: [`FamilyRules::translated`] is false
    /// for them); the chains the ports no longer have are in
    /// [`FamilyRules::replaced`]. A different node intent starts over.
    pub fn rules(&mut self, intent: &Intent, family: IpFamily) -> Option<FamilyRules> {
        let fam = intent.family(family);
        let Some(node) = fam.node() else {
            self.clear();
            return None;
        };
        if self.family != Some(family)
            || self
                .node
                .as_ref()
                .is_none_or(|n| !Arc::ptr_eq(n, node) && **n != **node)
        {
            self.clear();
            self.family = Some(family);
            self.node = Some(node.clone());
        }
        let mut r = FamilyRules::new(family);
        for c in FILTER_CHAINS {
            r.filter.declare(c);
        }
        for c in NAT_CHAINS {
            r.nat.declare(c);
        }
        let detect = Detect::new(node);
        node_rules(&mut r, node, detect.as_ref());
        // Each port with its cached translation if that still holds.
        let mut services: Vec<Port> = fam
            .services()
            .values()
            .map(|svc| {
                let hit = self.groups.get(&svc.name).filter(|c| {
                    Arc::ptr_eq(&c.svc, svc) && c.owned.iter().copied().eq(owned_keys(fam, svc))
                });
                match hit {
                    Some(c) => (c.order, svc, Some(c.clone())),
                    None => (order(svc), svc, None),
                }
            })
            .collect();
        // In descending order of their chains' names, which keeps restores linear
        // (see `FamilyRules::restore`).
        services.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.name.cmp(&a.1.name)));
        let mut replaced: HashMap<TableId, Vec<String>> = HashMap::new();
        for (order, svc, hit) in services {
            r.begin_group(Some(&svc.name));
            let g = r.groups.len() - 1;
            if let Some(c) = hit {
                r.translated[g] = false;
                for (t, chain, rule) in &c.dispatch {
                    r.add_fixed(*t, chain, rule.clone());
                }
                r.replayed_rules[0] += c.rules[0];
                r.replayed_rules[1] += c.rules[1];
                continue;
            }
            let starts = [r.filter.chains.len(), r.nat.chains.len()];
            service_rules(&mut r, fam, svc, &Names::new(svc, order), detect.as_ref());
            let (chains, rules) = group_chains(&mut r, g, starts);
            let entry = Cached {
                svc: svc.clone(),
                owned: owned_keys(fam, svc).collect(),
                order,
                chains,
                dispatch: std::mem::take(&mut r.dispatch[g]),
                rules,
            };
            if let Some(old) = self.groups.get(&svc.name) {
                for (t, c) in old.chains.iter().filter(|x| !entry.chains.contains(x)) {
                    replaced.entry(*t).or_default().push(c.clone());
                }
            }
            self.groups.insert(svc.name.clone(), Arc::new(entry));
        }
        self.forget_gone(fam, &mut replaced);
        r.begin_group(None);
        tail_rules(&mut r, fam, node);
        r.replaced = replaced;
        Some(r)
    }
}

impl TranslationCache {
    /// Forgets the service ports gone (every port has its entry: more entries
    /// than ports means some are stale), their chains into `replaced`.
    fn forget_gone(&mut self, fam: &FamilyIntent, replaced: &mut HashMap<TableId, Vec<String>>) {
        let services = fam.services();
        if self.groups.len() > services.len() {
            self.groups.retain(|name, c| {
                let keep = services.contains_key(name);
                if !keep {
                    for (t, chain) in &c.chains {
                        replaced.entry(*t).or_default().push(chain.clone());
                    }
                }
                keep
            });
        }
    }
}

/// The chains group `g` translated (those after `starts`, per table), and the
/// rules in them per table.
fn group_chains(
    r: &mut FamilyRules,
    g: usize,
    starts: [usize; 2],
) -> (Vec<(TableId, String)>, [usize; 2]) {
    let mut chains = Vec::new();
    let mut rules = [0; 2];
    for (k, id) in TableId::ALL.into_iter().enumerate() {
        let t = r.table(id);
        for (c, owner) in t.chain_group.iter().enumerate().skip(starts[k]) {
            if *owner == Some(g as u32) {
                chains.push((id, t.chains[c].0.clone()));
                rules[k] += t.chains[c].1.len();
            }
        }
    }
    (chains, rules)
}

/// A service port's place in the translation order: the 48 bits of its hash that
/// its chain names carry (see [`Names`]).
fn order(svc: &ServiceIntent) -> u64 {
    service_port_hash(svc.family, &svc.name) >> 16
}

/// The node-wide rules that come before any service's.
fn node_rules(r: &mut FamilyRules, node: &NodeIntent, detect: Option<&Detect>) {
    let mark = format!("{:#x}", node.masquerade_mark);
    // Masquerade exactly the marked packets, once (the mark is cleared).
    r.nat.add(
        POSTROUTING,
        format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
    );
    r.nat.add(POSTROUTING, format!("-j MARK --xor-mark {mark}"));
    r.nat.add(
        POSTROUTING,
        format!(
            "{} -j MASQUERADE --random-fully",
            comment("service traffic requiring snat")
        ),
    );
    r.nat.add(MARK_MASQ, format!("-j MARK --or-mark {mark}"));
    // Several pod CIDRs: "unless from a local pod" returns for each, then marks.
    if let Some(d) = detect.filter(|d| d.if_not_local.is_none()) {
        for m in &d.if_local {
            r.nat.add(NOT_LOCAL, format!("{m} -j RETURN"));
        }
        r.nat.add(NOT_LOCAL, format!("-j {MARK_MASQ}"));
    }
    // An out-of-window packet conntrack calls INVALID is not un-DNATed; reaching the
    // pod, it would draw a reset that kills the connection (kubernetes#74839).
    if node.drop_invalid_forwarded {
        r.filter.add(
            FORWARD,
            "-m conntrack --ctstate INVALID -j DROP".to_string(),
        );
    }
    // Forwarded service traffic is accepted even under a FORWARD policy of DROP.
    r.filter
        .add(FORWARD, format!("-m mark --mark {mark}/{mark} -j ACCEPT"));
    r.filter.add(
        FORWARD,
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".to_string(),
    );
    // NodePorts on 127.0.0.1 need route_localnet; this keeps packets from outside
    // from reaching 127.0.0.0/8 that way (CVE-2020-8558).
    if node.localhost_nodeports && node.family == IpFamily::V4 {
        r.filter.add(
            LOCALNET,
            format!(
                "{} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                comment("block incoming localnet connections")
            ),
        );
    }
}

/// Rules that must follow every service's: the guard of the service address space
/// and the NodePort dispatch (last in `SVCPROXY-SERVICES`).
fn tail_rules(r: &mut FamilyRules, fam: &FamilyIntent, node: &NodeIntent) {
    if node.guard_service_ips {
        // After DNAT: still addressed to a cluster IP means no service port took it.
        let ips: BTreeSet<IpAddr> = fam.cluster_ips().collect();
        for ip in ips {
            r.filter.add(
                SERVICES,
                format!("-d {} -p tcp {}", host(ip), reject(Protocol::Tcp)),
            );
            r.filter.add(SERVICES, format!("-d {} -j REJECT", host(ip)));
        }
        for cidr in &node.service_cidrs {
            r.filter.add(SERVICES, format!("-d {cidr} -j DROP"));
        }
    }
    // The buckets holding service addresses, in order.
    for b in 0..BUCKETS as u8 {
        let chain = bucket_chain(b);
        if r.nat.has(&chain) {
            r.nat.add(
                SERVICES,
                format!("{} -j {chain}", bucket_match(node.family, b)),
            );
        }
    }
    let np = comment("nodeports: last rule of this chain");
    match &node.nodeports {
        NodePortDestinations::AllLocal => {
            let lo = if node.family == IpFamily::V6 || !node.localhost_nodeports {
                format!(" ! -d {}", loopback(node.family))
            } else {
                String::new()
            };
            r.nat.add(
                SERVICES,
                format!("{np} -m addrtype --dst-type LOCAL{lo} -j {NODEPORTS}"),
            );
        }
        NodePortDestinations::Ips(ips) => {
            for ip in ips {
                r.nat
                    .add(SERVICES, format!("{np} -d {} -j {NODEPORTS}", host(*ip)));
            }
            if node.localhost_nodeports && node.family == IpFamily::V4 {
                r.nat
                    .add(SERVICES, format!("{np} -d 127.0.0.0/8 -j {NODEPORTS}"));
            }
        }
    }
}

/// The hashed chain names of one service port: `SVP-<12 hex digits>-<kind>` for its
/// own chains, `SVP-<same 12>-E<10 hex digits>` per endpoint that has a chain (28
/// characters, the most iptables allows). The shared prefix (48 bits of the service
/// port's hash) keeps a service port's chains together in name order; the endpoint
/// part (40 bits of the endpoint's hash) only has to be unique within the service
/// port.
///
/// An endpoint has its own chain only when something must happen besides the DNAT:
/// the hairpin masquerade (an endpoint that may be this node's own, see
/// [`ServiceIntent::hairpin`]) or session affinity (`recent` per endpoint). Every
/// other endpoint is DNATed straight from the endpoint set's chain: in a large
/// cluster most endpoints are on other nodes, and a chain each is what makes the
/// tables big (the kernel validates and commits every chain of the table at each
/// change).
struct Names {
    prefix: String,
    endpoints: Vec<Option<String>>,
}

impl Names {
    /// `order`: the port's [`order`].
    fn new(svc: &ServiceIntent, order: u64) -> Names {
        let hasher = EndpointHasher::new(svc.family, &svc.name);
        let prefix = format!("{HASHED_PREFIX}{order:012X}-");
        Names {
            endpoints: svc
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, ep)| {
                    svc.endpoint_needs_own_state(i).then(|| {
                        format!(
                            "{prefix}E{:010X}",
                            hasher.endpoint(ep.ip(), ep.port()) >> 24
                        )
                    })
                })
                .collect(),
            prefix,
        }
    }

    fn chain(&self, kind: &str) -> String {
        format!("{}{kind}", self.prefix)
    }

    fn set(&self, id: EndpointSetId) -> String {
        self.chain(match id {
            EndpointSetId::Cluster => "SVC",
            EndpointSetId::Local => "SVL",
        })
    }
}

/// The dispatch chain of `ip`'s bucket in `nat`: [`SERVICES`] jumps to
/// `SVCPROXY-SVC-<bucket>` on the low 6 bits of the destination, so a packet walks
/// at most 64 bucket rules and then its bucket's share of the service addresses
/// (rather than every one of them, as upstream's `KUBE-SERVICES`), and a change
/// rewrites one bucket rather than the whole dispatch.
pub(super) fn bucket(ip: IpAddr) -> u8 {
    let low = match ip {
        IpAddr::V4(a) => a.octets()[3],
        IpAddr::V6(a) => a.octets()[15],
    };
    low & (BUCKETS as u8 - 1)
}

fn bucket_chain(b: u8) -> String {
    format!("{BUCKET_PREFIX}{b:02X}")
}

/// The match selecting bucket `b`'s addresses.
fn bucket_match(family: IpFamily, b: u8) -> String {
    let mask = BUCKETS - 1;
    match family {
        IpFamily::V4 => format!("-d 0.0.0.{b}/0.0.0.{mask}"),
        IpFamily::V6 => format!("-d ::{b:x}/::{mask:x}"),
    }
}

/// One service port's rules in one family: its endpoint-set and endpoint chains
/// (`nat`), its external and firewall chains, its dispatch rules and the filter
/// verdicts for what must not get through.
fn service_rules(
    r: &mut FamilyRules,
    fam: &FamilyIntent,
    svc: &ServiceIntent,
    names: &Names,
    detect: Option<&Detect>,
) {
    let owned: Vec<&Frontend> = svc
        .frontends
        .iter()
        .filter(|f| fam.owner(&f.key).is_some_and(|o| o.name == svc.name))
        .collect();
    let (declared, endpoints) = endpoint_set_chains(r, svc, names, detect);
    endpoint_chains(r, svc, names, endpoints);
    external_chain(r, svc, names, &owned, &declared, detect);
    firewall_chain(r, svc, names, &owned);
    let note = comment(&service_port_comment(&svc.name));
    for f in &owned {
        match f.key {
            FrontendKey::Vip { .. } => vip_dispatch(r, svc, names, f, &note),
            FrontendKey::NodePort { .. } => node_port_dispatch(r, svc, names, f, &note),
        }
    }
    // A load balancer's health checks must get through a default-drop INPUT.
    // (One rule per port: the ports of one Service share it, see `dispatch`.)
    if let Some(hc) = svc.health_check_node_port {
        let rule = format!("{} -j ACCEPT", proto_match(Protocol::Tcp, hc));
        r.dispatch(TableId::Filter, NODEPORTS, rule);
    }
}

/// The endpoint sets' chains, each choosing an endpoint at random (after
/// affinity). Returns the sets declared and the endpoints they name.
fn endpoint_set_chains(
    r: &mut FamilyRules,
    svc: &ServiceIntent,
    names: &Names,
    detect: Option<&Detect>,
) -> (BTreeSet<EndpointSetId>, BTreeSet<u32>) {
    let proto = svc.protocol;
    let mut declared: BTreeSet<EndpointSetId> = BTreeSet::new();
    let mut endpoints: BTreeSet<u32> = BTreeSet::new();
    for id in [EndpointSetId::Cluster, EndpointSetId::Local] {
        let Some(list) = svc.set_indices(id).filter(|l| !l.is_empty()) else {
            continue;
        };
        declared.insert(id);
        endpoints.extend(list.iter().copied());
        let chain = names.set(id);
        r.nat.declare(&chain);
        if svc.internal.set == id {
            // Only traffic that came for the cluster IP: external traffic reaches the
            // same chain through the external chain, which decides for it.
            for ip in svc.cluster_ips() {
                let d = dest(ip, proto, svc.port);
                match (svc.internal.masquerade, detect) {
                    (Masquerade::Always, _) => r.nat.add(&chain, format!("{d} -j {MARK_MASQ}")),
                    (Masquerade::UnlessFromLocalPod, Some(det)) => match &det.if_not_local {
                        Some(m) => r.nat.add(&chain, format!("{d} {m} -j {MARK_MASQ}")),
                        None => r.nat.add(&chain, format!("{d} -j {NOT_LOCAL}")),
                    },
                    _ => {}
                }
            }
        }
        if let Some(timeout) = svc.affinity_timeout {
            // (With affinity every endpoint has its chain.)
            for ep in list
                .iter()
                .filter_map(|&i| names.endpoints[i as usize].as_ref())
            {
                r.nat.add(
                    &chain,
                    format!("-m recent --name {ep} --rcheck --seconds {timeout} --reap -j {ep}"),
                );
            }
        }
        // Uniform choice: endpoint k is taken with probability 1/(n-k) among those
        // left; to its chain, or straight to the endpoint.
        let p = protocol_keyword(proto);
        let n = list.len();
        for (k, &i) in list.iter().enumerate() {
            let to = match &names.endpoints[i as usize] {
                Some(ep) => format!("-j {ep}"),
                None => format!(
                    "-p {p} -j DNAT --to-destination {}",
                    svc.endpoints.get(i as usize)
                ),
            };
            if k + 1 == n {
                r.nat.add(&chain, to);
            } else {
                let prob = 1.0 / (n - k) as f64;
                r.nat.add(
                    &chain,
                    format!("-m statistic --mode random --probability {prob:.10} {to}"),
                );
            }
        }
    }
    (declared, endpoints)
}

/// Each endpoint's chain (where it has one): the hairpin's masquerade, affinity's
/// note, the DNAT.
fn endpoint_chains(
    r: &mut FamilyRules,
    svc: &ServiceIntent,
    names: &Names,
    endpoints: BTreeSet<u32>,
) {
    let p = protocol_keyword(svc.protocol);
    for i in endpoints {
        let ep: SocketAddr = svc.endpoints.get(i as usize);
        let Some(chain) = &names.endpoints[i as usize] else {
            continue;
        };
        r.nat.declare(chain);
        // Hairpin: an endpoint reaching itself through the service.
        r.nat
            .add(chain, format!("-s {} -j {MARK_MASQ}", host(ep.ip())));
        let affinity = if svc.affinity_timeout.is_some() {
            format!("-m recent --name {chain} --set ")
        } else {
            String::new()
        };
        // (`-p` alone lets DNAT rewrite the port: an empty `-m tcp` would only add
        // an xt match for the kernel to run.)
        r.nat.add(
            chain,
            format!("{affinity}-p {p} -j DNAT --to-destination {ep}"),
        );
    }
}

/// The external route's chain, when an external frontend forwards: masquerade,
/// the shortcuts for this node's pods and host, then the set the rest goes to.
fn external_chain(
    r: &mut FamilyRules,
    svc: &ServiceIntent,
    names: &Names,
    owned: &[&Frontend],
    declared: &BTreeSet<EndpointSetId>,
    detect: Option<&Detect>,
) {
    let forwards_external = owned
        .iter()
        .any(|f| f.kind.is_external() && f.action == Action::Forward);
    let (Some(ext), true) = (&svc.external, forwards_external) else {
        return;
    };
    let ext_chain = names.chain("EXT");
    let cluster = names.set(EndpointSetId::Cluster);
    let has_cluster = declared.contains(&EndpointSetId::Cluster);
    r.nat.declare(&ext_chain);
    if ext.masquerade {
        r.nat.add(&ext_chain, format!("-j {MARK_MASQ}"));
    }
    if ext.pods_to_cluster && has_cluster {
        for m in detect.map(|d| d.if_local.as_slice()).unwrap_or_default() {
            r.nat.add(&ext_chain, format!("{m} -j {cluster}"));
        }
    }
    if ext.host_masquerade {
        r.nat.add(
            &ext_chain,
            format!("-m addrtype --src-type LOCAL -j {MARK_MASQ}"),
        );
    }
    if ext.host_to_cluster && has_cluster {
        r.nat.add(
            &ext_chain,
            format!("-m addrtype --src-type LOCAL -j {cluster}"),
        );
    }
    if let Disposition::Forward(id) = ext.rest {
        if declared.contains(&id) {
            r.nat.add(&ext_chain, format!("-j {}", names.set(id)));
        }
    }
}

/// loadBalancerSourceRanges: allowed sources go on to the external chain; the rest
/// is not DNATed and the filter chain drops it by its destination.
fn firewall_chain(r: &mut FamilyRules, svc: &ServiceIntent, names: &Names, owned: &[&Frontend]) {
    let (Some(fw), true) = (&svc.firewall, owned.iter().any(|f| f.firewall)) else {
        return;
    };
    let fw_chain = names.chain("FW");
    let ext_chain = names.chain("EXT");
    r.nat.declare(&fw_chain);
    for range in &fw.ranges {
        r.nat.add(&fw_chain, format!("-s {range} -j {ext_chain}"));
    }
    // Upstream's allowFromNode: the LB IPs themselves as sources.
    for ip in &fw.lb_sources {
        r.nat.add(
            &fw_chain,
            format!("-s {} -j {ext_chain}", ipnet::IpNet::from(*ip)),
        );
    }
}

/// A service address's dispatch in its bucket, and the filter verdicts for what
/// must not get through.
fn vip_dispatch(r: &mut FamilyRules, svc: &ServiceIntent, names: &Names, f: &Frontend, note: &str) {
    let FrontendKey::Vip { ip, protocol, port } = f.key else {
        return;
    };
    let d = dest(ip, protocol, port);
    match (f.action, f.kind.is_external()) {
        (Action::Forward, false) => r.dispatch(
            TableId::Nat,
            &bucket_chain(bucket(ip)),
            format!("{note} {d} -j {}", names.set(svc.internal.set)),
        ),
        (Action::Forward, true) => {
            let fw_chain = names.chain("FW");
            let to = if f.firewall && r.nat.has(&fw_chain) {
                fw_chain
            } else {
                names.chain("EXT")
            };
            r.dispatch(
                TableId::Nat,
                &bucket_chain(bucket(ip)),
                format!("{note} {d} -j {to}"),
            );
            if f.firewall {
                r.dispatch(TableId::Filter, FIREWALL, format!("{note} {d} -j DROP"));
            }
            if svc.external.is_some_and(|e| e.rest == Disposition::Drop) {
                r.dispatch(TableId::Filter, EXTERNAL, format!("{note} {d} -j DROP"));
            }
        }
        (action, false) => r.dispatch(
            TableId::Filter,
            SERVICES,
            format!("{note} {d} {}", verdict(action, protocol)),
        ),
        (action, true) => r.dispatch(
            TableId::Filter,
            EXTERNAL,
            format!("{note} {d} {}", verdict(action, protocol)),
        ),
    }
}

/// A NodePort's dispatch, and the filter verdicts for what must not get through.
fn node_port_dispatch(
    r: &mut FamilyRules,
    svc: &ServiceIntent,
    names: &Names,
    f: &Frontend,
    note: &str,
) {
    let FrontendKey::NodePort { protocol, port } = f.key else {
        return;
    };
    let m = proto_match(protocol, port);
    match f.action {
        Action::Forward => {
            let ext_chain = names.chain("EXT");
            r.dispatch(
                TableId::Nat,
                NODEPORTS,
                format!("{note} {m} -j {ext_chain}"),
            );
            if svc.external.is_some_and(|e| e.rest == Disposition::Drop) {
                r.dispatch(
                    TableId::Filter,
                    EXTERNAL,
                    format!("{note} -m addrtype --dst-type LOCAL {m} -j DROP"),
                );
            }
        }
        action => r.dispatch(
            TableId::Filter,
            EXTERNAL,
            format!(
                "{note} -m addrtype --dst-type LOCAL {m} {}",
                verdict(action, protocol)
            ),
        ),
    }
}
