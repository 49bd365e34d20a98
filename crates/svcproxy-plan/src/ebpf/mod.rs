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
            for (svc, frontend) in fam.frontends() {
                t.add_frontend(svc, frontend, &ips);
            }
        }
        t
    }

    /// Brings the table built for the intent before `delta` to `intent`, doing
    /// only the work `delta` names (the whole table when a family's node-wide part
    /// changed); says which entries and lists may differ, for the writer.
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
            let mut keys: BTreeSet<FrontendKey> = d.frontends.iter().map(|c| c.key).collect();
            for c in &d.services {
                for svc in c.before.iter().chain(&c.after) {
                    keys.extend(svc.frontends.iter().map(|f| f.key));
                }
                for set in [EndpointSetId::Cluster, EndpointSetId::Local] {
                    let name = ListName {
                        family,
                        service: c.name.clone(),
                        set,
                    };
                    self.lists.remove(&name);
                    changes.lists.insert(name);
                }
            }
            for key in &keys {
                for dest in dests(family, key, &ips) {
                    self.entries.remove(&dest);
                    changes.entries.insert(dest);
                }
                if let Some((svc, frontend)) = fam.frontend(key) {
                    for name in self.add_frontend(svc, frontend, &ips) {
                        changes.lists.insert(name);
                    }
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

    /// Adds the entries of one frontend and the lists they name; returns those
    /// lists' names.
    fn add_frontend(
        &mut self,
        svc: &ServiceIntent,
        frontend: &Frontend,
        nodeport_ips: &[Option<IpAddr>],
    ) -> Vec<ListName> {
        let mut named = Vec::new();
        let mut route = |origin| {
            let r = self.route(svc, svc.socket_verdict(frontend, origin));
            if let Route::Forward(name) = &r {
                named.push(name.clone());
            }
            r
        };
        let entry = Entry {
            pod: route(Origin::Pod),
            host: route(Origin::Host),
            affinity: svc
                .affinity_timeout
                .map(|secs| (service_port_hash(svc.family, &svc.name), secs)),
        };
        for dest in dests(svc.family, &frontend.key, nodeport_ips) {
            self.entries.insert(dest, entry.clone());
        }
        named
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
