//! Destination conflicts as the sync's orchestration reports and logs them: in
//! every sync's report, logged once when they change (not again across a failed
//! apply), and noted once when resolved. Against a fake `nft` (`RecordingSink`).
//!
//! Address plan: as the data plane's `common` (node-a, services 198.19.0.0/16,
//! external IPs 203.0.113.0/24).

// The data plane's test cluster (YAML through the real `ClusterState`).
#[path = "../../svcproxy-dataplane/tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use svcproxy_dataplane::{NftDataPlane, NoConntrackCleanup, RecordingSink};
use svcproxy_sync::Driver;

fn plane() -> Driver<NftDataPlane<RecordingSink>, NoConntrackCleanup> {
    Driver::without_conntrack(plan_config(), NftDataPlane::with_sink(RecordingSink::new()))
}

/// Captured log output.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

#[test]
fn conflicts_are_reported_and_logged_once_per_change() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let mut state = cluster(&[WEB, DB, CACHE_CONFLICT]);
        let mut dp = plane();
        let report = dp.sync(&snapshot(&mut state), false).expect("sync");
        assert_eq!(report.conflicts.len(), 1, "{:?}", report.conflicts);
        let c = &report.conflicts[0];
        assert_eq!(c.kept, spn("cache", "pg"));
        assert_eq!(c.ignored, [spn("db", "pg")]);
        let out = logs.take();
        assert_eq!(out.matches("claim one destination").count(), 1, "{out}");
        assert!(out.contains("203.0.113.20"), "{out}");

        // Unchanged conflicts: reported, not logged again (even across a failure).
        dp.plane_mut().sink_mut().fail_next("Error: x");
        upsert(&mut state, WEB_MOVED);
        assert!(dp.sync(&snapshot(&mut state), false).is_err());
        let report = dp.sync(&snapshot(&mut state), true).expect("sync");
        assert_eq!(report.conflicts.len(), 1);
        assert!(!logs.take().contains("claim one destination"));

        // Resolved: noted once.
        delete_service(&mut state, "cache");
        let report = dp.sync(&snapshot(&mut state), false).expect("sync");
        assert!(report.conflicts.is_empty());
        let out = logs.take();
        assert_eq!(out.matches("conflict resolved").count(), 1, "{out}");
        dp.sync(&snapshot(&mut state), true).expect("sync");
        assert!(!logs.take().contains("conflict"));
    });
}
