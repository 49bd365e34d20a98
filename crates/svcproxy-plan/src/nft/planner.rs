//! The incremental nftables planner: the intent and its delta in, one
//! transaction out (typed statements, an `nft -f` script, or both), with the
//! translated state kept in memory so that a change to one service costs
//! statements about that service only.
//!
//! Entry point: [`Planner::plan_into`] (or [`Planner::plan`]), then
//! [`Planner::commit`] once the kernel accepted the transaction, or
//! [`Planner::abandon`] when it did not.
//!
//! State per family: the node intent the skeleton was written from, and per service
//! port its [`Fragment`] (the intent and its objects' hashed names). Map elements
//! come from the intent's frontends: only each frontend's owner puts elements in
//! the maps, so a conflict can never make `nft` fail.
//!
//! Three kinds of plan, each applied as one atomic transaction (one nf_tables
//! batch over netlink from its typed statements, [`Planner::plan_into`], or one
//! `nft -f` of its script, as [`Output`] asks):
//! - [`PlanKind::Recreate`] when the kernel's state is unknown (first sync, after a
//!   failed or unconfirmed apply): `add table` + `delete table` + the whole table.
//! - [`PlanKind::Resync`] for a requested full sync, when the shared skeleton
//!   changed, or when the delta does not follow the last planned intent, while the kernel is
//!   known to hold the last committed plan: flush every rule and every shared set
//!   and map, delete objects no longer wanted, then add the whole table again.
//!   Unlike Recreate it keeps the session-affinity sets' contents.
//! - [`PlanKind::Partial`]: only the objects and elements of changed service ports
//!   and frontends. Order within the script: declare new chains and sets; rewrite
//!   changed chains; delete, then add, map elements; flush and delete stale chains;
//!   delete stale sets. A stale chain is therefore unreferenced by the time it is
//!   deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use svcproxy_core::model::{IpFamily, Protocol, ServicePortName};

use crate::intent::{
    Conflict, FamilyDelta, FamilyIntent, FrontendKey, Intent, IntentDelta, LocalTraffic,
    NodeIntent, NodePortDestinations, ServiceIntent,
};
use crate::names::service_port_hash;

use super::base::{
    base_ruleset, endpoint_map_decl, loopback, CLUSTER_IPS_SET, HAIRPIN_SET, NODEPORT_IPS_SET,
};
use super::elements::{concat, concat_text, Atom, ElemOp, ElemValue};
use super::ruleset::{
    family_keyword, stmt, write_map, write_table_close, write_table_open, Chain, Map, Ruleset, Set,
    TABLE_NAME,
};
use super::service::{
    elems, key_atoms, key_text, CapturePorts, Detect, Elem, Fragment, POD_CIDRS_SET,
};
use super::slots::Slots;
use super::typed::{disjoint_prefixes, Action as RuleAction, Addr, Match, Op, TypedRule};
use crate::names::sanitize_comment;

/// What kind of transaction a [`Plan`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanKind {
    /// Delete and re-create the tables.
    Recreate,
    /// Replace the tables' contents in place (affinity state survives).
    Resync,
    /// Only what changed since the last committed plan.
    Partial,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// Service ports programmed, both families.
    pub service_ports: usize,
    /// Service port intents decided again for this plan.
    pub replanned: usize,
    /// Per-service chains in the desired state.
    pub chains: usize,
    /// Chains the script adds or rewrites (every chain for a full plan).
    pub chains_written: usize,
    /// Chains the script deletes.
    pub chains_deleted: usize,
    /// Map and set elements the script adds and deletes (partial plans).
    pub elements_added: usize,
    pub elements_deleted: usize,
}

/// One planned transaction.
#[derive(Clone, Debug)]
pub struct Plan {
    pub kind: PlanKind,
    /// The `nft -f` script. Empty for a partial plan with nothing to do (which needs
    /// no apply, but still a [`Planner::commit`]).
    pub script: String,
    /// When every statement of a partial plan has a typed form (elements, the set
    /// chains of most service ports: see [`super::typed`]), the same statements
    /// typed, in the script's order, for a writer that sends them to the kernel
    /// itself.
    pub typed: Option<Vec<Op>>,
    /// Every statement has a typed form: [`Planner::plan_into`] handed them all out.
    pub all_typed: bool,
    /// The typed statements handed out.
    pub typed_ops: usize,
    /// Every destination conflict in the desired state.
    pub conflicts: Vec<Conflict>,
    pub stats: PlanStats,
    generation: u64,
}

impl Plan {
    pub fn is_full(&self) -> bool {
        self.kind != PlanKind::Partial
    }

    /// Nothing to apply (a partial plan with no change). A full plan written only
    /// as typed statements has no script (see [`Output`]).
    pub fn is_empty(&self) -> bool {
        self.script.is_empty() && self.typed_ops == 0
    }
}

/// What [`Planner::plan_steps_into`] hands out: a statement, or the end of a
/// transaction (the writer sends what it has so far, and goes on only if the
/// kernel took it).
#[derive(Debug)]
pub enum Step {
    Op(Op),
    Commit,
}

/// How to write a table the kernel does not have yet (a node's first start): in
/// several transactions, each bounded and whole on its own, instead of one that
/// holds the kernel's nftables lock for the whole table (kubernetes#139328).
/// Another writer then waits for one of them at most. See
/// `FamilyState::staged_table_ops` for the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdStart {
    /// Statements per transaction writing service ports' objects (a transaction
    /// ends after the service port that reaches it).
    pub objects_per_commit: usize,
    /// Elements per transaction linking services in; each such transaction makes
    /// the kernel validate everything linked so far.
    pub links_per_commit: usize,
}

/// A plan's typed operations: none (a text plan), or emitted (a partial plan's
/// own, else the whole tables', staged for a cold start when given).
enum TypedOps {
    None,
    Emit {
        cold: Option<ColdStart>,
        partial: Vec<Op>,
    },
}

impl Default for ColdStart {
    /// Measured at 100k services x 10 endpoints (docs/benchmarks.md): a
    /// transaction of 8192 objects or elements takes the kernel 40-90 ms; one
    /// linking 16384 elements at most 120 ms plus the validation of what is
    /// linked.
    fn default() -> Self {
        ColdStart {
            objects_per_commit: 8192,
            links_per_commit: 16384,
        }
    }
}

/// The Services a node needs before any other (written and linked in the first
/// transaction of a cold start): the API server's `default/kubernetes` and the
/// cluster DNS's `kube-system/kube-dns`, by their well-known names.
pub fn needed_first(name: &ServicePortName) -> bool {
    matches!(
        (&*name.service.namespace, &*name.service.name),
        ("default", "kubernetes") | ("kube-system", "kube-dns")
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// Nothing known: the next plan recreates the tables.
    Unknown,
    /// The kernel holds exactly the planner's state.
    InSync,
    /// A plan was handed out and not yet committed or abandoned.
    Pending(u64),
    /// The kernel holds what the planner's state describes, in a layout of its
    /// own (a predecessor's: the same objects, endpoint map keys of its history):
    /// the next plan rewrites in place.
    Adopted,
}

/// Names of a family's objects, to work out what a resync must delete.
#[derive(Default)]
struct Names {
    chains: BTreeSet<String>,
    /// Set name and whether it is a dynamic (affinity) set, whose contents survive.
    sets: BTreeMap<String, bool>,
    maps: BTreeSet<String>,
}

/// One part of a partial plan's script, and the same statements typed.
#[derive(Default)]
struct Section {
    text: String,
    ops: Vec<Op>,
}

impl Section {
    fn typed(&mut self, text: &str, op: Op) {
        self.text.push_str(text);
        self.ops.push(op);
    }

    fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// Script fragments of a partial plan, kept apart so they can be emitted in an
/// order in which every reference resolves.
struct Delta {
    family: IpFamily,
    declare: Section,
    flush: Section,
    rules: Section,
    delete_elements: Section,
    add_elements: Section,
    flush_stale: Section,
    delete_stale_chains: Section,
    delete_stale_sets: Section,
}

impl Delta {
    fn new(family: IpFamily) -> Self {
        Delta {
            family,
            declare: Section::default(),
            flush: Section::default(),
            rules: Section::default(),
            delete_elements: Section::default(),
            add_elements: Section::default(),
            flush_stale: Section::default(),
            delete_stale_chains: Section::default(),
            delete_stale_sets: Section::default(),
        }
    }

    /// Writes the script; `ops` gets the statements typed, in the script's order.
    fn finish(self, out: &mut String, ops: &mut Vec<Op>) {
        for part in [
            self.declare,
            self.flush,
            self.rules,
            self.delete_elements,
            self.add_elements,
            self.flush_stale,
            self.delete_stale_chains,
            self.delete_stale_sets,
        ] {
            if part.is_empty() {
                continue;
            }
            out.push_str(&part.text);
            ops.extend(part.ops);
        }
    }

    fn element(&mut self, add: bool, set: &str, key: Vec<Atom>, value: Option<ElemValue>) {
        let op = ElemOp {
            family: self.family,
            add,
            set: set.to_string(),
            key,
            value,
        };
        let section = if add {
            &mut self.add_elements
        } else {
            &mut self.delete_elements
        };
        section.typed(&op.text(), Op::Element(op));
    }

    /// Statements moving one service port's elements of the `endpoint-dnat-*` maps
    /// from `old` to `new`: an element whose key keeps its endpoint is left alone.
    fn dnat_elements(
        &mut self,
        old: Option<&Fragment>,
        new: Option<&Fragment>,
        stats: &mut PlanStats,
    ) {
        let collect = |frag: Option<&Fragment>| {
            let mut elems = BTreeMap::new();
            if let Some(frag) = frag {
                frag.dnat_elements(|k, ep| {
                    elems.insert(k, *ep);
                });
            }
            elems
        };
        let map_of = |frag: Option<&Fragment>| frag.map(Fragment::endpoint_map);
        let (old_map, new_map) = (map_of(old), map_of(new));
        let (old, new) = (collect(old), collect(new));
        for (k, ep) in &old {
            if new.get(k) != Some(ep) || new_map != old_map {
                self.element(
                    false,
                    old_map.as_deref().unwrap_or_default(),
                    vec![Atom::Num(*k)],
                    None,
                );
                stats.elements_deleted += 1;
            }
        }
        for (k, ep) in &new {
            if old.get(k) != Some(ep) || new_map != old_map {
                self.element(
                    true,
                    new_map.as_deref().unwrap_or_default(),
                    vec![Atom::Num(*k)],
                    Some(ElemValue::Data(dnat_value(ep))),
                );
                stats.elements_added += 1;
            }
        }
    }

    /// Statements turning `old` objects of one service port into `new` ones.
    fn objects(&mut self, old: &Ruleset, new: &Ruleset, stats: &mut PlanStats) {
        let f = self.family;
        let flush = |name: &String| Op::FlushChain {
            family: f,
            name: name.clone(),
        };
        for (name, chain) in &new.chains {
            match old.chains.get(name) {
                Some(prev) if prev == chain => continue,
                Some(_) => self.flush.typed(&stmt::flush_chain(f, name), flush(name)),
                None => self
                    .declare
                    .typed(&stmt::add_chain(f, name, chain), add_chain(f, name, chain)),
            }
            stats.chains_written += 1;
            for rule in &chain.rules {
                self.rules.typed(
                    &stmt::add_rule(f, name, &rule.text()),
                    Op::AddRule {
                        family: f,
                        chain: name.clone(),
                        rule: rule.clone(),
                    },
                );
            }
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                // Stale chains reference each other (service → endpoint), so all
                // are flushed before any is deleted.
                self.flush_stale
                    .typed(&stmt::flush_chain(f, name), flush(name));
                self.delete_stale_chains.typed(
                    &stmt::delete_chain(f, name),
                    Op::DeleteChain {
                        family: f,
                        name: name.clone(),
                    },
                );
                stats.chains_deleted += 1;
            }
        }
        for (name, set) in &new.sets {
            if !old.sets.contains_key(name) {
                self.declare
                    .typed(&stmt::add_set(f, name, set), add_set(f, name, set));
            }
        }
        for name in old.sets.keys() {
            if !new.sets.contains_key(name) {
                self.delete_stale_sets
                    .typed(&stmt::delete_set(f, name), delete_set(f, name));
            }
        }
    }
}

fn add_chain(family: IpFamily, name: &str, chain: &Chain) -> Op {
    Op::AddChain {
        family,
        name: name.to_string(),
        comment: chain.comment.as_deref().map(sanitize_comment),
        base: chain.base,
    }
}

/// A set's declaration, without its elements.
fn add_set(family: IpFamily, name: &str, set: &Set) -> Op {
    Op::AddSet {
        family,
        name: name.to_string(),
        set: Set {
            elements: Vec::new(),
            ..set.clone()
        },
    }
}

/// A map's declaration, without its elements.
fn add_map(family: IpFamily, name: &str, map: &Map) -> Op {
    Op::AddMap {
        family,
        name: name.to_string(),
        map: Map {
            elements: Vec::new(),
            ..map.clone()
        },
    }
}

/// Deletes a set or a map.
fn delete_set(family: IpFamily, name: &str) -> Op {
    Op::DeleteSet {
        family,
        name: name.to_string(),
    }
}

/// A cold start's steps for one family ([`FamilyState::staged_table_ops`]), with
/// what they have written so far.
struct Staging<'a> {
    state: &'a FamilyState,
    fam: &'a FamilyIntent,
    cold: ColdStart,
    /// Hairpin addresses and cluster IPs written (several fragments share them).
    hairpin: BTreeSet<IpAddr>,
    linked: BTreeSet<IpAddr>,
    /// Sets written: the kernel's cost of a statement about a set grows with them.
    sets: usize,
    /// The weight written since the last commit.
    pending: usize,
}

impl<'a> Staging<'a> {
    fn new(state: &'a FamilyState, fam: &'a FamilyIntent, cold: ColdStart) -> Self {
        Staging {
            state,
            fam,
            cold,
            hairpin: BTreeSet::new(),
            linked: BTreeSet::new(),
            sets: 0,
            pending: 0,
        }
    }

    fn elem(&self, set: &str, key: Vec<Atom>, value: Option<ElemValue>) -> Step {
        Step::Op(add_element(self.state.family, set, key, value))
    }

    /// Ends the transaction once `limit` is reached.
    fn commit_at(&mut self, limit: usize, out: &mut dyn FnMut(Step)) {
        if self.pending >= limit.max(1) {
            out(Step::Commit);
            self.pending = 0;
        }
    }

    /// The table's declarations (every set and map, the endpoint maps), the
    /// skeleton's chains and rules, and the node-wide elements.
    fn skeleton(&mut self, node: &NodeIntent, out: &mut dyn FnMut(Step)) {
        let (state, f) = (self.state, self.state.family);
        let shared = state.skeleton(node);
        state.declarations(&shared, &mut |op| out(Step::Op(op)));
        chain_ops(f, shared.chains, out);
        if let Some(o) = state.pod_cidrs().ok().flatten() {
            out(Step::Op(o));
        }
        if let NodePortDestinations::Ips(ips) = &node.nodeports {
            for ip in ips {
                out(self.elem(NODEPORT_IPS_SET, vec![Atom::Ip(*ip)], None));
            }
        }
    }

    /// The service ports the node needs first ([`needed_first`]), whole.
    fn needed_first(&mut self, out: &mut dyn FnMut(Step)) {
        let state = self.state;
        for (name, frag) in state.entries.iter().filter(|(n, _)| needed_first(n)) {
            self.fragment(frag, out);
            self.endpoints(frag, out);
            self.hairpins(&mut frag.hairpin_ips(), out);
            if let Some(svc) = self.fam.service(name) {
                self.link(svc, out);
            }
        }
    }

    /// Every other service port's objects, then their endpoint map and hairpin
    /// elements: unreachable until linked.
    ///
    /// Every rule before any endpoint map element: a new rule using a map is
    /// checked against every element the map holds, a new element against every
    /// rule using its map (cheaply); rules after elements would be quadratic (see
    /// `write_table`). And map by map: those checks walk the map's list of rules,
    /// which walked again and again stays in the CPU's caches. The fragments
    /// without an endpoint map first: those with sets (session affinity's, one per
    /// endpoint) cost the kernel a walk of the table's sets each, and the table is
    /// smallest then (each commit also walks every chain of the table).
    fn objects(&mut self, out: &mut dyn FnMut(Step)) {
        let state = self.state;
        let limit = self.cold.objects_per_commit;
        let rest = |f: &&Fragment| !needed_first(&f.intent.name);
        let by_map = state.fragments_by_endpoint_map();
        let unmapped = state.entries.values().filter(|f| !f.uses_endpoint_map());
        for frag in unmapped
            .chain(by_map.values().flatten().copied())
            .filter(rest)
        {
            self.pending += self.fragment(frag, out);
            self.commit_at(limit, out);
        }
        for frag in by_map.values().flatten().copied().filter(rest) {
            self.pending += self.endpoints(frag, out);
            self.commit_at(limit, out);
        }
        for frag in state.entries.values().filter(rest) {
            self.pending += self.hairpins(&mut frag.hairpin_ips(), out);
            self.commit_at(limit, out);
        }
        // Addresses no fragment names (none, as fragments are made; the table
        // stays whole whatever the state holds).
        self.pending += self.hairpins(&mut state.hairpin.keys().copied(), out);
        if self.pending > 0 {
            out(Step::Commit);
            self.pending = 0;
        }
    }

    /// The links, a Service at a time: each Service's are in one transaction.
    fn links(&mut self, out: &mut dyn FnMut(Step)) {
        let fam = self.fam;
        let mut last: Option<&ServicePortName> = None;
        for (name, svc) in fam.services().iter().filter(|(n, _)| !needed_first(n)) {
            if last.is_some_and(|l| l.service != name.service) {
                self.commit_at(self.cold.links_per_commit, out);
            }
            last = Some(name);
            self.pending += self.link(svc, out);
        }
        // Cluster IPs of no service port (none, as the intent is built).
        for ip in fam.cluster_ips() {
            if self.linked.insert(ip) {
                out(self.elem(CLUSTER_IPS_SET, vec![Atom::Ip(ip)], None));
            }
        }
    }

    /// A fragment's objects; their weight: the number of statements, each
    /// weighing more the more sets the table holds when the fragment has sets, as
    /// the kernel finds a set by name in a list of them.
    fn fragment(&mut self, frag: &Fragment, out: &mut dyn FnMut(Step)) -> usize {
        let f = self.state.family;
        let objs = frag.objects(self.state.detect.as_ref());
        for (name, set) in &objs.sets {
            out(Step::Op(add_set(f, name, set)));
        }
        let n = objs.sets.len() + chain_ops(f, objs.chains, out);
        let weight = match objs.sets.len() {
            0 => 1,
            _ => 1 + self.sets / SETS_PER_WEIGHT,
        };
        self.sets += objs.sets.len();
        n * weight
    }

    /// A fragment's endpoint map elements; their number.
    fn endpoints(&self, frag: &Fragment, out: &mut dyn FnMut(Step)) -> usize {
        let mut n = 0;
        self.state.dnat_ops(frag, &mut |op| {
            n += 1;
            out(Step::Op(op))
        });
        n
    }

    /// The hairpin elements of `ips` not written yet; their number.
    fn hairpins(
        &mut self,
        ips: &mut dyn Iterator<Item = IpAddr>,
        out: &mut dyn FnMut(Step),
    ) -> usize {
        let mut n = 0;
        for ip in ips {
            if self.hairpin.insert(ip) {
                n += 1;
                out(self.elem(HAIRPIN_SET, hairpin_elem(ip), None));
            }
        }
        n
    }

    /// A service port's links (its cluster IPs not written yet, and the verdict
    /// map elements of the frontends it owns); their number.
    fn link(&mut self, svc: &Arc<ServiceIntent>, out: &mut dyn FnMut(Step)) -> usize {
        let state = self.state;
        let mut n = 0;
        for ip in svc.cluster_ips() {
            if self.linked.insert(ip) {
                n += 1;
                out(self.elem(CLUSTER_IPS_SET, vec![Atom::Ip(ip)], None));
            }
        }
        let hash = state.port_hash(svc);
        for frontend in svc.frontends.iter() {
            // Only the owner of a contested frontend links it.
            match self.fam.frontend(&frontend.key) {
                Some((owner, _)) if Arc::ptr_eq(owner, svc) => {}
                _ => continue,
            }
            for e in elems(svc, hash, &frontend.key, state.localhost_rejects()) {
                n += 1;
                out(self.elem(
                    e.map.name(),
                    key_atoms(&frontend.key),
                    Some(ElemValue::Verdict(e.verdict.elem())),
                ));
            }
        }
        n
    }
}

/// In a cold start, how many sets in the table make a statement about a set
/// weigh one more statement (`FamilyState::staged_table_ops`).
const SETS_PER_WEIGHT: usize = 256;

/// The chains' declarations, then their rules (which may jump to one another);
/// the number of statements.
fn chain_ops(
    family: IpFamily,
    chains: BTreeMap<String, Chain>,
    out: &mut dyn FnMut(Step),
) -> usize {
    let mut n = chains.len();
    for (name, chain) in &chains {
        out(Step::Op(add_chain(family, name, chain)));
    }
    for (name, chain) in chains {
        n += chain.rules.len();
        for rule in chain.rules {
            out(Step::Op(Op::AddRule {
                family,
                chain: name.clone(),
                rule,
            }));
        }
    }
    n
}

/// An element added to `set`.
fn add_element(family: IpFamily, set: &str, key: Vec<Atom>, value: Option<ElemValue>) -> Op {
    Op::Element(ElemOp {
        family,
        add: true,
        set: set.to_string(),
        key,
        value,
    })
}

/// A value of an `endpoint-dnat-*` map: `address . port`.
fn dnat_value(ep: &SocketAddr) -> Vec<Atom> {
    vec![Atom::Ip(ep.ip()), Atom::Port(ep.port())]
}

/// A `hairpin-endpoints` element: `address . address`.
fn hairpin_elem(ip: IpAddr) -> Vec<Atom> {
    vec![Atom::Ip(ip), Atom::Ip(ip)]
}

/// Objects or elements several fragments may need (a hairpin address, an endpoint
/// map), counted: each exists while one fragment needs it. What came or went since
/// the last [`Shared::settle`] is what a partial plan adds or deletes.
struct Shared<K, V> {
    counts: BTreeMap<K, (V, usize)>,
    /// Keys whose count changed since the last settle, with whether each existed
    /// before.
    touched: BTreeMap<K, bool>,
}

impl<K, V> Default for Shared<K, V> {
    fn default() -> Self {
        Shared {
            counts: BTreeMap::new(),
            touched: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, V: Copy> Shared<K, V> {
    fn add(&mut self, key: K, value: V) {
        let (_, count) = self.counts.entry(key.clone()).or_insert((value, 0));
        self.touched.entry(key).or_insert(*count > 0);
        *count += 1;
    }

    fn remove(&mut self, key: &K) {
        let Some((_, count)) = self.counts.get_mut(key) else {
            return;
        };
        self.touched.entry(key.clone()).or_insert(true);
        *count -= 1;
        if *count == 0 {
            self.counts.remove(key);
        }
    }

    /// The keys touched since the last call: whether each existed before, and its
    /// value if it exists now.
    fn settle(&mut self) -> Vec<(K, bool, Option<V>)> {
        std::mem::take(&mut self.touched)
            .into_iter()
            .map(|(k, was)| {
                let now = self.counts.get(&k).map(|(v, _)| *v);
                (k, was, now)
            })
            .collect()
    }

    fn keys(&self) -> impl Iterator<Item = &K> {
        self.counts.keys()
    }

    fn iter(&self) -> impl Iterator<Item = (&K, V)> {
        self.counts.iter().map(|(k, (v, _))| (k, *v))
    }
}

struct FamilyState {
    family: IpFamily,
    /// The node intent last planned; `None` while the family is not programmed.
    node: Option<Arc<NodeIntent>>,
    detect: Option<Detect>,
    entries: BTreeMap<ServicePortName, Fragment>,
    chain_total: usize,
    capture: Option<Arc<dyn CapturePorts>>,
    /// Keys of the `endpoint-dnat-*` maps, held by the fragments' sets.
    slots: Slots,
    /// Each address in `hairpin-endpoints`, counted per fragment that puts it there.
    hairpin: Shared<IpAddr, ()>,
    /// The endpoint maps in use (with their protocol), counted per fragment.
    endpoint_maps: Shared<String, Protocol>,
}

/// The elements the owner of a frontend puts in the maps.
fn owner_elems(
    owner: &Option<Arc<crate::intent::ServiceIntent>>,
    key: &crate::intent::FrontendKey,
    localhost_rejects: &[Protocol],
) -> Vec<Elem> {
    owner
        .as_ref()
        .map(|svc| {
            elems(
                svc,
                service_port_hash(svc.family, &svc.name),
                key,
                localhost_rejects,
            )
        })
        .unwrap_or_default()
}

impl FamilyState {
    fn new(family: IpFamily, capture: Option<Arc<dyn CapturePorts>>) -> Self {
        FamilyState {
            family,
            node: None,
            detect: None,
            entries: BTreeMap::new(),
            chain_total: 0,
            capture,
            slots: Slots::new(),
            hairpin: Shared::default(),
            endpoint_maps: Shared::default(),
        }
    }

    /// A new fragment, holding its keys of the `endpoint-dnat-*` maps and counted in
    /// `hairpin-endpoints`; [`FamilyState::release`] gives both back.
    fn fragment(&mut self, svc: Arc<crate::intent::ServiceIntent>) -> Fragment {
        let mut frag = Fragment::new(svc, self.capture.as_deref());
        for (slot, n) in frag.dispatch_sizes().into_iter().enumerate() {
            if n > 0 {
                frag.blocks[slot] = self.slots.alloc(n);
            }
        }
        for ip in frag.hairpin_ips() {
            self.hairpin.add(ip, ());
        }
        if frag.uses_endpoint_map() {
            self.endpoint_maps
                .add(frag.endpoint_map(), frag.intent.protocol);
        }
        frag
    }

    fn release(&mut self, frag: &Fragment) {
        for run in frag.blocks.iter().flatten() {
            self.slots.free(*run);
        }
        for ip in frag.hairpin_ips() {
            self.hairpin.remove(&ip);
        }
        if frag.uses_endpoint_map() {
            self.endpoint_maps.remove(&frag.endpoint_map());
        }
    }

    /// Whether moving to `node` changes more than per-service chains: the shared
    /// objects, or the rule text that recognises local traffic (which every
    /// service chain uses, whether or not its intent changed).
    fn skeleton_changes(&self, node: Option<&Arc<NodeIntent>>) -> bool {
        match (&self.node, node) {
            (None, None) => false,
            (Some(old), Some(new)) if Arc::ptr_eq(old, new) => false,
            (Some(old), Some(new)) => {
                base_ruleset(old) != base_ruleset(new)
                    || self.detect.as_ref() != Detect::new(new).as_ref()
            }
            _ => true,
        }
    }

    /// The protocols whose NodePorts the node rejects on loopback (KEP-6032).
    fn localhost_rejects(&self) -> &[Protocol] {
        self.node
            .as_deref()
            .map_or(&[], |n| n.localhost_rejects.as_slice())
    }

    fn set_node(&mut self, node: Option<Arc<NodeIntent>>) {
        self.detect = node.as_deref().and_then(Detect::new);
        self.node = node;
    }

    /// Applies one family's delta to the fragments and, when `delta` is given,
    /// writes the statements that take the kernel along.
    fn apply(
        &mut self,
        fd: &FamilyDelta,
        node: Option<&Arc<NodeIntent>>,
        mut delta: Option<&mut Delta>,
        stats: &mut PlanStats,
    ) {
        if self.node.as_ref() != node {
            self.set_node(node.cloned());
        }
        self.hairpin.settle();
        self.endpoint_maps.settle();
        for change in &fd.services {
            let old = self.entries.remove(&change.name);
            if let Some(old) = &old {
                // First, so that a changed port whose endpoint count keeps its
                // size gets its keys back.
                self.release(old);
            }
            let new = change.after.clone().map(|svc| self.fragment(svc));
            if let Some(d) = delta.as_deref_mut() {
                let empty = Ruleset::new(self.family);
                let detect = self.detect.as_ref();
                let old_objs = old
                    .as_ref()
                    .map_or_else(|| empty.clone(), |f| f.objects(detect));
                let new_objs = new.as_ref().map_or(empty, |f| f.objects(detect));
                d.objects(&old_objs, &new_objs, stats);
                d.dnat_elements(old.as_ref(), new.as_ref(), stats);
            }
            if let Some(old) = old {
                self.chain_total -= old.chain_count();
            }
            if let Some(new) = new {
                self.chain_total += new.chain_count();
                self.entries.insert(change.name.clone(), new);
            }
        }
        let Some(d) = delta else {
            return;
        };
        self.delta_of_sets(d, stats);
        self.delta_of_verdicts(fd, d, stats);
    }

    /// The endpoint maps and the hairpin set that came into use or went, into
    /// `d`: endpoint maps come into use before the rules that use them, and go
    /// after the chains that used them.
    fn delta_of_sets(&mut self, d: &mut Delta, stats: &mut PlanStats) {
        let f = self.family;
        for (name, was, now) in self.endpoint_maps.settle() {
            match (was, now) {
                (true, None) => d
                    .delete_stale_sets
                    .typed(&stmt::delete_map(f, &name), delete_set(f, &name)),
                (false, Some(protocol)) => {
                    let map = endpoint_map_decl(f, protocol);
                    d.declare
                        .typed(&stmt::add_map(f, &name, &map), add_map(f, &name, &map))
                }
                _ => {}
            }
        }
        for (ip, was, now) in self.hairpin.settle() {
            match (was, now.is_some()) {
                (true, false) => {
                    d.element(false, HAIRPIN_SET, hairpin_elem(ip), None);
                    stats.elements_deleted += 1;
                }
                (false, true) => {
                    d.element(true, HAIRPIN_SET, hairpin_elem(ip), None);
                    stats.elements_added += 1;
                }
                _ => {}
            }
        }
    }

    /// The frontends whose owner changed (their verdict map elements) and the
    /// cluster IPs that came or went, into `d`.
    fn delta_of_verdicts(&self, fd: &FamilyDelta, d: &mut Delta, stats: &mut PlanStats) {
        let rejects = self.localhost_rejects().to_vec();
        for change in &fd.frontends {
            let key = key_atoms(&change.key);
            let before = owner_elems(&change.before, &change.key, &rejects);
            let after = owner_elems(&change.after, &change.key, &rejects);
            for b in &before {
                if !after.contains(b) {
                    d.element(false, b.map.name(), key.clone(), None);
                    stats.elements_deleted += 1;
                }
            }
            for a in &after {
                if !before.contains(a) {
                    d.element(
                        true,
                        a.map.name(),
                        key.clone(),
                        Some(ElemValue::Verdict(a.verdict.elem())),
                    );
                    stats.elements_added += 1;
                }
            }
        }
        for ip in &fd.cluster_ips_removed {
            d.element(false, CLUSTER_IPS_SET, vec![Atom::Ip(*ip)], None);
            stats.elements_deleted += 1;
        }
        for ip in &fd.cluster_ips_added {
            d.element(true, CLUSTER_IPS_SET, vec![Atom::Ip(*ip)], None);
            stats.elements_added += 1;
        }
    }

    /// Rebuilds the fragments from the whole intent (reusing those whose intent
    /// is the same `Arc`): for a delta that does not follow the last plan.
    fn reset(&mut self, fam: &FamilyIntent) {
        self.set_node(fam.node().cloned());
        let mut old = std::mem::take(&mut self.entries);
        let mut kept = BTreeMap::new();
        for (name, svc) in fam.services() {
            if let Some(f) = old.remove(name) {
                if Arc::ptr_eq(&f.intent, svc) {
                    kept.insert(name.clone(), f);
                } else {
                    old.insert(name.clone(), f);
                }
            }
        }
        for frag in old.values() {
            self.release(frag);
        }
        self.chain_total = 0;
        // Collected in name order, so the map is built with full nodes (inserted
        // one by one, a B-tree's nodes end about half full: a third more memory
        // for tens of thousands of fragments).
        self.entries = fam
            .services()
            .iter()
            .map(|(name, svc)| {
                let frag = match kept.remove(name) {
                    Some(f) => f,
                    None => self.fragment(svc.clone()),
                };
                self.chain_total += frag.chain_count();
                (name.clone(), frag)
            })
            .collect();
        // A full plan follows: nothing to report element by element.
        self.hairpin.settle();
        self.endpoint_maps.settle();
    }

    /// The shared objects, without their elements.
    fn skeleton(&self, node: &NodeIntent) -> Ruleset {
        let mut rs = base_ruleset(node);
        if self.capture.is_some() {
            // The capture serves NodePorts on loopback to the node's own clients
            // only: a packet from outside addressed to loopback is left alone (the
            // kernel drops it as a martian), never redirected to the proxy.
            if let Some(chain) = rs.chains.get_mut("nat-prerouting") {
                let from_loopback = Match::Prefix {
                    addr: Addr::Daddr,
                    net: loopback(self.family),
                    negate: false,
                };
                chain.rules.insert(
                    0,
                    TypedRule::new(self.family, vec![from_loopback], RuleAction::Return),
                );
            }
        }
        rs
    }

    /// The shared objects with their elements filled in.
    fn base_with_elements(&self, node: &NodeIntent, fam: &FamilyIntent) -> Ruleset {
        let mut rs = self.skeleton(node);
        if let Some(set) = rs.sets.get_mut(CLUSTER_IPS_SET) {
            set.elements = fam.cluster_ips().map(|ip| ip.to_string()).collect();
        }
        if let Some(set) = rs.sets.get_mut(HAIRPIN_SET) {
            set.elements = self
                .hairpin
                .keys()
                .map(|ip| concat_text(&hairpin_elem(*ip)))
                .collect();
        }
        for (key, elems) in self.frontend_elems(fam) {
            let text = key_text(key);
            for elem in elems {
                if let Some(map) = rs.maps.get_mut(elem.map.name()) {
                    map.elements.push((text.clone(), elem.verdict.text()));
                }
            }
        }
        rs
    }

    /// Each frontend's key, and the elements its owner puts in the shared maps.
    fn frontend_elems<'a>(
        &'a self,
        fam: &'a FamilyIntent,
    ) -> impl Iterator<Item = (&'a FrontendKey, Vec<Elem>)> + 'a {
        fam.frontends().map(|(svc, frontend)| {
            (
                &frontend.key,
                elems(
                    svc,
                    self.port_hash(svc),
                    &frontend.key,
                    self.localhost_rejects(),
                ),
            )
        })
    }

    /// The hash naming a service port's objects: its fragment's, or (a port with
    /// no fragment yet) computed.
    fn port_hash(&self, svc: &ServiceIntent) -> u64 {
        match self.entries.get(&svc.name) {
            Some(f) => f.hash,
            None => service_port_hash(svc.family, &svc.name),
        }
    }

    /// `AddTable`, and the declarations of the shared sets and maps and of the
    /// endpoint maps (without elements).
    fn declarations(&self, shared: &Ruleset, out: &mut dyn FnMut(Op)) {
        let f = self.family;
        out(Op::AddTable { family: f });
        for (name, set) in &shared.sets {
            out(add_set(f, name, set));
        }
        for (name, map) in &shared.maps {
            out(add_map(f, name, map));
        }
        for (name, protocol) in self.endpoint_maps.iter() {
            out(add_map(f, name, &endpoint_map_decl(f, protocol)));
        }
    }

    /// A fragment's endpoint map elements.
    fn dnat_ops(&self, frag: &Fragment, out: &mut dyn FnMut(Op)) {
        if frag.uses_endpoint_map() {
            let map = frag.endpoint_map();
            frag.dnat_elements(|k, ep| {
                out(add_element(
                    self.family,
                    &map,
                    vec![Atom::Num(k)],
                    Some(ElemValue::Data(dnat_value(ep))),
                ))
            });
        }
    }

    /// The whole table block, streamed: the shared objects, then each service
    /// port's objects in name order. Nothing but the output grows with the table.
    fn write_table(&self, fam: &FamilyIntent, out: &mut String) -> usize {
        let Some(node) = &self.node else {
            return 0;
        };
        write_table_open(out, self.family);
        let shared = self.base_with_elements(node, fam);
        let mut chains = shared.chains.len();
        shared.write_body(out);
        for (name, protocol) in self.endpoint_maps.iter() {
            write_map(out, name, &endpoint_map_decl(self.family, protocol));
        }
        for frag in self.entries.values() {
            let objs = frag.objects(self.detect.as_ref());
            chains += objs.chains.len();
            objs.write_body(out);
        }
        write_table_close(out);
        // The endpoint maps' elements after the rules using them: the kernel
        // checks a new rule against every element of its map, and a new element
        // against every rule using its map (see `base::ENDPOINT_MAP_SHARDS`).
        // Streamed: no element is held as text but in `out`.
        for (name, frags) in self.fragments_by_endpoint_map() {
            let mut first = true;
            for frag in frags {
                frag.dnat_elements(|k, ep| {
                    if first {
                        let _ = write!(
                            out,
                            "add element {} {TABLE_NAME} {name} {{ ",
                            family_keyword(self.family)
                        );
                        first = false;
                    } else {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "{k} : ");
                    concat(out, &dnat_value(ep));
                });
            }
            if !first {
                out.push_str(" }\n");
            }
        }
        chains
    }

    /// Each endpoint map in use with its elements (key, value).
    fn endpoint_map_elements(&self) -> BTreeMap<String, Vec<(String, String)>> {
        let mut maps: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for frag in self.entries.values().filter(|f| f.uses_endpoint_map()) {
            let elements = maps.entry(frag.endpoint_map()).or_default();
            frag.dnat_elements(|k, ep| {
                elements.push((k.to_string(), concat_text(&dnat_value(ep))))
            });
        }
        maps
    }

    /// The `pod-cidrs` elements, when the table has that set: `Err` when they
    /// have no typed form (overlapping prefixes, which `nft` refuses).
    fn pod_cidrs(&self) -> Result<Option<Op>, ()> {
        let Some(node) = &self.node else {
            return Ok(None);
        };
        match &node.local_traffic {
            Some(LocalTraffic::Cidrs(nets)) if nets.len() > 1 => Ok(Some(Op::AddIntervals {
                family: self.family,
                set: POD_CIDRS_SET.to_string(),
                nets: disjoint_prefixes(nets).ok_or(())?,
            })),
            _ => Ok(None),
        }
    }

    /// The whole table as typed statements (what [`FamilyState::write_table`]
    /// writes as text), in an order in which every reference resolves: the
    /// declarations of every set, map and chain, the elements of the shared sets
    /// and verdict maps, every rule, and last the endpoint maps' elements (see
    /// there). Only when [`FamilyState::pod_cidrs`] is not `Err`.
    fn table_ops(&self, fam: &FamilyIntent, out: &mut dyn FnMut(Op)) {
        let Some(node) = &self.node else {
            return;
        };
        let f = self.family;
        let shared = self.skeleton(node);
        let pod_cidrs = self.pod_cidrs().ok().flatten();
        self.declarations(&shared, out);
        let mut rules = Vec::new();
        // Each chain declared now, its rules kept for after the elements.
        let mut chains = |out: &mut dyn FnMut(Op), objs: Ruleset| {
            for (name, chain) in objs.chains {
                out(add_chain(f, &name, &chain));
                rules.extend(chain.rules.into_iter().map(|rule| Op::AddRule {
                    family: f,
                    chain: name.clone(),
                    rule,
                }));
            }
        };
        chains(out, shared);
        // Map by map (see `staged_table_ops`).
        let by_map = self.fragments_by_endpoint_map();
        let unmapped = self.entries.values().filter(|f| !f.uses_endpoint_map());
        for frag in by_map.values().flatten().copied().chain(unmapped) {
            let objs = frag.objects(self.detect.as_ref());
            for (name, set) in &objs.sets {
                out(add_set(f, name, set));
            }
            chains(out, objs);
        }
        let elem = |set: &str, key, value| add_element(f, set, key, value);
        if let Some(op) = pod_cidrs {
            out(op);
        }
        for ip in fam.cluster_ips() {
            out(elem(CLUSTER_IPS_SET, vec![Atom::Ip(ip)], None));
        }
        if let NodePortDestinations::Ips(ips) = &node.nodeports {
            for ip in ips {
                out(elem(NODEPORT_IPS_SET, vec![Atom::Ip(*ip)], None));
            }
        }
        for ip in self.hairpin.keys() {
            out(elem(HAIRPIN_SET, hairpin_elem(*ip), None));
        }
        for (key, elems) in self.frontend_elems(fam) {
            for e in elems {
                out(elem(
                    e.map.name(),
                    key_atoms(key),
                    Some(ElemValue::Verdict(e.verdict.elem())),
                ));
            }
        }
        for rule in rules {
            out(rule);
        }
        for frag in by_map.into_values().flatten() {
            self.dnat_ops(frag, out);
        }
    }

    /// [`FamilyState::table_ops`] cut into transactions for a table the kernel
    /// does not have yet ([`ColdStart`]), each ended by [`Step::Commit`]:
    /// 1. the skeleton, and the service ports the node needs first
    ///    ([`needed_first`]) whole;
    /// 2. every other service port's objects (sets, chains, rules), then their
    ///    endpoint map elements and the hairpin elements: nothing reaches them yet, so
    ///    traffic meets none of it, and the kernel's validation at each commit
    ///    walks only what step 1 linked;
    /// 3. the links: each service's `cluster-ips` elements and verdict map
    ///    elements (its frontends), all of a Service's in one transaction, so a
    ///    Service appears whole. Each of these commits makes the kernel walk
    ///    everything linked so far, so they are fewer and larger.
    ///
    /// The statements are those of `table_ops` (the same multiset), in this order.
    fn staged_table_ops(&self, fam: &FamilyIntent, cold: ColdStart, out: &mut dyn FnMut(Step)) {
        let Some(node) = &self.node else {
            return;
        };
        let mut staging = Staging::new(self, fam, cold);
        staging.skeleton(node, out);
        staging.needed_first(out);
        out(Step::Commit);
        staging.objects(out);
        staging.links(out);
        out(Step::Commit);
    }

    /// The fragments that use an endpoint map, by map.
    fn fragments_by_endpoint_map(&self) -> BTreeMap<String, Vec<&Fragment>> {
        let mut by_map: BTreeMap<String, Vec<&Fragment>> = BTreeMap::new();
        for frag in self.entries.values().filter(|f| f.uses_endpoint_map()) {
            by_map.entry(frag.endpoint_map()).or_default().push(frag);
        }
        by_map
    }

    /// The whole desired table as one typed ruleset.
    fn ruleset(&self, fam: &FamilyIntent) -> Option<Ruleset> {
        let node = self.node.as_ref()?;
        let mut rs = self.base_with_elements(node, fam);
        for frag in self.entries.values() {
            rs.extend(frag.objects(self.detect.as_ref()));
        }
        let mut elements = self.endpoint_map_elements();
        for (name, protocol) in self.endpoint_maps.iter() {
            rs.maps.insert(
                name.clone(),
                Map {
                    elements: elements.remove(name).unwrap_or_default(),
                    ..endpoint_map_decl(self.family, protocol)
                },
            );
        }
        Some(rs)
    }

    fn names(&self) -> Names {
        let mut names = Names::default();
        let Some(node) = &self.node else {
            return names;
        };
        let shared = base_ruleset(node);
        names.chains.extend(shared.chains.into_keys());
        names.sets.extend(
            shared
                .sets
                .into_iter()
                .map(|(n, s)| (n, s.timeout.is_some())),
        );
        names.maps.extend(shared.maps.into_keys());
        names.maps.extend(self.endpoint_maps.keys().cloned());
        for frag in self.entries.values() {
            let (chains, sets) = frag.object_names();
            names.chains.extend(chains);
            names.sets.extend(sets.into_iter().map(|s| (s, true)));
        }
        names
    }
}

/// Plans svcproxy's nftables tables from the intent, keeping the translated state
/// in memory.
pub struct Planner {
    families: [FamilyState; 2],
    kernel: Kernel,
    generation: u64,
    /// The intent generation last planned: a delta from any other is not trusted.
    intent_generation: Option<u64>,
    /// What full plans carry: their script, their typed statements, or both.
    output: Output,
    /// The next recreate is a cold start, written in steps.
    cold_start: Option<ColdStart>,
}

/// What a full plan carries (a partial plan, small, always carries both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// The script only (`nft -f`, `svcproxy render`).
    Text,
    /// The typed statements only, for a writer that sends them itself; the script
    /// too when some statement has no typed form. Rendering the script costs time
    /// and memory in proportion to the whole table.
    Typed,
    /// Both (the default).
    #[default]
    Both,
}

impl Default for Planner {
    fn default() -> Self {
        Planner::new()
    }
}

impl Planner {
    pub fn new() -> Self {
        Planner::with_capture(None)
    }

    /// A planner for the userspace mode when `capture` is given: each endpoint
    /// set's connections are redirected to the proxy's port for it.
    pub fn with_capture(capture: Option<Arc<dyn CapturePorts>>) -> Self {
        Planner {
            families: [
                FamilyState::new(IpFamily::V4, capture.clone()),
                FamilyState::new(IpFamily::V6, capture),
            ],
            kernel: Kernel::Unknown,
            generation: 0,
            intent_generation: None,
            output: Output::Both,
            cold_start: None,
        }
    }

    /// What full plans carry from now on.
    pub fn set_output(&mut self, output: Output) {
        self.output = output;
    }

    /// Plans the tables for `intent`, which `delta` says how it differs from the
    /// intent of the previous plan.
    ///
    /// `full` asks for a full sync (periodic resync). The result is a full plan
    /// whenever the kernel's state is not known to match the previous plan (see
    /// [`Planner::commit`]), the shared skeleton changed, or `delta` does not start
    /// at the previous plan's intent.
    pub fn plan(&mut self, intent: &Intent, delta: &IntentDelta, full: bool) -> Plan {
        let mut ops = Vec::new();
        let mut plan = self.plan_into(intent, delta, full, &mut |op| ops.push(op));
        plan.typed = (plan.all_typed && !ops.is_empty()).then_some(ops);
        plan
    }

    /// [`Planner::plan`], handing each typed statement to `out` as it is made
    /// instead of collecting them in [`Plan::typed`] (a writer encodes them as
    /// they come: a full sync's statements are never all held at once). Nothing
    /// is handed out when some statement has no typed form
    /// ([`Plan::all_typed`] is then `false`, and the plan has its script).
    pub fn plan_into(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
        out: &mut dyn FnMut(Op),
    ) -> Plan {
        self.plan_steps_into(intent, delta, full, &mut |step| {
            if let Step::Op(op) = step {
                out(op)
            }
        })
    }

    /// Whether the next plan recreates the tables (the kernel's state is not
    /// known).
    pub fn will_recreate(&self) -> bool {
        matches!(self.kernel, Kernel::Unknown | Kernel::Pending(_))
    }

    /// The next plan, if it recreates the tables as typed statements, writes them
    /// in the steps of `cold` ([`Planner::plan_steps_into`]). For a table the
    /// kernel does not have: the first steps replace nothing.
    pub fn set_cold_start(&mut self, cold: Option<ColdStart>) {
        self.cold_start = cold;
    }

    /// [`Planner::plan_into`], with the ends of transactions: one at the end of
    /// the plan, and, for a cold start ([`Planner::set_cold_start`]), the steps
    /// in between. Every step is whole: what one step links, that step or an
    /// earlier one wrote.
    pub fn plan_steps_into(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
        out: &mut dyn FnMut(Step),
    ) -> Plan {
        let cold = self.cold_start.take();
        self.generation += 1;
        let (kind, in_step) = self.plan_kind(intent, delta, full);
        // What the kernel holds right now, before the state moves on.
        let old_names: Vec<Names> = if kind == PlanKind::Resync {
            self.families.iter().map(FamilyState::names).collect()
        } else {
            Vec::new()
        };

        let mut stats = PlanStats {
            replanned: delta.rebuilt,
            ..PlanStats::default()
        };
        let (mut script, partial) = self.advance(intent, delta, kind, in_step, &mut stats);
        let all_typed =
            kind == PlanKind::Partial || self.families.iter().all(|f| f.pod_cidrs().is_ok());
        let text = !all_typed || self.output != Output::Typed;
        let typed = all_typed && self.output != Output::Text;
        let ops = if typed || kind == PlanKind::Partial {
            TypedOps::Emit { cold, partial }
        } else {
            TypedOps::None
        };
        let (emitted, added, deleted) = self.emit_typed(intent, kind, ops, &old_names, out);
        match kind {
            PlanKind::Partial => {}
            PlanKind::Recreate if text => {
                script = self.render_counting(intent, &mut stats);
            }
            PlanKind::Resync if text => {
                for (fam, old) in self.families.iter().zip(&old_names) {
                    let fi = intent.family(fam.family);
                    Self::write_resync(fam, fi, old, &mut script, &mut stats);
                }
            }
            _ => {
                stats.chains_written = added;
                stats.chains_deleted = deleted;
            }
        }
        for fam in &self.families {
            stats.service_ports += fam.entries.len();
            stats.chains += fam.chain_total;
        }
        self.kernel = Kernel::Pending(self.generation);
        Plan {
            kind,
            script,
            typed: None,
            all_typed,
            typed_ops: emitted,
            conflicts: intent.conflicts(),
            stats,
            generation: self.generation,
        }
    }

    /// What this plan is (partial, resync or recreate), and whether `delta` takes
    /// the state from the intent it last planned (`in_step`).
    fn plan_kind(&mut self, intent: &Intent, delta: &IntentDelta, full: bool) -> (PlanKind, bool) {
        let in_step = self.intent_generation == Some(delta.from) && delta.to == intent.generation();
        self.intent_generation = Some(intent.generation());
        let skeleton_changed = self
            .families
            .iter()
            .any(|fam| fam.skeleton_changes(intent.family(fam.family).node()));
        let kind = match self.kernel {
            Kernel::InSync if !(full || skeleton_changed || !in_step) => PlanKind::Partial,
            Kernel::InSync | Kernel::Adopted => PlanKind::Resync,
            Kernel::Unknown | Kernel::Pending(_) => PlanKind::Recreate,
        };
        (kind, in_step)
    }

    /// Moves each family's state to `intent` (by `delta`, or afresh when out of
    /// step); for a partial plan, returns its script and its operations.
    fn advance(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        kind: PlanKind,
        in_step: bool,
        stats: &mut PlanStats,
    ) -> (String, Vec<Op>) {
        let mut script = String::new();
        let mut partial = Vec::new();
        for fam in &mut self.families {
            let fi = intent.family(fam.family);
            if !in_step {
                fam.reset(fi);
                continue;
            }
            let mut d = (kind == PlanKind::Partial).then(|| Delta::new(fam.family));
            fam.apply(delta.family(fam.family), fi.node(), d.as_mut(), stats);
            if let Some(d) = d {
                d.finish(&mut script, &mut partial);
            }
        }
        (script, partial)
    }

    /// Hands the plan's typed operations to `out`, then a commit; returns the
    /// operations, chains added and chains deleted counted.
    fn emit_typed(
        &self,
        intent: &Intent,
        kind: PlanKind,
        ops: TypedOps,
        old_names: &[Names],
        out: &mut dyn FnMut(Step),
    ) -> (usize, usize, usize) {
        let (mut emitted, mut added, mut deleted) = (0, 0, 0);
        let mut step = |step: Step| {
            if let Step::Op(op) = &step {
                emitted += 1;
                match op {
                    Op::AddChain { .. } => added += 1,
                    Op::DeleteChain { .. } => deleted += 1,
                    _ => {}
                }
            }
            out(step);
        };
        if let TypedOps::Emit { cold, partial } = ops {
            match kind {
                PlanKind::Partial => partial.into_iter().for_each(|op| step(Step::Op(op))),
                PlanKind::Recreate => {
                    for fam in &self.families {
                        step(Step::Op(Op::AddTable { family: fam.family }));
                        step(Step::Op(Op::DeleteTable { family: fam.family }));
                        let fi = intent.family(fam.family);
                        match cold {
                            Some(cold) => fam.staged_table_ops(fi, cold, &mut step),
                            None => fam.table_ops(fi, &mut |op| step(Step::Op(op))),
                        }
                    }
                }
                PlanKind::Resync => {
                    for (fam, old) in self.families.iter().zip(old_names) {
                        let fi = intent.family(fam.family);
                        Self::resync_ops(fam, fi, old, &mut |op| step(Step::Op(op)));
                    }
                }
            }
        }
        step(Step::Commit);
        (emitted, added, deleted)
    }

    fn write_resync(
        fam: &FamilyState,
        fi: &FamilyIntent,
        old: &Names,
        out: &mut String,
        stats: &mut PlanStats,
    ) {
        let f = fam.family;
        out.push_str(&stmt::add_table(f));
        if fam.node.is_none() {
            out.push_str(&stmt::delete_table(f));
            return;
        }
        // Drop every rule and every static element first: after that nothing in
        // the table references a chain, so stale ones can go.
        out.push_str(&stmt::flush_table(f));
        for name in &old.maps {
            out.push_str(&stmt::flush_map(f, name));
        }
        for (name, dynamic) in &old.sets {
            if !dynamic {
                out.push_str(&stmt::flush_set(f, name));
            }
        }
        let new = fam.names();
        for name in old.chains.difference(&new.chains) {
            out.push_str(&stmt::delete_chain(f, name));
            stats.chains_deleted += 1;
        }
        for name in old.sets.keys() {
            if !new.sets.contains_key(name) {
                out.push_str(&stmt::delete_set(f, name));
            }
        }
        for name in old.maps.difference(&new.maps) {
            out.push_str(&stmt::delete_map(f, name));
        }
        stats.chains_written += fam.write_table(fi, out);
    }

    /// [`Planner::write_resync`]'s statements typed.
    fn resync_ops(fam: &FamilyState, fi: &FamilyIntent, old: &Names, out: &mut dyn FnMut(Op)) {
        let f = fam.family;
        out(Op::AddTable { family: f });
        if fam.node.is_none() {
            out(Op::DeleteTable { family: f });
            return;
        }
        out(Op::FlushTable { family: f });
        let flush = |name: &String| Op::FlushSet {
            family: f,
            name: name.clone(),
        };
        old.maps.iter().map(flush).for_each(&mut *out);
        old.sets
            .iter()
            .filter(|(_, dynamic)| !**dynamic)
            .map(|(name, _)| flush(name))
            .for_each(&mut *out);
        let new = fam.names();
        old.chains
            .difference(&new.chains)
            .map(|name| Op::DeleteChain {
                family: f,
                name: name.clone(),
            })
            .for_each(&mut *out);
        old.sets
            .keys()
            .filter(|name| !new.sets.contains_key(*name))
            .chain(old.maps.difference(&new.maps))
            .map(|name| delete_set(f, name))
            .for_each(&mut *out);
        fam.table_ops(fi, out)
    }

    /// Marks `plan` as applied: the kernel now holds the planned state, so the next
    /// plan may be partial. Committing anything but the latest plan forgets what the
    /// kernel holds (the next plan recreates the tables).
    pub fn commit(&mut self, plan: &Plan) {
        self.kernel = if self.kernel == Kernel::Pending(plan.generation) {
            Kernel::InSync
        } else {
            Kernel::Unknown
        };
    }

    /// `plan` was not applied because the kernel already holds its objects, in
    /// another writer's layout (a predecessor's, sealed at a hand-over): the next
    /// plan rewrites the tables in place (keeping affinity), never partially.
    pub fn adopt(&mut self, plan: &Plan) {
        self.kernel = if self.kernel == Kernel::Pending(plan.generation) {
            Kernel::Adopted
        } else {
            Kernel::Unknown
        };
    }

    /// The last plan was not applied (or failed): the next plan recreates the
    /// tables from scratch.
    pub fn abandon(&mut self) {
        self.kernel = Kernel::Unknown;
    }

    /// The full script for `intent`, which must be the intent last planned, as a
    /// first sync would apply it: for each family `add table` and `delete table`
    /// (so it applies whatever exists) and then the whole table. Rendering it costs
    /// time and memory in proportion to the whole ruleset, so partial plans do not
    /// carry it.
    pub fn render(&self, intent: &Intent) -> String {
        self.render_counting(intent, &mut PlanStats::default())
    }

    fn render_counting(&self, intent: &Intent, stats: &mut PlanStats) -> String {
        let mut out = String::new();
        for fam in &self.families {
            out.push_str(&stmt::add_table(fam.family));
            out.push_str(&stmt::delete_table(fam.family));
            stats.chains_written += fam.write_table(intent.family(fam.family), &mut out);
        }
        out
    }

    /// The last planned state of one family as a typed ruleset (`intent`: the one
    /// last planned); `None` when the family is not programmed.
    pub fn ruleset(&self, intent: &Intent, family: IpFamily) -> Option<Ruleset> {
        self.families
            .iter()
            .find(|f| f.family == family)
            .and_then(|f| f.ruleset(intent.family(family)))
    }
}

/// The full script for `intent` from a fresh planner: exactly what the first sync
/// would apply.
pub fn render_full(intent: &Intent) -> String {
    render_full_with(intent, None)
}

/// [`render_full`] for a planner with `capture` (the userspace mode).
pub fn render_full_with(intent: &Intent, capture: Option<Arc<dyn CapturePorts>>) -> String {
    let mut planner = Planner::with_capture(capture);
    planner.set_output(Output::Text);
    planner
        .plan_into(intent, &intent.delta_from_empty(), true, &mut |_| {})
        .script
}

/// A script deleting svcproxy's tables, and nothing else, in both families. It
/// succeeds whether or not they exist (`add table` first makes `delete` safe).
pub fn cleanup_script() -> String {
    let mut out = String::new();
    for family in IpFamily::BOTH {
        out.push_str(&stmt::add_table(family));
        out.push_str(&stmt::delete_table(family));
    }
    out
}
