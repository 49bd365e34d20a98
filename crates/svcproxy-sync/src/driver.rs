//! [`Driver`]: one data plane, and the work every mode shares around its sync.
//! Before the apply it decides the intent (the builder, kept from sync to sync)
//! and logs destination conflicts when they change; it hands the intent and its
//! delta to the [`DataPlane`]; after each successful apply it deletes the UDP
//! conntrack entries the change left stale (retrying failed deletions with the
//! next sync) and, once, writes the configured conntrack sysctls.
//!
//! The path from the sync loop to the kernel: the binary's runner (`runner.rs`:
//! when to sync) → its syncer (state → snapshot, metrics, health) → the kernel's
//! [`Target`](crate::Target), [`Driver::sync`] → [`Intents::update`] →
//! [`DataPlane::sync`] → conntrack cleanup from the intent's change
//! ([`UdpChanges`]).

use std::time::{Duration, Instant};

use svcproxy_core::model::IpFamily;
use svcproxy_core::state::SnapshotUpdate;
use svcproxy_dataplane::{
    apply_conntrack_sysctls, ApplyReport, ConntrackCleaner, ConntrackCleanupReport,
    ConntrackFilter, ConntrackSettings, DataPlane, DataPlaneError, NetlinkConntrack,
    NoConntrackCleanup, NodeRequirements, RuleCount, StaleUdp, SyncKind,
};
use svcproxy_plan::{Conflict, IntentDelta, PlanConfig};

use crate::conntrack::{stale_udp_flows, UdpChanges};
use crate::intents::Intents;

/// The most failed conntrack filters kept for a retry.
const MAX_CONNTRACK_RETRY: usize = 10_000;

/// What one successful sync did.
#[derive(Clone, Debug)]
pub struct SyncReport {
    /// How the data plane applied it.
    pub kind: SyncKind,
    /// Deciding, translating, applying and conntrack cleanup.
    pub duration: Duration,
    /// Of which applying (the kernel's tool or API).
    pub apply_duration: Duration,
    /// Each programmed family's own figure: the pass's shared part (deciding,
    /// translating, conntrack cleanup) plus that family's own write, when the data
    /// plane writes each family apart; the whole pass for each when it does not.
    pub family_durations: Vec<(IpFamily, Duration)>,
    /// Size of what was applied; 0 when nothing changed (and nothing ran).
    pub script_bytes: usize,
    /// Service port intents decided again.
    pub replanned: usize,
    /// Every destination conflict in the desired state (logged when they change).
    pub conflicts: Vec<Conflict>,
    /// What UDP conntrack cleanup did after the apply (its failure does not fail
    /// the sync).
    pub conntrack: ConntrackCleanupReport,
    /// The data plane's rule counts, if it counts rules.
    pub rules: Vec<RuleCount>,
    /// Where the time went.
    pub steps: SyncSteps,
}

/// One sync's time, step by step (`svcproxy_sync_step_duration_seconds{step}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncSteps {
    /// Bringing the intent up to the snapshot: the changed service ports decided
    /// again (endpoints, drop or reject, masquerade).
    pub decide: Duration,
    /// The data plane's translation of the intent's change into its kernel objects
    /// (its sync less its writes).
    pub translate: Duration,
    /// Its writes to the kernel (zero when the first sync adopted sealed objects).
    pub apply: Duration,
    /// UDP conntrack cleanup after the apply.
    pub conntrack: Duration,
}

impl SyncSteps {
    /// The steps with their metric label.
    pub fn labelled(&self) -> [(&'static str, Duration); 4] {
        [
            ("decide", self.decide),
            ("translate", self.translate),
            ("apply", self.apply),
            ("conntrack", self.conntrack),
        ]
    }
}

/// One data plane with the shared logic around it: the intent, conflicts, and
/// conntrack cleanup after the intent's change.
pub struct Driver<P = Box<dyn DataPlane>, C = NetlinkConntrack> {
    intents: Intents,
    plane: P,
    cleaner: C,
    /// The UDP service ports changed since the last successful apply.
    udp_changes: UdpChanges,
    /// A sync has succeeded: the next cleanup follows the intent's change (the
    /// first compares the kernel's entries with the intent instead).
    applied_once: bool,
    /// Conntrack filters whose deletion failed, tried again with the next cleanup: a
    /// UDP client that keeps sending keeps its stale entry alive forever otherwise.
    conntrack_retry: Vec<ConntrackFilter>,
    /// The configuration's conntrack sysctls, written once after the first
    /// successful sync: by then the NAT rules have loaded `nf_conntrack` (whose
    /// files they are), and nothing is written by an instance that fails at start
    /// (e.g. a port in use).
    conntrack_sysctls: Option<ConntrackSettings>,
    /// The drift check failed last time (logged once until it works again).
    drift_check_failing: bool,
    /// No sync has been tried yet: the first may adopt a predecessor's sealed
    /// objects ([`DataPlane::adopt`]), if allowed.
    first: bool,
    /// [`Driver::allow_adoption`] was called.
    adoption_allowed: bool,
    /// The last sync succeeded: the kernel holds the intent (what a seal vouches for).
    in_sync: bool,
    /// The mode's [`ModeInfo::large_cluster_endpoints`](svcproxy_dataplane::ModeInfo::large_cluster_endpoints).
    large_cluster_endpoints: Option<usize>,
}

/// What a seal names: the mode and the full text its first sync of an intent
/// would write, hashed. Two processes (two releases, two configurations) whose
/// first syncs would write the same have the same seal.
pub fn seal_of(mode: &str, rendered: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(mode.as_bytes());
    h.update([0]);
    h.update(rendered.as_bytes());
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl<P: DataPlane> Driver<P, NetlinkConntrack> {
    /// `plane`, with conntrack cleaned over netlink in the current namespace.
    pub fn new(cfg: PlanConfig, plane: P) -> Self {
        Driver::with_cleaner(cfg, plane, NetlinkConntrack::new())
    }
}

impl<P: DataPlane> Driver<P, NoConntrackCleanup> {
    /// `plane` without conntrack cleanup (it may apply somewhere other than this
    /// namespace).
    pub fn without_conntrack(cfg: PlanConfig, plane: P) -> Self {
        Driver::with_cleaner(cfg, plane, NoConntrackCleanup)
    }
}

impl<P: DataPlane, C: ConntrackCleaner> Driver<P, C> {
    /// `plane`, cleaning stale UDP conntrack entries with `cleaner` (e.g. a
    /// [`NetlinkConntrack`] in the plane's namespace, or a
    /// [`RecordingCleaner`](svcproxy_dataplane::RecordingCleaner)).
    pub fn with_cleaner(cfg: PlanConfig, plane: P, cleaner: C) -> Self {
        Driver {
            intents: Intents::new(cfg),
            plane,
            cleaner,
            udp_changes: UdpChanges::default(),
            applied_once: false,
            conntrack_retry: Vec::new(),
            conntrack_sysctls: None,
            drift_check_failing: false,
            first: true,
            adoption_allowed: false,
            in_sync: false,
            large_cluster_endpoints: None,
        }
    }

    /// Writes `settings` (the conntrack table's size and timeouts) after the first
    /// successful sync.
    pub fn with_conntrack_sysctls(mut self, settings: ConntrackSettings) -> Self {
        self.conntrack_sysctls = Some(settings);
        self
    }

    /// Above `threshold` endpoints in one family the cluster is large
    /// ([`Driver::large_cluster`]): the mode's
    /// [`ModeInfo::large_cluster_endpoints`](svcproxy_dataplane::ModeInfo::large_cluster_endpoints).
    pub fn with_large_cluster(mut self, threshold: Option<usize>) -> Self {
        self.large_cluster_endpoints = threshold;
        self
    }

    /// Upstream's large cluster mode: the intent last built holds more endpoints
    /// in one family (every service port's, counted once per port as upstream
    /// counts them) than the mode's threshold. Never, for a mode without one.
    /// Stops counting past the threshold.
    pub fn large_cluster(&self) -> bool {
        let Some(threshold) = self.large_cluster_endpoints else {
            return false;
        };
        self.intents.intent().families().any(|f| {
            f.services()
                .values()
                .try_fold(0usize, |sum, s| {
                    let sum = sum + s.endpoints.len();
                    if sum > threshold {
                        None
                    } else {
                        Some(sum)
                    }
                })
                .is_none()
        })
    }

    /// Whether the periodic full sync is skipped: a large cluster
    /// ([`Driver::large_cluster`]) whose drift check works and watches all it can
    /// ([`DataPlane::drift_armed`]); otherwise that sync is what repairs.
    pub fn skips_periodic_full_sync(&self) -> bool {
        self.large_cluster() && !self.drift_check_failing && self.plane.drift_armed()
    }

    pub fn plane(&self) -> &P {
        &self.plane
    }

    pub fn plane_mut(&mut self) -> &mut P {
        &mut self.plane
    }

    pub fn cleaner(&self) -> &C {
        &self.cleaner
    }

    pub fn cleaner_mut(&mut self) -> &mut C {
        &mut self.cleaner
    }

    pub fn config(&self) -> &PlanConfig {
        self.intents.config()
    }

    /// Why the kernel no longer holds what the last sync wrote, if it does not
    /// ([`DataPlane::drift`]); the next sync then rewrites everything.
    pub fn drift(&mut self) -> Result<Option<String>, DataPlaneError> {
        self.plane.drift()
    }

    /// [`Driver::drift`] for the sync loop: a check that cannot be made is logged
    /// (once until it works again) and counts as no drift; the periodic full sync
    /// repairs the rules anyway.
    pub fn check_drift(&mut self) -> Option<String> {
        match self.plane.drift() {
            Ok(drift) => {
                if std::mem::take(&mut self.drift_check_failing) {
                    tracing::info!("the drift check works again");
                }
                drift
            }
            Err(e) => {
                if !std::mem::replace(&mut self.drift_check_failing, true) {
                    tracing::warn!(error = %e, "cannot check that the kernel still holds the rules (the periodic full sync still repairs them)");
                }
                None
            }
        }
    }

    /// What the node needs for this data plane.
    pub fn node_requirements(&self) -> NodeRequirements {
        self.plane.node_requirements(self.intents.config())
    }

    /// See [`DataPlane::preflight`].
    pub fn preflight(&mut self) -> Result<(), DataPlaneError> {
        self.plane.preflight()
    }

    /// Brings the kernel to `update`'s state.
    ///
    /// `full` asks for a full resync (periodic, or a retry). Only `update.changed`
    /// (and any view that is not the previous `Arc`) is decided again; the data
    /// plane writes what changed, or everything when it must. On error each
    /// family's previous rules stay in force, unless its own write went through
    /// before another family's failed (see [`DataPlane::sync`]).
    ///
    /// After a successful apply, the UDP conntrack entries made stale by the
    /// intent's change since the last successful apply are deleted
    /// ([`UdpChanges`]); a failure there is logged and reported in
    /// [`SyncReport::conntrack`], never an error of the sync. The first sync has
    /// nothing to compare with: it compares the kernel's UDP entries with the
    /// intent it applied instead ([`stale_udp_flows`](crate::conntrack::stale_udp_flows)).
    pub fn sync(
        &mut self,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncReport, DataPlaneError> {
        let start = Instant::now();
        let (delta, conflicts) = self.intents.update(update);
        self.udp_changes.record(&delta);
        let decided = start.elapsed();
        let plane_start = Instant::now();
        let adopted =
            std::mem::take(&mut self.first) && self.adoption_allowed && self.adopt(&delta);
        let mut applied = if adopted {
            ApplyReport {
                kind: SyncKind::Adopted,
                apply_duration: Duration::ZERO,
                family_apply: Vec::new(),
                script_bytes: 0,
                rules: Vec::new(),
                stale_flows: Vec::new(),
            }
        } else {
            self.in_sync = false;
            self.plane.sync(self.intents.intent(), &delta, full)?
        };
        let planed = plane_start.elapsed();
        self.in_sync = true;
        let conntrack = self.clean_conntrack(std::mem::take(&mut applied.stale_flows));
        let steps = SyncSteps {
            decide: decided,
            translate: planed.saturating_sub(applied.apply_duration),
            apply: applied.apply_duration,
            conntrack: conntrack.duration,
        };
        if let Some(wanted) = self.conntrack_sysctls.take() {
            let report = apply_conntrack_sysctls(&wanted);
            if !report.changed.is_empty() {
                tracing::info!(changed = ?report.changed, "conntrack settings applied");
            }
        }
        let duration = start.elapsed();
        let report = SyncReport {
            kind: applied.kind,
            duration,
            apply_duration: applied.apply_duration,
            family_durations: family_durations(
                self.intents.config(),
                duration,
                &applied.family_apply,
            ),
            script_bytes: applied.script_bytes,
            replanned: delta.rebuilt,
            conflicts,
            conntrack,
            rules: applied.rules,
            steps,
        };
        tracing::info!(
            mode = self.plane.mode(),
            kind = ?report.kind,
            duration_ms = report.duration.as_secs_f64() * 1000.0,
            apply_ms = report.apply_duration.as_secs_f64() * 1000.0,
            script_bytes = report.script_bytes,
            changed = update.changed.len(),
            replanned = report.replanned,
            "synced"
        );
        Ok(report)
    }

    /// Lets the first sync take a predecessor's sealed objects as they are: for a
    /// process the owner handed over to moments ago (it sealed them just before).
    /// Never for a repair (`--once`), nor after a crash: then the first sync writes
    /// everything, and deletes any seal with the rest.
    pub fn allow_adoption(&mut self) {
        self.adoption_allowed = true;
    }

    /// The first sync: takes the kernel's objects as they are if the predecessor
    /// sealed them with this sync's own seal ([`DataPlane::adopt`]). A failure to
    /// look is logged and the sync writes as usual.
    fn adopt(&mut self, delta: &IntentDelta) -> bool {
        match self.plane.sealed() {
            Ok(true) => {}
            Ok(false) => return false,
            // Not worth a warning: the sync writes everything, and if the kernel
            // refused for want of privileges, the sync's own error says so.
            Err(e) => {
                tracing::debug!(error = %e, "cannot look for a predecessor's seal; writing everything");
                return false;
            }
        }
        let seal = self.intent_seal();
        match self.plane.adopt(self.intents.intent(), delta, &seal) {
            Ok(true) => {
                tracing::info!(%seal, "the kernel holds what this sync would write (sealed by the predecessor): adopted, nothing written");
                true
            }
            Ok(false) => {
                tracing::info!(%seal, "the predecessor's rules differ from what this sync writes: writing everything");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "adopting the predecessor's rules failed; writing everything");
                false
            }
        }
    }

    /// The seal of the current intent: what this data plane's first sync of it
    /// would write ([`seal_of`]).
    fn intent_seal(&self) -> String {
        seal_of(self.plane.mode(), &self.plane.render(self.intents.intent()))
    }

    /// At a hand-over (the owner stopping): seals the kernel's objects with what
    /// they hold, if the last sync succeeded, so that a successor whose first sync
    /// would write the same adopts them instead ([`DataPlane::seal`]). Says whether
    /// it did.
    pub fn seal(&mut self) -> Result<bool, DataPlaneError> {
        if !self.in_sync {
            return Ok(false);
        }
        let seal = self.intent_seal();
        let done = self.plane.seal(&seal)?;
        if done {
            tracing::info!(%seal, "rules sealed for a successor");
        }
        Ok(done)
    }

    /// The first sync's cleanup: nothing to compare with, so the kernel's UDP entries
    /// are compared with the intent ([`stale_udp_flows`]): a flow stuck on an
    /// endpoint that went away while svcproxy was down is deleted. A failure is
    /// logged and not retried (the next syncs follow the intent's change again).
    fn reconcile_conntrack(&mut self, start: Instant) -> ConntrackCleanupReport {
        let stale = stale_udp_flows(self.intents.intent());
        if stale.is_empty() {
            return ConntrackCleanupReport::default();
        }
        let mut report = match self.cleaner.delete_stale(&stale) {
            Ok(stats) => ConntrackCleanupReport {
                scanned: stats.scanned,
                deleted: stats.deleted,
                families: stats.families,
                ..ConntrackCleanupReport::default()
            },
            Err(e) => {
                tracing::warn!(error = %e, "UDP conntrack reconciliation at start failed");
                ConntrackCleanupReport {
                    error: Some(e.to_string()),
                    ..ConntrackCleanupReport::default()
                }
            }
        };
        report.closed = self.close_stale_udp(&StaleUdp::Reconcile(&stale));
        report.duration = start.elapsed();
        if report.deleted > 0 {
            tracing::info!(
                deleted = report.deleted,
                scanned = report.scanned,
                duration = ?report.duration,
                "deleted stale UDP conntrack entries (first sync: the table against the rules)"
            );
        }
        report
    }

    /// Has the data plane close the flows it holds itself that `stale` names:
    /// how many it closed (logged; a failure is a warning, never the sync's
    /// error, and not retried: by the next sync the endpoint may be back, and
    /// the flow good again).
    fn close_stale_udp(&mut self, stale: &StaleUdp<'_>) -> usize {
        match self.plane.close_stale_udp(stale) {
            Ok(0) => 0,
            Ok(n) => {
                tracing::info!(
                    closed = n,
                    "closed connected UDP sockets whose endpoint their service no longer reaches"
                );
                n
            }
            Err(e) => {
                tracing::warn!(error = %e, "closing the stale UDP flows the data plane holds failed; they keep their endpoint until they close");
                0
            }
        }
    }

    /// Deletes the conntrack entries the intent's change since the last successful
    /// apply made stale. `plane_stale` are the entries the data plane itself found
    /// stale.
    fn clean_conntrack(&mut self, mut plane_stale: Vec<ConntrackFilter>) -> ConntrackCleanupReport {
        let start = Instant::now();
        if !std::mem::replace(&mut self.applied_once, true) {
            self.udp_changes.clear();
            return self.reconcile_conntrack(start);
        }
        let mut filters = self.udp_changes.take_filters(self.intents.intent());
        if !self.conntrack_retry.is_empty() || !plane_stale.is_empty() {
            filters.append(&mut plane_stale);
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
                families: stats.families,
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
        report.closed = self.close_stale_udp(&StaleUdp::Changed(&filters));
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

    /// What a first sync of `update` would apply, in the data plane's own text
    /// (`svcproxy render`), from a fresh intent: neither the kernel nor this
    /// driver's state is touched.
    pub fn render(&self, update: &SnapshotUpdate) -> String {
        let mut fresh = Intents::new(self.intents.config().clone());
        fresh.update(update);
        self.plane.render(fresh.intent())
    }
}

/// Each enabled family's figure for a pass that took `total`, of which `own` were
/// each family's own writes (see [`SyncReport::family_durations`]).
fn family_durations(
    cfg: &PlanConfig,
    total: Duration,
    own: &[(IpFamily, Duration)],
) -> Vec<(IpFamily, Duration)> {
    let shared = total.saturating_sub(own.iter().map(|(_, d)| *d).sum());
    IpFamily::BOTH
        .into_iter()
        .filter(|f| cfg.family_enabled(*f))
        .map(|f| {
            let mine = own.iter().find(|(g, _)| *g == f).map(|(_, d)| *d);
            (f, mine.map_or(total, |d| shared + d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_s_figure_is_the_shared_part_plus_its_own_write() {
        let ms = Duration::from_millis;
        let cfg = PlanConfig::default();
        let own = [(IpFamily::V4, ms(70)), (IpFamily::V6, ms(5))];
        assert_eq!(
            family_durations(&cfg, ms(100), &own),
            vec![(IpFamily::V4, ms(95)), (IpFamily::V6, ms(30))]
        );
        // One write for both: the whole pass for each.
        assert_eq!(
            family_durations(&cfg, ms(100), &[]),
            vec![(IpFamily::V4, ms(100)), (IpFamily::V6, ms(100))]
        );
        // A family not programmed has no figure.
        let v4_only = PlanConfig {
            ipv6: false,
            ..PlanConfig::default()
        };
        assert_eq!(
            family_durations(&v4_only, ms(100), &own[..1]),
            vec![(IpFamily::V4, ms(100))]
        );
    }
}
