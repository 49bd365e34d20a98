//! The nftables data plane: the intent translated by [`svcproxy_plan::nft`] and
//! applied as one atomic transaction per family and sync (an nf_tables batch over
//! netlink), or one `nft -f` for both families when a statement has no typed form
//! or `--nft-writer text` asks for it.
//!
//! Entry point: [`NftDataPlane`]. It keeps the planner, which knows whether the
//! kernel holds the last plan: a plan is committed when `nft` accepted it and
//! abandoned otherwise (the next one then recreates the tables).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use std::sync::Arc;
use svcproxy_core::model::IpFamily;

use svcproxy_plan::nft::{
    cleanup_script, render_full_with, typed::Op, CapturePorts, ColdStart, Output, PlanKind,
    Planner, Step, DRIFT_WATCHED_CHAINS, TABLE_NAME,
};
use svcproxy_plan::{Intent, IntentDelta, PlanConfig};

use super::NftWriter;
use crate::error::DataPlaneError;
use crate::kernel::listing::{self, Compared};
use crate::kernel::nft::{Batch, BatchBuilder, NftCommand, ScriptSink, TableState};
use crate::kernel::sysctl::required_sysctls;
use crate::seam::{ApplyReport, Comparison, DataPlane, NodeRequirements, SyncKind};

/// svcproxy's nftables tables (`ip svcproxy`, `ip6 svcproxy`), written through a
/// [`ScriptSink`]: the real `nft` ([`NftCommand`], optionally behind a netns
/// prefix) or a recorder in tests.
pub struct NftDataPlane<S = NftCommand> {
    planner: Planner,
    sink: S,
    /// Each family's table as the last successful full sync left it (what the drift
    /// check compares with); empty before it and after a failure.
    expected: BTreeMap<IpFamily, TableState>,
    /// Per family in `expected`, the use counts the last full sync left of the
    /// chains the drift check watches ([`DRIFT_WATCHED_CHAINS`]: their rules and
    /// the jumps to them): lower now means the table or a base chain was flushed,
    /// which leaves the table's handle as it was.
    watched_uses: BTreeMap<IpFamily, Vec<(&'static str, u32)>>,
    /// The userspace mode's capture (set chains redirect to its sockets).
    capture: Option<Arc<dyn CapturePorts>>,
    /// `--nft-writer`: whether a plan whose every statement is typed goes to the
    /// sink as typed statements (netlink) or as its script.
    writer: NftWriter,
    /// The configuration the plane was made for, when its metrics depend on it
    /// (KEP-6032's reject counters).
    cfg: Option<PlanConfig>,
    /// How a first sync into a node without svcproxy's tables is cut into
    /// transactions; `None`: one transaction.
    cold_start: Option<ColdStart>,
}

impl NftDataPlane<NftCommand> {
    /// Runs `nft` from `PATH` in the current network namespace.
    pub fn new() -> Self {
        NftDataPlane::with_sink(NftCommand::default())
    }
}

impl Default for NftDataPlane<NftCommand> {
    fn default() -> Self {
        NftDataPlane::new()
    }
}

impl<S: ScriptSink> NftDataPlane<S> {
    pub fn with_sink(sink: S) -> Self {
        NftDataPlane::with_capture(sink, None)
    }

    /// The tables of the userspace mode when `capture` is given: the same objects,
    /// with each endpoint set's chain redirecting to the proxy's port for it.
    pub fn with_capture(sink: S, capture: Option<Arc<dyn CapturePorts>>) -> Self {
        NftDataPlane {
            planner: Planner::with_capture(capture.clone()),
            sink,
            expected: BTreeMap::new(),
            watched_uses: BTreeMap::new(),
            capture,
            writer: NftWriter::default(),
            cfg: None,
            cold_start: Some(ColdStart::default()),
        }
    }

    /// The same data plane writing a cold start (no svcproxy table in the
    /// kernel) in the steps of `cold`, or, with `None`, in one transaction.
    pub fn with_cold_start(mut self, cold: Option<ColdStart>) -> Self {
        self.cold_start = cold;
        self
    }

    /// The same data plane exporting the metrics `cfg` asks for: the localhost
    /// NodePort reject counters when KEP-6032's gate is on.
    pub fn with_config(mut self, cfg: &PlanConfig) -> Self {
        self.cfg = Some(cfg.clone());
        self
    }

    /// The same data plane writing as `writer` says (`--nft-writer`).
    pub fn with_writer(mut self, writer: NftWriter) -> Self {
        self.writer = writer;
        self
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }

    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }
}

/// The chain a sealed table carries whatever its seal (found with one question).
const SEALED_CHAIN: &str = "sealed";

/// The chain naming a table's seal ([`DataPlane::seal`]).
fn seal_chain(seal: &str) -> String {
    format!("seal-{seal}")
}

impl<S: ScriptSink> NftDataPlane<S> {
    /// Adds (or, with `delete`, deletes) the empty chains `chains` in `families`'
    /// tables, in one transaction.
    fn write_chains(
        &mut self,
        families: &[IpFamily],
        chains: &[String],
        delete: bool,
    ) -> Result<(), DataPlaneError> {
        let mut script = String::new();
        let mut batch = BatchBuilder::new();
        for &family in families {
            let keyword = svcproxy_plan::nft::family_keyword(family);
            for name in chains {
                let verb = if delete { "delete" } else { "add" };
                script.push_str(&format!("{verb} chain {keyword} {TABLE_NAME} {name}\n"));
                batch.push(if delete {
                    Op::DeleteChain {
                        family,
                        name: name.clone(),
                    }
                } else {
                    Op::AddChain {
                        family,
                        name: name.clone(),
                        comment: None,
                        base: None,
                    }
                });
            }
        }
        if self.writer == NftWriter::Netlink && self.sink.writes_typed() {
            self.sink.apply_batch(batch.finish(), &script)
        } else {
            self.sink.apply(&script)
        }
    }

    /// Reads the tables a full sync just wrote (a recreated table has a new handle).
    /// A family that cannot be read is left out of the drift check until the next
    /// full sync.
    /// Whether this sync is a first one into a node without svcproxy's tables,
    /// written in bounded steps (every other writer of the node's nftables waits
    /// for one step at most); the tables being absent, no step replaces anything.
    fn writes_in_steps(&mut self) -> bool {
        self.cold_start.is_some()
            && self.planner.will_recreate()
            && IpFamily::BOTH.into_iter().all(|f| {
                matches!(
                    self.sink.table_state(f, TABLE_NAME),
                    Ok(TableState::Missing)
                )
            })
    }

    fn remember_tables(&mut self) {
        self.forget_tables();
        for family in IpFamily::BOTH {
            match self.sink.table_state(family, TABLE_NAME) {
                Ok(state) => {
                    self.expected.insert(family, state);
                    if matches!(state, TableState::Present { .. }) {
                        match self.watched_uses(family) {
                            Ok(uses) => {
                                self.watched_uses.insert(family, uses);
                            }
                            // A recorder cannot ask; a kernel that would not answer
                            // leaves the drift check unarmed (see `drift_armed`).
                            Err(e) => {
                                tracing::debug!(%family, error = %e, "cannot read the use counts of svcproxy's nftables chains")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%family, error = %e, "cannot read svcproxy's nftables table; its drift check waits for the next full sync")
                }
            }
        }
    }

    /// What the kernel holds as the last full sync left it: nothing known.
    fn forget_tables(&mut self) {
        self.expected.clear();
        self.watched_uses.clear();
    }

    /// The use count of each watched chain of `family`'s table that exists.
    fn watched_uses(
        &mut self,
        family: IpFamily,
    ) -> Result<Vec<(&'static str, u32)>, DataPlaneError> {
        let mut uses = Vec::new();
        for &chain in DRIFT_WATCHED_CHAINS {
            if let Some(n) = self.sink.chain_use(family, TABLE_NAME, chain)? {
                uses.push((chain, n));
            }
        }
        Ok(uses)
    }
}

/// The transactions of one sync, sent as the planner ends them: each family's
/// batch on its own, the other family's not sent once one failed (the next sync
/// rewrites both anyway).
struct Steps {
    began: Instant,
    /// When the first transaction was in (a cold start's first step: the
    /// Services needed first), from `began`.
    first: Option<Duration>,
    failed: Option<DataPlaneError>,
    /// Time in the kernel per family (v4, v6).
    spent: [Duration; 2],
    sent: usize,
    longest: Duration,
}

impl Steps {
    fn new() -> Self {
        Steps {
            began: Instant::now(),
            first: None,
            failed: None,
            spent: [Duration::ZERO; 2],
            sent: 0,
            longest: Duration::ZERO,
        }
    }

    fn send<S: ScriptSink + ?Sized>(&mut self, sink: &mut S, batches: &mut [BatchBuilder; 2]) {
        for (i, b) in batches.iter_mut().enumerate() {
            self.send_one(sink, i, std::mem::take(b).finish());
        }
    }

    /// Sends family `i`'s (v4, v6) `batch`, unless it is empty or one failed.
    fn send_one<S: ScriptSink + ?Sized>(&mut self, sink: &mut S, i: usize, batch: Batch) {
        if batch.is_empty() || self.failed.is_some() {
            return;
        }
        let at = Instant::now();
        if let Err(e) = sink.apply_batch(batch, "") {
            self.failed = Some(e);
        }
        let took = at.elapsed();
        tracing::debug!(
            transaction = self.sent,
            ms = took.as_secs_f64() * 1e3,
            "nftables transaction"
        );
        self.spent[i] += took;
        self.sent += 1;
        self.first.get_or_insert_with(|| self.began.elapsed());
        self.longest = self.longest.max(took);
    }
}

/// `op` into its family's batch (v4 first, as [`Steps`] counts them).
fn push_op(batches: &mut [BatchBuilder; 2], op: Op) {
    batches[usize::from(op.family() == IpFamily::V6)].push(op);
}

/// Transactions waiting for the writer: the planner encodes the next step while
/// the kernel commits this one. One, so that at most three steps' encoded
/// statements are held (the one in the kernel, one waiting, one being encoded).
const STEPS_AHEAD: usize = 1;

/// A cold start's steps, planned on this thread and sent to the kernel by another
/// as each ends ([`STEPS_AHEAD`] at most waiting): the kernel's time (1.5 s of
/// 3.5 s at 100k Services x 10 endpoints) is spent while the next steps are
/// planned and encoded, on the core the planner leaves idle. In order, and none
/// after one failed, as on one thread. Returns the plan, and the remaining
/// statements (the last step's), not yet sent; an error, before anything is
/// planned, when no thread can be had.
fn plan_and_send_in_steps<S: ScriptSink + Send>(
    planner: &mut Planner,
    sink: &mut S,
    steps: &mut Steps,
    plan: impl FnOnce(&mut Planner, &mut dyn FnMut(Step)) -> svcproxy_plan::nft::Plan,
) -> Result<(svcproxy_plan::nft::Plan, [BatchBuilder; 2]), DataPlaneError> {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Batch)>(STEPS_AHEAD);
        let writer = std::thread::Builder::new()
            .name("nft-writer".into())
            .spawn_scoped(scope, move || {
                for (i, batch) in rx {
                    steps.send_one(sink, i, batch);
                }
            })
            .map_err(|source| DataPlaneError::Spawn {
                command: "the nftables writer thread".to_string(),
                source,
            })?;
        let mut batches = [BatchBuilder::new(), BatchBuilder::new()];
        let plan = plan(planner, &mut |step| match step {
            Step::Op(op) => push_op(&mut batches, op),
            Step::Commit => {
                for (i, b) in batches.iter_mut().enumerate() {
                    // A closed channel: the writer is gone (a panic), which the
                    // join below passes on.
                    let _ = tx.send((i, std::mem::take(b).finish()));
                }
            }
        });
        drop(tx);
        if let Err(panic) = writer.join() {
            std::panic::resume_unwind(panic);
        }
        Ok((plan, batches))
    })
}

/// Why `now` is not the table a sync left (`expected`), if it is not.
fn table_drift(family: IpFamily, expected: TableState, now: TableState) -> Option<String> {
    let table = format!(
        "table {} {TABLE_NAME}",
        svcproxy_plan::nft::family_keyword(family)
    );
    match (expected, now) {
        (a, b) if a == b => None,
        (TableState::Present { .. }, TableState::Missing) => Some(format!("{table} was deleted")),
        (TableState::Missing, TableState::Present { .. }) => Some(format!(
            "{table} exists, though svcproxy programs no {family} service"
        )),
        (_, TableState::Present { dormant: true, .. }) => Some(format!(
            "{table} was made dormant (its rules see no packets)"
        )),
        _ => Some(format!(
            "{table} was deleted and created again by someone else"
        )),
    }
}

/// Why watched chain `chain`, used `expected` times after the last full sync, is
/// not as that sync left it (`now`), if it is not.
fn chain_drift(family: IpFamily, chain: &str, expected: u32, now: Option<u32>) -> Option<String> {
    let chain = format!(
        "chain {chain} of table {} {TABLE_NAME}",
        svcproxy_plan::nft::family_keyword(family)
    );
    match now {
        None => Some(format!("{chain} was deleted")),
        Some(n) if n < expected => Some(format!(
            "{chain} lost rules or the jumps to it ({n} of {expected} left: the table or a base chain was flushed)"
        )),
        Some(_) => None,
    }
}

/// What a sync applied, for the debug log.
fn log_applied(plan: &svcproxy_plan::nft::Plan, apply: Duration) {
    tracing::debug!(
        kind = ?plan.kind,
        bytes = plan.script.len(),
        chains = plan.stats.chains,
        chains_written = plan.stats.chains_written,
        chains_deleted = plan.stats.chains_deleted,
        elements_added = plan.stats.elements_added,
        elements_deleted = plan.stats.elements_deleted,
        ?apply,
        "nftables applied"
    );
}

impl<S: ScriptSink + Send> DataPlane for NftDataPlane<S> {
    fn mode(&self) -> &'static str {
        super::MODE
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        // Over netlink the statements are encoded as the planner makes them: a
        // full sync's are never all held at once, and it renders no script.
        let typed = self.writer == NftWriter::Netlink && self.sink.writes_typed();
        self.planner
            .set_output(if typed { Output::Typed } else { Output::Text });
        let staged = typed && self.writes_in_steps();
        self.planner
            .set_cold_start(staged.then_some(self.cold_start).flatten());
        // One batch per family: each family's table is its own transaction, as
        // upstream's proxier per family, and its time in the kernel its own.
        let mut steps = Steps::new();
        let (plan, mut batches) = if staged {
            plan_and_send_in_steps(
                &mut self.planner,
                &mut self.sink,
                &mut steps,
                |planner, out| planner.plan_steps_into(intent, delta, full, out),
            )?
        } else {
            let mut batches = [BatchBuilder::new(), BatchBuilder::new()];
            let plan = self
                .planner
                .plan_steps_into(intent, delta, full, &mut |step| match step {
                    Step::Op(op) if typed => push_op(&mut batches, op),
                    Step::Op(_) | Step::Commit => {}
                });
            (plan, batches)
        };
        let mut family_apply = Vec::new();
        let mut text_apply = None;
        let applied = match plan.is_empty() {
            true => {
                // Nothing to write: no family spent time in the kernel.
                family_apply = IpFamily::BOTH.map(|f| (f, Duration::ZERO)).to_vec();
                Ok(())
            }
            false if typed && plan.all_typed => {
                steps.send(&mut self.sink, &mut batches);
                family_apply = IpFamily::BOTH.into_iter().zip(steps.spent).collect();
                steps.failed.map_or(Ok(()), Err)
            }
            false => {
                let at = Instant::now();
                let applied = self.sink.apply(&plan.script);
                text_apply = Some(at.elapsed());
                applied
            }
        };
        if staged && applied.is_ok() && steps.sent > 0 {
            tracing::info!(
                transactions = steps.sent,
                longest_ms = steps.longest.as_secs_f64() * 1e3,
                first_in_ms = steps.first.unwrap_or_default().as_secs_f64() * 1e3,
                "nftables cold start written in steps"
            );
        }
        let apply_duration = match text_apply {
            Some(took) => took,
            None => steps.spent.iter().sum(),
        };
        match applied {
            Ok(()) => self.planner.commit(&plan),
            Err(e) => {
                self.planner.abandon();
                self.forget_tables();
                return Err(e);
            }
        }
        if plan.kind != PlanKind::Partial || self.expected.is_empty() {
            self.remember_tables();
        }
        log_applied(&plan, apply_duration);
        Ok(ApplyReport {
            kind: match plan.kind {
                PlanKind::Recreate => SyncKind::Recreate,
                PlanKind::Resync => SyncKind::Resync,
                PlanKind::Partial => SyncKind::Partial,
            },
            apply_duration,
            family_apply,
            script_bytes: plan.script.len(),
            rules: Vec::new(),
            stale_flows: Vec::new(),
        })
    }

    fn render(&self, intent: &Intent) -> String {
        render_full_with(intent, self.capture.clone())
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        // Asked over netlink first: nothing to remove needs no `nft` at all.
        let none = IpFamily::BOTH.into_iter().all(|family| {
            matches!(
                self.sink.table_state(family, TABLE_NAME),
                Ok(TableState::Missing)
            )
        });
        if none {
            return Ok(());
        }
        self.sink.apply(&cleanup_script())
    }

    fn drift_armed(&self) -> bool {
        // Both families read after the last full sync, and each table there
        // with its chains' use counts.
        IpFamily::BOTH
            .into_iter()
            .all(|f| match self.expected.get(&f) {
                Some(TableState::Present { .. }) => self.watched_uses.contains_key(&f),
                Some(TableState::Missing) => true,
                None => false,
            })
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        let mut found = Vec::new();
        let expected: Vec<(IpFamily, TableState)> =
            self.expected.iter().map(|(f, s)| (*f, *s)).collect();
        for (family, want) in expected {
            let now = self.sink.table_state(family, TABLE_NAME)?;
            if let Some(drift) = table_drift(family, want, now) {
                found.push(drift);
            } else if let Some(uses) = self.watched_uses.get(&family).cloned() {
                for (chain, was) in uses {
                    let now = self.sink.chain_use(family, TABLE_NAME, chain)?;
                    found.extend(chain_drift(family, chain, was, now));
                }
            }
        }
        if found.is_empty() {
            return Ok(None);
        }
        // The kernel no longer holds the last plan: the next one recreates the
        // tables (which also wakes a dormant one).
        self.planner.abandon();
        self.forget_tables();
        Ok(Some(found.join("; ")))
    }

    fn seal(&mut self, seal: &str) -> Result<bool, DataPlaneError> {
        // The userspace mode's redirects point at this process's sockets.
        if self.capture.is_some() || self.expected.is_empty() {
            return Ok(false);
        }
        let families: Vec<IpFamily> = self
            .expected
            .iter()
            .filter(|(_, state)| matches!(state, TableState::Present { .. }))
            .map(|(f, _)| *f)
            .collect();
        if families.is_empty() {
            return Ok(false);
        }
        let chains = [SEALED_CHAIN.to_string(), seal_chain(seal)];
        self.write_chains(&families, &chains, false)?;
        Ok(true)
    }

    fn sealed(&mut self) -> Result<bool, DataPlaneError> {
        if self.capture.is_some() {
            return Ok(false);
        }
        for family in IpFamily::BOTH {
            if self.sink.chain_exists(family, TABLE_NAME, SEALED_CHAIN)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn adopt(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        seal: &str,
    ) -> Result<bool, DataPlaneError> {
        if self.capture.is_some() {
            return Ok(false);
        }
        // Every family this intent programs carries the seal; the others have no
        // table (as a first sync would leave them).
        let chain = seal_chain(seal);
        let mut programmed = Vec::new();
        for family in IpFamily::BOTH {
            if intent.family(family).node().is_some() {
                if !self.sink.chain_exists(family, TABLE_NAME, &chain)? {
                    return Ok(false);
                }
                programmed.push(family);
            } else if self.sink.table_state(family, TABLE_NAME)? != TableState::Missing {
                return Ok(false);
            }
        }
        // The state a first sync would leave, without its statements.
        self.planner.set_output(Output::Typed);
        let plan = self.planner.plan_into(intent, delta, true, &mut |_| {});
        let chains = [SEALED_CHAIN.to_string(), chain];
        if let Err(e) = self.write_chains(&programmed, &chains, true) {
            self.planner.abandon();
            self.forget_tables();
            return Err(e);
        }
        self.planner.adopt(&plan);
        self.remember_tables();
        Ok(true)
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.cfg
            .as_ref()
            .and_then(super::localhost_rejects::collector)
            .into_iter()
            .collect()
    }

    fn compare(&mut self, intent: &Intent) -> Result<Comparison, DataPlaneError> {
        let script = render_full_with(intent, self.capture.clone());
        // The plan in the kernel's form, or else in the planner's (counts only).
        let (planned, how, counted_only) = match self.sink.scratch_listing(&script) {
            Ok(listed) => (listed, Compared::Rules, None),
            Err(e) => (
                script,
                Compared::Counts,
                Some(format!(
                    "the plan could not be listed in the kernel's form (loading it into a scratch network namespace failed: {e})"
                )),
            ),
        };
        let mut out = Comparison {
            counted_only,
            ..Comparison::default()
        };
        let mut programmed = Vec::new();
        for family in IpFamily::BOTH {
            if intent.family(family).node().is_none() {
                continue;
            }
            let keyword = svcproxy_plan::nft::family_keyword(family);
            programmed.push(keyword);
            let what = format!("table {keyword} {TABLE_NAME}");
            let expected = listing::nft_listing(&planned, keyword, TABLE_NAME);
            match self
                .sink
                .list(&["-s", "list", "table", keyword, TABLE_NAME])?
            {
                None => out.differences.push(format!("{what} is missing")),
                Some(text) => {
                    let live = listing::nft_listing(&text, keyword, TABLE_NAME);
                    out.differences
                        .extend(listing::differences(&what, &expected, &live, how));
                }
            }
        }
        out.ahead = self.chains_ahead(&programmed)?;
        Ok(out)
    }

    fn node_requirements(&self, cfg: &PlanConfig) -> NodeRequirements {
        NodeRequirements {
            sysctls: required_sysctls(cfg),
            // nf_tables and its expressions are loaded by the kernel on demand.
            modules: Vec::new(),
        }
    }
}

impl<S: ScriptSink> NftDataPlane<S> {
    /// Other tables' base chains that see packets of the `families` (`ip`,
    /// `ip6`) before svcproxy's at the same hook, leaving out those that cannot
    /// change a packet (no rule, policy accept).
    fn chains_ahead(&mut self, families: &[&str]) -> Result<Vec<String>, DataPlaneError> {
        let Some(json) = self.sink.list(&["-j", "list", "chains"])? else {
            return Ok(Vec::new());
        };
        let chains = listing::nft_base_chains(&json).map_err(|e| DataPlaneError::Io {
            command: "nft -j list chains".into(),
            source: std::io::Error::other(e),
        })?;
        // Per foreign chain (an `inet` one sees both families): the families it
        // sees before svcproxy, and the first chain of ours it precedes.
        let mut found: Vec<(&listing::BaseChain, Vec<&str>, &listing::BaseChain)> = Vec::new();
        for family in families {
            for (other, mine) in listing::nft_chains_ahead(&chains, family, TABLE_NAME) {
                match found.iter_mut().find(|(o, _, _)| *o == other) {
                    Some((_, fams, first)) => {
                        fams.push(family);
                        if mine.priority < first.priority {
                            *first = mine;
                        }
                    }
                    None => found.push((other, vec![family], mine)),
                }
            }
        }
        let mut out = Vec::new();
        for (other, fams, mine) in found {
            let rules = match self.sink.list(&[
                "-j",
                "list",
                "chain",
                &other.family,
                &other.table,
                &other.name,
            ])? {
                Some(json) => listing::nft_rule_count(&json),
                None => continue,
            };
            if rules == 0 && other.policy == "accept" {
                continue;
            }
            let when = if other.priority == mine.priority {
                "at the same priority as"
            } else {
                "before"
            };
            out.push(format!(
                "table {} {} chain {} (hook {}, priority {}, policy {}, {rules} rules) sees {} packets {when} svcproxy's chain {} (priority {})",
                other.family,
                other.table,
                other.name,
                other.hook,
                other.priority,
                other.policy,
                fams.join(" and "),
                mine.name,
                mine.priority
            ));
        }
        Ok(out)
    }
}

/// Removes svcproxy's tables (both families) and nothing else, running the `nft`
/// binary at `nft`. Succeeds when they do not exist.
pub fn cleanup(nft: &str) -> Result<(), DataPlaneError> {
    cleanup_with(&mut NftCommand::new(nft))
}

/// [`cleanup`] through any sink (e.g. an [`NftCommand`] with a netns prefix).
pub fn cleanup_with<S: ScriptSink + ?Sized>(sink: &mut S) -> Result<(), DataPlaneError> {
    sink.apply(&cleanup_script())
}
