//! Where each sync's snapshot goes: the [`Target`]s of [`crate::daemon::run`].
//!
//! The kernel is one target: the mode's data plane behind its
//! [`svcproxy_dataplane::Driver`]. The one-shot tools are the others: `snapshot`
//! and `explain` print, `render` prints what the data plane would apply, and
//! `svcproxy dns` uses no snapshot at all.

use std::io::Write as _;
use std::time::Duration;

use svcproxy_core::report;
use svcproxy_core::state::{ClusterState, SnapshotUpdate};
use svcproxy_dataplane::{DataPlane, Driver, NoConntrackCleanup};
use svcproxy_plan::PlanConfig;

/// Why a sync failed: the data plane's own error, which says whether the kernel
/// was left half written (a partial sync's metric), or another target's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    #[error(transparent)]
    DataPlane(#[from] svcproxy_dataplane::DataPlaneError),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl SyncError {
    /// The data plane applied part of the sync before it failed.
    pub(crate) fn is_partial(&self) -> bool {
        matches!(self, SyncError::DataPlane(e) if e.is_partial())
    }

    /// The kernel refused for want of privilege.
    pub(crate) fn permission_denied(&self) -> bool {
        match self {
            SyncError::DataPlane(e) => e.permission_denied(),
            SyncError::Other(e) => crate::permission_denied(e),
        }
    }
}

impl From<std::io::Error> for SyncError {
    fn from(e: std::io::Error) -> Self {
        SyncError::Other(e.into())
    }
}

impl From<serde_json::Error> for SyncError {
    fn from(e: serde_json::Error) -> Self {
        SyncError::Other(e.into())
    }
}

/// Where a sync's snapshot goes.
pub(crate) trait Target {
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
    /// ([`svcproxy_dataplane::Driver::seal`]).
    fn seal(&mut self) {}

    /// This process was handed the node over just now: its first sync may adopt
    /// the sealed rules ([`svcproxy_dataplane::Driver::allow_adoption`]).
    fn allow_adoption(&mut self) {}

    /// Writes the kernel settings the mode needs (once this process owns the node).
    fn prepare_node(&mut self) {}
}

/// What a target reports of a successful sync.
pub(crate) struct SyncDone {
    /// A full (re)write rather than a partial update.
    pub(crate) full: bool,
    pub(crate) duration: Duration,
    /// Each programmed family's own figure (kernel only; empty: `duration` for
    /// each family).
    pub(crate) families: Vec<(svcproxy_core::model::IpFamily, Duration)>,
    /// What UDP conntrack cleanup did (kernel only).
    pub(crate) conntrack: Option<svcproxy_dataplane::ConntrackCleanupReport>,
    /// The data plane's rule counts (kernel only, the modes that count rules).
    pub(crate) rules: Vec<svcproxy_dataplane::RuleCount>,
    /// Claims on destinations that other service ports hold (kernel only).
    pub(crate) lost_claims: Option<usize>,
}

impl SyncDone {
    /// A sync that printed rather than programmed: nothing from the kernel to report.
    fn printed(full: bool, duration: Duration) -> Self {
        SyncDone {
            full,
            duration,
            families: Vec::new(),
            conntrack: None,
            rules: Vec::new(),
            lost_claims: None,
        }
    }
}

/// A one-shot tool's target that also records whether its input had errors
/// ([`ClusterState::has_input_errors`]) at its last sync, for the exit code.
pub(crate) struct Checked<T> {
    pub(crate) inner: T,
    pub(crate) input_errors: std::sync::Arc<std::sync::atomic::AtomicBool>,
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
}

/// `svcproxy dns`: no snapshot is used; the catalog reads the state's model.
pub(crate) struct DnsOnly;

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
        })
    }

    fn drift(&mut self) -> Option<String> {
        self.check_drift()
    }
}

/// Prints snapshots (`svcproxy snapshot`): only when they differ from the last one.
pub(crate) struct SnapshotPrinter {
    pub(crate) json: bool,
    /// One line per snapshot (NDJSON) rather than pretty-printed.
    pub(crate) compact: bool,
    /// A hash of the last printed text: at 100k endpoints the text is ~14 MB, too
    /// much to keep just to compare.
    pub(crate) last: Option<u64>,
}

/// An `io::Write` that only hashes what is written to it.
struct HashWriter(std::hash::DefaultHasher);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::hash::Hasher::write(&mut self.0, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SnapshotPrinter {
    /// Writes the snapshot as text to `out`. JSON is streamed (it is written twice
    /// per sync, to hash and to print, rather than held).
    fn write(
        &self,
        out: &mut dyn std::io::Write,
        state: &ClusterState,
        update: &SnapshotUpdate,
    ) -> anyhow::Result<()> {
        let all = state.problems();
        let problems: Vec<_> = all.values().flatten().collect();
        let snaps = [update.v4.as_ref(), update.v6.as_ref()];
        if self.json {
            report::write_snapshot_json(
                out,
                &snaps,
                &problems,
                state.input_problems(),
                !self.compact,
            )?;
            out.write_all(b"\n")?;
        } else {
            out.write_all(
                report::snapshot_table(&snaps, &problems, state.input_problems()).as_bytes(),
            )?;
            if self.compact {
                out.write_all(b"\n")?;
            }
        }
        Ok(())
    }
}

impl Target for SnapshotPrinter {
    fn sync(
        &mut self,
        state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        let start = std::time::Instant::now();
        let mut hash = HashWriter(std::hash::DefaultHasher::new());
        self.write(&mut hash, state, update)?;
        let hash = std::hash::Hasher::finish(&hash.0);
        if self.last != Some(hash) {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            self.write(&mut out, state, update)?;
            out.flush()?;
            self.last = Some(hash);
        }
        Ok(SyncDone::printed(full, start.elapsed()))
    }
}

/// Prints the path of one connection through the intent of the first sync
/// (`svcproxy explain`).
pub(crate) struct ExplainPrinter {
    pub(crate) cfg: PlanConfig,
    pub(crate) packet: svcproxy_plan::explain::Packet,
    pub(crate) json: bool,
    /// `--live`: the mode's data plane, to read the kernel's rules with.
    pub(crate) live: Option<Box<dyn DataPlane>>,
}

impl Target for ExplainPrinter {
    fn sync(
        &mut self,
        _state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        let start = std::time::Instant::now();
        let intent = svcproxy_plan::build_intent(&update.v4, &update.v6, &self.cfg);
        let mut trace =
            svcproxy_plan::explain::explain(&intent, &update.v4, &update.v6, &self.packet);
        if let Some(plane) = &mut self.live {
            let compared = plane
                .compare(&intent)
                .map_err(|e| anyhow::anyhow!("reading the kernel's rules (--live): {e}"))?;
            let found = svcproxy_dataplane::kernel::kube_proxy::find_leftovers(&[]);
            let mut leftovers: Vec<String> = found
                .iptables
                .iter()
                .map(|(table, chains)| format!("{table}: {}", chains.join(" ")))
                .collect();
            leftovers.extend(
                found
                    .nft_tables
                    .iter()
                    .map(|t| format!("nftables table {t}")),
            );
            if found.ipvs {
                leftovers.push("the kube-ipvs0 interface (ipvs mode)".to_string());
            }
            trace.with_kernel(svcproxy_plan::explain::KernelFindings {
                mode: plane.mode().to_string(),
                counted_only: compared.counted_only,
                differences: compared.differences,
                ahead: compared.ahead,
                kube_proxy_leftovers: leftovers,
            });
        }
        let mut out = std::io::stdout().lock();
        if self.json {
            serde_json::to_writer_pretty(&mut out, &trace)?;
            out.write_all(b"\n")?;
        } else {
            out.write_all(trace.text().as_bytes())?;
        }
        out.flush()?;
        Ok(SyncDone::printed(full, start.elapsed()))
    }

    fn wants_host_addresses(&self) -> bool {
        true
    }
}

/// Prints what a first sync would apply, in the mode's own text (`svcproxy render`).
pub(crate) struct RenderPrinter(pub(crate) Driver<Box<dyn DataPlane>, NoConntrackCleanup>);

impl Target for RenderPrinter {
    fn sync(
        &mut self,
        _state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        let start = std::time::Instant::now();
        let mut out = std::io::stdout().lock();
        out.write_all(self.0.render(update).as_bytes())?;
        out.flush()?;
        Ok(SyncDone::printed(full, start.elapsed()))
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
        assert!(!SyncError::from(anyhow::anyhow!("stdout closed")).is_partial());
        assert!(!SyncError::from(std::io::Error::other("broken pipe")).is_partial());
    }
}
