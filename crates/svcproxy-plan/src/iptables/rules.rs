//! The translation itself: the node-wide chains from the [`NodeIntent`], then each
//! service port's chains and dispatch rules from its [`ServiceIntent`]. Which rule
//! implements which behaviour is said where it is written; what to do always comes
//! from the intent.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use svcproxy_core::model::{IpFamily, Protocol};

use crate::intent::{
    Action, Disposition, EndpointSetId, FamilyIntent, FrontendKey, Intent, LocalTraffic,
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

/// One family's chains, or `None` when the intent does not program the family.
pub fn rules(intent: &Intent, family: IpFamily) -> Option<FamilyRules> {
    let fam = intent.family(family);
    let node = fam.node()?;
    let mut r = FamilyRules {
        family,
        filter: Table::default(),
        nat: Table::default(),
        owners: HashMap::new(),
    };
    for c in FILTER_CHAINS {
        r.filter.chain(c);
    }
    for c in NAT_CHAINS {
        r.nat.chain(c);
    }
    let detect = Detect::new(node);
    node_rules(&mut r, node, detect.as_ref());
    for svc in fam.services().values() {
        // The chains this service port declares are appended: they are its own.
        let before = r.nat.chains.len();
        service_rules(&mut r, fam, svc, detect.as_ref());
        for (name, _) in &r.nat.chains[before..] {
            r.owners.insert(name.clone(), svc.name.clone());
        }
    }
    tail_rules(&mut r, fam, node);
    Some(r)
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

/// The hashed chain names of one service port.
struct Names {
    hash: u64,
    endpoints: Vec<String>,
}

impl Names {
    fn new(svc: &ServiceIntent) -> Names {
        let hasher = EndpointHasher::new(svc.family, &svc.name);
        Names {
            hash: service_port_hash(svc.family, &svc.name),
            endpoints: svc
                .endpoints
                .iter()
                .map(|ep| {
                    format!(
                        "{HASHED_PREFIX}SEP-{:016X}",
                        hasher.endpoint(ep.ip(), ep.port())
                    )
                })
                .collect(),
        }
    }

    fn chain(&self, kind: &str) -> String {
        format!("{HASHED_PREFIX}{kind}-{:016X}", self.hash)
    }

    fn set(&self, id: EndpointSetId) -> String {
        self.chain(match id {
            EndpointSetId::Cluster => "SVC",
            EndpointSetId::Local => "SVL",
        })
    }
}

fn service_rules(
    r: &mut FamilyRules,
    fam: &FamilyIntent,
    svc: &ServiceIntent,
    detect: Option<&Detect>,
) {
    let names = Names::new(svc);
    let text = service_port_comment(&svc.name);
    let note = comment(&text);
    let proto = svc.protocol;
    let owned: Vec<_> = svc
        .frontends
        .iter()
        .filter(|f| fam.owner(&f.key).is_some_and(|o| o.name == svc.name))
        .collect();

    // The endpoint sets: each a chain choosing an endpoint at random (after affinity).
    let mut declared: BTreeSet<EndpointSetId> = BTreeSet::new();
    let mut endpoints: BTreeSet<u32> = BTreeSet::new();
    for id in [EndpointSetId::Cluster, EndpointSetId::Local] {
        let Some(list) = svc.set_indices(id).filter(|l| !l.is_empty()) else {
            continue;
        };
        declared.insert(id);
        endpoints.extend(list.iter().copied());
        let chain = names.set(id);
        let rules = r.nat.chain(&chain);
        if svc.internal.set == id {
            // Only traffic that came for the cluster IP: external traffic reaches the
            // same chain through the external chain, which decides for it.
            for ip in &svc.cluster_ips {
                let d = dest(*ip, proto, svc.port);
                match (svc.internal.masquerade, detect) {
                    (Masquerade::Always, _) => rules.push(format!("{d} -j {MARK_MASQ}")),
                    (Masquerade::UnlessFromLocalPod, Some(det)) => match &det.if_not_local {
                        Some(m) => rules.push(format!("{d} {m} -j {MARK_MASQ}")),
                        None => rules.push(format!("{d} -j {NOT_LOCAL}")),
                    },
                    _ => {}
                }
            }
        }
        if let Some(timeout) = svc.affinity_timeout {
            for &i in list {
                let ep = &names.endpoints[i as usize];
                rules.push(format!(
                    "-m recent --name {ep} --rcheck --seconds {timeout} --reap -j {ep}"
                ));
            }
        }
        // Uniform choice: endpoint k is taken with probability 1/(n-k) among those left.
        let n = list.len();
        for (k, &i) in list.iter().enumerate() {
            let ep = &names.endpoints[i as usize];
            if k + 1 == n {
                rules.push(format!("-j {ep}"));
            } else {
                let p = 1.0 / (n - k) as f64;
                rules.push(format!(
                    "-m statistic --mode random --probability {p:.10} -j {ep}"
                ));
            }
        }
    }
    for i in endpoints {
        let ep: SocketAddr = svc.endpoints[i as usize];
        let chain = &names.endpoints[i as usize];
        let rules = r.nat.chain(chain);
        // Hairpin: an endpoint reaching itself through the service.
        rules.push(format!("-s {} -j {MARK_MASQ}", host(ep.ip())));
        let affinity = if svc.affinity_timeout.is_some() {
            format!("-m recent --name {chain} --set ")
        } else {
            String::new()
        };
        let p = protocol_keyword(proto);
        rules.push(format!(
            "{affinity}-p {p} -m {p} -j DNAT --to-destination {ep}"
        ));
    }

    // The external route.
    let ext_chain = names.chain("EXT");
    let fw_chain = names.chain("FW");
    let cluster = names.set(EndpointSetId::Cluster);
    let forwards_external = owned
        .iter()
        .any(|f| f.kind.is_external() && f.action == Action::Forward);
    if let (Some(ext), true) = (&svc.external, forwards_external) {
        let has_cluster = declared.contains(&EndpointSetId::Cluster);
        let rules = r.nat.chain(&ext_chain);
        if ext.masquerade {
            rules.push(format!("-j {MARK_MASQ}"));
        }
        if ext.pods_to_cluster && has_cluster {
            for m in detect.map(|d| d.if_local.as_slice()).unwrap_or_default() {
                rules.push(format!("{m} -j {cluster}"));
            }
        }
        if ext.host_masquerade {
            rules.push(format!("-m addrtype --src-type LOCAL -j {MARK_MASQ}"));
        }
        if ext.host_to_cluster && has_cluster {
            rules.push(format!("-m addrtype --src-type LOCAL -j {cluster}"));
        }
        if let Disposition::Forward(id) = ext.rest {
            if declared.contains(&id) {
                rules.push(format!("-j {}", names.set(id)));
            }
        }
    }

    // loadBalancerSourceRanges: allowed sources go on to the external chain; the rest
    // is not DNATed and the filter chain drops it by its destination.
    let firewalled: Vec<_> = owned.iter().filter(|f| f.firewall).collect();
    if let (Some(fw), false) = (&svc.firewall, firewalled.is_empty()) {
        let rules = r.nat.chain(&fw_chain);
        if fw.allow_from_node {
            rules.push(format!("-m addrtype --src-type LOCAL -j {ext_chain}"));
        }
        for range in &fw.ranges {
            rules.push(format!("-s {range} -j {ext_chain}"));
        }
    }

    // Dispatch, and the filter verdicts for what must not get through.
    for f in &owned {
        let external = f.kind.is_external();
        match f.key {
            FrontendKey::Vip { ip, protocol, port } => {
                let d = dest(ip, protocol, port);
                match (f.action, external) {
                    (Action::Forward, false) => r.nat.add(
                        SERVICES,
                        format!("{note} {d} -j {}", names.set(svc.internal.set)),
                    ),
                    (Action::Forward, true) => {
                        let to = if f.firewall && r.nat.index.contains_key(&fw_chain) {
                            &fw_chain
                        } else {
                            &ext_chain
                        };
                        r.nat.add(SERVICES, format!("{note} {d} -j {to}"));
                        if f.firewall {
                            r.filter.add(FIREWALL, format!("{note} {d} -j DROP"));
                        }
                        if svc.external.is_some_and(|e| e.rest == Disposition::Drop) {
                            r.filter.add(EXTERNAL, format!("{note} {d} -j DROP"));
                        }
                    }
                    (action, false) => r.filter.add(
                        SERVICES,
                        format!("{note} {d} {}", verdict(action, protocol)),
                    ),
                    (action, true) => r.filter.add(
                        EXTERNAL,
                        format!("{note} {d} {}", verdict(action, protocol)),
                    ),
                }
            }
            FrontendKey::NodePort { protocol, port } => {
                let m = proto_match(protocol, port);
                match f.action {
                    Action::Forward => {
                        r.nat.add(NODEPORTS, format!("{note} {m} -j {ext_chain}"));
                        if svc.external.is_some_and(|e| e.rest == Disposition::Drop) {
                            r.filter.add(
                                EXTERNAL,
                                format!("{note} -m addrtype --dst-type LOCAL {m} -j DROP"),
                            );
                        }
                    }
                    action => r.filter.add(
                        EXTERNAL,
                        format!(
                            "{note} -m addrtype --dst-type LOCAL {m} {}",
                            verdict(action, protocol)
                        ),
                    ),
                }
            }
        }
    }
    // A load balancer's health checks must get through a default-drop INPUT.
    // (One rule per port: the ports of one Service share it.)
    if let Some(hc) = svc.health_check_node_port {
        let rule = format!("{} -j ACCEPT", proto_match(Protocol::Tcp, hc));
        let rules = r.filter.chain(NODEPORTS);
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
}
