//! The eBPF mode's translation: what its maps must hold for an intent, as plain
//! values. One entry per service address a socket can name, with the route a
//! pod's and the host's connection take ([`ServiceIntent::socket_verdict`]), and
//! the endpoint lists those routes name. Decides nothing; the kernel side
//! (`svcproxy_dataplane::ebpf`) gives the lists their ids and writes the
//! differences.
//!
//! Entry point: [`Table::build`]; [`Table::render`] is `svcproxy render`'s text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::intent::{
    EndpointSetId, Frontend, FrontendKey, NodeIntent, NodePortDestinations, Origin, ServiceIntent,
    SocketVerdict,
};
use crate::names::service_port_hash;
use crate::{Intent, IntentDelta};
use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};

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

/// One service address's entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub pod: Route,
    pub host: Route,
    /// ClientIP affinity: the service port's id (its hash) and the timeout.
    pub affinity: Option<(u64, u32)>,
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
}

/// What [`Table::update`] may have changed: the keys to write again or delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub entries: BTreeSet<Dest>,
    pub lists: BTreeSet<ListName>,
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
            }
            // The lists of those ports, from what each owns now.
            for name in &ports {
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

    /// The entry of one frontend, adding the lists its routes name.
    fn entry(&mut self, svc: &ServiceIntent, frontend: &Frontend) -> Entry {
        Entry {
            pod: self.route(svc, svc.socket_verdict(frontend, Origin::Pod)),
            host: self.route(svc, svc.socket_verdict(frontend, Origin::Host)),
            affinity: svc
                .affinity_timeout
                .map(|secs| (service_port_hash(svc.family, &svc.name), secs)),
        }
    }

    fn route(&mut self, svc: &ServiceIntent, verdict: SocketVerdict) -> Route {
        match verdict {
            SocketVerdict::Forward(set) => match svc.set(set) {
                Some(endpoints) => {
                    let name = ListName {
                        family: svc.family,
                        service: svc.name.clone(),
                        set,
                    };
                    let list = EndpointList {
                        endpoints,
                        remembered: svc.affinity_timeout.is_some() || svc.protocol == Protocol::Udp,
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
        for (dest, e) in &self.entries {
            let _ = write!(
                out,
                "service {dest} pod: {} host: {}",
                route(&e.pod),
                route(&e.host)
            );
            if let Some((_, secs)) = e.affinity {
                let _ = write!(out, " affinity: {secs}s");
            }
            out.push('\n');
        }
        for (name, list) in &self.lists {
            let eps: Vec<String> = list.endpoints.iter().map(|a| a.to_string()).collect();
            let remembered = if list.remembered { " (remembered)" } else { "" };
            let _ = writeln!(out, "endpoints {name}{remembered}: {}", eps.join(" "));
        }
        for ip in &self.local_addrs {
            let _ = writeln!(out, "local-address {ip}");
        }
        out
    }
}
