//! The incremental planner: snapshots in, one `nft -f` script out, with the desired
//! state kept in memory so that a change to one service costs a script about that
//! service only.
//!
//! Entry point: [`Planner::plan`], then [`Planner::commit`] once `nft` accepted the
//! script, or [`Planner::abandon`] when it did not.
//!
//! State per family: the shared skeleton's context, and per service port the view it
//! was planned from and its fragment. Destinations (`ip . proto . port` and
//! NodePorts) are claimed by service ports; when several claim one, the first by
//! name wins deterministically and the others are reported as [`Conflict`]s. The
//! maps hold only the winners' elements, so a conflict can never make `nft` fail.
//!
//! Three kinds of script, all applied as one atomic `nft -f` transaction:
//! - [`PlanKind::Recreate`] when the kernel's state is unknown (first sync, after a
//!   failed or unconfirmed apply): `add table` + `delete table` + the whole table.
//! - [`PlanKind::Resync`] for a requested full sync, or when the skeleton changed,
//!   while the kernel is known to hold the last committed plan: flush every rule and
//!   every shared set and map, delete objects no longer wanted, then add the whole
//!   table again. Unlike Recreate it keeps the session-affinity sets' contents.
//! - [`PlanKind::Partial`]: only the objects and elements of changed service ports.
//!   Order within the script: declare new chains and sets; rewrite changed chains;
//!   delete, then add, map elements; flush and delete stale chains; delete stale
//!   sets. A stale chain is therefore unreferenced by the time it is deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use svcproxy_core::model::{IpFamily, ServicePortName};
use svcproxy_core::snapshot::{NodeSnapshot, ServicePortView};

use crate::base::{base_ruleset, BaseCtx, CLUSTER_IPS_SET};
use crate::config::PlanConfig;
use crate::fragment::{ClaimKey, Elem, FamilyCtx, Fragment};
use crate::ruleset::{stmt, write_table_close, write_table_open, Ruleset};

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

/// Two or more service ports claiming one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub family: IpFamily,
    /// The destination, e.g. `198.19.255.1:80/TCP` or `nodePort 30080/TCP`.
    pub destination: String,
    /// The port that gets the destination (the first by name).
    pub kept: ServicePortName,
    /// The ports whose claim is ignored.
    pub ignored: Vec<ServicePortName>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// Service ports programmed, both families.
    pub service_ports: usize,
    /// Service ports planned again for this plan.
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
    /// Every destination conflict in the desired state.
    pub conflicts: Vec<Conflict>,
    pub stats: PlanStats,
    generation: u64,
}

impl Plan {
    pub fn is_full(&self) -> bool {
        self.kind != PlanKind::Partial
    }

    pub fn is_empty(&self) -> bool {
        self.script.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// Nothing known: the next plan recreates the tables.
    Unknown,
    /// The kernel holds exactly the planner's state.
    InSync,
    /// A plan was handed out and not yet committed or abandoned.
    Pending(u64),
}

struct Entry {
    view: Arc<ServicePortView>,
    frag: Fragment,
}

/// Names of a family's objects, to work out what a resync must delete.
#[derive(Default)]
struct Names {
    chains: BTreeSet<String>,
    /// Set name and whether it is a dynamic (affinity) set, whose contents survive.
    sets: BTreeMap<String, bool>,
    maps: BTreeSet<String>,
}

struct FamilyState {
    family: IpFamily,
    /// `None` while the family is not programmed.
    base: Option<BaseCtx>,
    ctx: Option<FamilyCtx>,
    entries: BTreeMap<ServicePortName, Entry>,
    /// Claimants of each destination, sorted; the first wins.
    owners: BTreeMap<ClaimKey, Vec<ServicePortName>>,
    /// Cluster IPs with the number of service ports using each.
    cluster_ips: BTreeMap<IpAddr, u32>,
    conflicted: BTreeSet<ClaimKey>,
    chain_total: usize,
}

/// Script fragments of a partial plan, kept apart so they can be emitted in an
/// order in which every reference resolves.
struct Delta {
    family: IpFamily,
    declare: String,
    flush: String,
    rules: String,
    delete_elements: String,
    add_elements: String,
    flush_stale: String,
    delete_stale_chains: String,
    delete_stale_sets: String,
}

impl Delta {
    fn new(family: IpFamily) -> Self {
        Delta {
            family,
            declare: String::new(),
            flush: String::new(),
            rules: String::new(),
            delete_elements: String::new(),
            add_elements: String::new(),
            flush_stale: String::new(),
            delete_stale_chains: String::new(),
            delete_stale_sets: String::new(),
        }
    }

    fn finish(self, out: &mut String) {
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
            out.push_str(&part);
        }
    }

    /// Statements turning `old` objects of one service port into `new` ones.
    fn objects(&mut self, old: &Ruleset, new: &Ruleset, stats: &mut PlanStats) {
        let f = self.family;
        for (name, chain) in &new.chains {
            match old.chains.get(name) {
                Some(prev) if prev == chain => continue,
                Some(_) => self.flush.push_str(&stmt::flush_chain(f, name)),
                None => self.declare.push_str(&stmt::add_chain(f, name, chain)),
            }
            stats.chains_written += 1;
            for rule in &chain.rules {
                self.rules.push_str(&stmt::add_rule(f, name, rule));
            }
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                // Stale chains reference each other (service → endpoint), so all
                // are flushed before any is deleted.
                self.flush_stale.push_str(&stmt::flush_chain(f, name));
                self.delete_stale_chains
                    .push_str(&stmt::delete_chain(f, name));
                stats.chains_deleted += 1;
            }
        }
        for (name, set) in &new.sets {
            if !old.sets.contains_key(name) {
                self.declare.push_str(&stmt::add_set(f, name, set));
            }
        }
        for name in old.sets.keys() {
            if !new.sets.contains_key(name) {
                self.delete_stale_sets.push_str(&stmt::delete_set(f, name));
            }
        }
    }
}

impl FamilyState {
    fn new(family: IpFamily) -> Self {
        FamilyState {
            family,
            base: None,
            ctx: None,
            entries: BTreeMap::new(),
            owners: BTreeMap::new(),
            cluster_ips: BTreeMap::new(),
            conflicted: BTreeSet::new(),
            chain_total: 0,
        }
    }

    /// The elements the winner of `key` puts in the maps.
    fn effective(&self, key: &ClaimKey) -> Vec<Elem> {
        self.owners
            .get(key)
            .and_then(|owners| owners.first())
            .and_then(|winner| self.entries.get(winner))
            .map(|e| e.frag.elems(key).to_vec())
            .unwrap_or_default()
    }

    /// Brings the family to `snap` under `base`/`ctx` (`None`: not programmed),
    /// re-planning only ports whose view or context changed, and, when `delta` is
    /// given, writes the statements that take the kernel along.
    fn update(
        &mut self,
        snap: &NodeSnapshot,
        base: Option<BaseCtx>,
        ctx: Option<FamilyCtx>,
        changed: &BTreeSet<ServicePortName>,
        mut delta: Option<&mut Delta>,
        stats: &mut PlanStats,
    ) {
        let ctx_changed = self.ctx != ctx;
        let old_ctx = std::mem::replace(&mut self.ctx, ctx);
        self.base = base;

        // Which ports to plan again: a merge walk of the old entries and the
        // snapshot, both ordered by name. A view that is the very same Arc as last
        // time (and not reported changed) keeps its fragment.
        let mut work: Vec<(ServicePortName, Option<Arc<ServicePortView>>)> = Vec::new();
        {
            let empty = BTreeMap::new();
            let ports = if self.ctx.is_some() {
                &snap.service_ports
            } else {
                &empty
            };
            let mut old = self.entries.iter().peekable();
            for (name, view) in ports {
                while let Some((o, _)) = old.next_if(|(o, _)| *o < name) {
                    work.push((o.clone(), None));
                }
                match old.next_if(|(o, _)| *o == name) {
                    Some((_, e))
                        if !ctx_changed
                            && Arc::ptr_eq(&e.view, view)
                            && !changed.contains(name) => {}
                    _ => work.push((name.clone(), Some(view.clone()))),
                }
            }
            for (o, _) in old {
                work.push((o.clone(), None));
            }
        }
        if work.is_empty() {
            return;
        }
        stats.replanned += work.iter().filter(|(_, v)| v.is_some()).count();

        let planned: Vec<(ServicePortName, Option<Entry>)> = work
            .into_iter()
            .map(|(name, view)| {
                let entry = view.map(|view| {
                    let ctx = self.ctx.as_ref().expect("views only when programmed");
                    Entry {
                        frag: Fragment::build(&name, &view, ctx),
                        view,
                    }
                });
                (name, entry)
            })
            .collect();

        let mut touched: BTreeSet<ClaimKey> = BTreeSet::new();
        let mut touched_ips: BTreeSet<IpAddr> = BTreeSet::new();
        for (name, new) in &planned {
            for frag in self
                .entries
                .get(name)
                .map(|e| &e.frag)
                .into_iter()
                .chain(new.as_ref().map(|e| &e.frag))
            {
                touched.extend(frag.claims.iter().map(|(k, _)| *k));
                touched_ips.extend(frag.cluster_ips().iter().copied());
            }
        }
        let before: Vec<Vec<Elem>> = touched.iter().map(|k| self.effective(k)).collect();
        let ips_before: Vec<bool> = touched_ips
            .iter()
            .map(|ip| self.cluster_ips.contains_key(ip))
            .collect();

        for (name, new) in planned {
            let old = self.entries.remove(&name);
            if let Some(d) = delta.as_deref_mut() {
                let empty = Ruleset::new(self.family);
                let old_objs = match (&old, &old_ctx) {
                    (Some(e), Some(c)) => e.frag.objects(&name, c),
                    _ => empty.clone(),
                };
                let new_objs = match (&new, &self.ctx) {
                    (Some(e), Some(c)) => e.frag.objects(&name, c),
                    _ => empty,
                };
                d.objects(&old_objs, &new_objs, stats);
            }
            if let Some(old) = old {
                self.chain_total -= old.frag.chain_count();
                for (key, _) in &old.frag.claims {
                    if let Some(owners) = self.owners.get_mut(key) {
                        owners.retain(|o| o != &name);
                        if owners.is_empty() {
                            self.owners.remove(key);
                        }
                    }
                }
                for ip in old.frag.cluster_ips() {
                    if let Some(n) = self.cluster_ips.get_mut(ip) {
                        *n -= 1;
                        if *n == 0 {
                            self.cluster_ips.remove(ip);
                        }
                    }
                }
            }
            if let Some(new) = new {
                self.chain_total += new.frag.chain_count();
                for (key, _) in &new.frag.claims {
                    let owners = self.owners.entry(*key).or_default();
                    if let Err(i) = owners.binary_search(&name) {
                        owners.insert(i, name.clone());
                    }
                }
                for ip in new.frag.cluster_ips() {
                    *self.cluster_ips.entry(*ip).or_default() += 1;
                }
                self.entries.insert(name, new);
            }
        }

        for (key, before) in touched.iter().zip(before) {
            let after = self.effective(key);
            if self.owners.get(key).is_some_and(|o| o.len() > 1) {
                self.conflicted.insert(*key);
            } else {
                self.conflicted.remove(key);
            }
            let Some(d) = delta.as_deref_mut() else {
                continue;
            };
            let text = key.key_text();
            for b in &before {
                if !after.contains(b) {
                    d.delete_elements.push_str(&stmt::delete_element(
                        self.family,
                        b.map.name(),
                        &text,
                    ));
                    stats.elements_deleted += 1;
                }
            }
            for a in &after {
                if !before.contains(a) {
                    d.add_elements.push_str(&stmt::add_element(
                        self.family,
                        a.map.name(),
                        &text,
                        Some(&a.verdict.text()),
                    ));
                    stats.elements_added += 1;
                }
            }
        }
        if let Some(d) = delta {
            for (ip, was) in touched_ips.iter().zip(ips_before) {
                let is = self.cluster_ips.contains_key(ip);
                if was && !is {
                    d.delete_elements.push_str(&stmt::delete_element(
                        self.family,
                        CLUSTER_IPS_SET,
                        &ip.to_string(),
                    ));
                    stats.elements_deleted += 1;
                } else if is && !was {
                    d.add_elements.push_str(&stmt::add_element(
                        self.family,
                        CLUSTER_IPS_SET,
                        &ip.to_string(),
                        None,
                    ));
                    stats.elements_added += 1;
                }
            }
        }
    }

    /// The shared objects with their elements filled in.
    fn base_with_elements(&self, base: &BaseCtx) -> Ruleset {
        let mut rs = base_ruleset(base);
        if let Some(set) = rs.sets.get_mut(CLUSTER_IPS_SET) {
            set.elements = self.cluster_ips.keys().map(ToString::to_string).collect();
        }
        for (key, owners) in &self.owners {
            let Some(entry) = owners.first().and_then(|w| self.entries.get(w)) else {
                continue;
            };
            let text = key.key_text();
            for elem in entry.frag.elems(key) {
                if let Some(map) = rs.maps.get_mut(elem.map.name()) {
                    map.elements.push((text.clone(), elem.verdict.text()));
                }
            }
        }
        rs
    }

    /// The whole table block, streamed: the shared objects, then each service
    /// port's objects in name order. Nothing but the output grows with the table.
    fn write_table(&self, out: &mut String) -> usize {
        let (Some(base), Some(ctx)) = (&self.base, &self.ctx) else {
            return 0;
        };
        write_table_open(out, self.family);
        let shared = self.base_with_elements(base);
        let mut chains = shared.chains.len();
        shared.write_body(out);
        for (name, entry) in &self.entries {
            let objs = entry.frag.objects(name, ctx);
            chains += objs.chains.len();
            objs.write_body(out);
        }
        write_table_close(out);
        chains
    }

    /// The whole desired table as one typed ruleset.
    fn ruleset(&self) -> Option<Ruleset> {
        let (base, ctx) = (self.base.as_ref()?, self.ctx.as_ref()?);
        let mut rs = self.base_with_elements(base);
        for (name, entry) in &self.entries {
            rs.extend(entry.frag.objects(name, ctx));
        }
        Some(rs)
    }

    fn names(&self) -> Names {
        let mut names = Names::default();
        let Some(base) = &self.base else {
            return names;
        };
        let shared = base_ruleset(base);
        names.chains.extend(shared.chains.into_keys());
        names.sets.extend(
            shared
                .sets
                .into_iter()
                .map(|(n, s)| (n, s.timeout.is_some())),
        );
        names.maps.extend(shared.maps.into_keys());
        for entry in self.entries.values() {
            let (chains, sets) = entry.frag.object_names();
            names.chains.extend(chains);
            names.sets.extend(sets.into_iter().map(|s| (s, true)));
        }
        names
    }

    fn conflicts(&self, out: &mut Vec<Conflict>) {
        for key in &self.conflicted {
            if let Some(owners) = self.owners.get(key) {
                out.push(Conflict {
                    family: self.family,
                    destination: key.to_string(),
                    kept: owners[0].clone(),
                    ignored: owners[1..].to_vec(),
                });
            }
        }
    }
}

/// Plans svcproxy's nftables tables, keeping the last planned state in memory.
pub struct Planner {
    families: [FamilyState; 2],
    kernel: Kernel,
    generation: u64,
}

impl Default for Planner {
    fn default() -> Self {
        Planner::new()
    }
}

impl Planner {
    pub fn new() -> Self {
        Planner {
            families: [
                FamilyState::new(IpFamily::V4),
                FamilyState::new(IpFamily::V6),
            ],
            kernel: Kernel::Unknown,
            generation: 0,
        }
    }

    /// Plans the tables for `v4` and `v6` under `cfg`.
    ///
    /// `full` asks for a full sync (periodic resync). `changed` names the service
    /// ports the caller knows changed; ports whose view is not the same `Arc` as in
    /// the previous plan are re-planned too, so a missed name costs time, never
    /// correctness. The result is a full plan whenever the kernel's state is not
    /// known to match the previous plan (see [`Planner::commit`]).
    pub fn plan(
        &mut self,
        v4: &NodeSnapshot,
        v6: &NodeSnapshot,
        cfg: &PlanConfig,
        full: bool,
        changed: &BTreeSet<ServicePortName>,
    ) -> Plan {
        self.generation += 1;
        let snaps = [v4, v6];
        let mut bases = Vec::with_capacity(2);
        let mut ctxs = Vec::with_capacity(2);
        let mut skeleton_changed = false;
        for (fam, snap) in self.families.iter().zip(snaps) {
            let enabled = cfg.family_enabled(fam.family);
            let base = enabled.then(|| BaseCtx::new(fam.family, cfg, snap));
            skeleton_changed |= fam.base != base;
            bases.push(base);
            ctxs.push(enabled.then(|| FamilyCtx::new(fam.family, cfg, snap)));
        }
        let kind = if self.kernel != Kernel::InSync {
            PlanKind::Recreate
        } else if full || skeleton_changed {
            PlanKind::Resync
        } else {
            PlanKind::Partial
        };
        // What the kernel holds right now, before the state moves on.
        let old_names: Vec<Names> = if kind == PlanKind::Resync {
            self.families.iter().map(FamilyState::names).collect()
        } else {
            Vec::new()
        };

        let mut stats = PlanStats::default();
        let mut script = String::new();
        for ((fam, snap), (base, ctx)) in self
            .families
            .iter_mut()
            .zip(snaps)
            .zip(bases.into_iter().zip(ctxs))
        {
            let mut delta = (kind == PlanKind::Partial).then(|| Delta::new(fam.family));
            fam.update(snap, base, ctx, changed, delta.as_mut(), &mut stats);
            if let Some(d) = delta {
                d.finish(&mut script);
            }
        }
        match kind {
            PlanKind::Partial => {}
            PlanKind::Recreate => {
                script = self.render_counting(&mut stats);
            }
            PlanKind::Resync => {
                for (fam, old) in self.families.iter().zip(&old_names) {
                    Self::write_resync(fam, old, &mut script, &mut stats);
                }
            }
        }
        let mut conflicts = Vec::new();
        for fam in &self.families {
            fam.conflicts(&mut conflicts);
            stats.service_ports += fam.entries.len();
            stats.chains += fam.chain_total;
        }
        self.kernel = Kernel::Pending(self.generation);
        Plan {
            kind,
            script,
            conflicts,
            stats,
            generation: self.generation,
        }
    }

    fn write_resync(fam: &FamilyState, old: &Names, out: &mut String, stats: &mut PlanStats) {
        let f = fam.family;
        out.push_str(&stmt::add_table(f));
        if fam.base.is_none() {
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
        stats.chains_written += fam.write_table(out);
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

    /// The last plan was not applied (or failed): the next plan recreates the
    /// tables from scratch.
    pub fn abandon(&mut self) {
        self.kernel = Kernel::Unknown;
    }

    /// The full script for the last planned state, as a first sync would apply it
    /// (what `svcproxy render` prints): for each family `add table` and `delete
    /// table` (so it applies whatever exists) and then the whole table. Rendering it
    /// costs time and memory in proportion to the whole ruleset, so partial plans do
    /// not carry it.
    pub fn render(&self) -> String {
        self.render_counting(&mut PlanStats::default())
    }

    fn render_counting(&self, stats: &mut PlanStats) -> String {
        let mut out = String::new();
        for fam in &self.families {
            out.push_str(&stmt::add_table(fam.family));
            out.push_str(&stmt::delete_table(fam.family));
            stats.chains_written += fam.write_table(&mut out);
        }
        out
    }

    /// The last planned state of one family as a typed ruleset; `None` when the
    /// family is not programmed.
    pub fn ruleset(&self, family: IpFamily) -> Option<Ruleset> {
        self.families
            .iter()
            .find(|f| f.family == family)
            .and_then(FamilyState::ruleset)
    }
}

/// The full script for these snapshots from a fresh planner: exactly what the first
/// sync would apply.
pub fn render_full(v4: &NodeSnapshot, v6: &NodeSnapshot, cfg: &PlanConfig) -> String {
    let mut planner = Planner::new();
    planner.plan(v4, v6, cfg, true, &BTreeSet::new()).script
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
