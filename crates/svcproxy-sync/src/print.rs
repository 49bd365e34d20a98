//! The one-shot tools' [`Target`]s: they print rather than program, from the
//! same intent the kernel's [`Driver`](crate::Driver) would apply
//! ([`Intents`]).
//!
//! - [`SnapshotPrinter`]: `svcproxy snapshot`, each snapshot that differs from
//!   the last;
//! - [`ExplainPrinter`]: `svcproxy explain`, one connection's path through the
//!   intent, and with `--live` how the kernel's rules differ from it;
//! - [`RenderPrinter`]: `svcproxy render`, what a first sync would apply, in the
//!   mode's own text.

use std::io::Write as _;

use svcproxy_core::report;
use svcproxy_core::state::{ClusterState, SnapshotUpdate};
use svcproxy_dataplane::DataPlane;
use svcproxy_plan::PlanConfig;

use crate::intents::Intents;
use crate::target::{SyncDone, SyncError, Target};

/// Prints snapshots (`svcproxy snapshot`): only when they differ from the last one.
pub struct SnapshotPrinter {
    pub json: bool,
    /// One line per snapshot (NDJSON) rather than pretty-printed.
    pub compact: bool,
    /// A hash of the last printed text: at 100k endpoints the text is ~14 MB, too
    /// much to keep just to compare.
    pub last: Option<u64>,
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
    ) -> Result<(), SyncError> {
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
pub struct ExplainPrinter {
    pub cfg: PlanConfig,
    pub packet: svcproxy_plan::explain::Packet,
    pub json: bool,
    /// `--live`: the mode's data plane, to read the kernel's rules with.
    pub live: Option<Box<dyn DataPlane>>,
}

impl Target for ExplainPrinter {
    fn sync(
        &mut self,
        _state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        let start = std::time::Instant::now();
        let mut intents = Intents::new(self.cfg.clone());
        intents.update(update);
        let intent = intents.intent();
        let mut trace =
            svcproxy_plan::explain::explain(intent, &update.v4, &update.v6, &self.packet);
        if let Some(plane) = &mut self.live {
            let compared = plane.compare(intent).map_err(SyncError::Live)?;
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
pub struct RenderPrinter {
    pub cfg: PlanConfig,
    /// The mode's data plane (its `render`: nothing is written).
    pub plane: Box<dyn DataPlane>,
}

impl Target for RenderPrinter {
    fn sync(
        &mut self,
        _state: &ClusterState,
        update: &SnapshotUpdate,
        full: bool,
    ) -> Result<SyncDone, SyncError> {
        let start = std::time::Instant::now();
        let mut out = std::io::stdout().lock();
        let mut intents = Intents::new(self.cfg.clone());
        intents.update(update);
        out.write_all(self.plane.render(intents.intent()).as_bytes())?;
        out.flush()?;
        Ok(SyncDone::printed(full, start.elapsed()))
    }
}
