//! The backend-neutral intent: per IP family, every frontend this node serves and
//! what happens to a connection to it, plus the node-wide parts. Every decision
//! that is not syntax is made here, once per sync, before any data plane sees it.
//!
//! Entry point: [`IntentBuilder::update`], which brings the [`Intent`] to a new pair
//! of snapshots and returns the [`IntentDelta`] partial syncs consume. It decides
//! again only the service ports whose view changed (a view that is the same `Arc`
//! as last time, and not named changed, keeps its [`ServiceIntent`]), and it
//! resolves contested destinations: when several service ports claim one frontend,
//! the first by name gets it, deterministically, and the others are reported as a
//! [`Conflict`]. [`build_intent`] computes an intent from scratch.
//!
//! Pure: no I/O, no clock, no kernel, no backend syntax.

mod endpoints;
mod node;
mod service;
mod text;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use smallvec::SmallVec;
use svcproxy_core::chunked::ChunkedMap;
use svcproxy_core::model::{IpFamily, ServicePortName};
use svcproxy_core::snapshot::{NodeSnapshot, ServicePortView};

use crate::config::PlanConfig;

pub use endpoints::Endpoints;
pub use node::{
    family_nets, nodeport_destinations, LocalTraffic, NodeIntent, NodePortDestinations,
};
pub use service::{
    Action, Disposition, EndpointSetId, ExternalRoute, Firewall, Frontend, FrontendKey,
    FrontendKind, InternalRoute, Masquerade, Origin, PacketOrigin, PacketVerdict, ServiceIntent,
    SocketVerdict,
};
pub use text::describe;

/// One service port's claim on a frontend. Claims order by rank, then by name: a
/// service's cluster IP always beats another service's external or load-balancer IP
/// at the same address (so no Service can take over the cluster's own addresses by
/// listing them), and among claims of one rank the first port by name wins.
/// A claim holds its port's intent (the one in the family's map), not a copy of
/// its name: one frontend or more per port, at tens of thousands of ports.
#[derive(Clone, Debug)]
struct Claim {
    /// 0: a cluster IP; 1: anything else.
    rank: u8,
    svc: Arc<ServiceIntent>,
}

impl Claim {
    fn new(kind: FrontendKind, svc: &Arc<ServiceIntent>) -> Claim {
        Claim {
            rank: u8::from(kind != FrontendKind::ClusterIp),
            svc: svc.clone(),
        }
    }

    fn order(&self) -> (u8, &ServicePortName) {
        (self.rank, &self.svc.name)
    }
}

impl PartialEq for Claim {
    fn eq(&self, other: &Self) -> bool {
        self.order() == other.order()
    }
}

impl Eq for Claim {}

impl PartialOrd for Claim {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Claim {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order().cmp(&other.order())
    }
}

/// Two or more service ports claiming one frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub family: IpFamily,
    /// The destination, e.g. `198.19.255.1:80/TCP` or `nodePort 30080/TCP`.
    pub destination: String,
    /// The port that gets the destination (a cluster IP first, then the first by name).
    pub kept: ServicePortName,
    /// The ports whose claim is ignored.
    pub ignored: Vec<ServicePortName>,
}

/// One family's intent.
#[derive(Clone, Debug)]
pub struct FamilyIntent {
    family: IpFamily,
    /// `None` while the family is not programmed (then there are no services).
    node: Option<Arc<NodeIntent>>,
    services: BTreeMap<ServicePortName, Arc<ServiceIntent>>,
    /// Claimants of each frontend, sorted by [`Claim`]; the first wins. Almost
    /// every frontend has one: it is held inline.
    owners: BTreeMap<FrontendKey, SmallVec<[Claim; 1]>>,
    /// Cluster IPs, with the number of service ports using each.
    cluster_ips: BTreeMap<IpAddr, u32>,
    conflicted: BTreeSet<FrontendKey>,
}

impl FamilyIntent {
    fn new(family: IpFamily) -> Self {
        FamilyIntent {
            family,
            node: None,
            services: BTreeMap::new(),
            owners: BTreeMap::new(),
            cluster_ips: BTreeMap::new(),
            conflicted: BTreeSet::new(),
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The node-wide part; `None` when this family is not programmed.
    pub fn node(&self) -> Option<&Arc<NodeIntent>> {
        self.node.as_ref()
    }

    /// Every service port, by name (conflict losers included: they keep the
    /// frontends they do not contest).
    pub fn services(&self) -> &BTreeMap<ServicePortName, Arc<ServiceIntent>> {
        &self.services
    }

    pub fn service(&self, name: &ServicePortName) -> Option<&Arc<ServiceIntent>> {
        self.services.get(name)
    }

    /// The port that owns `key`, if any.
    pub fn owner(&self, key: &FrontendKey) -> Option<&Arc<ServiceIntent>> {
        self.owners.get(key).and_then(|o| o.first()).map(|c| &c.svc)
    }

    /// The frontend at `key` with the port that owns it.
    pub fn frontend(&self, key: &FrontendKey) -> Option<(&Arc<ServiceIntent>, &Frontend)> {
        let svc = self.owner(key)?;
        svc.frontend(key).map(|f| (svc, f))
    }

    /// Every frontend with its owner, in key order.
    pub fn frontends(&self) -> impl Iterator<Item = (&Arc<ServiceIntent>, &Frontend)> {
        self.owners.keys().filter_map(|k| self.frontend(k))
    }

    /// Every cluster IP of the family's service ports, sorted: traffic to one of
    /// them that matches no frontend is rejected.
    pub fn cluster_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.cluster_ips.keys().copied()
    }

    pub fn conflicts(&self) -> Vec<Conflict> {
        self.conflicted
            .iter()
            .filter_map(|key| {
                let owners = self.owners.get(key)?;
                Some(Conflict {
                    family: self.family,
                    destination: key.to_string(),
                    kept: owners[0].svc.name.clone(),
                    ignored: owners[1..].iter().map(|c| c.svc.name.clone()).collect(),
                })
            })
            .collect()
    }

    /// Takes back what service `name`'s former intent claimed: its frontends and
    /// its cluster IPs.
    fn release(&mut self, name: &ServicePortName, old: &ServiceIntent) {
        for f in &old.frontends {
            if let Some(owners) = self.owners.get_mut(&f.key) {
                owners.retain(|o| o.svc.name != *name);
                if owners.is_empty() {
                    self.owners.remove(&f.key);
                }
            }
        }
        for ip in old.cluster_ips() {
            if let Some(n) = self.cluster_ips.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.cluster_ips.remove(&ip);
                }
            }
        }
    }

    /// Records what a service intent claims: its frontends (in claim order) and
    /// its cluster IPs.
    fn claim(&mut self, new: &Arc<ServiceIntent>) {
        for f in &new.frontends {
            let owners = self.owners.entry(f.key).or_default();
            let claim = Claim::new(f.kind, new);
            if let Err(i) = owners.binary_search(&claim) {
                owners.insert(i, claim);
            }
        }
        for ip in new.cluster_ips() {
            *self.cluster_ips.entry(ip).or_default() += 1;
        }
    }

    /// Moves this family to `node` and the given service intents (`None`: gone),
    /// recording what changed in `delta`.
    fn apply(
        &mut self,
        node: Option<Arc<NodeIntent>>,
        work: Vec<(ServicePortName, Option<Arc<ServiceIntent>>)>,
        delta: &mut FamilyDelta,
    ) {
        delta.node_changed |= self.node != node;
        self.node = node;
        if work.is_empty() {
            return;
        }
        let rebuilt = work.len();
        let mut touched: BTreeSet<FrontendKey> = BTreeSet::new();
        let mut touched_ips: BTreeSet<IpAddr> = BTreeSet::new();
        for (name, new) in &work {
            for svc in self.services.get(name).into_iter().chain(new.as_ref()) {
                touched.extend(svc.frontends.iter().map(|f| f.key));
                touched_ips.extend(svc.cluster_ips());
            }
        }
        let before: Vec<Option<Arc<ServiceIntent>>> =
            touched.iter().map(|k| self.owner(k).cloned()).collect();
        let ips_before: Vec<bool> = touched_ips
            .iter()
            .map(|ip| self.cluster_ips.contains_key(ip))
            .collect();

        for (name, new) in work {
            let old = match &new {
                Some(svc) => self.services.insert(name.clone(), svc.clone()),
                None => self.services.remove(&name),
            };
            if let Some(old) = &old {
                self.release(&name, old);
            }
            if let Some(new) = &new {
                self.claim(new);
            }
            if old != new {
                delta.services.push(ServiceChange {
                    name,
                    before: old,
                    after: new,
                });
            }
        }

        for (key, before) in touched.into_iter().zip(before) {
            if self.owners.get(&key).is_some_and(|o| o.len() > 1) {
                self.conflicted.insert(key);
            } else {
                self.conflicted.remove(&key);
            }
            let after = self.owner(&key).cloned();
            let same = match (&before, &after) {
                (Some(b), Some(a)) => Arc::ptr_eq(b, a) || b == a,
                (None, None) => true,
                _ => false,
            };
            if !same {
                delta.frontends.push(FrontendChange { key, before, after });
            }
        }
        for (ip, was) in touched_ips.into_iter().zip(ips_before) {
            match (was, self.cluster_ips.contains_key(&ip)) {
                (true, false) => delta.cluster_ips_removed.push(ip),
                (false, true) => delta.cluster_ips_added.push(ip),
                _ => {}
            }
        }
        if rebuilt > self.services.len() / 2 {
            // Most of the family was (re)built, as on the first sync: maps filled
            // one insert at a time keep their B-tree nodes about half full; built
            // from their sorted entries they are full, for a third less memory.
            self.services = std::mem::take(&mut self.services).into_iter().collect();
            self.owners = std::mem::take(&mut self.owners).into_iter().collect();
            self.cluster_ips = std::mem::take(&mut self.cluster_ips).into_iter().collect();
        }
    }
}

/// The intent for both families.
#[derive(Clone, Debug)]
pub struct Intent {
    families: [FamilyIntent; 2],
    generation: u64,
}

impl Default for Intent {
    fn default() -> Self {
        Intent {
            families: [
                FamilyIntent::new(IpFamily::V4),
                FamilyIntent::new(IpFamily::V6),
            ],
            generation: 0,
        }
    }
}

impl Intent {
    pub fn family(&self, family: IpFamily) -> &FamilyIntent {
        match family {
            IpFamily::V4 => &self.families[0],
            IpFamily::V6 => &self.families[1],
        }
    }

    /// IPv4, then IPv6.
    pub fn families(&self) -> impl Iterator<Item = &FamilyIntent> {
        self.families.iter()
    }

    /// Counts updates: a delta applies to the intent of its `from` generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every contested frontend, both families.
    pub fn conflicts(&self) -> Vec<Conflict> {
        self.families.iter().flat_map(|f| f.conflicts()).collect()
    }

    /// A delta from nothing to this intent: everything added.
    pub fn delta_from_empty(&self) -> IntentDelta {
        let mut delta = IntentDelta::new(0, self.generation);
        for (fam, d) in self.families.iter().zip(&mut delta.families) {
            d.node_changed = fam.node.is_some();
            d.services = fam
                .services
                .iter()
                .map(|(name, svc)| ServiceChange {
                    name: name.clone(),
                    before: None,
                    after: Some(svc.clone()),
                })
                .collect();
            d.frontends = fam
                .owners
                .keys()
                .map(|key| FrontendChange {
                    key: *key,
                    before: None,
                    after: fam.owner(key).cloned(),
                })
                .collect();
            d.cluster_ips_added = fam.cluster_ips().collect();
        }
        delta
    }
}

/// One service port whose intent changed.
#[derive(Clone, Debug)]
pub struct ServiceChange {
    pub name: ServicePortName,
    pub before: Option<Arc<ServiceIntent>>,
    pub after: Option<Arc<ServiceIntent>>,
}

/// One frontend whose owner, or whose owner's intent, changed.
#[derive(Clone, Debug)]
pub struct FrontendChange {
    pub key: FrontendKey,
    pub before: Option<Arc<ServiceIntent>>,
    pub after: Option<Arc<ServiceIntent>>,
}

/// What changed in one family between two intents.
#[derive(Clone, Debug)]
pub struct FamilyDelta {
    pub family: IpFamily,
    /// The node-wide part changed (or the family was switched on or off): a data
    /// plane should rewrite the family whole.
    pub node_changed: bool,
    /// Service ports added, changed or removed, by name.
    pub services: Vec<ServiceChange>,
    /// Frontends whose owner or action changed, by key.
    pub frontends: Vec<FrontendChange>,
    pub cluster_ips_added: Vec<IpAddr>,
    pub cluster_ips_removed: Vec<IpAddr>,
}

impl FamilyDelta {
    fn new(family: IpFamily) -> Self {
        FamilyDelta {
            family,
            node_changed: false,
            services: Vec::new(),
            frontends: Vec::new(),
            cluster_ips_added: Vec::new(),
            cluster_ips_removed: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.node_changed
            && self.services.is_empty()
            && self.frontends.is_empty()
            && self.cluster_ips_added.is_empty()
            && self.cluster_ips_removed.is_empty()
    }
}

/// What changed between the intent of generation `from` and that of `to`.
#[derive(Clone, Debug)]
pub struct IntentDelta {
    pub from: u64,
    pub to: u64,
    families: [FamilyDelta; 2],
    /// Service intents decided again for this update (both families).
    pub rebuilt: usize,
}

impl IntentDelta {
    /// Nothing changed yet between generations `from` and `to`.
    fn new(from: u64, to: u64) -> Self {
        IntentDelta {
            from,
            to,
            families: [
                FamilyDelta::new(IpFamily::V4),
                FamilyDelta::new(IpFamily::V6),
            ],
            rebuilt: 0,
        }
    }

    pub fn family(&self, family: IpFamily) -> &FamilyDelta {
        match family {
            IpFamily::V4 => &self.families[0],
            IpFamily::V6 => &self.families[1],
        }
    }

    pub fn families(&self) -> impl Iterator<Item = &FamilyDelta> {
        self.families.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.families.iter().all(FamilyDelta::is_empty)
    }
}

/// Keeps the intent (whose service intents hold the views they were decided
/// from), so that an update decides again only what changed.
#[derive(Default)]
pub struct IntentBuilder {
    intent: Intent,
    /// Per family (v4, v6), the ports of the snapshot last decided from: each
    /// service intent's view is its entry here. The next snapshot is compared with
    /// it skipping the chunks they share ([`ChunkedMap::diff`]).
    last: [ChunkedMap<ServicePortName, Arc<ServicePortView>>; 2],
}

impl IntentBuilder {
    pub fn new() -> Self {
        IntentBuilder::default()
    }

    pub fn intent(&self) -> &Intent {
        &self.intent
    }

    /// Brings the intent to `v4` and `v6` under `cfg`, returning what changed.
    ///
    /// `changed` names the service ports the caller knows changed; ports whose view
    /// is not the same `Arc` as last time are decided again too, so a missed name
    /// costs time, never correctness.
    pub fn update(
        &mut self,
        v4: &NodeSnapshot,
        v6: &NodeSnapshot,
        cfg: &PlanConfig,
        changed: &BTreeSet<ServicePortName>,
    ) -> IntentDelta {
        let from = self.intent.generation;
        self.intent.generation += 1;
        let mut delta = IntentDelta::new(from, self.intent.generation);
        for ((fam, last), (snap, d)) in self
            .intent
            .families
            .iter_mut()
            .zip(&mut self.last)
            .zip([v4, v6].into_iter().zip(&mut delta.families))
        {
            let node = cfg
                .family_enabled(fam.family)
                .then(|| NodeIntent::new(fam.family, cfg, snap));
            let node_changed = fam.node.as_deref() != node.as_ref();
            let node = match node {
                Some(n) if node_changed => Some(Arc::new(n)),
                Some(_) => fam.node.clone(),
                None => None,
            };
            let work = Self::work(
                &fam.services,
                last,
                snap,
                node.as_deref(),
                node_changed,
                changed,
            );
            delta.rebuilt += work.iter().filter(|(_, s)| s.is_some()).count();
            fam.apply(node, work, d);
        }
        delta
    }

    /// The service ports to decide again: what differs between the snapshot last
    /// decided from (`last`, whose views the intents hold) and this one, or, when
    /// the node changed, every port; and the ports named `changed`. Leaves `last`
    /// at this snapshot's ports.
    fn work(
        services: &BTreeMap<ServicePortName, Arc<ServiceIntent>>,
        last: &mut ChunkedMap<ServicePortName, Arc<ServicePortView>>,
        snap: &NodeSnapshot,
        node: Option<&NodeIntent>,
        node_changed: bool,
        changed: &BTreeSet<ServicePortName>,
    ) -> Vec<(ServicePortName, Option<Arc<ServiceIntent>>)> {
        let empty = ChunkedMap::new();
        let ports = if node.is_some() {
            &snap.service_ports
        } else {
            &empty
        };
        let mut todo: Vec<(ServicePortName, Option<&Arc<ServicePortView>>)> = Vec::new();
        if node_changed {
            // Every port, and every intent without one: a merge walk, both by name.
            let mut old = services.iter().peekable();
            for (name, view) in ports {
                while let Some((o, _)) = old.next_if(|(o, _)| *o < name) {
                    todo.push((o.clone(), None));
                }
                old.next_if(|(o, _)| *o == name);
                todo.push((name.clone(), Some(view)));
            }
            for (o, _) in old {
                todo.push((o.clone(), None));
            }
        } else {
            // The intents' views are `last`'s: only what differs from it.
            for (name, _, view) in ports.diff(last, |a, b| !Arc::ptr_eq(a, b)) {
                todo.push((name.clone(), view));
            }
        }
        // The ports named changed whose view is the same `Arc` (with a changed
        // node, the walk took every port already). Looked up one by one: between
        // full syncs `changed` names a few ports, and looking every port of the
        // walk up in it compared names as strings tens of thousands of times.
        let before = todo.len();
        if !node_changed {
            for name in changed {
                if let (Some(view), Some(svc)) = (ports.get(name), services.get(name)) {
                    if Arc::ptr_eq(&svc.source.0, view) {
                        todo.push((name.clone(), Some(view)));
                    }
                }
            }
        }
        if todo.len() > before {
            // By name, as the walk made them.
            todo.sort_by(|a, b| a.0.cmp(&b.0));
        }
        let work = todo
            .into_iter()
            .map(|(name, view)| {
                let svc = view.map(|view| {
                    let node = node.expect("views only when programmed");
                    Arc::new(ServiceIntent::build(&name, view, node))
                });
                (name, svc)
            })
            .collect();
        *last = ports.clone();
        work
    }
}

/// The intent for these snapshots, from scratch.
pub fn build_intent(v4: &NodeSnapshot, v6: &NodeSnapshot, cfg: &PlanConfig) -> Intent {
    let mut builder = IntentBuilder::new();
    builder.update(v4, v6, cfg, &BTreeSet::new());
    builder.intent
}
