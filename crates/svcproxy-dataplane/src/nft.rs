//! The nftables data plane: the intent translated by [`svcproxy_plan::nft`] and
//! applied with `nft -f` as one atomic transaction per sync.
//!
//! Entry point: [`NftDataPlane`]. It keeps the planner, which knows whether the
//! kernel holds the last plan: a plan is committed when `nft` accepted it and
//! abandoned otherwise (the next one then recreates the tables).

use std::collections::BTreeMap;
use std::time::Instant;

use svcproxy_core::model::IpFamily;
use svcproxy_plan::nft::{cleanup_script, PlanKind, Planner, TABLE_NAME};
use svcproxy_plan::{Intent, IntentDelta, PlanConfig};

use crate::backend::{
    ApplyReport, Backend, DataPlane, FailureCounter, FailureKind, NodeRequirements, SyncKind,
};
use crate::error::DataPlaneError;
use crate::nft_table::TableState;
use crate::node::required_sysctls;
use crate::sink::{NftCommand, ScriptSink};

/// The nftables mode in the registry.
pub const BACKEND: Backend = Backend {
    counts_rules: false,
    mode: "nftables",
    failure_counters: &[
        FailureCounter {
            kind: FailureKind::Sync,
            name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            help: "Cumulative proxy nftables sync failures",
        },
        // Stale chains go in the same transaction as the sync, so a failed
        // cleanup shows as a failed sync and this stays 0 (as upstream names it).
        FailureCounter {
            kind: FailureKind::Cleanup,
            name: "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            help: "Cumulative proxy nftables cleanup failures",
        },
    ],
    semantics: svcproxy_plan::nft::SEMANTICS,
    new: |_| Box::new(NftDataPlane::new()),
};

/// svcproxy's nftables tables (`ip svcproxy`, `ip6 svcproxy`), written through a
/// [`ScriptSink`]: the real `nft` ([`NftCommand`], optionally behind a netns
/// prefix) or a recorder in tests.
pub struct NftDataPlane<S = NftCommand> {
    planner: Planner,
    sink: S,
    /// Each family's table as the last successful full sync left it (what the drift
    /// check compares with); empty before it and after a failure.
    expected: BTreeMap<IpFamily, TableState>,
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
        NftDataPlane {
            planner: Planner::new(),
            sink,
            expected: BTreeMap::new(),
        }
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }

    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }
}

impl<S: ScriptSink> NftDataPlane<S> {
    /// Reads the tables a full sync just wrote (a recreated table has a new handle).
    /// A family that cannot be read is left out of the drift check until the next
    /// full sync.
    fn remember_tables(&mut self) {
        self.expected.clear();
        for family in IpFamily::BOTH {
            match self.sink.table_state(family, TABLE_NAME) {
                Ok(state) => {
                    self.expected.insert(family, state);
                }
                Err(e) => {
                    tracing::warn!(%family, error = %e, "cannot read svcproxy's nftables table; its drift check waits for the next full sync")
                }
            }
        }
    }
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

impl<S: ScriptSink + Send> DataPlane for NftDataPlane<S> {
    fn mode(&self) -> &'static str {
        BACKEND.mode
    }

    fn sync(
        &mut self,
        intent: &Intent,
        delta: &IntentDelta,
        full: bool,
    ) -> Result<ApplyReport, DataPlaneError> {
        let plan = self.planner.plan(intent, delta, full);
        let start = Instant::now();
        let applied = if plan.is_empty() {
            Ok(())
        } else {
            self.sink.apply(&plan.script)
        };
        let apply_duration = start.elapsed();
        match applied {
            Ok(()) => self.planner.commit(&plan),
            Err(e) => {
                self.planner.abandon();
                self.expected.clear();
                return Err(e);
            }
        }
        if plan.kind != PlanKind::Partial || self.expected.is_empty() {
            self.remember_tables();
        }
        tracing::debug!(
            kind = ?plan.kind,
            bytes = plan.script.len(),
            chains = plan.stats.chains,
            chains_written = plan.stats.chains_written,
            chains_deleted = plan.stats.chains_deleted,
            elements_added = plan.stats.elements_added,
            elements_deleted = plan.stats.elements_deleted,
            apply = ?apply_duration,
            "nftables applied"
        );
        Ok(ApplyReport {
            kind: match plan.kind {
                PlanKind::Recreate => SyncKind::Recreate,
                PlanKind::Resync => SyncKind::Resync,
                PlanKind::Partial => SyncKind::Partial,
            },
            apply_duration,
            script_bytes: plan.script.len(),
            rules: Vec::new(),
        })
    }

    fn render(&self, intent: &Intent) -> String {
        svcproxy_plan::nft::render_full(intent)
    }

    fn cleanup(&mut self) -> Result<(), DataPlaneError> {
        self.sink.apply(&cleanup_script())
    }

    fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        let mut found = Vec::new();
        let expected: Vec<(IpFamily, TableState)> =
            self.expected.iter().map(|(f, s)| (*f, *s)).collect();
        for (family, want) in expected {
            let now = self.sink.table_state(family, TABLE_NAME)?;
            found.extend(table_drift(family, want, now));
        }
        if found.is_empty() {
            return Ok(None);
        }
        // The kernel no longer holds the last plan: the next one recreates the
        // tables (which also wakes a dormant one).
        self.planner.abandon();
        self.expected.clear();
        Ok(Some(found.join("; ")))
    }

    fn compare(&mut self, intent: &Intent) -> Result<Vec<String>, DataPlaneError> {
        let script = svcproxy_plan::nft::render_full(intent);
        let mut out = Vec::new();
        for family in IpFamily::BOTH {
            if intent.family(family).node().is_none() {
                continue;
            }
            let keyword = svcproxy_plan::nft::family_keyword(family);
            let what = format!("table {keyword} {TABLE_NAME}");
            let expected = crate::shape::nft_script_shape(&script, keyword, TABLE_NAME);
            match self.sink.list_json(family, TABLE_NAME)? {
                None => out.push(format!("{what} is missing")),
                Some(json) => {
                    let live =
                        crate::shape::nft_json_shape(&json).map_err(|e| DataPlaneError::Io {
                            command: "nft -j list table".into(),
                            source: std::io::Error::other(e),
                        })?;
                    out.extend(crate::shape::differences(&what, &expected, &live));
                }
            }
        }
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

/// Removes svcproxy's tables (both families) and nothing else, running the `nft`
/// binary at `nft`. Succeeds when they do not exist.
pub fn cleanup(nft: &str) -> Result<(), DataPlaneError> {
    cleanup_with(&mut NftCommand::new(nft))
}

/// [`cleanup`] through any sink (e.g. an [`NftCommand`] with a netns prefix).
pub fn cleanup_with<S: ScriptSink + ?Sized>(sink: &mut S) -> Result<(), DataPlaneError> {
    sink.apply(&cleanup_script())
}
