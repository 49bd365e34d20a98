//! The commit/abandon logic of the nftables data plane fed as the sync's
//! orchestration feeds it (`common::Syncer`), against a fake `nft`
//! (`RecordingSink`): no kernel, no root.

mod common;

use common::*;
use svcproxy_core::model::IpFamily;
use svcproxy_dataplane::{DataPlaneError, NftDataPlane, RecordingSink, SyncKind, TableState};

fn plane() -> Syncer<NftDataPlane<RecordingSink>> {
    Syncer::new(plan_config(), NftDataPlane::with_sink(RecordingSink::new()))
}

#[test]
fn first_sync_recreates_then_nothing_changed_runs_no_nft() {
    let mut state = cluster(&[WEB, DB]);
    let mut dp = plane();
    let report = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert_eq!(report.kind, SyncKind::Recreate);
    let script = dp.plane().sink().last_applied().unwrap();
    assert_eq!(report.script_bytes, script.len());
    assert!(script.starts_with("add table ip svcproxy"), "{script}");
    assert!(script.contains("delete table ip svcproxy"));
    assert!(script.contains("198.19.0.10 . tcp . 80"));
    assert!(script.contains("198.19.0.20 . tcp . 5432"));

    let report = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert_eq!(report.kind, SyncKind::Partial);
    assert_eq!(report.script_bytes, 0);
    assert_eq!(
        dp.plane().sink().attempts.len(),
        1,
        "an empty plan must not run nft"
    );

    let report = dp.sync(&snapshot(&mut state), true).expect("sync");
    assert_eq!(report.kind, SyncKind::Resync);
    assert_eq!(dp.plane().sink().attempts.len(), 2);
}

#[test]
fn a_failed_apply_makes_the_next_plan_a_full_recreate() {
    let mut state = cluster(&[WEB, DB]);
    let mut dp = plane();
    dp.sync(&snapshot(&mut state), false).expect("first sync");

    upsert(&mut state, WEB_MOVED);
    dp.plane_mut()
        .sink_mut()
        .fail_next("Error: Could not process rule: No such file or directory");
    let err = dp.sync(&snapshot(&mut state), false).unwrap_err();
    assert!(matches!(err, DataPlaneError::Rejected { .. }), "{err:?}");
    assert_eq!(
        err.stderr(),
        Some("Error: Could not process rule: No such file or directory")
    );
    assert!(
        err.to_string().contains("No such file or directory"),
        "{err}"
    );
    let failed = dp.plane().sink().attempts.last().unwrap().clone();
    assert!(
        !failed.contains("delete table"),
        "the failed plan was partial"
    );

    // Nothing changed since, and no full sync asked for: still a full recreate,
    // holding the state the failed plan wanted.
    let report = dp.sync(&snapshot(&mut state), false).expect("retry");
    assert_eq!(report.kind, SyncKind::Recreate);
    let script = dp.plane().sink().last_applied().unwrap();
    assert!(script.contains("delete table ip svcproxy"));
    assert!(script.contains("198.18.3.10 . 8080"), "{script}");
    assert!(!script.contains("198.18.2.10"), "{script}");
    assert!(script.contains("198.19.0.20 . tcp . 5432"));

    // Success: the next change is partial again.
    delete_service(&mut state, "db");
    let report = dp.sync(&snapshot(&mut state), false).expect("partial");
    assert_eq!(report.kind, SyncKind::Partial);
}

#[test]
fn failures_in_a_row_keep_recreating() {
    let mut state = cluster(&[WEB]);
    let mut dp = plane();
    dp.plane_mut()
        .sink_mut()
        .fail_always(Some("Error: busy".into()));
    for _ in 0..3 {
        assert!(dp.sync(&snapshot(&mut state), false).is_err());
    }
    dp.plane_mut().sink_mut().fail_always(None);
    let report = dp.sync(&snapshot(&mut state), false).expect("sync");
    assert_eq!(report.kind, SyncKind::Recreate);
    assert!(dp
        .plane()
        .sink()
        .attempts
        .iter()
        .all(|s| s.contains("delete table ip svcproxy")));
}

#[test]
fn a_one_service_change_touches_only_that_service() {
    let mut state = cluster(&[WEB, DB]);
    let mut dp = plane();
    dp.sync(&snapshot(&mut state), false).expect("first sync");

    upsert(&mut state, WEB_MOVED);
    let report = dp.sync(&snapshot(&mut state), false).expect("partial");
    assert_eq!(report.kind, SyncKind::Partial);
    assert_eq!(report.replanned, 1);
    let script = dp.plane().sink().last_applied().unwrap();
    // Same endpoint count: web's chain stays, one element of the endpoint map
    // changes.
    assert!(!script.contains("chain"), "{script}");
    assert_eq!(script.lines().count(), 2, "{script}");
    assert!(script.contains("198.18.3.10 . 8080"), "{script}");
    assert!(!script.contains(&service_chain("db", "pg")), "{script}");
    assert!(!script.contains("198.19.0.20"), "{script}");
    assert!(!script.contains("203.0.113.20"), "{script}");
    assert!(
        !script.contains("table"),
        "no table-level statement: {script}"
    );
    assert!(!script.contains("ip6 svcproxy"), "{script}");

    // Deleting the other service touches only it.
    delete_service(&mut state, "db");
    let report = dp.sync(&snapshot(&mut state), false).expect("partial");
    assert_eq!(report.kind, SyncKind::Partial);
    let script = dp.plane().sink().last_applied().unwrap();
    assert!(script.contains(&service_chain("db", "pg")), "{script}");
    assert!(script.contains("delete element"), "{script}");
    assert!(!script.contains(&service_chain("web", "http")), "{script}");
}

#[test]
fn render_is_the_first_sync_script_and_touches_nothing() {
    let mut state = cluster(&[WEB, DB]);
    let up = snapshot(&mut state);
    let mut dp = plane();
    let rendered = dp.render(&up);
    assert!(dp.plane().sink().attempts.is_empty());
    dp.sync(&up, false).expect("sync");
    assert_eq!(dp.plane().sink().last_applied().unwrap(), rendered);

    // Rendering later does not disturb the partial-sync state.
    upsert(&mut state, WEB_MOVED);
    let up = snapshot(&mut state);
    let rendered = dp.render(&up);
    assert!(rendered.contains("198.18.3.10 . 8080"));
    assert_eq!(dp.sync(&up, false).unwrap().kind, SyncKind::Partial);
}

#[test]
fn cleanup_applies_the_cleanup_script() {
    let mut sink = RecordingSink::new();
    svcproxy_dataplane::nftables::cleanup_with(&mut sink).expect("cleanup");
    assert_eq!(sink.applied, [svcproxy_plan::nft::cleanup_script()]);
    sink.fail_next("Error: nope");
    assert_eq!(
        svcproxy_dataplane::nftables::cleanup_with(&mut sink)
            .unwrap_err()
            .stderr(),
        Some("Error: nope")
    );
}

#[test]
fn a_table_taken_away_behind_our_back_is_drift_and_the_next_sync_recreates() {
    let mut state = cluster(&[WEB, DB]);
    let mut dp = plane();
    // Nothing written yet: nothing to compare with.
    assert_eq!(dp.drift().unwrap(), None);
    dp.sync(&snapshot(&mut state), false).expect("first sync");
    assert_eq!(
        dp.drift().unwrap(),
        None,
        "the kernel holds what was written"
    );

    let cases = [
        (TableState::Missing, "table ip svcproxy was deleted"),
        (
            TableState::Present {
                handle: 1,
                dormant: true,
            },
            "table ip svcproxy was made dormant",
        ),
        (
            TableState::Present {
                handle: 9,
                dormant: false,
            },
            "table ip svcproxy was deleted and created again by someone else",
        ),
    ];
    for (now, reason) in cases {
        dp.plane_mut().sink_mut().tables.insert(IpFamily::V4, now);
        let drift = dp.drift().unwrap().expect("drift");
        assert!(drift.contains(reason), "{drift}");
        assert!(!drift.contains("ip6"), "{drift}");
        // Asked again before a sync: nothing known to compare with any more.
        assert_eq!(dp.drift().unwrap(), None);
        // The kernel (here: the fake) gets a fresh table from the recreate.
        dp.plane_mut().sink_mut().tables.remove(&IpFamily::V4);
        let report = dp.sync(&snapshot(&mut state), false).expect("repair");
        assert_eq!(report.kind, SyncKind::Recreate, "{reason}");
        assert_eq!(dp.drift().unwrap(), None, "{reason}: repaired");
    }

    // A partial sync keeps the handle it knows.
    upsert(&mut state, WEB_MOVED);
    let report = dp.sync(&snapshot(&mut state), false).expect("partial");
    assert_eq!(report.kind, SyncKind::Partial);
    assert_eq!(dp.drift().unwrap(), None);
}
