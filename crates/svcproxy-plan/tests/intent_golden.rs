//! Golden intents: each scenario directory under `testdata/` decides, through the
//! real `ClusterState` and a fresh intent builder, exactly its `expected.intent`
//! (the intent as text, one line per frontend: what every backend must do).
//!
//! `UPDATE_GOLDEN=1 cargo test -p svcproxy-plan --test intent_golden` rewrites the
//! files; review the diff like code.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use svcproxy_plan::intent::describe;

#[test]
fn every_scenario_describes_its_golden_intent() {
    let update = std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    for case in cases() {
        let mut sc = Scenario::load(&case);
        let text = describe(&sc.intent());
        let path = sc.dir.join("expected.intent");
        if update {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            panic!("{case}: no expected.intent; run with UPDATE_GOLDEN=1 to create it")
        });
        assert_eq!(
            expected, text,
            "{case}: intent differs from expected.intent"
        );
    }
}
