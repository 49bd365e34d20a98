//! Golden intents: each scenario directory under `testdata/` decides, through the
//! real `ClusterState` and a fresh intent builder, exactly its `expected.intent`
//! (the intent as text, one line per frontend: what every backend must do).
//!
//! `UPDATE_GOLDEN=1 cargo test -p svcproxy-plan --test intent_golden` rewrites the
//! files; review the diff like code.

mod common;

use common::*;
use svcproxy_plan::intent::describe;

#[test]
fn every_scenario_describes_its_golden_intent() {
    for case in cases() {
        let mut sc = Scenario::load(&case);
        assert_golden(&case, "expected.intent", &describe(&sc.intent()));
    }
}
