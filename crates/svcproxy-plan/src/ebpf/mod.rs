//! The eBPF mode's translation: what its maps must hold for an intent, as plain
//! values. One entry per service address a socket or a packet can name, with the
//! route a pod's and the host's connection take at the socket
//! ([`ServiceIntent::socket_verdict`]) and the route a packet from this node's
//! pods or from elsewhere takes on the packet path
//! ([`ServiceIntent::packet_verdict`]), the endpoint lists those routes name, the
//! sources loadBalancerSourceRanges admit, and how the packet path tells this
//! node's pods (the node intent's `local_traffic`). Decides nothing; the kernel side
//! (`svcproxy_dataplane::ebpf`) gives the lists their ids and writes the
//! differences.
//!
//! Entry point: [`Table::build`]; [`Table::render`] is `svcproxy render`'s text.

pub mod maglev;
pub mod weights;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

pub use crate::intent::Masquerade;
use crate::intent::{
    EndpointSetId, Frontend, FrontendKey, LocalTraffic, NodeIntent, NodePortDestinations, Origin,
    PacketOrigin, ServiceIntent, SocketVerdict,
};
use crate::names::service_port_hash;
use crate::{Intent, IntentDelta};
use svcproxy_core::model::{IpFamily, Protocol, Scheduler, ServicePortName};

/// An address and port a socket names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dest {
    pub family: IpFamily,
    /// `None`: every local address of the node (NodePorts with
    /// `NodePortDestinations::AllLocal`), those in [`Table::local_addrs`].
    pub ip: Option<IpAddr>,
    pub protocol: Protocol,
    pub port: u16,
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = self.protocol.as_str().to_ascii_lowercase();
        match self.ip {
            Some(IpAddr::V4(a)) => write!(f, "{a}:{}/{proto}", self.port),
            Some(IpAddr::V6(a)) => write!(f, "[{a}]:{}/{proto}", self.port),
            None => write!(f, "{}-local:{}/{proto}", self.family, self.port),
        }
    }
}

/// One endpoint list: a set of one service port in one family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListName {
    pub family: IpFamily,
    pub service: ServicePortName,
    pub set: EndpointSetId,
}

impl std::fmt::Display for ListName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = match self.set {
            EndpointSetId::Cluster => "cluster",
            EndpointSetId::Local => "local",
        };
        write!(
            f,
            "{} {}/{} {set}",
            self.family, self.service, self.service.protocol
        )
    }
}

/// One endpoint list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointList {
    pub endpoints: Vec<SocketAddr>,
    /// Clients remember an endpoint of this list (ClientIP affinity, or the flows
    /// of unconnected UDP sockets), so the programs must be able to tell whether
    /// it is still in the list.
    pub remembered: bool,
    /// How the programs choose among them (the service port's).
    pub scheduler: Scheduler,
    /// Maglev's table size (cells), when `scheduler` is Maglev
    /// ([`ServiceIntent::maglev_table_size`]).
    pub maglev_table_size: Option<u32>,
    /// Each slot's endpoint weight, for the weighted schedulers; empty: every
    /// one weighs 1 (a weighted list holds each endpoint in as many slots as
    /// its weight: [`weights::schedule`]).
    pub weights: Vec<u8>,
}

/// What a connection from one origin meets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    Forward(ListName),
    Drop,
    Reject,
    /// Not translated at the socket.
    Pass,
}

/// What a packet that no socket translated meets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PacketRoute {
    /// Never `Pass`.
    pub route: Route,
    /// The connection is masqueraded (besides a hairpin, which always is).
    pub masquerade: bool,
}

/// A service port in one family: whose loadBalancerSourceRanges an entry checks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortName {
    pub family: IpFamily,
    pub service: ServicePortName,
}

impl PortName {
    /// The id the maps know it by.
    pub fn id(&self) -> u64 {
        service_port_hash(self.family, &self.service)
    }
}

impl std::fmt::Display for PortName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.family, self.service, self.service.protocol
        )
    }
}

/// One service address's entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// A connection translated at the socket, from a pod's process.
    pub pod: Route,
    /// ... from one of the host's processes.
    pub host: Route,
    /// ... masqueraded when the host's socket is bound to a source address
    /// ([`ServiceIntent::host_masquerade`]).
    pub host_masquerade: Masquerade,
    /// A packet from one of this node's pods.
    pub packet_pod: PacketRoute,
    /// A packet from anywhere else.
    pub packet_other: PacketRoute,
    /// ClientIP affinity: the service port's id (its hash) and the timeout.
    pub affinity: Option<(u64, u32)>,
    /// loadBalancerSourceRanges: a packet's source must be among the port's
    /// admitted sources ([`Table::firewalls`]) before any route applies.
    pub firewall: Option<PortName>,
}

/// How the packet path tells a packet from one of this node's pods by the
/// interface it arrives on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodInterface {
    Name(String),
    Prefix(String),
}

impl PodInterface {
    pub fn matches(&self, ifname: &str) -> bool {
        match self {
            PodInterface::Name(n) => ifname == n,
            PodInterface::Prefix(p) => ifname.starts_with(p.as_str()),
        }
    }
}

/// Everything the maps hold for one intent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub entries: BTreeMap<Dest, Entry>,
    /// Each list's endpoints, in the intent's order (never empty).
    pub lists: BTreeMap<ListName, EndpointList>,
    /// The node's own addresses answering the `ip: None` entries (loopback left
    /// out); empty when no entry needs them.
    pub local_addrs: BTreeSet<IpAddr>,
    /// The sources each fenced port admits: its loadBalancerSourceRanges and,
    /// with `allowFromNode`, its load-balancer IPs (never empty of meaning: an
    /// empty list admits nobody).
    pub firewalls: BTreeMap<PortName, Vec<IpNet>>,
    /// This node's pods' sources (`--detect-local-mode` ClusterCIDR / NodeCIDR).
    pub pod_cidrs: BTreeSet<IpNet>,
    /// ... or the interfaces their packets arrive on (BridgeInterface,
    /// InterfaceNamePrefix).
    pub pod_interfaces: BTreeSet<PodInterface>,
    /// The packet path's marks, each acted on by one fixed nftables rule
    /// ([`companion_rules`]): masquerade (the intent's), and reject.
    pub masquerade_mark: u32,
    pub reject_mark: u32,
    /// The service address space's guard (the node intent's
    /// `guard_service_ips`): a connection to a cluster IP on a port no service
    /// exposes is refused...
    pub cluster_ips: BTreeMap<IpAddr, usize>,
    /// ... and one to an address of these ServiceCIDRs that is no cluster IP is
    /// dropped. Each cluster IP counts the service ports that have it.
    pub guard_cidrs: BTreeSet<IpNet>,
}

/// The ebpf mode's behaviour where modes differ: NodePorts on loopback are
/// translated at the socket in both families (no `route_localnet`, as the
/// userspace proxy serves them); the service address space is guarded at the
/// socket and on the packet path. The INVALID-drop rule is not on the packet
/// path, and the intent says so.
pub const SEMANTICS: crate::ModeSemantics = crate::ModeSemantics {
    localhost_nodeports: crate::LocalhostNodePorts::Proxy,
    guard_service_ips: true,
    drop_invalid_forwarded: false,
    schedulers: true,
};

/// The name of the eBPF mode's nftables table (fixed rules only).
pub const COMPANION_TABLE: &str = "svcproxy-ebpf";

/// The mark asking the companion rules to reject a packet: the bit above the
/// masquerade mark's (kube-proxy's 0x4000 gives 0x8000, its old drop bit), or
/// the one below when that is the top bit.
pub fn reject_mark(masquerade_mark: u32) -> u32 {
    if masquerade_mark >= 1 << 31 {
        masquerade_mark >> 1
    } else {
        (masquerade_mark << 1).max(1)
    }
}

/// The eBPF mode's fixed nftables rules, the same whatever the services: the
/// packet programs mark, these act. A connection marked for masquerade is
/// masqueraded (the kernel's conntrack owns its source port and turns its
/// replies back before they reach the egress program); a packet marked for
/// reject gets a TCP reset or an ICMP port unreachable, which a tc program
/// cannot send. Both marks together are neither: a packet of a connection
/// svcproxy masquerades itself (the XDP fast path's), whose source the egress
/// program gives, or a reply of a connection the XDP program sent on; the
/// kernel's conntrack does not track them (raw prerouting: their connection's
/// other way is never seen, and a tracked reply would be a new flow for the
/// node's other NAT rules). With `snat_ports` (the ports svcproxy's own masquerade takes, from
/// its first to 65535), the kernel's masquerade keeps out of them. The
/// masquerade mark is left on the packet: the egress program, after
/// postrouting, reads it (a masqueraded UDP flow's replies may come to a
/// NodePort's port, and must be left to the kernel) and clears it. The script
/// replaces the table whole.
pub fn companion_rules(masquerade_mark: u32, reject_mark: u32, snat_ports: Option<u16>) -> String {
    let both = masquerade_mark | reject_mark;
    // A client's port at or above 1024 stays there (the unranged masquerade
    // keeps a privileged port privileged, and never goes as high).
    let ports = match snat_ports {
        Some(first) if first > 1024 => format!(
            "\t\tmeta mark & {both:#x} == {m:#x} meta l4proto {{ tcp, udp }} th sport >= 1024 \
             masquerade to :1024-{}\n",
            first - 1,
            m = masquerade_mark
        ),
        _ => String::new(),
    };
    format!(
        "table inet {t}\n\
         delete table inet {t}\n\
         table inet {t} {{\n\
         \tchain raw-prerouting {{\n\
         \t\ttype filter hook prerouting priority raw; policy accept;\n\
         \t\tmeta mark & {both:#x} == {both:#x} notrack\n\
         \t}}\n\
         \tchain nat-postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         {ports}\
         \t\tmeta mark & {both:#x} == {m:#x} masquerade\n\
         \t}}\n\
         \tchain filter-input {{\n\
         \t\ttype filter hook input priority filter - 5; policy accept;\n\
         \t\tmeta mark & {both:#x} == {r:#x} jump reject-marked\n\
         \t}}\n\
         \tchain filter-forward {{\n\
         \t\ttype filter hook forward priority filter - 5; policy accept;\n\
         \t\tmeta mark & {both:#x} == {r:#x} jump reject-marked\n\
         \t}}\n\
         \tchain reject-marked {{\n\
         \t\tmeta l4proto tcp reject with tcp reset\n\
         \t\treject with icmpx port-unreachable\n\
         \t}}\n\
         }}\n",
        t = COMPANION_TABLE,
        m = masquerade_mark,
        r = reject_mark,
    )
}

/// What [`Table::update`] may have changed: the keys to write again or delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub entries: BTreeSet<Dest>,
    pub lists: BTreeSet<ListName>,
    pub firewalls: BTreeSet<PortName>,
    pub cluster_ips: BTreeSet<IpAddr>,
}

/// The addresses a family's NodePorts answer on (`None`: every local address).
fn nodeport_ips(node: &NodeIntent) -> Vec<Option<IpAddr>> {
    let mut v: Vec<Option<IpAddr>> = match &node.nodeports {
        NodePortDestinations::Ips(ips) => ips.iter().copied().map(Some).collect(),
        NodePortDestinations::AllLocal => vec![None],
    };
    if node.localhost_nodeports {
        v.push(Some(match node.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        }));
    }
    v
}

/// The entries' addresses for frontend `key`.
fn dests(family: IpFamily, key: &FrontendKey, nodeport_ips: &[Option<IpAddr>]) -> Vec<Dest> {
    let (ips, protocol, port) = match *key {
        FrontendKey::Vip { ip, protocol, port } => (vec![Some(ip)], protocol, port),
        FrontendKey::NodePort { protocol, port } => (nodeport_ips.to_vec(), protocol, port),
    };
    ips.into_iter()
        .map(|ip| Dest {
            family,
            ip,
            protocol,
            port,
        })
        .collect()
}

impl Table {
    /// The table for `intent`. `host_addrs` are the node's addresses (as
    /// `ip addr` lists them), read only when a family's NodePorts answer on every
    /// local address.
    pub fn build(intent: &Intent, host_addrs: &[IpAddr]) -> Table {
        let mut t = Table {
            local_addrs: Self::local_addrs(intent, host_addrs),
            ..Table::default()
        };
        for fam in intent.families() {
            let Some(node) = fam.node() else { continue };
            t.masquerade_mark = node.masquerade_mark;
            t.reject_mark = reject_mark(node.masquerade_mark);
            if node.guard_service_ips {
                t.guard_cidrs.extend(node.service_cidrs.iter().copied());
                for svc in fam.services().values() {
                    for ip in svc.cluster_ips() {
                        *t.cluster_ips.entry(ip).or_default() += 1;
                    }
                }
            }
            match &node.local_traffic {
                Some(LocalTraffic::Cidrs(nets)) => t.pod_cidrs.extend(nets.iter().copied()),
                Some(LocalTraffic::Interface(name)) => {
                    t.pod_interfaces
                        .insert(PodInterface::Name(name.as_str().to_string()));
                }
                Some(LocalTraffic::InterfacePrefix(prefix)) => {
                    t.pod_interfaces
                        .insert(PodInterface::Prefix(prefix.as_str().to_string()));
                }
                None => {}
            }
            let ips = nodeport_ips(node);
            // Key order: a service IP's frontend comes before a NodePort's, and
            // takes an address both name (an external IP that is also a NodePort
            // address, on the same port), as the packet modes check service IPs
            // first.
            for (svc, frontend) in fam.frontends() {
                let entry = t.entry(svc, frontend);
                for dest in dests(svc.family, &frontend.key, &ips) {
                    t.entries.entry(dest).or_insert_with(|| entry.clone());
                }
            }
        }
        t
    }

    /// Brings the table built for the intent before `delta` to `intent`, doing
    /// only the work `delta` names (the whole table when a family's node-wide part
    /// changed); says which entries and lists may differ, for the writer.
    ///
    /// Touched: the addresses of every frontend of a changed service port (before
    /// and after) and of every frontend whose owner changed, each given again to
    /// the frontend that takes it now; and the lists of those ports and of the
    /// frontends' previous and new owners, named again from the frontends each
    /// owns now (a list no frontend names any more goes).
    pub fn update(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        host_addrs: &[IpAddr],
    ) -> Option<Changes> {
        if delta.families().any(|d| d.node_changed) {
            *self = Table::build(intent, host_addrs);
            return None;
        }
        self.local_addrs = Self::local_addrs(intent, host_addrs);
        let mut changes = Changes::default();
        for fam in intent.families() {
            let Some(node) = fam.node() else { continue };
            let family = fam.family();
            let d = delta.family(family);
            let ips = nodeport_ips(node);
            let mut keys: BTreeSet<FrontendKey> = BTreeSet::new();
            let mut ports: BTreeSet<ServicePortName> = BTreeSet::new();
            for c in &d.frontends {
                keys.insert(c.key);
                for svc in c.before.iter().chain(&c.after) {
                    ports.insert(svc.name.clone());
                }
            }
            for c in &d.services {
                ports.insert(c.name.clone());
                for svc in c.before.iter().chain(&c.after) {
                    keys.extend(svc.frontends.iter().map(|f| f.key));
                }
                if node.guard_service_ips {
                    for ip in c.before.iter().flat_map(|s| s.cluster_ips()) {
                        if let Some(n) = self.cluster_ips.get_mut(&ip) {
                            *n -= 1;
                            if *n == 0 {
                                self.cluster_ips.remove(&ip);
                            }
                        }
                        changes.cluster_ips.insert(ip);
                    }
                    for ip in c.after.iter().flat_map(|s| s.cluster_ips()) {
                        *self.cluster_ips.entry(ip).or_default() += 1;
                        changes.cluster_ips.insert(ip);
                    }
                }
            }
            // The lists of those ports, from what each owns now.
            for name in &ports {
                let port = PortName {
                    family,
                    service: name.clone(),
                };
                self.firewalls.remove(&port);
                changes.firewalls.insert(port);
                for set in [EndpointSetId::Cluster, EndpointSetId::Local] {
                    let list = ListName {
                        family,
                        service: name.clone(),
                        set,
                    };
                    self.lists.remove(&list);
                    changes.lists.insert(list);
                }
                if let Some(svc) = fam.service(name) {
                    for f in svc.frontends.iter() {
                        if fam.owner(&f.key).is_some_and(|o| o.name == svc.name) {
                            self.entry(svc, f);
                        }
                    }
                }
            }
            // The addresses, each to the frontend that takes it now.
            let dests: BTreeSet<Dest> = keys.iter().flat_map(|k| dests(family, k, &ips)).collect();
            for dest in dests {
                self.entries.remove(&dest);
                changes.entries.insert(dest);
                let vip = dest.ip.map(|ip| FrontendKey::Vip {
                    ip,
                    protocol: dest.protocol,
                    port: dest.port,
                });
                let node_port = ips.contains(&dest.ip).then_some(FrontendKey::NodePort {
                    protocol: dest.protocol,
                    port: dest.port,
                });
                if let Some((svc, frontend)) = vip
                    .into_iter()
                    .chain(node_port)
                    .find_map(|k| fam.frontend(&k))
                {
                    let entry = self.entry(svc, frontend);
                    self.entries.insert(dest, entry);
                }
            }
        }
        Some(changes)
    }

    fn local_addrs(intent: &Intent, host_addrs: &[IpAddr]) -> BTreeSet<IpAddr> {
        let mut out = BTreeSet::new();
        for fam in intent.families() {
            let Some(node) = fam.node() else { continue };
            if nodeport_ips(node).contains(&None) {
                out.extend(
                    host_addrs
                        .iter()
                        .filter(|ip| IpFamily::of(ip) == fam.family() && !ip.is_loopback()),
                );
            }
        }
        out
    }

    /// The entry of one frontend, adding the lists its routes name and the
    /// sources its firewall admits.
    fn entry(&mut self, svc: &ServiceIntent, frontend: &Frontend) -> Entry {
        let mut packet = |origin| {
            let v = svc.packet_verdict(frontend, origin);
            PacketRoute {
                route: self.route(svc, v.verdict),
                masquerade: v.masquerade,
            }
        };
        let packet_pod = packet(PacketOrigin::LocalPod);
        let packet_other = packet(PacketOrigin::Elsewhere);
        let firewall = match svc.firewall.as_deref() {
            Some(fw) if frontend.firewall => {
                let port = PortName {
                    family: svc.family,
                    service: svc.name.clone(),
                };
                let sources = fw
                    .ranges
                    .iter()
                    .copied()
                    .chain(fw.lb_sources.iter().map(|ip| IpNet::from(*ip)))
                    .collect();
                self.firewalls.insert(port.clone(), sources);
                Some(port)
            }
            _ => None,
        };
        Entry {
            pod: self.route(svc, svc.socket_verdict(frontend, Origin::Pod)),
            host: self.route(svc, svc.socket_verdict(frontend, Origin::Host)),
            host_masquerade: svc.host_masquerade(frontend),
            packet_pod,
            packet_other,
            affinity: svc
                .affinity_timeout
                .map(|secs| (service_port_hash(svc.family, &svc.name), secs)),
            firewall,
        }
    }

    fn route(&mut self, svc: &ServiceIntent, verdict: SocketVerdict) -> Route {
        match verdict {
            SocketVerdict::Forward(set) => match svc.set(set) {
                Some(mut endpoints) => {
                    let name = ListName {
                        family: svc.family,
                        service: svc.name.clone(),
                        set,
                    };
                    let mut weights = svc.set_weights(set);
                    // The counting schedulers weigh each endpoint's one slot by the
                    // weight it carries; the others choose among slots, so a
                    // weighted list holds each endpoint as often as its weight.
                    if !weights.is_empty() && !svc.scheduler.counts_connections() {
                        let slots = weights::schedule(&weights);
                        endpoints = slots.iter().map(|&i| endpoints[usize::from(i)]).collect();
                        weights = slots.iter().map(|&i| weights[usize::from(i)]).collect();
                    }
                    let list = EndpointList {
                        endpoints,
                        remembered: svc.affinity_timeout.is_some() || svc.protocol == Protocol::Udp,
                        scheduler: svc.scheduler,
                        maglev_table_size: svc.maglev_table_size,
                        weights,
                    };
                    self.lists.insert(name.clone(), list);
                    Route::Forward(name)
                }
                // Not reached: the intent forwards only to a set with members.
                None => Route::Reject,
            },
            SocketVerdict::Drop => Route::Drop,
            SocketVerdict::Reject => Route::Reject,
            SocketVerdict::Untranslated => Route::Pass,
        }
    }

    /// The table as text, one line per entry, list and local address, sorted:
    /// `svcproxy render`'s output and the golden files'.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let route = |r: &Route| match r {
            Route::Forward(l) => format!("forward {l}"),
            Route::Drop => "drop".to_string(),
            Route::Reject => "reject".to_string(),
            Route::Pass => "pass".to_string(),
        };
        let packet = |p: &PacketRoute| {
            let masq = if p.masquerade { " masquerade" } else { "" };
            format!("{}{masq}", route(&p.route))
        };
        for (dest, e) in &self.entries {
            let host_masq = match (&e.host, e.host_masquerade) {
                (Route::Forward(_), Masquerade::Always) => " bound-masquerade",
                (Route::Forward(_), Masquerade::UnlessFromLocalPod) => {
                    " bound-masquerade-unless-pod"
                }
                _ => "",
            };
            let _ = write!(
                out,
                "service {dest} pod: {} host: {}{host_masq} packet-pod: {} packet-other: {}",
                route(&e.pod),
                route(&e.host),
                packet(&e.packet_pod),
                packet(&e.packet_other),
            );
            if let Some((_, secs)) = e.affinity {
                let _ = write!(out, " affinity: {secs}s");
            }
            if let Some(fw) = &e.firewall {
                let _ = write!(out, " source-ranges: {fw}");
            }
            out.push('\n');
        }
        for (port, nets) in &self.firewalls {
            let nets: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
            let _ = writeln!(out, "source-ranges {port}: {}", nets.join(" "));
        }
        for net in &self.pod_cidrs {
            let _ = writeln!(out, "pod-cidr {net}");
        }
        if self.masquerade_mark != 0 {
            let _ = writeln!(
                out,
                "marks masquerade {:#x} reject {:#x}",
                self.masquerade_mark, self.reject_mark
            );
        }
        for net in &self.guard_cidrs {
            let _ = writeln!(out, "guard-cidr {net}");
        }
        for ip in self.cluster_ips.keys() {
            let _ = writeln!(out, "cluster-ip {ip}");
        }
        for i in &self.pod_interfaces {
            match i {
                PodInterface::Name(n) => {
                    let _ = writeln!(out, "pod-interface {n}");
                }
                PodInterface::Prefix(p) => {
                    let _ = writeln!(out, "pod-interface {p}*");
                }
            }
        }
        for (name, list) in &self.lists {
            let eps: Vec<String> = list
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, a)| match list.weights.get(i) {
                    Some(w) => format!("{a}*{w}"),
                    None => a.to_string(),
                })
                .collect();
            let remembered = if list.remembered { " (remembered)" } else { "" };
            let scheduler = match (list.scheduler, list.maglev_table_size) {
                (Scheduler::Random, _) => String::new(),
                (s, Some(cells)) => format!(" [{s} {cells}]"),
                (s, None) => format!(" [{s}]"),
            };
            let _ = writeln!(
                out,
                "endpoints {name}{remembered}{scheduler}: {}",
                eps.join(" ")
            );
        }
        for ip in &self.local_addrs {
            let _ = writeln!(out, "local-address {ip}");
        }
        out
    }
}
