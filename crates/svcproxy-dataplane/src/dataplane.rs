//! [`NftDataPlane`]: plan, apply atomically, commit or abandon; then clean up the
//! UDP conntrack entries the change left stale.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use svcproxy_core::model::IpFamily;
use svcproxy_core::state::SnapshotUpdate;
use svcproxy_plan::{
    cleanup_script, render_full, Conflict, PlanConfig, PlanKind, PlanStats, Planner,
};

use crate::conntrack::{
    cleanup_filters, ConntrackCleaner, ConntrackCleanupReport, ConntrackFilter, NoConntrackCleanup,
};

/// The most failed conntrack filters kept for a retry.
const MAX_CONNTRACK_RETRY: usize = 10_000;
use crate::ctnetlink::NetlinkConntrack;
use crate::error::DataPlaneError;
use crate::sink::{NftCommand, ScriptSink};

/// What one successful sync did.
#[derive(Clone, Debug)]
pub struct SyncReport {
    /// The kind of transaction applied.
    pub kind: PlanKind,
    /// Planning, rendering, applying and conntrack cleanup.
    pub duration: Duration,
    /// Of which applying (running `nft`).
    pub apply_duration: Duration,
    /// Size of the script applied; 0 when nothing changed (and `nft` was not run).
    pub script_bytes: usize,
    /// Every destination conflict in the desired state (logged when they change).
    pub conflicts: Vec<Conflict>,
    pub stats: PlanStats,
    /// What UDP conntrack cleanup did after the apply (its failure does not fail
    /// the sync).
    pub conntrack: ConntrackCleanupReport,
}

/// svcproxy's nftables data plane: keeps the planner, which keeps the desired (and,
/// after a commit, the kernel's) state in memory, and the last snapshot applied, from
/// which the next successful sync computes the conntrack entries to delete.
pub struct NftDataPlane<S = NftCommand, C = NetlinkConntrack> {
    cfg: PlanConfig,
    planner: Planner,
    sink: S,
    cleaner: C,
    /// The snapshot the kernel holds (the last one applied successfully).
    applied: Option<SnapshotUpdate>,
    /// Conntrack filters whose deletion failed, tried again with the next cleanup: a
    /// UDP client that keeps sending keeps its stale entry alive forever otherwise.
    conntrack_retry: Vec<ConntrackFilter>,
    /// The conflicts last logged, by family and destination.
    logged_conflicts: BTreeMap<(IpFamily, String), Conflict>,
}

impl NftDataPlane<NftCommand, NetlinkConntrack> {
    /// A data plane running `nft` from `PATH` and cleaning conntrack over netlink,
    /// both in the current network namespace.
    pub fn new(cfg: PlanConfig) -> Self {
        NftDataPlane::with_cleaner(cfg, NftCommand::default(), NetlinkConntrack::new())
    }
}

impl<S: ScriptSink> NftDataPlane<S, NoConntrackCleanup> {
    /// A data plane applying its scripts to `sink` (e.g. an [`NftCommand`] with
    /// another binary or a netns prefix, or a [`RecordingSink`](crate::RecordingSink)),
    /// without conntrack cleanup: the sink may apply somewhere other than this
    /// namespace. [`NftDataPlane::with_cleaner`] adds one.
    pub fn with_sink(cfg: PlanConfig, sink: S) -> Self {
        NftDataPlane::with_cleaner(cfg, sink, NoConntrackCleanup)
    }
}

impl<S: ScriptSink, C: ConntrackCleaner> NftDataPlane<S, C> {
    /// A data plane applying its scripts to `sink` and cleaning stale UDP conntrack
    /// entries with `cleaner` (e.g. a [`NetlinkConntrack`] in the sink's namespace,
    /// or a [`RecordingCleaner`](crate::RecordingCleaner)).
    pub fn with_cleaner(cfg: PlanConfig, sink: S, cleaner: C) -> Self {
        if let Err(e) = cfg.validate() {
            tracing::warn!(error = %e, "invalid data plane configuration; using the default");
        }
        NftDataPlane {
            cfg,
            planner: Planner::new(),
            sink,
            cleaner,
            applied: None,
            conntrack_retry: Vec::new(),
            logged_conflicts: BTreeMap::new(),
        }
    }

    pub fn cleaner(&self) -> &C {
        &self.cleaner
    }

    pub fn cleaner_mut(&mut self) -> &mut C {
        &mut self.cleaner
    }

    pub fn config(&self) -> &PlanConfig {
        &self.cfg
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }

    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }

    /// Brings the kernel to `update`'s state in one atomic transaction.
    ///
    /// `full` asks for a full resync (periodic, or a retry). The first sync, and the
    /// first after a failure, recreates the tables whatever `full` says; otherwise
    /// only `update.changed` (and any view that is not the previous `Arc`) is
    /// re-planned. On error the previous rules stay in force and the next sync
    /// recreates the tables.
    ///
    /// After a successful apply, the UDP conntrack entries made stale by the change
    /// from the previously applied snapshot are deleted
    /// ([`cleanup_filters`](crate::cleanup_filters)); a failure there is logged and
    /// reported in [`SyncReport::conntrack`], never an error of the sync. The first
    /// sync has nothing to compare with and cleans nothing.
    pub fn sync(
        &mut self,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncReport, DataPlaneError> {
        let start = Instant::now();
        let plan = self
            .planner
            .plan(&update.v4, &update.v6, &self.cfg, full, &update.changed);
        self.log_conflicts(&plan.conflicts);
        let apply_start = Instant::now();
        let applied = if plan.is_empty() {
            Ok(())
        } else {
            self.sink.apply(&plan.script)
        };
        let apply_duration = apply_start.elapsed();
        match applied {
            Ok(()) => self.planner.commit(&plan),
            Err(e) => {
                self.planner.abandon();
                return Err(e);
            }
        }
        let conntrack = self.clean_conntrack(update);
        let report = SyncReport {
            kind: plan.kind,
            duration: start.elapsed(),
            apply_duration,
            script_bytes: plan.script.len(),
            conflicts: plan.conflicts,
            stats: plan.stats,
            conntrack,
        };
        tracing::debug!(
            kind = ?report.kind,
            bytes = report.script_bytes,
            duration = ?report.duration,
            apply = ?report.apply_duration,
            replanned = report.stats.replanned,
            "nftables synced"
        );
        Ok(report)
    }

    /// Deletes the conntrack entries the move from the applied snapshot to `update`
    /// made stale, and remembers `update` as applied.
    fn clean_conntrack(&mut self, update: &SnapshotUpdate) -> ConntrackCleanupReport {
        let start = Instant::now();
        // Only the snapshots matter; `changed` can be large.
        let applied = SnapshotUpdate {
            v4: update.v4.clone(),
            v6: update.v6.clone(),
            changed: Default::default(),
            service_changes: 0,
            endpoint_changes: 0,
            trigger_times: Vec::new(),
        };
        let previous = self.applied.replace(applied);
        let Some(previous) = previous else {
            return ConntrackCleanupReport::default();
        };
        let mut filters = cleanup_filters(&previous, update);
        if !self.conntrack_retry.is_empty() {
            filters.append(&mut self.conntrack_retry);
            filters.sort();
            filters.dedup();
        }
        if filters.is_empty() {
            return ConntrackCleanupReport {
                duration: start.elapsed(),
                ..ConntrackCleanupReport::default()
            };
        }
        for f in &filters {
            tracing::debug!(filter = %f, "deleting stale conntrack entries");
        }
        let mut report = match self.cleaner.delete(&filters) {
            Ok(stats) => ConntrackCleanupReport {
                scanned: stats.scanned,
                deleted: stats.deleted,
                ..ConntrackCleanupReport::default()
            },
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    filters = filters.len(),
                    "UDP conntrack cleanup failed; retrying with the next sync"
                );
                // Bounded: a cleaner that never works must not grow this forever.
                self.conntrack_retry = filters.iter().take(MAX_CONNTRACK_RETRY).cloned().collect();
                ConntrackCleanupReport {
                    error: Some(e.to_string()),
                    ..ConntrackCleanupReport::default()
                }
            }
        };
        report.filters = filters;
        report.duration = start.elapsed();
        if report.deleted > 0 {
            tracing::info!(
                deleted = report.deleted,
                filters = report.filters.len(),
                duration = ?report.duration,
                "deleted stale UDP conntrack entries"
            );
        }
        tracing::debug!(
            filters = report.filters.len(),
            scanned = report.scanned,
            deleted = report.deleted,
            duration = ?report.duration,
            "conntrack cleanup done"
        );
        report
    }

    /// The full script a first sync of `update` would apply (`svcproxy render`),
    /// from a fresh planner: neither the kernel nor this data plane's state is
    /// touched.
    pub fn render(&self, update: &SnapshotUpdate) -> String {
        render_full(&update.v4, &update.v6, &self.cfg)
    }

    /// Warns about each conflict that is new or changed since the last plan, and
    /// notes those that went away.
    fn log_conflicts(&mut self, conflicts: &[Conflict]) {
        let current: BTreeMap<(IpFamily, String), Conflict> = conflicts
            .iter()
            .map(|c| ((c.family, c.destination.clone()), c.clone()))
            .collect();
        if current == self.logged_conflicts {
            return;
        }
        for (key, c) in &current {
            if self.logged_conflicts.get(key) != Some(c) {
                let ignored: Vec<String> = c.ignored.iter().map(ToString::to_string).collect();
                tracing::warn!(
                    family = %c.family,
                    destination = %c.destination,
                    kept = %c.kept,
                    ignored = %ignored.join(", "),
                    "several service ports claim one destination; only the first by name gets it"
                );
            }
        }
        for (key, c) in &self.logged_conflicts {
            if !current.contains_key(key) {
                tracing::info!(
                    family = %c.family,
                    destination = %c.destination,
                    "destination conflict resolved"
                );
            }
        }
        self.logged_conflicts = current;
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
