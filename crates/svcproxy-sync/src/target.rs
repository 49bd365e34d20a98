//! Where each sync's snapshot goes: the [`Target`] the binary's sync loop hands
//! it to.
//!
//! The kernel is one target: the mode's data plane behind its [`Driver`]. The
//! one-shot tools are the others ([`crate::print`]): `snapshot` and `explain`
//! print, `render` prints what the data plane would apply, and `svcproxy dns`
//! uses no snapshot at all ([`DnsOnly`]).

use std::time::Duration;

use svcproxy_core::state::{ClusterState, SnapshotUpdate};
use svcproxy_dataplane::{ConntrackCleanupReport, DataPlaneError, RuleCount, SyncKind};

use crate::Driver;

/// Why a sync failed: the data plane's own error, which says whether the kernel
/// was left half written (a partial sync's metric), or a printing target's.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    DataPlane(#[from] DataPlaneError),
    /// `explain --live` could not read the kernel's rules.
    #[error("reading the kernel's rules (--live): {0}")]
    Live(DataPlaneError),
    /// Writing what a target prints failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl SyncError {
    /// The data plane applied part of the sync before it failed.
    pub fn is_partial(&self) -> bool {
        matches!(self, SyncError::DataPlane(e) if e.is_partial())
    }

    /// The kernel refused for want of privilege.
    pub fn permission_denied(&self) -> bool {
        match self {
            SyncError::DataPlane(e) | SyncError::Live(e) => e.permission_denied(),
            SyncError::Io(e) => svcproxy_dataplane::is_permission_error(e),
            SyncError::Json(_) => false,
        }
    }
}

/// Where a sync's snapshot goes.
pub trait Target {
    /// Programs or prints `update`; returns the kind of sync done.
    fn sync(
        &mut self,
        state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError>;

    /// Why the kernel no longer holds what the last sync wrote, if it does not.
    fn drift(&mut self) -> Option<String> {
        None
    }

    /// Whether the snapshots must carry this host's addresses whatever the plan
    /// needs (`explain`: a NodePort on every local address is told by them).
    fn wants_host_addresses(&self) -> bool {
        false
    }

    /// Whether the target reads node snapshots at all (`svcproxy dns` does not: its
    /// catalog reads the cluster state's model, and building snapshots of it would
    /// only cost memory).
    fn uses_snapshots(&self) -> bool {
        true
    }

    /// Whether what it wrote stays in the kernel when the process stops (the
    /// kernel's data planes), for the shutdown message.
    fn leaves_rules(&self) -> bool {
        false
    }

    /// The data plane's own metrics: see [`svcproxy_dataplane::DataPlane::collectors`].
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        Vec::new()
    }

    /// The process is stopping: see [`svcproxy_dataplane::DataPlane::shutdown`].
    fn shutdown(&mut self) {}

    /// The owner is stopping: seals what it wrote for a successor
    /// ([`Driver::seal`]).
    fn seal(&mut self) {}

    /// This process was handed the node over just now: its first sync may adopt
    /// the sealed rules ([`Driver::allow_adoption`]).
    fn allow_adoption(&mut self) {}

    /// Writes the kernel settings the mode needs (once this process owns the node).
    fn prepare_node(&mut self) {}

    /// Whether the periodic full sync is skipped: upstream's large cluster mode,
    /// while the drift check is armed ([`Driver::skips_periodic_full_sync`]).
    fn skips_periodic_full_sync(&self) -> bool {
        false
    }
}

/// What a target reports of a successful sync.
pub struct SyncDone {
    /// A full (re)write rather than a partial update.
    pub full: bool,
    pub duration: Duration,
    /// Each programmed family's own figure (kernel only; empty: `duration` for
    /// each family).
    pub families: Vec<(svcproxy_core::model::IpFamily, Duration)>,
    /// What UDP conntrack cleanup did (kernel only).
    pub conntrack: Option<ConntrackCleanupReport>,
    /// The data plane's rule counts (kernel only, the modes that count rules).
    pub rules: Vec<RuleCount>,
    /// Claims on destinations that other service ports hold (kernel only).
    pub lost_claims: Option<usize>,
    /// Where the time went (kernel only).
    pub steps: Option<crate::SyncSteps>,
    /// The sync took a predecessor's sealed objects as they were, writing nothing.
    pub adopted: bool,
}

impl SyncDone {
    /// A sync that printed rather than programmed: nothing from the kernel to report.
    pub fn printed(full: bool, duration: Duration) -> Self {
        SyncDone {
            full,
            duration,
            families: Vec::new(),
            conntrack: None,
            rules: Vec::new(),
            lost_claims: None,
            steps: None,
            adopted: false,
        }
    }
}

/// A one-shot tool's target that also records whether its input had errors
/// ([`ClusterState::has_input_errors`]) at its last sync, for the exit code.
pub struct Checked<T> {
    pub inner: T,
    pub input_errors: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<T: Target> Target for Checked<T> {
    fn sync(
        &mut self,
        state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        self.input_errors.store(
            state.has_input_errors(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.inner.sync(state, update, full)
    }

    fn drift(&mut self) -> Option<String> {
        self.inner.drift()
    }

    fn wants_host_addresses(&self) -> bool {
        self.inner.wants_host_addresses()
    }

    fn uses_snapshots(&self) -> bool {
        self.inner.uses_snapshots()
    }

    fn leaves_rules(&self) -> bool {
        self.inner.leaves_rules()
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.inner.collectors()
    }

    fn shutdown(&mut self) {
        self.inner.shutdown()
    }

    fn skips_periodic_full_sync(&self) -> bool {
        self.inner.skips_periodic_full_sync()
    }
}

/// `svcproxy dns`: no snapshot is used; the catalog reads the state's model.
pub struct DnsOnly;

impl Target for DnsOnly {
    fn sync(
        &mut self,
        _state: &ClusterState,
        _update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        Ok(SyncDone::printed(full, Duration::ZERO))
    }

    fn uses_snapshots(&self) -> bool {
        false
    }
}

/// Programs the kernel: the mode's data plane behind the [`Driver`], which does
/// what every mode shares around a sync.
impl Target for Driver {
    fn leaves_rules(&self) -> bool {
        true
    }

    fn skips_periodic_full_sync(&self) -> bool {
        Driver::skips_periodic_full_sync(self)
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.plane().collectors()
    }

    fn shutdown(&mut self) {
        self.plane_mut().shutdown();
    }

    fn allow_adoption(&mut self) {
        Driver::allow_adoption(self);
    }

    fn prepare_node(&mut self) {
        svcproxy_dataplane::prepare_node(&self.node_requirements().sysctls);
    }

    fn seal(&mut self) {
        if let Err(e) = Driver::seal(self) {
            tracing::warn!(error = %e, "cannot seal the rules for a successor (it writes them all again)");
        }
    }

    fn sync(
        &mut self,
        _state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        let report = Driver::sync(self, update, full)?;
        Ok(SyncDone {
            full: report.kind.is_full(),
            duration: report.duration,
            families: report.family_durations,
            conntrack: Some(report.conntrack),
            rules: report.rules,
            lost_claims: Some(report.conflicts.iter().map(|c| c.ignored.len()).sum()),
            steps: Some(report.steps),
            adopted: report.kind == SyncKind::Adopted,
        })
    }

    fn drift(&mut self) -> Option<String> {
        self.check_drift()
    }
}

#[cfg(test)]
mod tests {
    use super::SyncError;
    use svcproxy_dataplane::DataPlaneError;

    /// The partial-sync metric follows the data plane's own word, through `?`.
    #[test]
    fn a_sync_error_is_partial_only_when_the_data_plane_says_so() {
        let rejected = || DataPlaneError::TimedOut {
            command: "nft -f -".into(),
            after: std::time::Duration::from_secs(1),
        };
        let through = |e: DataPlaneError| -> Result<(), SyncError> { Err(e)? };
        assert!(through(DataPlaneError::Partial(Box::new(rejected())))
            .unwrap_err()
            .is_partial());
        assert!(!through(rejected()).unwrap_err().is_partial());
        assert!(!SyncError::Live(rejected()).is_partial());
        assert!(!SyncError::from(std::io::Error::other("broken pipe")).is_partial());
    }
}
