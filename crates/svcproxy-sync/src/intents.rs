//! Snapshot → intent, once for every consumer: [`Intents`] keeps the intent from
//! sync to sync (only what changed is decided again), says what changed
//! ([`IntentDelta`]), and logs what the intent refuses when it changes: service
//! ports claiming one destination ([`Conflict`]s), and ServiceCIDRs that hold an
//! address of this node. The kernel's [`Driver`](crate::Driver), `explain` and
//! `render` all take their intent from here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use svcproxy_core::model::IpFamily;
use svcproxy_core::state::SnapshotUpdate;
use svcproxy_plan::{Conflict, Intent, IntentBuilder, IntentDelta, PlanConfig};

/// The intent of the last snapshot, and what was last logged of its refusals.
pub struct Intents {
    cfg: PlanConfig,
    builder: IntentBuilder,
    /// The conflicts last logged, by family and destination.
    logged_conflicts: BTreeMap<(IpFamily, String), Conflict>,
    /// The ServiceCIDRs last logged as refused (both families).
    logged_refused_cidrs: Vec<(IpNet, IpAddr)>,
}

impl Intents {
    /// No intent yet, decided under `cfg` (an invalid one is logged: the planner
    /// then uses the default where it must).
    pub fn new(cfg: PlanConfig) -> Self {
        if let Err(e) = cfg.validate() {
            tracing::warn!(error = %e, "invalid data plane configuration; using the default");
        }
        Intents {
            cfg,
            builder: IntentBuilder::new(),
            logged_conflicts: BTreeMap::new(),
            logged_refused_cidrs: Vec::new(),
        }
    }

    pub fn config(&self) -> &PlanConfig {
        &self.cfg
    }

    /// The intent of the last update.
    pub fn intent(&self) -> &Intent {
        self.builder.intent()
    }

    /// Brings the intent to `update`'s snapshots: only `update.changed` (and any
    /// view that is not the previous `Arc`) is decided again. Logs the refusals
    /// that changed; returns what changed and every conflict now.
    pub fn update(&mut self, update: &SnapshotUpdate) -> (IntentDelta, Vec<Conflict>) {
        let delta = self
            .builder
            .update(&update.v4, &update.v6, &self.cfg, &update.changed);
        let conflicts = self.builder.intent().conflicts();
        self.log_conflicts(&conflicts);
        self.log_refused_service_cidrs();
        (delta, conflicts)
    }

    /// Logs an error for each ServiceCIDR the intent refuses (it holds a node
    /// address) when the set changes, and notes when none is left.
    fn log_refused_service_cidrs(&mut self) {
        let current: Vec<(IpNet, IpAddr)> = self
            .builder
            .intent()
            .families()
            .filter_map(|f| f.node())
            .flat_map(|n| n.refused_service_cidrs.iter().copied())
            .collect();
        if current == self.logged_refused_cidrs {
            return;
        }
        for (cidr, ip) in &current {
            if !self.logged_refused_cidrs.contains(&(*cidr, *ip)) {
                tracing::error!(
                    %cidr,
                    node_address = %ip,
                    "a ServiceCIDR holds an address of this node: its unallocated addresses are not dropped (that would cut the node's own traffic); fix the ServiceCIDR"
                );
            }
        }
        if current.is_empty() {
            tracing::info!("no ServiceCIDR holds an address of this node any more");
        }
        self.logged_refused_cidrs = current;
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
                    "several service ports claim one destination; a cluster IP wins, then the first port by name"
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
