//! A sync's time by step (`SyncReport::steps`, the `svcproxy_sync_step_duration_seconds`
//! histogram): the steps lie within the sync, `apply` is the data plane's own figure,
//! and an adopted first sync writes nothing. Against a fake `nft` (`RecordingSink`).

// The data plane's test cluster (YAML through the real `ClusterState`).
#[path = "../../svcproxy-dataplane/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
use svcproxy_dataplane::{NftDataPlane, RecordingSink};
use svcproxy_sync::Driver;

#[test]
fn the_steps_add_up_within_the_sync_and_apply_is_the_writes() {
    let mut state = cluster(&[WEB, DB]);
    let mut dp =
        Driver::without_conntrack(plan_config(), NftDataPlane::with_sink(RecordingSink::new()));
    for full in [false, true, false] {
        let report = dp.sync(&snapshot(&mut state), full).expect("sync");
        let s = report.steps;
        assert_eq!(s.apply, report.apply_duration, "{s:?}");
        let sum = s.decide + s.translate + s.apply + s.conntrack;
        assert!(
            sum <= report.duration,
            "{s:?} add up to more than {:?}",
            report.duration
        );
        // What is not in a step (bookkeeping between them) is small.
        assert!(
            report.duration - sum < Duration::from_millis(50),
            "{s:?} of {:?}",
            report.duration
        );
        let labels: Vec<&str> = s.labelled().iter().map(|(l, _)| *l).collect();
        assert_eq!(labels, ["decide", "translate", "apply", "conntrack"]);
    }
}
