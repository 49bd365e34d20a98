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
//!
//! The parts, by concern: `family` (one family's state: its fragments, the
//! elements they share, and a delta applied to them), `partial` (a partial
//! plan's script, section by section), `table` (the whole table: as text, as
//! typed statements, as a ruleset), `cold_start` (the whole table in bounded
//! transactions), `resync` (the whole table rewritten in place), `ops` (the
//! typed statements they share). Here: the plans' types, and the [`Planner`]
//! that decides which kind of plan to make.

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
    base_ruleset, clusterip_dnat_map, clusterip_port_set, clusterip_rule, clusterip_set,
    endpoint_map_decl, loopback, CLUSTER_IPS_SET, HAIRPIN_SET, NODEPORT_IPS_SET, SERVICES_CHAIN,
};
use super::elements::{concat, concat_text, Atom, ElemOp, ElemValue};
use super::ruleset::{
    family_keyword, stmt, write_map, write_table_close, write_table_open, Chain, Map, Ruleset, Set,
    TABLE_NAME,
};
use super::service::{
    cluster_elems, elems, key_atoms, key_text, CapturePorts, DataElem, Detect, Elem, Fragment,
    POD_CIDRS_SET,
};
use super::slots::Slots;
use super::typed::{disjoint_prefixes, Action as RuleAction, Addr, Match, Op, TypedRule};
use crate::names::sanitize_comment;

mod cold_start;
mod family;
mod ops;
mod partial;
mod resync;
mod table;

pub use cold_start::{needed_first, ColdStart};
use family::FamilyState;
use ops::*;
use partial::Delta;
use resync::Names;

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

/// A plan's typed operations: none (a text plan), or emitted (a partial plan's
/// own, else the whole tables', staged for a cold start when given).
enum TypedOps {
    None,
    Emit {
        cold: Option<ColdStart>,
        partial: Vec<Op>,
    },
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
